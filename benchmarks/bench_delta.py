"""Delta-codec benchmark on a real training trajectory (Inshrinkerator §9.3, Fig. 11/12).

Every checkpoint of `benchmarks.trajectory` (an ~1.1M-parameter MLP trained with
Adam on sklearn's digits) is quantized; the first is stored as a base (`qbase/1`),
every later one as a delta against its predecessor with three encoders measured
side by side in this run:

  HE   Huffman of the cyclic delta, original order (QD-compressor style)
  RLE  sign-trick RLE + Huffman of the delta, original order
  PE   RLE + Huffman per parent-level group (Alg. 5/6; `qdelta/1`, ours)

plus BASE (every checkpoint stored as `qbase/1`, no delta) as a reference.
Reported: stored bytes (payload + JSON meta) and the compression ratio against
the fp32 bytes of the quantized tensors, per checkpoint and overall; the "state"
ratio also counts the tensors the quantizer policy keeps lossless, stored raw.
Two runs: a fixed config (16 bins, prune 0.1, protect 0.005) and one where the
bin count changes at every checkpoint.  Every delta is decoded and checked
against the quantizer's levels.  Target: PE >= 1.3x smaller than RLE overall.

    python benchmarks/bench_delta.py [--json] [--runs fixed,fixed-cold,varying] [--no-checkout]
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, like the others

from benchmarks.trajectory import Checkpoint, TrajectoryConfig, checkpoints  # noqa: E402
from mvc.codecs import quantized as qc  # noqa: E402
from mvc.quant import QuantConfig, QuantizedTensor, quantize_state  # noqa: E402

MODES = ("he", "rle", "pe")
ENCODERS = {"he": qc.encode_delta_he, "rle": qc.encode_delta_rle, "pe": qc.encode_delta}
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
                    r = qc.decode_delta(enc.meta, _payload(enc), q.dtype, shape, p.levels)
                    secs[mode]["decode"] += time.perf_counter() - t0
                    _check(q, r, f"{name} ckpt {ck.index} {tname} {mode}")
        prev = {k: v for k, v in quant.items() if v is not None}
        res.checkpoints.append(CheckpointResult(ck.index, ck.step, bins, fp32, lossless,
                                                changed / total if total else 1.0, sizes,
                                                level_sizes))
    res.seconds = secs
    return res


def checkout_times(cks: Sequence[Checkpoint], config: QuantConfig,
                   depths: Iterable[int] = (1, 8, 32), repeats: int = 3,
                   delta_max_ratio: float = 1.0) -> Optional[dict[str, Any]]:
    """Checkout time at delta-chain depth 1, 8, 32 relative to torch.load of the same file.

    The full checkpoints (model, Adam state, scheduler) are committed into a
    fresh repository with `quant=config` and `commit.base_every` disabled, so
    commit d sits at chain depth d (the depth actually recorded is reported).
    Each checkout is timed on a freshly opened `Repo`, twice: for any commit
    (no level cache: the chain is walked from its base) and, right after it
    was committed, as the newest commit (levels from `.mvc/cache/levels`, the
    resume-after-failure case), best of `repeats`, against the best-of-`repeats`
    `torch.load` of that checkpoint's `.pt` file; both read warm page cache.
    Target (issue 5): depth-32 checkout <= 2x torch.load.  Returns None when
    the trajectory is too short for any requested depth.
    """
    import tempfile

    from mvc.repo.repository import Repo

    depths = [d for d in depths if d < len(cks)]
    if not depths:
        return None
    out: dict[str, Any] = {"depth": {}}

    def timed_checkout(root: str, cid: str, use_cache: bool) -> float:
        best = float("inf")
        for _ in range(repeats):
            r = Repo(root)
            if not use_cache:
                r.disk_levels = None
            try:
                t0 = time.perf_counter()
                r.read_state(cid)
                best = min(best, time.perf_counter() - t0)
            finally:
                r.close()
        return best

    with tempfile.TemporaryDirectory(prefix="mvc-bench-checkout-") as tmp:
        repo = Repo.init(tmp)
        repo.config.set("commit.base_every", 0)
        repo.config.set("commit.delta_max_ratio", delta_max_ratio)
        ids, latest = [], {}
        for ck in cks[:max(depths) + 1]:
            ids.append(repo.commit(ck.state, f"epoch {ck.index}", step=ck.step, quant=config))
            d = len(ids) - 1
            if d in depths:
                # Resuming from the newest commit (the failure-recovery case) in a new process:
                # its levels come from .mvc/cache/levels, whatever its chain depth.
                latest[d] = timed_checkout(tmp, ids[d], use_cache=True)
        recorded = {d: repo.read_commit(ids[d]).chain_depth for d in depths}
        out["stored_bytes"] = repo.stats().stored_bytes
        out["delta_max_ratio"] = delta_max_ratio
        repo.close()
        for d in depths:
            cold = timed_checkout(tmp, ids[d], use_cache=False)
            load = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.load(cks[d].path, map_location="cpu", weights_only=True)
                load = min(load, time.perf_counter() - t0)
            walk, fold = _chain_decode_seconds(tmp, ids[d], repeats)
            out["depth"][str(d)] = {"chain_depth": recorded[d], "checkout_s": cold,
                                    "chain_walk_s": walk, "per_step_fold_s": fold,
                                    "torch_load_s": load, "ratio": cold / load,
                                    "latest_checkout_s": latest[d],
                                    "latest_ratio": latest[d] / load}
    return out


def _chain_decode_seconds(root: str, cid: str, repeats: int) -> tuple[float, float]:
    """Levels of every quantized tensor of `cid` from its chain: (walker, per-step fold) seconds.

    The walker (`decode_chain`, native/chain.c) against folding the one-step
    decoder `decode_delta` over the same chain, best of `repeats`, both
    single-threaded and from payloads already read.
    """
    from mvc.codecs.quantized import decode_base, decode_chain, decode_delta
    from mvc.repo.lossy import QBASE, QDELTA, parent_ref
    from mvc.repo.repository import Repo
    from mvc.repo.tensors import parse_dtype, read_payload

    repo = Repo(root)
    try:
        chains = []
        snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
        for rec in snap.tensors:
            if rec.codec != QDELTA:
                continue
            steps, cur = [], rec
            while cur.codec == QDELTA:
                data = read_payload(repo.store, cur)
                steps.append((cur.meta, lambda data=data: data))
                psid, pname = parent_ref(cur)
                cur = next(r for r in repo.read_snapshot(psid).tensors if r.name == pname)
            assert cur.codec == QBASE
            base = decode_base(cur.meta, read_payload(repo.store, cur), parse_dtype(cur.dtype),
                               tuple(cur.shape))
            chains.append((base, steps[::-1], parse_dtype(rec.dtype), tuple(rec.shape)))
    finally:
        repo.close()

    def best(fn) -> float:
        t = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - t0)
        return t

    def walk() -> None:
        for base, steps, dtype, shape in chains:
            decode_chain(base, steps, dtype, shape)

    def fold() -> None:
        for base, steps, dtype, shape in chains:
            q = base
            for meta, load in steps:
                q = decode_delta(meta, load(), dtype, shape, q.levels)

    return best(walk), best(fold)


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


def _print_checkout(checkout: Optional[dict[str, Any]]) -> None:
    if checkout is None:
        print("\ncheckout timing: skipped")
        return
    print(f"\ncheckout (fresh Repo, full checkpoint incl. Adam state, commit.delta_max_ratio = "
          f"{checkout['delta_max_ratio']}) vs torch.load of the same file:")
    print("  'any commit': no level cache, the chain is walked from its base;"
          " 'newest commit': the resume case, levels from .mvc/cache/levels")
    for d, r in checkout["depth"].items():
        print(f"  depth {int(d):3d} (recorded {r['chain_depth']:3d}): any commit {r['ratio']:.2f}x, "
              f"newest commit {r['latest_ratio']:.2f}x torch.load; chain levels alone: walker "
              f"{1e3 * r['chain_walk_s']:.1f} ms vs per-step decode {1e3 * r['per_step_fold_s']:.1f} ms "
              f"({r['per_step_fold_s'] / max(r['chain_walk_s'], 1e-9):.2f}x)")
    deep = checkout["depth"].get("32")
    if deep is not None:
        print(f"  target depth-32 <= 2x torch.load: any commit {'PASS' if deep['ratio'] <= 2 else 'MISS'}, "
              f"newest commit {'PASS' if deep['latest_ratio'] <= 2 else 'MISS'}")


def main(argv: Optional[Sequence[str]] = None) -> int:
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
    # The same chain with commit.delta_max_ratio = 0.5: deltas that save < 50% become bases.
    checkout_strict = None if args.no_checkout else checkout_times(cks, cfg, delta_max_ratio=0.5)

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
            "checkout_delta_max_ratio_0.5": checkout_strict,
        }
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        n_params = sum(t.numel() for t in cks[0].model.values())
        print(f"trajectory: {len(cks)} checkpoints, {n_params:,} parameters, "
              f"final test acc {cks[-1].metrics['acc']:.4f}")
        for r in runs:
            _print_run(r)
        _print_checkout(checkout)
        if checkout_strict is not None:
            _print_checkout(checkout_strict)
        if checkout and checkout_strict:
            print(f"\nstorage of the 33 full checkpoints: delta_max_ratio 1.0 {checkout['stored_bytes']:,} B, "
                  f"0.5 {checkout_strict['stored_bytes']:,} B "
                  f"({checkout_strict['stored_bytes'] / checkout['stored_bytes']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
