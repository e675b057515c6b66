"""Error feedback (GPTQ) in commits (issue 29 item 2): what it buys through the gate, what it
costs per commit, and what it does to the next commit's delta.

On bench_transfer's pretrained character transformer (cached as bench_frontier caches it),
with a fidelity gate built from the module (`mvc.quality.from_module`) on the calibration
split's windows:

* gate rows: one commit per (gate, search space) to a fresh repository -- both quantizer
  families, without error feedback and with it searched (`SearchSpace(feedback=(False,
  True))`), and with `--finer` the same with bins 96 / 128 and embedding bins 64 / 128; ratio
  (raw / stored bytes of the whole state), chosen config, held-out top-1 agreement and KL,
  seconds for the commit (search, Hessians, encoding);
* cost rows: a fixed config committed with and without feedback: seconds per commit;
* delta rows: the model fine-tuned a few more steps and committed again with the same fixed
  config: the next commit's stored bytes with and without feedback (the levels of a weight
  re-assigned by GPTQ move more between commits than nearest-level rounding's).

    python benchmarks/bench_feedback.py [--small] [--finer] [--skip-history] [--json]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mvc  # noqa: E402
from mvc.quant import QuantConfig  # noqa: E402
from mvc.quality import from_module  # noqa: E402
from mvc.search import SearchSpace  # noqa: E402


def _model(small: bool) -> tuple[nn.Module, dict[str, Any]]:
    from benchmarks.bench_frontier import char_model
    from benchmarks.bench_transfer import CTX, _data
    from benchmarks.e2e_models import CharLM

    state, _, _, _ = char_model(small)  # pretrained, or read from bench_transfer's cache
    d = _data(0, 128, 256 if small else 512)
    model = CharLM(d["vocab"], d=128, layers=2, ctx=CTX)
    model.load_state_dict(state)
    return model.eval(), d


def _stored(repo: Any, cid: str) -> tuple[int, int]:
    snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
    return (sum(r.raw_bytes for r in snap.tensors), sum(r.stored_bytes for r in snap.tensors))


def gate_row(model: nn.Module, d: dict[str, Any], metric: str, space: SearchSpace,
             label: str) -> dict[str, Any]:
    from benchmarks.bench_transfer import held_out

    xc = d["calib"][0]
    gate = from_module(model, [xc[i:i + 32] for i in range(0, len(xc), 32)], metric=metric)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tmp = tempfile.mkdtemp(prefix="mvc-feedback-")
    try:
        repo = mvc.Repo.init(tmp)
        t0 = time.perf_counter()
        cid = repo.commit(state, label, quality=gate, space=space)
        secs = time.perf_counter() - t0
        raw, stored = _stored(repo, cid)
        c = repo.read_commit(cid)
        restored = repo.read_state(cid)
        q, cfg = dict(c.quality or {}), dict(c.quant or {})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    h = held_out(model, state, restored, d)
    knob = "lossless" if not cfg else (f"{cfg.get('family', 'kmeans')} {cfg['bins']}b/"
                                       f"p{cfg['prune']}" + (" +fb" if cfg.get("feedback") else ""))
    return {"row": label, "metric": metric, "ratio": raw / stored, "config": knob,
            "agree": h["agree"], "kl": h["kl"], "loss_pct": h["loss_pct"], "seconds": secs,
            "evaluations": q.get("evaluations"), "trials": len(q.get("trials") or [])}


def history(model: nn.Module, d: dict[str, Any], config: QuantConfig, steps: int
            ) -> dict[str, Any]:
    """Two commits of one fixed config: the model, then after `steps` more Adam steps."""
    from benchmarks.bench_transfer import CTX

    model = _copy(model)
    xc = d["calib"][0]
    gate = from_module(model, [xc[i:i + 32] for i in range(0, len(xc), 32)])
    tmp = tempfile.mkdtemp(prefix="mvc-feedback-")
    out: dict[str, Any] = {"config": config.to_dict()}
    try:
        repo = mvc.Repo.init(tmp)
        repo.config.set("commit.chain_budget", 0)
        secs, sizes = [], []
        for k in range(2):
            if k:
                opt = torch.optim.Adam(model.parameters(), 1e-4)
                tr, g = d["train"], torch.Generator().manual_seed(7)
                for _ in range(steps):
                    s = torch.randint(len(tr) - CTX - 1, (32,), generator=g)
                    x = torch.stack([tr[i: i + CTX] for i in s])
                    y = torch.stack([tr[i + 1: i + CTX + 1] for i in s])
                    o = model(x)
                    loss = nn.functional.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                model.eval()
            state = {k2: v.detach().clone() for k2, v in model.state_dict().items()}
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cid = repo.commit(state, f"commit {k}", quant=config, quality=gate)
            secs.append(time.perf_counter() - t0)
            sizes.append(_stored(repo, cid)[1])
        out.update(first_bytes=sizes[0], next_bytes=sizes[1], first_s=secs[0], next_s=secs[1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def gate_spaces(finer: bool) -> list[tuple[SearchSpace, str]]:
    """The gate rows' search spaces: both families without and with error feedback; `finer`
    adds the same with bins 96 / 128 and embedding bins 64 / 128 (bench_scalar_gate
    --gate-defaults' finest space: where the default gates first accept on all-MiniLM-L6-v2)."""
    fams = ("kmeans", "uniform")
    out = [(SearchSpace(family=fams), "both families"),
           (SearchSpace(family=fams, feedback=(False, True)), "both families, feedback searched")]
    if finer:
        out.append((SearchSpace(bins=SearchSpace().bins + (96, 128),
                                embedding_bins=SearchSpace().embedding_bins + (64, 128),
                                family=fams, feedback=(False, True)),
                    "both families, feedback searched, bins + 96/128, embedding bins + 64/128"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=20, help="fine-tuning steps between commits")
    ap.add_argument("--skip-gates", action="store_true")
    ap.add_argument("--finer", action="store_true",
                    help="gate rows also with bins 96/128 and embedding bins 64/128")
    ap.add_argument("--skip-history", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, d = _model(a.small)
    rows: list[dict[str, Any]] = []
    if not a.skip_gates:
        for metric in ("kl", "top1"):
            for space, label in gate_spaces(a.finer):
                r = gate_row(model, d, metric, space, f"fidelity {metric} (default), {label}")
                rows.append(r)
                print(f"| {r['row']} | {r['ratio']:.2f}x | {r['config']} | "
                      f"{100 * r['agree']:.2f}% | {r['kl']:.4f} | {r['loss_pct']:+.2f}% | "
                      f"{r['seconds']:.1f} s | {r['evaluations']} |", flush=True)
    hist = []
    for cfg in () if a.skip_history else (QuantConfig(bins=48, protect=0.0005, family="uniform"),
                QuantConfig(bins=32, protect=0.0005)):
        for fb in (False, True):
            h = history(model, d, dataclasses.replace(cfg, feedback=fb), a.steps)
            hist.append(h)
            print(f"| {cfg.family} {cfg.bins} | {'yes' if fb else 'no'} | {h['first_bytes']:,} | "
                  f"{h['next_bytes']:,} | {h['first_s']:.2f} s | {h['next_s']:.2f} s |",
                  flush=True)
    if a.json:
        print(json.dumps({"gates": rows, "history": hist}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
