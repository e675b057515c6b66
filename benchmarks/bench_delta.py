"""Delta-codec benchmark on a real training trajectory (Inshrinkerator §9.3, Fig. 11/12).

Every checkpoint of `benchmarks.trajectory` (an ~1.1M-parameter MLP trained with
Adam on sklearn's digits) is quantized; the first is stored as a base (`qbase/1`),
every later one as a delta against its predecessor with three encoders measured
side by side in this run:

  HE   Huffman of the cyclic delta, original order (QD-compressor style)
  RLE  sign-trick RLE + Huffman of the delta, original order
  PE   RLE + Huffman per parent-level group (Alg. 5/6; `qdelta/1`, ours)

(HE and RLE are benchmark code, benchmarks/delta_ablations.py: mvc never writes them)

plus BASE (every checkpoint stored as `qbase/1`, no delta) as a reference.
Reported: stored bytes (payload + JSON meta) and the compression ratio against
the fp32 bytes of the quantized tensors, per checkpoint and overall; the "state"
ratio also counts the tensors the quantizer policy keeps lossless, stored raw.
Three runs: a fixed config (16 bins, prune 0.1, protect 0.005) with k-means
warm-started from the previous checkpoint's centroids (as commits do), the same
without warm start (the paper's setting: centroids move, so whole groups shift
level), and one where the bin count changes at every checkpoint.  Every delta
is decoded and checked against the quantizer's levels.  Target: PE >= 1.3x
smaller than RLE overall.

Then checkout timing (benchmarks/delta_checkout.py): at chain depth 1, 8 and 32
against torch.load, and storage against checkout of every commit per chain policy.

    python benchmarks/bench_delta.py [--json] [--runs fixed,fixed-cold,varying] [--no-checkout]
                                     [--no-policies]
"""
from __future__ import annotations

import argparse
import functools
import io
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, like the others

from benchmarks import delta_ablations
from benchmarks.delta_checkout import (
    checkout_times,
    policy_sweep,
    print_checkout,
    print_policies,
)
from benchmarks.trajectory import Checkpoint, TrajectoryConfig, checkpoints
from mvc.codecs import quantized as qc
from mvc.quant import QuantConfig, QuantizedTensor, quantize_state

MODES = ("he", "rle", "pe")
ENCODERS = {"he": functools.partial(delta_ablations.encode, "he"),
            "rle": functools.partial(delta_ablations.encode, "rle"), "pe": qc.encode_delta}
DECODERS = {"he": functools.partial(delta_ablations.decode, "he"),
            "rle": functools.partial(delta_ablations.decode, "rle"), "pe": qc.decode_delta}
TARGET_PE_OVER_RLE = 1.3
VARYING_BINS = (8, 12, 16, 24, 32, 20)


@dataclass
class CheckpointResult:
    """Bytes each encoder stored for one checkpoint's quantized tensors."""

    index: int
    step: int
    bins: int
    fp32_bytes: int        # quantized tensors, as fp32
    lossless_bytes: int    # tensors the policy keeps lossless, stored raw
    migration: float       # fraction of parameters whose level changed
    sizes: dict[str, int]  # "base", "he", "rle", "pe": everything stored
    level_sizes: dict[str, int]  # the level-stream sections alone (where the encoders differ)


@dataclass
class RunResult:
    name: str
    checkpoints: list[CheckpointResult] = field(default_factory=list)
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)

    def total(self, mode: str) -> int:
        """Stored bytes of the whole sequence: the first checkpoint as a base, then `mode` deltas."""
        first, rest = self.checkpoints[0], self.checkpoints[1:]
        return first.sizes["base"] + sum(c.sizes[mode] for c in rest)

    def summary(self) -> dict[str, Any]:
        fp32 = sum(c.fp32_bytes for c in self.checkpoints)
        lossless = sum(c.lossless_bytes for c in self.checkpoints)
        totals = {m: self.total(m) for m in ("base", *MODES)}
        levels = {m: sum(c.level_sizes[m] for c in self.checkpoints[1:]) for m in MODES}
        return {
            "checkpoints": len(self.checkpoints),
            "fp32_bytes": fp32,
            "lossless_bytes": lossless,
            "total_bytes": totals,
            "ratio": {m: fp32 / b for m, b in totals.items()},
            "state_ratio": {m: (fp32 + lossless) / (b + lossless) for m, b in totals.items()},
            "pe_over_rle": totals["rle"] / totals["pe"],
            "pe_over_he": totals["he"] / totals["pe"],
            "delta_level_bytes": levels,
            "pe_over_rle_levels_only": levels["rle"] / levels["pe"],
            "seconds": self.seconds,
        }


def _levels_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.to(torch.int32), b.to(torch.int32)))


