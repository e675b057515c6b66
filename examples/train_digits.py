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


def train_epoch(model, opt, sched, data, tracker=None, batch: int = 64) -> None:
    x, y = data
    perm = torch.randperm(len(x))
    for i in range(0, len(x), batch):
        idx = perm[i:i + batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        if tracker is not None:
            tracker.after_backward()  # gradient EMA: sensitivity for prune/protect
        opt.step()
    sched.step()


def make_run(lr: float):
    model = DigitsCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def make_tracker(repo, model, opt, sched, val, epoch_ref: list[int]):
    """Every commit is vouched for by the held-out loss: at most 1% worse than uncompressed."""
    def heldout_loss(m: nn.Module) -> float:
        return evaluate(m, val)[0]

    return mvc.Tracker(
        repo, model, opt, quality=heldout_loss, epsilon=0.01,
        extra_state=lambda: {"scheduler": sched.state_dict(), "epoch": epoch_ref[0],
                             "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                                     "numpy": np.random.get_state()}})


def resume(tracker, sched, rev: str) -> int:
    extra = tracker.restore(rev)
    sched.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["rng"]["torch"])
    random.setstate(extra["rng"]["python"])
    np.random.set_state(extra["rng"]["numpy"])
    return extra["epoch"]


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
    epoch_ref = [0]
    tracker = make_tracker(repo, model, opt, sched, val, epoch_ref)
    crash_at = args.epochs // 2
    crashed = False
    while epoch_ref[0] < args.epochs:
        train_epoch(model, opt, sched, train, tracker)
        epoch_ref[0] += 1
        loss, acc = evaluate(model, val)
        cid = tracker.commit(f"epoch {epoch_ref[0]}", step=epoch_ref[0],
                             metrics={"val_loss": loss, "val_acc": acc})
        q = repo.read_commit(cid)
        how = (f"bins {q.quant['bins']}, prune {q.quant['prune']:.1f}, "
               f"loss {q.quality['degradation']:+.2%}" if q.quant else "lossless")
        print(f"epoch {epoch_ref[0]}: val_loss {loss:.4f} acc {acc:.3f} -> commit {cid[:12]} ({how})")
        if epoch_ref[0] == crash_at and not crashed:
            crashed = True
            print(f"\n*** simulated crash after epoch {epoch_ref[0]}: the process state is lost ***")
            model, opt, sched = make_run(lr=2e-3)
            tracker = make_tracker(repo, model, opt, sched, val, epoch_ref)
            epoch_ref[0] = resume(tracker, sched, "main")
            rloss, _ = evaluate(model, val)
            assert rloss <= loss * 1.01 + 1e-6, "a restored commit must stay within epsilon"
            print(f"resumed from main at epoch {epoch_ref[0]}: val_loss {rloss:.4f} "
                  f"(committed {loss:.4f}, bound +1%)\n")
    tracker.close()

    # Fork a hyperparameter experiment from two epochs back.
    repo.branch("high-lr", repo.resolve("main~2"))
    repo.switch("high-lr")
    model, opt, sched = make_run(lr=2e-3)
    tracker = make_tracker(repo, model, opt, sched, val, epoch_ref)
    epoch_ref[0] = resume(tracker, sched, "high-lr")
    for group in opt.param_groups:
        group["lr"] *= 5
    for _ in range(2):
        train_epoch(model, opt, sched, train, tracker)
        epoch_ref[0] += 1
        loss, acc = evaluate(model, val)
        tracker.commit(f"high-lr epoch {epoch_ref[0]}", step=epoch_ref[0],
                       metrics={"val_loss": loss, "val_acc": acc}, background=True)
        print(f"[high-lr] epoch {epoch_ref[0]}: val_loss {loss:.4f} acc {acc:.3f} (committing in the background)")
    tracker.close()
    repo.switch("main")

    # A throwaway branch, deleted again: gc reclaims what only it reached.
    repo.switch("scratch", create=True)
    model, opt, sched = make_run(lr=2e-3)
    tracker = make_tracker(repo, model, opt, sched, val, epoch_ref)
    resume(tracker, sched, "scratch")
    train_epoch(model, opt, sched, train, tracker)
    tracker.commit("scratch experiment")
    tracker.close()
    repo.switch("main")
    repo.delete_branch("scratch", force=True)  # unmerged on purpose (branch -D)
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
