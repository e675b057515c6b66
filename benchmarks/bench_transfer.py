"""Transfer benchmark: one-shot commit of a pretrained transformer, gate by gate.

A GPT-style character transformer is pretrained here (nothing is downloaded) on
the docstrings of the Python standard library (`benchmarks.e2e_models`), then
committed once to a fresh mvc repository per row with a calibration set of
<= 128 windows from the validation split.  Each row's restored model is measured
on a disjoint held-out set (windows of the test split) against the original:

* top-1 agreement: the share of held-out positions whose argmax next character
  is the original's;
* KL(original || restored) per position, in nats;
* held-out loss change (relative), and the compression ratio of the model.

Rows: the fidelity gate (KL and top-1 metrics, default thresholds and a sweep),
the scalar loss gate (mean calibration loss, relative degradation <= epsilon) with
its mirror check (issue 29, the default) and without it (before), on all the
calibration windows and on a small set of 8 (where selection noise dominates), the
per-example confidence-bound gate, the proxy (no quality function), and tensor
caps.  The evidence for the defaults of `mvc.search.fidelity` and `mvc.search.gate`
comes from this table (docs/quality.md).

    python benchmarks/bench_transfer.py            # writes docs/transfer.md
    python benchmarks/bench_transfer.py --small    # a smaller model, fewer rows (a few minutes)
    python benchmarks/bench_transfer.py --json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.e2e_models import CharLM, stdlib_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CTX = 64
#: Windows of the "small calibration set" scalar rows (issue 29: 100 pairs fooled the gate).
SMALL_CALIB = 8


def _data(seed: int, n_calib: int, n_held: int) -> dict[str, Any]:
    text = stdlib_corpus()
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lut[c] for c in text], dtype=torch.int64)
    n = len(data)
    tr, va, te = data[: int(n * 0.9)], data[int(n * 0.9): int(n * 0.95)], data[int(n * 0.95):]

    def windows(seq: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.linspace(0, len(seq) - CTX - 2, count).long()
        return (torch.stack([seq[s: s + CTX] for s in starts]),
                torch.stack([seq[s + 1: s + CTX + 1] for s in starts]))

    return {"vocab": len(chars), "train": tr, "calib": windows(va, n_calib),
            "held": windows(te, n_held), "seed": seed}


def pretrain(d: dict[str, Any], width: int, layers: int, steps: int, seed: int) -> nn.Module:
    """The 'pretrained' model: Adam with a cosine schedule on the training split."""
    torch.manual_seed(seed)
    model = CharLM(d["vocab"], d=width, layers=layers, ctx=CTX)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    tr = d["train"]
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(len(tr) - CTX - 1, (32,), generator=g)
        x = torch.stack([tr[s: s + CTX] for s in starts])
        y = torch.stack([tr[s + 1: s + CTX + 1] for s in starts])
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


def _logits_fn(model: nn.Module) -> Callable[[dict, torch.Tensor], torch.Tensor]:
    def logits(state: dict, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return functional_call(model, state, (x,))
    return logits


def _embed_fn(model: nn.Module) -> Callable[[dict, torch.Tensor], torch.Tensor]:
    """A sentence-embedding-style output: the final normed hidden states, mean-pooled."""
    def embed(state: dict, x: torch.Tensor) -> torch.Tensor:
        got: dict[str, torch.Tensor] = {}
        hook = model.norm.register_forward_hook(lambda m, i, o: got.__setitem__("h", o))
        try:
            with torch.no_grad():
                functional_call(model, state, (x,))
        finally:
            hook.remove()
        return got["h"].mean(dim=1)
    return embed


def _gates(model: nn.Module, d: dict[str, Any]) -> dict[str, Callable[[dict], Any]]:
    """The quality functions of the rows, by name (None: the proxy)."""
    from mvc.quality import fidelity, from_module

    logits = _logits_fn(model)
    embed = _embed_fn(model)
    xc, yc = d["calib"]

    def loss(state: dict) -> float:
        out = logits(state, xc)
        return float(nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), yc.reshape(-1)))

    def loss_few(state: dict) -> float:
        """The mean loss of a small calibration set (SMALL_CALIB windows, spread over it)."""
        pick = torch.linspace(0, len(xc) - 1, SMALL_CALIB).long()
        out = logits(state, xc[pick])
        return float(nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                 yc[pick].reshape(-1)))

    def per_example(state: dict) -> torch.Tensor:
        out = logits(state, xc)
        ce = nn.functional.cross_entropy(out.transpose(1, 2), yc, reduction="none")
        return ce.mean(dim=1)

    batches = [xc[i:i + 32] for i in range(0, len(xc), 32)]
    return {"loss": loss, "loss-few": loss_few, "per-example": per_example,
            # the gate built from the module: its layers' input Hessians let a refined search
            # try error feedback (mvc.quality.from_module)
            "fid-kl-mod": lambda t=None: from_module(model, batches, "kl", t),  # type: ignore[misc]
            "fid-top1-mod": lambda t=None: from_module(model, batches, "top1", t),  # type: ignore[misc]
            "fid-kl": lambda t=None: fidelity(logits, xc, "kl", t),           # type: ignore[misc]
            "fid-top1": lambda t=None: fidelity(logits, xc, "top1", t),       # type: ignore[misc]
            "fid-kl-mean": lambda t=None: fidelity(logits, xc, "kl", t, None),  # type: ignore[misc]
            "fid-cos": lambda t=None: fidelity(embed, xc, "cosine", t)}         # type: ignore[misc]


def held_out(model: nn.Module, ref_state: dict, state: dict, d: dict[str, Any]) -> dict[str, float]:
    """Agreement of `state` with `ref_state` on the held-out windows."""
    logits = _logits_fn(model)
    x, y = d["held"]
    a, b = logits(ref_state, x), logits(state, x)
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    kl = float((la.exp() * (la - lb)).sum(-1).mean())
    agree = float((a.argmax(-1) == b.argmax(-1)).double().mean())
    ce_a = float(nn.functional.cross_entropy(a.reshape(-1, a.shape[-1]), y.reshape(-1)))
    ce_b = float(nn.functional.cross_entropy(b.reshape(-1, b.shape[-1]), y.reshape(-1)))
    acc_a = float((a.argmax(-1) == y).double().mean())
    acc_b = float((b.argmax(-1) == y).double().mean())
    embed = _embed_fn(model)
    cos = float((1 - nn.functional.cosine_similarity(embed(ref_state, x), embed(state, x), dim=-1)).mean())
    return {"agree": agree, "kl": kl, "loss_pct": 100 * (ce_b - ce_a) / ce_a,
            "acc": acc_b, "acc_ref": acc_a, "cos": cos}


def commit_row(model: nn.Module, state: dict, d: dict[str, Any], label: str, quality: Any,
               epsilon: float | None, cap: float | None, quant: Any = None,
               mirror: bool = True) -> dict[str, Any]:
    """Commit `state` to a fresh repository with one gate; measure what it restores.
    `mirror`: the scalar gate's mirror check (`quality.mirror`)."""
    import mvc

    tmp = tempfile.mkdtemp(prefix="mvc-transfer-")
    try:
        repo = mvc.Repo.init(tmp)
        if cap is not None:
            repo.config.set("quality.tensor_cap", cap)
        repo.config.set("quality.mirror", mirror)
        t0 = time.perf_counter()
        if quant is not None:   # a fixed config, measured (not chosen) by `quality`
            repo.config.set("quality.tensor_cap", 1e6)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cid = repo.commit(state, label, quality=quality, quant=quant)
        else:
            cid = repo.commit(state, label, quality=quality, epsilon=epsilon)
        secs = time.perf_counter() - t0
        c = repo.read_commit(cid)
        snap = repo.read_snapshot(c.snapshot)
        raw = sum(r.raw_bytes for r in snap.tensors)
        stored = sum(r.stored_bytes for r in snap.tensors)
        restored = repo.read_state(cid)
        q = dict(c.quality or {})
        cfg = dict(c.quant or {})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    knob = _knob(cfg)
    row = {"gate": label, "ratio": raw / stored, "knob": knob, "seconds": secs,
           "gate_kind": q.get("gate"), "calib": q.get("fidelity", q.get("degradation")),
           "ucb": q.get("fidelity_ucb", q.get("ucb")), "max_distortion": q.get("max_distortion"),
           "mirror": q.get("mirror_degradation"), "evaluations": q.get("evaluations"),
           "trials": len(q.get("trials") or [])}
    row.update(held_out(model, state, restored, d))
    return row


