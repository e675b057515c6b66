"""A real small model for search and Tracker tests: an MLP on scikit-learn's bundled digits."""
from __future__ import annotations

import torch


def digits(seed: int = 0):
    """(x_train, y_train, x_eval, y_eval) from scikit-learn's bundled digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, data, g: torch.Generator,
               after_backward=None) -> None:
    """One Adam step on a random batch of 64 training digits (`after_backward()` between the
    backward pass and the step: where a Tracker counts it)."""
    import torch.nn.functional as F

    xtr, ytr = data[0], data[1]
    i = torch.randint(0, len(ytr), (64,), generator=g)
    loss = F.cross_entropy(model(xtr[i]), ytr[i])
    opt.zero_grad()
    loss.backward()
    if after_backward is not None:
        after_backward()
    opt.step()
