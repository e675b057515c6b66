"""Train a small MLP on scikit-learn's digits with PyTorch Lightning, checkpoints in mvc.

`ModelCheckpoint` saves every few steps through `MvcCheckpointIO`: each save is one mvc commit
(quantized by the config search, judged by the validation loss through `MvcCallback`) and the
`.ckpt` files are small pointers.  The run "crashes" part-way; a new Trainer resumes from the
newest pointer with `fit(ckpt_path=...)` and finishes.  Finally `mvc checkout COMMIT -o x.ckpt`
writes a plain Lightning checkpoint.

    python examples/train_lightning.py --workdir lightning-run          # ~1 minute on 2 cores
    python examples/train_lightning.py --workdir /tmp/l --small         # the CI setting
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits

from mvc.cli.main import main as mvc_cli
from mvc.integrations.lightning import MvcCallback, MvcCheckpointIO, read_pointer
from mvc.repo.repository import Repo


def load_data(seed: int = 0):
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    return (x[360:], y[360:]), (x[:360], y[:360])


class DigitsMLP(L.LightningModule):
    def __init__(self, lr: float = 3e-3, hidden: int = 256) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.LayerNorm(hidden),
                                       torch.nn.Linear(hidden, 10))

    def training_step(self, batch, _):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, 400)}


class Crash(L.Callback):
    """A simulated failure (a lost node, a preemption) after step `at`."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at:
            raise RuntimeError(f"simulated failure at step {self.at}")


def evaluate(model: DigitsMLP, val) -> tuple[float, float]:
    with torch.no_grad():
        logits = model.net(val[0])
        return F.cross_entropy(logits, val[1]).item(), (logits.argmax(1) == val[1]).float().mean().item()


def trainer(workdir: Path, io: MvcCheckpointIO, quality, max_steps: int, every: int, extra=()) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=workdir, plugins=[io],
        callbacks=[ModelCheckpoint(dirpath=workdir / "checkpoints", every_n_train_steps=every, save_top_k=-1),
                   MvcCallback(io, quality=quality), *extra])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="lightning-run")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50, help="checkpoint interval in steps")
    ap.add_argument("--small", action="store_true", help="CI size: a narrower MLP, 24 steps, a checkpoint every 8")
    args = ap.parse_args()
    steps, every = (24, 8) if args.small else (args.steps, args.every)
    hidden = 96 if args.small else 256
    crash_at = (steps // 2 // every) * every + every // 2  # between two checkpoints
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    train, val = load_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=64, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))

    io = MvcCheckpointIO(workdir / "repo")

    def val_loss(module) -> float:
        return evaluate(module, val)[0]

    print(f"== training {steps} steps, a checkpoint every {every}; a failure at step {crash_at}")
    try:
        trainer(workdir, io, val_loss, steps, every, [Crash(crash_at)]).fit(DigitsMLP(hidden=hidden), loader)
    except RuntimeError as exc:
        print(f"   {exc}")
    pointers = sorted((workdir / "checkpoints").glob("*.ckpt"), key=lambda p: read_pointer(p)["step"])
    latest = pointers[-1]
    print(f"   {len(pointers)} pointer files, {max(p.stat().st_size for p in pointers)} bytes at most; "
          f"resuming from {latest.name} (step {read_pointer(latest)['step']})")

    model = DigitsMLP(hidden=hidden)
    t = trainer(workdir, io, val_loss, steps, every)
    t.fit(model, loader, ckpt_path=str(latest))
    loss, acc = evaluate(model, val)
    print(f"== finished at step {t.global_step}: val loss {loss:.4f}, accuracy {acc:.3f}")

    repo = Repo(workdir / "repo")
    for c in repo.log():
        snap = repo.read_snapshot(c.snapshot)
        stored = sum(r.stored_bytes for r in snap.tensors)
        print(f"   {c.id[:12]} step {c.step:>4}  {snap.raw_bytes:>8} -> {stored:>7} bytes "
              f"({snap.raw_bytes / max(stored, 1):.1f}x)  {c.message}")

    plain = workdir / "plain.ckpt"
    head = repo.log()[0].id
    # The CLI in this process: `mvc -C REPO checkout COMMIT -o plain.ckpt`.
    assert mvc_cli(["-C", str(workdir / "repo"), "checkout", head, "-o", str(plain.resolve())]) == 0
    ckpt = torch.load(plain, weights_only=True)
    print(f"== mvc checkout {head[:12]} -o {plain.name}: a plain Lightning checkpoint at step {ckpt['global_step']}")
    assert t.global_step == steps and ckpt["global_step"] == steps


if __name__ == "__main__":
    main()