def _knob(cfg: dict[str, Any]) -> str:
    """A stored config in short: bins/prune[/embedding bins][/family][+fb]."""
    if not cfg:
        return "lossless"
    out = f"{cfg.get('bins')}b/p{cfg.get('prune')}"
    if cfg.get("embedding_bins"):
        out += f"/e{cfg['embedding_bins']}"
    if cfg.get("family", "kmeans") != "kmeans":
        out += f"/{cfg['family']}"
    return out + ("+fb" if cfg.get("feedback") else "")


Row = tuple[str, str | None, float | None, float | None, bool]


def rows_spec(small: bool) -> list[Row]:
    """(label, gate key, threshold-or-epsilon (None: the default), tensor cap, mirror check)
    of each row."""
    from mvc.quality import DEFAULT_THRESHOLDS as T
    from mvc.search import DEFAULT_EPSILON as E
    from mvc.search import PROXY_EPSILON as P  # lossy without a quality function is opt-in

    few = f"scalar loss, {SMALL_CALIB} windows"
    spec: list[tuple[str, str | None, float | None, float | None]] = [
        (f"fidelity kl (default {T['kl']:g}), from_module", "fid-kl-mod", None, None),
        (f"fidelity top1 (default {T['top1']:g}), from_module", "fid-top1-mod", None, None),
        (f"fidelity kl (default {T['kl']:g})", "fid-kl", None, None),
        (f"fidelity top1 (default {T['top1']:g})", "fid-top1", None, None),
        (f"scalar loss, default eps {E:g} (mirror)", "loss", None, None),
        (f"scalar loss, default eps {E:g}, no mirror (before)", "loss", None, None),
        (f"{few}, default eps {E:g} (mirror)", "loss-few", None, None),
        (f"{few}, default eps {E:g}, no mirror (before)", "loss-few", None, None),
        ("scalar loss, eps 0.01 (mirror)", "loss", 0.01, None),
        ("scalar loss, eps 0.01, no mirror (before)", "loss", 0.01, None),
        ("per-example UCB, eps 0.01", "per-example", 0.01, None),
        (f"fidelity cosine (default {T['cosine']:g})", "fid-cos", None, None),
        (f"proxy (no quality fn, opted in: bound {P:g})", None, P, None),
    ]
    if not small:
        spec += [
            ("fidelity kl 0.01", "fid-kl", 0.01, None),
            ("fidelity kl 0.01, mean only", "fid-kl-mean", 0.01, None),
            ("fidelity kl 0.002", "fid-kl", 0.002, None),
            ("fidelity kl 0.005", "fid-kl", 0.005, None),
            ("fidelity kl 0.02", "fid-kl", 0.02, None),
            ("fidelity cosine 0.001", "fid-cos", 0.001, None),
            ("fidelity cosine 0.003", "fid-cos", 0.003, None),
            ("fidelity cosine 0.03", "fid-cos", 0.03, None),
            ("fidelity top1 0.01", "fid-top1", 0.01, None),
            ("fidelity top1 0.05", "fid-top1", 0.05, None),
            (f"{few}, eps 0.01 (mirror)", "loss-few", 0.01, None),
            (f"{few}, eps 0.01, no mirror (before)", "loss-few", 0.01, None),
            ("scalar loss, eps 0.01, no mirror, cap off", "loss", 0.01, 1e6),
            ("scalar loss, eps 0.01, no mirror, cap 0.3", "loss", 0.01, 0.3),
            ("proxy, cap off", None, P, 1e6),
            ("proxy, cap 0.3", None, P, 0.3),
        ]
    return [(label, key, thr, cap, "no mirror" not in label) for label, key, thr, cap in spec]


