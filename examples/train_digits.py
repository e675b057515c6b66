"""Train a small CNN on real data (scikit-learn's handwritten digits) under mvc.

Exercises the whole loop an ML engineer runs: commit a checkpoint every epoch
(model + optimizer + scheduler + RNG state), survive a simulated crash by
resuming from a commit, fork a hyperparameter experiment on a branch, compare
branches, and compact history with gc.  Run it with `make demo`.
"""
from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import mvc
from mvc.repo.repository import Repo


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 2 * 2, 256)
        self.norm = nn.LayerNorm(256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.norm(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


def load_data(seed: int = 0):
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    n_val = 360
    return (x[n_val:], y[n_val:]), (x[:n_val], y[:n_val])


def evaluate(model: nn.Module, data) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(data[0])
        loss = F.cross_entropy(logits, data[1]).item()
        acc = (logits.argmax(1) == data[1]).float().mean().item()
    model.train()
    return loss, acc


def train_epoch(model, opt, sched, data, batch: int = 64) -> None:
    x, y = data
    perm = torch.randperm(len(x))
    for i in range(0, len(x), batch):
        idx = perm[i:i + batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    sched.step()


def checkpoint(model, opt, sched, epoch: int) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "epoch": epoch,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()},
    }


def restore(state: dict, model, opt, sched) -> int:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    return state["epoch"]


def make_run(lr: float):
    model = DigitsCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def mvc_cli(workdir: Path, *args: str) -> None:
    print(f"\n$ mvc {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "mvc", *args], cwd=workdir, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="demo-run")
    ap.add_argument("--epochs", type=int, default=8)
    args = ap.parse_args()
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    train, val = load_data()
    repo = Repo.init(workdir)
    print(f"mvc {mvc.__version__}: repository in {repo.mvc_dir}; "
          f"{len(train[0])} training digits, {len(val[0])} held out")

    model, opt, sched = make_run(lr=2e-3)
    crash_at = args.epochs // 2
    epoch = 0
    crashed = False
    while epoch < args.epochs:
        train_epoch(model, opt, sched, train)
        epoch += 1
        loss, acc = evaluate(model, val)
        cid = repo.commit(checkpoint(model, opt, sched, epoch), f"epoch {epoch}", step=epoch,
                          metrics={"val_loss": loss, "val_acc": acc})
        print(f"epoch {epoch}: val_loss {loss:.4f} acc {acc:.3f} -> commit {cid[:12]}")
        if epoch == crash_at and not crashed:
            crashed = True
            print(f"\n*** simulated crash after epoch {epoch}: the process state is lost ***")
            model, opt, sched = make_run(lr=2e-3)
            epoch = restore(repo.checkout("main"), model, opt, sched)
            rloss, racc = evaluate(model, val)
            assert abs(rloss - loss) < 1e-6, "restored model must evaluate like the committed one"
            print(f"resumed from main at epoch {epoch}: val_loss {rloss:.4f} (identical)\n")

    # Fork a hyperparameter experiment from two epochs back.
    fork_point = repo.resolve("main~2")
    repo.branch("high-lr", fork_point)
    repo.switch("high-lr")
    model, opt, sched = make_run(lr=2e-3)
    epoch = restore(repo.checkout("high-lr"), model, opt, sched)
    for group in opt.param_groups:
        group["lr"] *= 5
    for _ in range(2):
        train_epoch(model, opt, sched, train)
        epoch += 1
        loss, acc = evaluate(model, val)
        repo.commit(checkpoint(model, opt, sched, epoch), f"high-lr epoch {epoch}", step=epoch,
                    metrics={"val_loss": loss, "val_acc": acc})
        print(f"[high-lr] epoch {epoch}: val_loss {loss:.4f} acc {acc:.3f}")
    repo.switch("main")

    # A throwaway branch, deleted again: gc reclaims what only it reached.
    repo.branch("scratch", "main")
    repo.switch("scratch")
    model, opt, sched = make_run(lr=2e-3)
    restore(repo.checkout("scratch"), model, opt, sched)
    train_epoch(model, opt, sched, train)
    repo.commit(checkpoint(model, opt, sched, epoch + 1), "scratch experiment")
    repo.switch("main")
    repo.delete_branch("scratch")
    repo.close()

    mvc_cli(workdir, "log", "--oneline", "--graph", "-n", "5")
    mvc_cli(workdir, "branch")
    mvc_cli(workdir, "diff", "main", "high-lr")
    mvc_cli(workdir, "show", "main")
    mvc_cli(workdir, "checkout", "main~1", "-o", "resumed.pt")
    mvc_cli(workdir, "switch", "main")
    mvc_cli(workdir, "gc")
    mvc_cli(workdir, "fsck")
    mvc_cli(workdir, "stats")


if __name__ == "__main__":
    main()
