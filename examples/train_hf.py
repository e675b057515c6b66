"""Train a tiny GPT-2 on Python's own source text with the Hugging Face Trainer, checkpoints in mvc.

`MvcCallback` commits each `checkpoint-N/` directory the Trainer writes (weights, optimizer,
scheduler, RNG states, trainer state, config) as one mvc commit and deletes the directory.  The
run "crashes" part-way; a new Trainer resumes from mvc (`train_from_mvc`: check the newest commit
out to `checkpoint-N/`, then `train(resume_from_checkpoint=...)`) and finishes.  The model is
built from a config and reads bytes (a 256-token vocabulary), so nothing is downloaded.

    python examples/train_hf.py --workdir hf-run            # a few minutes on 2 cores
    python examples/train_hf.py --workdir /tmp/h --small    # the CI setting
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import shutil
import textwrap
from pathlib import Path

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)

from mvc.integrations.hf import MvcCallback, train_from_mvc
from mvc.repo.repository import Repo


class ByteBlocks(torch.utils.data.Dataset):
    """Blocks of `block` bytes of text: the byte values are the token ids."""

    def __init__(self, data: bytes, block: int) -> None:
        n = len(data) // block
        self.blocks = torch.tensor(list(data[: n * block]), dtype=torch.long).view(n, block)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def corpus() -> tuple[bytes, bytes]:
    """Real text shipped with Python: the source of a few stdlib modules (train), another (eval)."""
    import argparse as a
    import json.decoder as jd
    import shutil as sh

    train = "".join(inspect.getsource(m) for m in (a, sh, textwrap)).encode()
    return train, inspect.getsource(jd).encode()


class Crash(TrainerCallback):
    """A simulated failure (a lost node, a preemption) after step `at`."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise RuntimeError(f"simulated failure at step {self.at}")


def make_trainer(out: Path, train, val, steps: int, every: int, callbacks, small: bool = False) -> Trainer:
    torch.manual_seed(0)
    width, depth = (32, 1) if small else (64, 2)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=width, n_layer=depth, n_head=4, bos_token_id=0,
                        eos_token_id=0)
    args = TrainingArguments(str(out), max_steps=steps, save_steps=every, save_strategy="steps", eval_strategy="steps",
                             eval_steps=every, per_device_train_batch_size=16, learning_rate=2e-3, logging_steps=every,
                             report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    return Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=train, eval_dataset=val,
                   callbacks=list(callbacks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="hf-run")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=40, help="checkpoint interval in steps")
    ap.add_argument("--small", action="store_true", help="CI size: a smaller model, 8 steps, a checkpoint every 4")
    args = ap.parse_args()
    steps, every = (8, 4) if args.small else (args.steps, args.every)
    crash_at = (steps // 2 // every) * every + every // 2
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    out, repo_dir = workdir / "out", workdir / "repo"
    text, held_out = corpus()
    train, val = ByteBlocks(text, 64), ByteBlocks(held_out[: 64 * 32], 64)

    print(f"== training {steps} steps, a checkpoint every {every}; a failure at step {crash_at}")
    mvc = MvcCallback(repo_dir, delete=True)
    try:
        make_trainer(out, train, val, steps, every, [mvc, Crash(crash_at)], args.small).train()
    except RuntimeError as exc:
        print(f"   {exc}")
    left = sorted(p.name for p in out.glob("checkpoint-*"))
    print(f"   commits at steps {[s for s, _ in mvc.commits]}; checkpoint directories left on disk: {left}")

    trainer = make_trainer(out, train, val, steps, every, [MvcCallback(repo_dir, delete=True)], args.small)
    result = train_from_mvc(trainer, repo_dir, "HEAD")
    eval_loss = trainer.evaluate()["eval_loss"]
    print(f"== resumed from mvc, finished at step {result.global_step}: eval loss {eval_loss:.3f} "
          f"(perplexity {math.exp(eval_loss):.1f} over 256 byte values)")

    repo = Repo(repo_dir)
    for c in repo.log():
        snap = repo.read_snapshot(c.snapshot)
        stored = sum(r.stored_bytes for r in snap.tensors)
        print(f"   {c.id[:12]} step {c.step:>4}  {snap.raw_bytes:>9} -> {stored:>8} bytes "
              f"({snap.raw_bytes / max(stored, 1):.1f}x)  {c.message}  {json.dumps(c.metrics)}")
    assert result.global_step == steps


if __name__ == "__main__":
    main()
