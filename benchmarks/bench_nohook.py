"""What a commit without a quality function costs: the proxy gate's bound, measured.

`mvc commit ckpt.pt` with no `quality.hook` (and `repo.commit(state, msg)` with no
`quality=`) is judged by the proxy: a weighted relative L2 reconstruction error of
the weights within a bound (`mvc.search.quality.PROXY_EPSILON`), plus the tensor cap.
This benchmark trains bench_e2e's two workloads (CNN on digits, char-level
transformer on stdlib docstrings) normally, commits the full checkpoint (model +
Adam state, `commit.optimizer = compressed`) once per proxy bound, restores it and
measures, against the exact checkpoint:

* the test loss of the restored model (relative change), and
* the test loss after resuming training for `--resume` steps from the restored
  model and optimizer, against resuming from the exact checkpoint on the same batches,

with the stored ratio of the full checkpoint.  The proxy's default bound is chosen
from this table (docs/quality.md).

    python benchmarks/bench_nohook.py             # 2 seeds, writes nothing
    python benchmarks/bench_nohook.py --small     # 1 seed, fewer bounds
    python benchmarks/bench_nohook.py --json
"""
from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.e2e_models import Workload, make_workload  # noqa: E402


def _step(model: nn.Module, opt: torch.optim.Optimizer, wl: Workload, step: int) -> None:
    x, y = wl.batch(step)
    out = model(x)
    loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


def _train(wl: Workload, steps: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = wl.build()
    opt = torch.optim.Adam(model.parameters(), lr=wl.lr)
    for s in range(steps):
        _step(model, opt, wl, s)
    return model, opt


def _resume(wl: Workload, state: dict, start: int, steps: int) -> float:
    model = wl.build()
    model.load_state_dict(state["model"])
    opt = torch.optim.Adam(model.parameters(), lr=wl.lr)
    # load_state_dict keeps the given moment tensors and Adam updates them in place: a copy,
    # or the reference state would change under the next row
    opt.load_state_dict(copy.deepcopy(state["optimizer"]))
    for s in range(start, start + steps):
        _step(model, opt, wl, s)
    return wl.loss(model, "test")


def run(wl: Workload, steps: int, resume: int, bounds: list[float | None]) -> list[dict]:
    """One row per bound (None: lossless) for one trained workload."""
    import mvc

    model, opt = _train(wl, steps)
    exact = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
             "optimizer": copy.deepcopy(opt.state_dict())}
    ref_now = wl.loss(model, "test")
    ref_resumed = _resume(wl, exact, steps, resume)
    rows = []
    for bound in bounds:
        tmp = tempfile.mkdtemp(prefix="mvc-nohook-")
        try:
            repo = mvc.Repo.init(tmp)
            repo.config.set("commit.mode", "search")
            t0 = time.perf_counter()
            cid = repo.commit(exact, "step", lossless=bound is None, epsilon=bound)
            secs = time.perf_counter() - t0
            c = repo.read_commit(cid)
            snap = repo.read_snapshot(c.snapshot)
            raw = sum(r.raw_bytes for r in snap.tensors)
            stored = sum(r.stored_bytes for r in snap.tensors) + repo.store.blobs.size(c.snapshot)
            restored = repo.read_state(cid)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        m = wl.build()
        m.load_state_dict(restored["model"])
        now = wl.loss(m, "test")
        resumed = _resume(wl, restored, steps, resume)
        q = c.quality or {}
        knob = f"{c.quant['bins']}b/p{c.quant.get('prune', 0)}" if c.quant else "lossless"
        rows.append({"workload": wl.name, "bound": bound, "ratio": raw / stored, "knob": knob,
                     "proxy": q.get("value"), "max_distortion": q.get("max_distortion"),
                     "now_pct": 100 * (now - ref_now) / ref_now,
                     "resumed_pct": 100 * (resumed - ref_resumed) / ref_resumed,
                     "seconds": secs})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="1 seed, three bounds")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--cnn-steps", type=int, default=200)
    ap.add_argument("--lm-steps", type=int, default=300)
    ap.add_argument("--resume", type=int, default=60, help="steps trained after the restore")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)   # a shared 2-core machine: two threads per process thrash
    seeds = a.seeds or (1 if a.small else 2)
    bounds: list[float | None] = ([None, 0.05, 0.02] if a.small
                                  else [None, 0.05, 0.03, 0.02, 0.01])
    rows = []
    for name, steps in (("cnn", a.cnn_steps), ("lm", a.lm_steps)):
        for seed in range(seeds):
            for r in run(make_workload(name, seed), steps, a.resume, bounds):
                r["seed"] = seed
                rows.append(r)
                print(f"{r['workload']:<14} seed {seed} bound {str(r['bound']):<5} "
                      f"{r['ratio']:6.1f}x {r['knob']:<10} restored {r['now_pct']:+.2f}% "
                      f"resumed {r['resumed_pct']:+.2f}% ({r['seconds']:.0f}s)", flush=True)
    lines = ["| workload | proxy bound | full-checkpoint ratio | configs | test loss, restored "
             "(mean, max over seeds) | after resuming (mean, max) |", "|---|---:|---:|---|---:|---:|"]
    for wname in dict.fromkeys(r["workload"] for r in rows):
        for bound in bounds:
            rs = [r for r in rows if r["workload"] == wname and r["bound"] == bound]
            now = [r["now_pct"] for r in rs]
            res = [r["resumed_pct"] for r in rs]
            lines.append(f"| {wname} | {bound if bound is not None else 'lossless'} | "
                         f"{sum(r['ratio'] for r in rs) / len(rs):.1f}x | "
                         f"{', '.join(sorted({r['knob'] for r in rs}))} | "
                         f"{sum(now) / len(now):+.2f}% ({max(now):+.2f}%) | "
                         f"{sum(res) / len(res):+.2f}% ({max(res):+.2f}%) |")
    print("\n".join(lines))
    if a.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
