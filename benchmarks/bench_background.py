"""Background commits at scale (issue 14 item 6): how long the training loop is blocked.

`Tracker.commit(..., background=True)` copies the state to the CPU and returns; the
commit itself (search or lossless encoding, writing) runs on a worker thread while
training goes on.  This measures, on bench_scale's GPT-2-small-shaped model (124M
parameters by default, `--params` to scale) trained a few AdamW steps:

    torch.save       the same state to a file, fsync included (the peer)
    blocking         the time `commit(background=True)` takes to return, per commit
                     (`--commits`, default 2: the first also allocates the pinned host
                     buffers a CUDA state is copied into, which later commits reuse)
    commit job       the background commit's own time, start to finish
    steps during     training steps run while the commits run, their mean time against
                     the mean step time without a commit running

    python benchmarks/bench_background.py [--params 124e6] [--epsilon 0.05] [--json]
    python benchmarks/bench_background.py --device cuda     # the model and optimizer on the GPU

`--worker process|thread` picks where the commit runs (the Tracker's `background_process`;
default: its own choice, a child process where it can). `--probe` times, in place of the big
model's steps, a small model's (12 blocks, d = 64, 256-word vocabulary, one sequence of 8
tokens) on the CPU: a loop whose every step is Python and kernel dispatch, the work a GPU
training loop's host thread does, and the part a commit on a thread of the same process
competes with for the interpreter lock. The commits still commit the big model. The training
process then uses one intra-op thread (a commit on its thread too).

Without `--epsilon` the commit is lossless (the default without a quality function);
with it, the proxy search runs in the background. `--quality` judges the search by the
model's loss on a held-out batch instead (a Tracker `quality` callable, evaluated in the
training process on the Tracker's copy of the model, wherever the commit runs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scale_workload import shape_for, tensor_bytes, trainer  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=124e6)
    ap.add_argument("--steps", type=int, default=3, help="AdamW steps before the commit")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--epsilon", type=float, default=None,
                    help="opt in to a lossy commit judged by the proxy (default: lossless)")
    ap.add_argument("--device", default="cpu", help="where the model trains: cpu or cuda")
    ap.add_argument("--commits", type=int, default=2,
                    help="background commits, each after --steps more training steps")
    ap.add_argument("--nice", type=int, default=None,
                    help="the Tracker's background_nice (default: its own, 10; 0: the training "
                         "loop's priority)")
    ap.add_argument("--worker", choices=("auto", "process", "thread"), default="auto",
                    help="where background commits run (the Tracker's background_process)")
    ap.add_argument("--probe", action="store_true",
                    help="time a small launch-bound CPU loop's steps instead of the model's")
    ap.add_argument("--quality", action="store_true",
                    help="judge the search by a quality callable, the model's loss on a held-out "
                         "batch (evaluated in the training process, on the Tracker's model copy)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.quality and a.epsilon is None:
        a.epsilon = 0.05   # a quality callable is a lossy search's judge
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")

    import mvc

    shape = shape_for(a.params)
    model, opt, train_step = trainer(shape, a.device, a.batch, a.seq)

    def sync() -> None:
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    timed_step = train_step
    if a.probe:
        # One intra-op thread, as a GPU loop's host thread uses: torch's idle OpenMP workers
        # spin between the probe's small kernels and would hold a second CPU a GPU loop leaves.
        torch.set_num_threads(1)
        _, _, timed_step = trainer({"layers": 12, "d": 64, "vocab": 256, "ctx": 64}, "cpu", 1, 8)
        for _ in range(10):
            timed_step()

    def step() -> float:
        t0 = time.perf_counter()
        timed_step()
        sync()  # a step's time is the device's, not its launch's
        return time.perf_counter() - t0

    def advance() -> list[float]:
        """The model's steps to its next checkpoint, timed when they are what is measured."""
        if a.probe:
            for _ in range(a.steps):
                train_step()
            sync()
            return [step() for _ in range(max(a.steps, 20))]
        return [step() for _ in range(a.steps)]

    quiet = advance()
    n_params = sum(p.numel() for p in model.parameters())
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    nbytes = tensor_bytes(state)
    with tempfile.TemporaryDirectory(prefix="mvc-bg-") as tmp:
        t0 = time.perf_counter()
        with open(Path(tmp) / "ck.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        save_s = time.perf_counter() - t0
        (Path(tmp) / "ck.pt").unlink()
        repo = mvc.Repo.init(Path(tmp) / "repo")
        kw: dict[str, Any] = {} if a.epsilon is None else {"epsilon": a.epsilon}
        if a.nice is not None:
            kw["background_nice"] = a.nice
        if a.worker != "auto":
            kw["background_process"] = a.worker == "process"
        if a.quality:
            kw["quality"] = held_out_loss(shape, a.device, a.batch, a.seq)
        tracker = mvc.Tracker(repo, model, opt, **kw)
        blocking: list[float] = []
        jobs: list[float] = []
        during: list[float] = []
        cid = ""
        for i in range(max(1, a.commits)):
            if i:
                quiet += advance()  # the next checkpoint's steps
            sync()
            t0 = time.perf_counter()
            fut = tracker.commit(f"background {i}", step=a.steps * (i + 1), background=True)
            blocking.append(time.perf_counter() - t0)
            while not fut.done():
                during.append(step())
            cid = fut.result()
            jobs.append(tracker.history[-1]["job_s"])
        worker = "process" if tracker.background_in_process else "thread"
        tracker.close()
        c = repo.read_commit(cid)
        stored = sum(r.stored_bytes for r in repo.read_snapshot(c.snapshot).tensors)
        repo.close()
    quiet_step = sum(quiet[1:]) / max(1, len(quiet) - 1)  # the first step warms up
    rep = {
        "params": n_params, "shape": shape, "checkpoint_bytes": nbytes,
        "torch_save_s": save_s, "blocking_s": blocking,
        "blocking_vs_save": [b / save_s for b in blocking],
        "commit_job_s": jobs, "stored_bytes": stored, "ratio": nbytes / stored,
        "config": c.quant, "steps_during": len(during),
        "step_s_quiet": quiet_step,
        "step_s_during": sum(during) / len(during) if during else None,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "device": a.device,
        "background_nice": tracker.background_nice, "worker": worker, "probe": a.probe,
        "quality": a.quality, "evaluations": [h.get("evaluations") for h in tracker.history],
    }
    if a.json:
        print(json.dumps(rep, indent=1, default=str))
    else:
        print(f"{n_params / 1e6:.1f}M parameters on {a.device}, checkpoint {nbytes / 1e9:.2f} GB, "
              f"{'lossless' if a.epsilon is None else f'epsilon {a.epsilon}'}, "
              f"{'held-out loss' if a.quality else 'proxy'} judge, "
              f"background commits in a {worker}, {tracker.background_nice} nice steps below the loop"
              + ("; steps timed: the CPU probe loop's" if a.probe else ""))
        print("| step | time | vs torch.save |\n|---|---|---|")
        print(f"| torch.save (incl. fsync) | {save_s:.2f} s | 1x |")
        for i, (b, j) in enumerate(zip(blocking, jobs)):
            print(f"| commit {i + 1}: training loop blocked by commit(background=True) | {b:.2f} s | "
                  f"{b / save_s:.2f}x |")
            print(f"| commit {i + 1}: the background commit itself | {j:.2f} s | {j / save_s:.2f}x |")
        sd = rep["step_s_during"]
        print(f"\n{len(during)} training steps ran during the commits: "
              + (f"{sd:.2f} s each vs {quiet_step:.2f} s without a commit running "
                 f"({sd / quiet_step:.2f}x; {os.cpu_count()} CPUs shared by both)" if sd else "none"))
        print(f"last commit stored {stored / 1e9:.3f} GB ({rep['ratio']:.2f}x)")
    return rep


def held_out_loss(shape: dict[str, int], device: str, batch: int, seq: int) -> Any:
    """quality(model): the model's loss on one held-out batch of the corpus's last tokens
    (the training batches are drawn from all of it: a stand-in for a validation set)."""
    from benchmarks.scale_workload import corpus_tokens

    data = corpus_tokens(shape["vocab"])[-(batch * (seq + 1)):].reshape(batch, seq + 1)
    x, y = data[:, :-1].to(device), data[:, 1:].to(device)

    def eval_loss(model: torch.nn.Module) -> float:
        with torch.no_grad():
            logits = model(x)
            return float(torch.nn.functional.cross_entropy(logits.reshape(-1, shape["vocab"]),
                                                           y.reshape(-1)))
    return eval_loss


if __name__ == "__main__":
    main()
