"""A real, deterministic training trajectory for the benchmarks.

An MLP (about 1.1M parameters by default) is trained with Adam and a cosine
learning-rate schedule on scikit-learn's bundled handwritten digits
(`load_digits`, shipped offline with scikit-learn), and a checkpoint is taken
after every epoch: model state, optimizer state, step and held-out metrics,
exactly what a training loop hands to `torch.save`.  Checkpoints are cached as
`.pt` files under the temp directory, keyed by the configuration and the torch
version, so every benchmark in a run (and later runs) reuses one trajectory.

    from benchmarks.trajectory import TrajectoryConfig, checkpoints
    for ck in checkpoints(TrajectoryConfig()):
        ck.path, ck.step, ck.state["model"]   # state loaded on demand

Run directly to build the cache and print a summary: `python -m benchmarks.trajectory`.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

__all__ = ["TrajectoryConfig", "Checkpoint", "build_model", "digits_data", "checkpoints",
           "ensure_trajectory", "evaluate", "iter_model_states"]


@dataclass(frozen=True)
class TrajectoryConfig:
    """What to train; every field is part of the cache key."""

    hidden: int = 1024          # width of each hidden layer
    depth: int = 2              # number of hidden layers
    epochs: int = 40            # one checkpoint per epoch (>= 33: checkout at chain depth 32)
    batch_size: int = 32
    lr: float = 1e-3            # peak Adam learning rate, cosine-decayed to lr_min
    lr_min: float = 1e-5
    weight_decay: float = 0.0
    dropout: float = 0.1
    label_smoothing: float = 0.1  # keeps gradients alive once the easy set is fit, as in real runs
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps({**dataclasses.asdict(self), "torch": torch.__version__, "v": 1},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Checkpoint:
    """One cached checkpoint; `state` loads it (weights_only) on first access."""

    index: int
    step: int
    path: Path
    metrics: dict[str, float]
    _state: Optional[dict[str, Any]] = None

    @property
    def state(self) -> dict[str, Any]:
        if self._state is None:
            self._state = torch.load(self.path, map_location="cpu", weights_only=True)
        return self._state

    @property
    def model(self) -> dict[str, torch.Tensor]:
        """The model's state dict."""
        return self.state["model"]


def build_model(cfg: TrajectoryConfig) -> nn.Module:
    """The MLP trained by the trajectory (64 pixel inputs, 10 classes)."""
    layers: list[nn.Module] = []
    width = 64
    for _ in range(cfg.depth):
        layers += [nn.Linear(width, cfg.hidden), nn.ReLU()]
        if cfg.dropout:
            layers.append(nn.Dropout(cfg.dropout))
        width = cfg.hidden
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def digits_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test) from sklearn's offline digits set, standardized."""
    from sklearn.datasets import load_digits

    ds = load_digits()
    x = torch.tensor(ds.data, dtype=torch.float32) / 16.0
    y = torch.tensor(ds.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    x_tr, x_te = x[n_test:], x[:n_test]
    mean, std = x_tr.mean(0), x_tr.std(0).clamp_min(1e-3)
    return (x_tr - mean) / std, y[n_test:], (x_te - mean) / std, y[:n_test]


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Cross-entropy loss and accuracy of `model` on (x, y)."""
    model.eval()
    logits = model(x)
    model.train()
    return {"loss": float(nn.functional.cross_entropy(logits, y)),
            "acc": float((logits.argmax(1) == y).float().mean())}


def _cache_root() -> Path:
    return Path(os.environ.get("MVC_BENCH_CACHE", Path(tempfile.gettempdir()) / "mvc-bench"))


def _train(cfg: TrajectoryConfig, out: Path) -> None:
    torch.manual_seed(cfg.seed)
    x_tr, y_tr, x_te, y_te = digits_data(cfg.seed)
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(x_tr) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * s / total)))
        / cfg.lr)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    index, step = [], 0
    for epoch in range(cfg.epochs):
        perm = torch.randperm(len(x_tr), generator=g)
        for i in range(0, len(x_tr), cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            loss = nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx],
                                               label_smoothing=cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
        metrics = evaluate(model, x_te, y_te)
        name = f"ckpt_{epoch:03d}.pt"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "step": step, "epoch": epoch}, out / name)
        index.append({"file": name, "step": step, "metrics": metrics})
    (out / "index.json").write_text(json.dumps({"config": dataclasses.asdict(cfg),
                                                "checkpoints": index}, indent=1))


def ensure_trajectory(cfg: TrajectoryConfig = TrajectoryConfig()) -> Path:
    """The cache directory of `cfg`'s trajectory, training it first if needed."""
    root = _cache_root()
    final = root / f"traj-{cfg.key()}"
    if (final / "index.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="building-", dir=root))
    try:
        _train(cfg, work)
        try:
            work.rename(final)  # atomic publish; a concurrent builder may have won
        except OSError:
            if not (final / "index.json").exists():
                raise
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final


def checkpoints(cfg: TrajectoryConfig = TrajectoryConfig()) -> list[Checkpoint]:
    """Every checkpoint of the trajectory, in training order (states load lazily)."""
    d = ensure_trajectory(cfg)
    index = json.loads((d / "index.json").read_text())["checkpoints"]
    return [Checkpoint(i, e["step"], d / e["file"], e["metrics"]) for i, e in enumerate(index)]


def iter_model_states(cfg: TrajectoryConfig = TrajectoryConfig()) -> Iterator[dict[str, torch.Tensor]]:
    """Model state dicts in training order, one in memory at a time."""
    for ck in checkpoints(cfg):
        yield torch.load(ck.path, map_location="cpu", weights_only=True)["model"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=TrajectoryConfig.epochs)
    ap.add_argument("--hidden", type=int, default=TrajectoryConfig.hidden)
    args = ap.parse_args()
    cfg = TrajectoryConfig(epochs=args.epochs, hidden=args.hidden)
    cks = checkpoints(cfg)
    n_params = sum(t.numel() for t in cks[0].model.values())
    print(f"{len(cks)} checkpoints in {cks[0].path.parent}, {n_params:,} model parameters")
    for ck in cks:
        print(f"  step {ck.step:5d}  test loss {ck.metrics['loss']:.4f}  acc {ck.metrics['acc']:.4f}")


if __name__ == "__main__":
    main()
