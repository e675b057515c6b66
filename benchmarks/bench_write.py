"""A next commit's write phase when its largest tensors change (issue 27: host memory and time).

`bench_scale`'s next commit barely touches its largest tensors (a few AdamW steps leave most of
an embedding's levels where they were), so how a commit encodes large tensors that do change
is measured here on a state built for it: three 50257x768 tensors (GPT-2-small's embedding
shape) and 48 768x3072 ones, float32, committed with a fixed config (16 bins: no search, the
write path alone), then the same tensors plus 5% noise on top (about a tenth of the levels
move). Each measurement runs in its own child process with `MVC_THREADS` set, against
torch.save of the same state in the same run:

    torch.save        the next state to a file, fsync included (the peer)
    commit            repo.commit of the next state on top of the first (deltas): the largest
                      tensors encode one at a time across the pool where they are over half a thread's part
                      of the values (`mvc.native.parallel.large_alone`; at 2 threads none is)
    commit, one per thread
                      the same with every tensor one per pool thread (what commits did before
                      large_alone), for the same run's comparison

Peak extra RSS is over the child's RSS once the state is in memory; the write phase's is
the peak of `pipeline.write` alone (see bench_scale). The two commit kinds run A-B-B-A
(`--repeat`), each one's faster run shown (all runs in the JSON).

    python benchmarks/bench_write.py                      # MVC_THREADS 2 and 16
    python benchmarks/bench_write.py --threads 16 --json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale  # noqa: E402
from benchmarks.child_memory import WritePhase, peak, reset_peak, rss  # noqa: E402

CONFIG = {"bins": 16, "prune": 0.1, "protect": 0.0005}


def state(step: int, vocab: int, d: int, mid: int) -> dict[str, torch.Tensor]:
    """Step 0: seeded normal tensors; step 1: the same plus 5% noise."""
    g = torch.Generator().manual_seed(0)
    s = {f"emb{i}": torch.randn(vocab, d, generator=g) for i in range(3)}
    s.update({f"fc{i}": torch.randn(d, 4 * d, generator=g) for i in range(mid)})
    if step:
        noise = torch.Generator().manual_seed(step)
        for t in s.values():
            t.add_(torch.randn(t.shape, generator=noise), alpha=0.05)
    return s


def child(task: dict) -> dict:
    from mvc.native import parallel
    from mvc.repo import pipeline
    from mvc.repo.repository import Repo

    st = state(task["step"], task["vocab"], task["d"], task["mid"])
    if task["kind"] == "first":
        repo = Repo.init(task["repo"])
        repo.config.set("commit.mode", "fixed")
        repo.config.set("commit.quant", CONFIG)
        repo.commit(st, message="first")
        return {}
    import mvc.repo.reader  # noqa: F401  (module imports are not the work measured)
    if task["kind"] == "commit_pool":
        parallel.LARGE_FLOOR = 1 << 62
    setup_peak = 0 if reset_peak() else peak()
    base = rss()
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    if task["kind"] == "save":
        with open(os.path.join(task["dir"], "save.pt"), "wb") as f:
            torch.save(st, f)
            f.flush()
            os.fsync(f.fileno())
    else:
        repo = Repo(task["repo"])
        timing: dict[str, float] = {}
        write = pipeline.write

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return write(*a, **k)
            finally:
                timing["write"] = timing.get("write", 0.0) + time.perf_counter() - t
        pipeline.write = timed
        phase = WritePhase(base)
        with phase:
            cid = repo.commit(st, message="next")
        snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
        out.update(write_seconds=timing.get("write"), write_extra_rss=phase.peak,
                   deltas=sum(1 for r in snap.tensors if r.depth > 0), tensors=len(snap.tensors),
                   stored=sum(r.stored_bytes for r in snap.tensors))
    out.update(seconds=time.perf_counter() - t0, peak_extra_rss=max(0, peak() - max(base, setup_peak)))
    return out


def run_child(task: dict, threads: int) -> dict:
    return bench_scale.run_child(task, script=__file__, env=dict(os.environ, MVC_THREADS=str(threads)),
                                 label=f"{threads} threads, ")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="2,16", help="MVC_THREADS values, comma-separated")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--mid", type=int, default=48, help="how many d x 4d tensors")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each commit kind (best kept)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return {}
    shape = {"vocab": args.vocab, "d": args.d, "mid": args.mid}
    nbytes = 4 * (3 * args.vocab * args.d + args.mid * 4 * args.d * args.d)
    rep: dict[str, Any] = {"state_bytes": nbytes, "shape": shape, "cpus": len(os.sched_getaffinity(0)),
                           "torch": torch.__version__, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="mvc-bench-write-") as work:
        first = os.path.join(work, "first")
        run_child({"kind": "first", "repo": first, "step": 0, **shape}, 1)
        for threads in [int(t) for t in args.threads.split(",")]:
            r: dict[str, Any] = {}
            r["torch.save"] = run_child({"kind": "save", "dir": work, "step": 1, **shape}, threads)
            os.remove(os.path.join(work, "save.pt"))   # its page cache would slow the next child
            # A-B-B-A, each kind's faster run kept: the order costs a child more than noise here
            order = ["commit", "commit_pool"] * args.repeat
            order = [k for i in range(args.repeat) for k in (order[:2] if i % 2 == 0 else order[1::-1])]
            runs: dict[str, list[dict]] = {"commit": [], "commit_pool": []}
            for kind in order:
                repo = os.path.join(work, kind)
                shutil.copytree(first, repo)
                runs[kind].append(run_child({"kind": kind, "repo": repo, "step": 1, **shape}, threads))
                shutil.rmtree(repo)
            for kind, got in runs.items():
                r[kind] = min(got, key=lambda c: c["seconds"])
                r[kind]["all_runs"] = got
            rep["runs"][str(threads)] = r
    print(table(rep))
    if args.json:
        print(json.dumps(rep, indent=2))
    return rep


def table(rep: dict) -> str:
    n = rep["state_bytes"]
    lines = [f"bench_write: {n / 1e9:.2f} GB float32 state {rep['shape']}, {rep['cpus']} CPUs, "
             f"torch {rep['torch']}", "",
             "| MVC_THREADS | step | time | vs torch.save | write phase | peak extra RSS | write phase RSS |",
             "|---|---|---|---|---|---|---|"]
    for threads, r in rep["runs"].items():
        save = r["torch.save"]["seconds"]
        lines.append(f"| {threads} | torch.save (fsync) | {save:.2f} s | 1x |  | "
                     f"{r['torch.save']['peak_extra_rss'] / n:.2f}x |  |")
        for kind, label in (("commit", "commit"), ("commit_pool", "commit, one per thread")):
            c = r[kind]
            lines.append(f"| {threads} | {label} ({c['deltas']}/{c['tensors']} deltas) | "
                         f"{c['seconds']:.2f} s | {c['seconds'] / save:.2f}x | {c['write_seconds']:.2f} s | "
                         f"{c['peak_extra_rss'] / n:.2f}x | {(c['write_extra_rss'] or 0) / n:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