def _check(q: QuantizedTensor, r: QuantizedTensor, what: str) -> None:
    if not (_levels_equal(q.levels, r.levels) and torch.equal(q.centroids, r.centroids)
            and torch.equal(q.protected.view(torch.uint8), r.protected.view(torch.uint8))):
        raise AssertionError(f"{what}: decode(encode(x)) != x")


def _payload(enc) -> bytes:
    return b"".join(bytes(p) for p in enc.parts)


def _torch_load_seconds(state: dict[str, torch.Tensor], repeats: int = 3) -> float:
    """Best-of time for torch.load of `state` (the peer a decode is compared with)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    best = float("inf")
    for _ in range(repeats):
        buf.seek(0)
        t0 = time.perf_counter()
        torch.load(buf, map_location="cpu", weights_only=True)
        best = min(best, time.perf_counter() - t0)
    return best


def run_sequence(name: str, cks: Sequence[Checkpoint], bins_for: Sequence[int],
                 prune: float, protect: float, verify: bool = True,
                 warm: bool = True) -> RunResult:
    """Quantize each checkpoint and encode the sequence as BASE, HE, RLE and PE."""
    res = RunResult(name)
    secs = {m: {"encode": 0.0, "decode": 0.0} for m in ("base", *MODES)}
    secs["torch_load"] = {"model_state": 0.0}
    prev: dict[str, QuantizedTensor] = {}
    for ck, bins in zip(cks, bins_for):
        state = ck.model
        secs["torch_load"]["model_state"] += _torch_load_seconds(state)
        # Warm-started from the previous checkpoint's centroids, as Repo.commit does.
        init = {n: q.centroids for n, q in prev.items()} if warm else None
        quant = quantize_state(state, QuantConfig(bins=bins, prune=prune, protect=protect),
                               init=init)
        sizes = dict.fromkeys(("base", *MODES), 0)
        level_sizes = dict.fromkeys(("base", *MODES), 0)
        fp32 = lossless = changed = total = 0
        for tname, q in quant.items():
            t = state[tname]
            if q is None:
                lossless += t.numel() * t.element_size()
                continue
            fp32 += t.numel() * 4
            shape = tuple(t.shape)
            t0 = time.perf_counter()
            enc = qc.encode_base(q)
            secs["base"]["encode"] += time.perf_counter() - t0
            sizes["base"] += qc.encoded_size(enc)
            level_sizes["base"] += sum(enc.meta["sections"][2:])
            if verify:
                t0 = time.perf_counter()
                r = qc.decode_base(enc.meta, _payload(enc), q.dtype, shape)
                secs["base"]["decode"] += time.perf_counter() - t0
                _check(q, r, f"{name} ckpt {ck.index} {tname} base")
            p = prev.get(tname)
            if p is None:
                continue
            changed += int((p.levels.to(torch.int32) != q.levels.to(torch.int32)).sum())
            total += q.levels.numel()
            for mode in MODES:
                t0 = time.perf_counter()
                enc = ENCODERS[mode](q, p.levels, p.n_levels)
                secs[mode]["encode"] += time.perf_counter() - t0
                sizes[mode] += qc.encoded_size(enc)
                level_sizes[mode] += sum(enc.meta["sections"][2:])
                if verify:
                    t0 = time.perf_counter()
                    r = DECODERS[mode](enc.meta, _payload(enc), q.dtype, shape, p.levels)
                    secs[mode]["decode"] += time.perf_counter() - t0
                    _check(q, r, f"{name} ckpt {ck.index} {tname} {mode}")
        prev = {k: v for k, v in quant.items() if v is not None}
        res.checkpoints.append(CheckpointResult(ck.index, ck.step, bins, fp32, lossless,
                                                changed / total if total else 1.0, sizes,
                                                level_sizes))
    res.seconds = secs
    return res


def _print_run(run: RunResult) -> None:
    s = run.summary()
    print(f"\n== run '{run.name}': {s['checkpoints']} checkpoints, "
          f"{s['fp32_bytes'] / s['checkpoints'] / 1e6:.2f} MB fp32 quantized per checkpoint ==")
    print(f"{'ckpt':>4} {'step':>5} {'bins':>4} {'migr%':>6} | ratio vs fp32: "
          f"{'BASE':>7} {'HE':>7} {'RLE':>7} {'PE':>7} | {'PE/RLE':>6}")
    for c in run.checkpoints:
        r = {m: c.fp32_bytes / max(b, 1) for m, b in c.sizes.items()}
        if c.index == run.checkpoints[0].index:
            cells = f"{r['base']:7.1f} {'(base)':>7} {'':>7} {'':>7} | {'':>6}"
        else:
            cells = (f"{r['base']:7.1f} {r['he']:7.1f} {r['rle']:7.1f} {r['pe']:7.1f} | "
                     f"{c.sizes['rle'] / max(c.sizes['pe'], 1):6.2f}")
        print(f"{c.index:4d} {c.step:5d} {c.bins:4d} {100 * c.migration:6.2f} | {'':14}{cells}")
    print("total stored bytes:  " + "  ".join(f"{m.upper()} {s['total_bytes'][m]:,}"
                                             for m in ("base", *MODES)))
    print("overall ratio vs fp32 (quantized tensors): "
          + "  ".join(f"{m.upper()} {s['ratio'][m]:.1f}x" for m in ("base", *MODES)))
    lv = s["delta_level_bytes"]
    print("delta level streams only: " + "  ".join(f"{m.upper()} {lv[m]:,}" for m in MODES)
          + f"  (PE/RLE {s['pe_over_rle_levels_only']:.2f}x; the rest - base, centroids, "
          "protected values, meta - is the same for all three)")
    print("overall ratio, whole model state (lossless tensors raw): "
          + "  ".join(f"{m.upper()} {s['state_ratio'][m]:.1f}x" for m in ("base", *MODES)))
    n = len(run.checkpoints)
    load = run.seconds["torch_load"]["model_state"] / n
    enc = {m: run.seconds[m]["encode"] / (n if m == "base" else n - 1) for m in ("base", *MODES)}
    dec = {m: run.seconds[m]["decode"] / (n if m == "base" else n - 1) for m in ("base", *MODES)}
    if dec["pe"] > 0:
        print("per checkpoint, relative to torch.load of the model state: decode "
              + "  ".join(f"{m.upper()} {dec[m] / load:.2f}x" for m in ("base", *MODES))
              + " | encode " + "  ".join(f"{m.upper()} {enc[m] / load:.2f}x" for m in ("base", *MODES)))
        print("  (a checkout at chain depth d decodes one base and d deltas, unless levels are cached)")
    ok = s["pe_over_rle"] >= TARGET_PE_OVER_RLE
    print(f"PE vs RLE: {s['pe_over_rle']:.2f}x smaller, PE vs HE: {s['pe_over_he']:.2f}x "
          f"(target PE/RLE >= {TARGET_PE_OVER_RLE}: {'PASS' if ok else 'MISS'})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="HE vs RLE vs PE delta encoding on a real trajectory")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    ap.add_argument("--runs", default="fixed,fixed-cold,varying",
                    help="comma list of: fixed, fixed-cold (no k-means warm start), varying")
    ap.add_argument("--bins", type=int, default=16)
    ap.add_argument("--prune", type=float, default=0.1)
    ap.add_argument("--protect", type=float, default=0.005)
    ap.add_argument("--epochs", type=int, default=TrajectoryConfig.epochs)
    ap.add_argument("--hidden", type=int, default=TrajectoryConfig.hidden)
    ap.add_argument("--no-verify", action="store_true", help="skip decoding every delta")
    ap.add_argument("--no-checkout", action="store_true", help="skip the repository checkout timing")
    ap.add_argument("--no-policies", action="store_true",
                    help="skip the chain-policy sweep (storage vs checkout of every commit)")
    args = ap.parse_args(argv)

    cks = checkpoints(TrajectoryConfig(epochs=args.epochs, hidden=args.hidden))
    runs: list[RunResult] = []
    for name in [r.strip() for r in args.runs.split(",") if r.strip()]:
        warm = name != "fixed-cold"
        if name in ("fixed", "fixed-cold"):
            bins_for = [args.bins] * len(cks)
        elif name == "varying":
            bins_for = [VARYING_BINS[i % len(VARYING_BINS)] for i in range(len(cks))]
        else:
            ap.error(f"unknown run {name!r}")
        runs.append(run_sequence(name, cks, bins_for, args.prune, args.protect,
                                 verify=not args.no_verify, warm=warm))
    cfg = QuantConfig(bins=args.bins, prune=args.prune, protect=args.protect)
    checkout = None if args.no_checkout else checkout_times(cks, cfg)
    policies = [] if args.no_checkout or args.no_policies else policy_sweep(cks, cfg)

    if args.json:
        doc = {
            "trajectory": {"checkpoints": len(cks),
                           "params": sum(t.numel() for t in cks[0].model.values()),
                           "final_test_acc": cks[-1].metrics["acc"]},
            "config": {"bins": args.bins, "prune": args.prune, "protect": args.protect,
                       "varying_bins": list(VARYING_BINS)},
            "runs": {r.name: {**r.summary(),
                              "per_checkpoint": [c.__dict__ for c in r.checkpoints]} for r in runs},
            "checkout": checkout,
            "chain_policies": policies,
        }
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        n_params = sum(t.numel() for t in cks[0].model.values())
        print(f"trajectory: {len(cks)} checkpoints, {n_params:,} parameters, "
              f"final test acc {cks[-1].metrics['acc']:.4f}")
        for r in runs:
            _print_run(r)
        print_checkout(checkout)
        print_policies(policies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