CURVE = [(64, 0.0), (64, 0.1), (32, 0.0), (16, 0.0), (12, 0.0), (8, 0.0), (6, 0.0), (32, 0.2), (16, 0.2), (16, 0.4),
         (8, 0.3), (4, 0.0)]


def curve(model: nn.Module, state: dict, d: dict[str, Any], gates: dict, as_json: bool) -> int:
    """Fixed configs measured by the fidelity KL gate: what calibration KL means held out."""
    from mvc.quant import QuantConfig

    rows = []
    print("| config | ratio | calib KL mean | calib KL 95% bound | calib top-1 flips (bound) "
          "| calib cosine distance (bound) | held-out agreement | held-out KL "
          "| held-out cosine distance | held-out loss |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for bins, prune in CURVE:
        r = commit_row(model, state, d, f"{bins}b/p{prune}", gates["fid-kl"](1e6), None, None,
                       quant=QuantConfig(bins=bins, prune=prune))
        t1 = commit_row(model, state, d, f"{bins}b/p{prune}", gates["fid-top1"](1.0), None, None,
                        quant=QuantConfig(bins=bins, prune=prune))
        cs = commit_row(model, state, d, f"{bins}b/p{prune}", gates["fid-cos"](2.0), None, None,
                        quant=QuantConfig(bins=bins, prune=prune))
        r["calib_top1"], r["calib_top1_ucb"] = t1["calib"], t1["ucb"]
        r["calib_cos"], r["calib_cos_ucb"] = cs["calib"], cs["ucb"]
        rows.append(r)
        print(f"| {bins} bins, prune {prune} | {r['ratio']:.1f}x | {r['calib']:.4f} | "
              f"{r['ucb']:.4f} | {r['calib_top1']:.4f} ({r['calib_top1_ucb']:.4f}) | "
              f"{r['calib_cos']:.5f} ({r['calib_cos_ucb']:.5f}) | "
              f"{100 * r['agree']:.2f}% | {r['kl']:.4f} | {r['cos']:.5f} | {r['loss_pct']:+.2f}% |",
              flush=True)
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true",
                    help="a smaller model trained shorter and the five default rows only")
    ap.add_argument("--steps", type=int, default=None, help="pretraining steps")
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--calib", type=int, default=128, help="calibration windows (<= 128)")
    ap.add_argument("--held", type=int, default=512, help="held-out windows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "mvc-bench-transfer"),
                    help="where the pretrained model is kept between runs (same settings)")
    ap.add_argument("--curve", action="store_true",
                    help="only the fixed-config curve: calibration KL (mean, 95%% bound) vs "
                         "held-out agreement and ratio, per config")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="write the table here (default: docs/transfer.md "
                    "unless --small)")
    a = ap.parse_args(argv)
    if a.calib > 128:
        ap.error("--calib must be <= 128")
    # one thread: on a shared 2-core machine two threads per process thrash (measured 3 s vs
    # 0.4 s per training step under load)
    torch.set_num_threads(1)
    width = a.width or 128
    layers = a.layers or 2
    steps = a.steps or (300 if a.small else 1500)
    t_start = time.perf_counter()
    d = _data(a.seed, a.calib, a.held)
    t0 = time.perf_counter()
    cache = Path(a.cache) / f"transfer-d{width}-l{layers}-s{steps}-seed{a.seed}.pt"
    if cache.exists():
        model = CharLM(d["vocab"], d=width, layers=layers, ctx=CTX)
        model.load_state_dict(torch.load(cache, weights_only=True))
        model.eval()
    else:
        model = pretrain(d, width, layers, steps, a.seed)
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), cache)
    pre_s = time.perf_counter() - t0
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_params = sum(p.numel() for p in model.parameters())
    ref = held_out(model, state, state, d)
    print(f"pretrained {n_params:,} params, {steps} steps in {pre_s:.0f}s: held-out acc "
          f"{100 * ref['acc_ref']:.1f}%", flush=True)
    gates = _gates(model, d)
    if a.curve:
        return curve(model, state, d, gates, a.json)
    rows = []
    for label, key, thr, cap, mirror in rows_spec(a.small):
        if key is None:
            quality, eps = None, thr
        elif key.startswith("fid-"):
            quality, eps = gates[key](thr), None
        else:
            quality, eps = gates[key], thr
        r = commit_row(model, state, d, label, quality, eps, cap, mirror=mirror)
        r["cap"] = cap
        rows.append(r)
        print(f"{label:<28} {r['ratio']:6.1f}x {r['knob']:<10} agree {100 * r['agree']:6.2f}% "
              f"kl {r['kl']:.4f} loss {r['loss_pct']:+.2f}% ({r['seconds']:.0f}s, "
              f"{r['trials']} trials, {r['evaluations']} evaluations)", flush=True)
    elapsed = time.perf_counter() - t_start
    cmd = "python benchmarks/bench_transfer.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Transfer: one-shot commit of a pretrained transformer, gate by gate", "",
        f"Command: `{cmd.strip()}` ({elapsed / 60:.1f} min on {os.cpu_count()} CPU cores, torch "
        f"{torch.__version__}, Python {platform.python_version()}).", "",
        f"Model: GPT-style character transformer (`CharLM`, d={width}, {layers} layers, context "
        f"{CTX}), {n_params:,} parameters, pretrained {steps} AdamW steps on stdlib docstrings; "
        f"held-out next-character accuracy {100 * ref['acc_ref']:.1f}%.  Calibration: "
        f"{a.calib} windows of {CTX} characters from the validation split; held-out: {a.held} "
        "windows of the test split (disjoint).  One fresh repository per row, default search "
        "space, default tensor cap unless stated.  Scalar loss rows: the mean next-character "
        f"loss of all calibration windows, or of {SMALL_CALIB} of them; 'mirror' is the scalar "
        "gate's mirror check (the default since issue 29: calib value 'd (mirror m)'), 'no "
        "mirror' the gate before it.", "",
        "| gate | ratio | config | calib value (gate's unit) | held-out top-1 agreement "
        "| held-out KL (nats) | held-out cosine distance | held-out loss | held-out acc "
        "| worst tensor distortion |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cal = "-" if r["calib"] is None else f"{r['calib']:.4g}"
        if r["ucb"] is not None:
            cal += f" (UCB {r['ucb']:.4g})"
        if r["mirror"] is not None:
            cal += f" (mirror {r['mirror']:.4g})"
        md = "-" if r["max_distortion"] is None else f"{r['max_distortion']:.3f}"
        lines.append(f"| {r['gate']} | {r['ratio']:.1f}x | {r['knob']} | {cal} | "
                     f"{100 * r['agree']:.2f}% | {r['kl']:.4f} | {r['cos']:.5f} | {r['loss_pct']:+.2f}% | "
                     f"{100 * r['acc']:.1f}% | {md} |")
    lines.append("")
    fid = [r for r in rows if r["gate"].startswith("fidelity") and "(default" in r["gate"]]
    best = max(fid, key=lambda r: (r["agree"] >= 0.98 and r["ratio"] >= 5, r["ratio"]))
    ok = best["agree"] >= 0.98 and best["ratio"] >= 5
    lines.append(f"Target (fidelity gate at default settings: held-out top-1 agreement >= 98% at "
                 f">= 5x, issue 29): {'met' if ok else 'NOT met'} (best: {best['gate']}, "
                 f"{100 * best['agree']:.2f}% at {best['ratio']:.1f}x; "
                 + ", ".join(f"{r['gate'].split(' (')[0]}{' from_module' if 'from_module' in r['gate'] else ''}"
                             f" {100 * r['agree']:.2f}% at {r['ratio']:.1f}x" for r in fid) + ").")
    scalar = [r for r in rows if r["gate"].startswith("scalar loss") and "default eps" in r["gate"]
              and "no mirror" not in r["gate"]]
    worst = min(r["agree"] for r in scalar)
    lines.append(f"Target (scalar mean-loss quality function at the default epsilon: held-out "
                 f"top-1 agreement >= 95%, issue 29): {'met' if worst >= 0.95 else 'NOT met'} "
                 "(" + ", ".join(f"{100 * r['agree']:.2f}% at {r['ratio']:.1f}x" for r in scalar)
                 + ").")
    text = "\n".join(lines)
    print(text)
    if a.json:
        print(json.dumps({"rows": rows, "params": n_params, "steps": steps,
                          "reference": ref}, indent=1, default=str))
    out = a.out or (None if a.small else str(ROOT / "docs" / "transfer.md"))
    if out:
        Path(out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
