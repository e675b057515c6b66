"""End-to-end evaluation: fault-tolerant training and transfer, mvc against its peers.

For each workload (a CNN on digits, a char-level transformer on stdlib docstrings)
and each system (benchmarks/e2e_systems.py), train from the same seed with a
checkpoint every `--every` steps and simulated failures: at each failure step the
process "dies", and training resumes only from what the system restores (model and
optimizer), replaying the lost steps with the same data.  Then one-shot compression
of the pretrained CNN (transfer) at the same epsilon.

    python benchmarks/bench_e2e.py            # writes docs/results.md and docs/results.png
    python benchmarks/bench_e2e.py --json     # also prints the raw figures as JSON
    python benchmarks/bench_e2e.py --quick    # a smoke run (few steps), no docs written
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.e2e_models import Workload, make_workload, n_params  # noqa: E402
from benchmarks.e2e_systems import SYSTEMS, make_system  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def train_run(wl: Workload, key: str, steps: int, every: int, failures: list[int],
              epsilon: float) -> dict:
    """One fault-tolerant training run of system `key`; returns its figures."""
    torch.manual_seed(0)
    model = wl.build()
    opt = torch.optim.Adam(model.parameters(), lr=wl.lr)
    system = make_system(key, epsilon)
    system.attach(model, opt, lambda m: wl.loss(m, "val"))
    pending = sorted(failures)
    step, train_s, saves, restores = 0, 0.0, [], []
    try:
        while step < steps:
            t0 = time.perf_counter()
            x, y = wl.batch(step)
            loss = _loss(model, x, y)
            opt.zero_grad()
            loss.backward()
            system.after_backward()
            opt.step()
            step += 1
            train_s += time.perf_counter() - t0
            if step % every == 0:
                st = system.save(step)
                saves.append({"step": step, **st.__dict__})
            if pending and step == pending[0]:
                pending.pop(0)
                t0 = time.perf_counter()
                step = system.restore()   # the crash loses everything since the last checkpoint
                restores.append(time.perf_counter() - t0)
        final = {"val": wl.loss(model, "val"), "test": wl.loss(model, "test")}
        if wl.name.startswith("cnn"):
            final["acc"] = wl.accuracy(model, "test")
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        system.close()
    rw, sw = sum(s["raw_w"] for s in saves), sum(s["stored_w"] for s in saves)
    rt, stt = sum(s["raw_total"] for s in saves), sum(s["stored_total"] for s in saves)
    return {"system": system.name, "key": key, "final": final, "saves": saves,
            "ratio_w": rw / sw, "ratio_total": rt / stt, "train_s": train_s,
            "save_s": sum(s["seconds"] for s in saves), "restore_s": restores,
            "overhead_pct": 100 * sum(s["seconds"] for s in saves) / train_s,
            "state": state}


def transfer(wl: Workload, pretrained: dict, epsilon: float, ft_steps: int) -> list[dict]:
    """One-shot compression of a pretrained model, then a brief fine-tune on the val split."""
    out = []
    for key in SYSTEMS:
        if key == "mvc-exact-opt":
            continue   # no optimizer state in a one-shot model checkpoint: same as "mvc"
        model = wl.build()
        model.load_state_dict(pretrained)
        system = make_system(key, epsilon)
        system.attach(model, None, lambda m: wl.loss(m, "val"))
        try:
            st = system.save(0)
            # wipe the live weights so that only what the system restores is evaluated
            torch.manual_seed(123)
            model.load_state_dict(type(model)().state_dict() if wl.name.startswith("cnn")
                                  else wl.build().state_dict())
            system.restore()
            fresh = model
        finally:
            system.close()
        row = {"system": system.name, "ratio_w": st.raw_w / st.stored_w, "knob": st.knob,
               "test_loss": wl.loss(fresh, "test"), "acc": wl.accuracy(fresh, "test")}
        xv, yv = wl.splits["val"]
        opt = torch.optim.Adam(fresh.parameters(), lr=wl.lr * 0.3)
        g = torch.Generator().manual_seed(1)
        for _ in range(ft_steps):
            idx = torch.randint(len(xv), (32,), generator=g)
            loss = _loss(fresh, xv[idx], yv[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        row.update(ft_test_loss=wl.loss(fresh, "test"), ft_acc=wl.accuracy(fresh, "test"))
        out.append(row)
    return out


def _fmt_table(runs: list[dict], wl_name: str) -> list[str]:
    ref = next(r for r in runs if r["key"] == "exact")
    lines = [f"### {wl_name}", "",
             "| system | ratio weights | ratio optimizer | ratio full ckpt | final test loss "
             "| degradation vs exact | train overhead | mean restore | knobs chosen (distinct, over the run) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        deg = 100 * (r["final"]["test"] - ref["final"]["test"]) / ref["final"]["test"]
        r["degradation_pct"] = deg
        knobs = [s["knob"] for s in r["saves"] if s["knob"]]
        ks = ", ".join(sorted(set(knobs)))[:60] if knobs else "-"
        acc = f" (acc {100 * r['final']['acc']:.1f}%)" if "acc" in r["final"] else ""
        ro = ((sum(x["raw_total"] - x["raw_w"] for x in r["saves"]))
              / max(1, sum(x["stored_total"] - x["stored_w"] for x in r["saves"])))
        r["ratio_opt"] = ro
        lines.append(f"| {r['system']} | {r['ratio_w']:.1f}x | {ro:.1f}x | {r['ratio_total']:.1f}x | "
                     f"{r['final']['test']:.4f}{acc} | {deg:+.2f}% | {r['overhead_pct']:.0f}% | "
                     f"{1e3 * sum(r['restore_s']) / max(1, len(r['restore_s'])):.0f} ms | {ks} |")
    return lines


NOTES = """## How the peers were built (simplifications)

All peers are re-implemented in `benchmarks/e2e_systems.py` from the papers' descriptions and
get the same per-checkpoint search over their own knobs as mvc (most compressive knob whose
held-out loss degradation is <= epsilon, same quality function). Small tensors (< 1024 values:
biases, norms, step counters) are stored lossless by every system.

* **Uniform (QD-like)**: min-max uniform quantization, one global bit width in {2..8} searched
  per checkpoint (QD-compressor's entropy-based per-layer width is not reproduced); integer
  levels delta-coded cyclically (mod B) against the previous checkpoint and Huffman coded with
  mvc's native Huffman. Optimizer state is stored lossless (zipnn), as QD compresses the model only.
* **Adaptive (CNR-like)**: Check-N-Run's adaptive uniform quantization (greedy clipping-range
  search minimising L2 error per tensor), bit width in {2..8} searched, levels Huffman coded,
  no delta (Inshrinkerator A.2 drops CNR's recommendation-model delta too). Optimizer lossless.
* **ExCP-like**: residual against the last reconstruction, weight pruning by ExCP eq. 5
  (threshold alpha/sqrt(v) * median|W| per element, alpha searched on a geometric grid),
  momentum pruning by eq. 6 (beta = 1, joint with the weight mask) applied to both Adam moments,
  15-centre k-means (centres fitted on a 64k sample) + zero code, LZMA ("7zip"). Restore replays
  the residual chain from the stored bytes.
* **mvc**: `mvc.Tracker` with the same held-out loss as `quality`, `commit.mode=search`,
  `commit.optimizer=compressed` (default) or `exact`; commits are foreground (mvc can commit in the
  background, which would hide most of its overhead; not used here so that all systems compare alike).

Degradation is the final test loss of the run with failures vs the exact run's (same seed,
same data order; the exact run is identical to a run without failures). Overhead is checkpoint
time / training-step time in the same run; restore time is the mean over the failures.
Ratios are raw bytes / stored bytes summed over every checkpoint of the run ("optimizer" = the
full checkpoint minus the model tensors; the Adam moments are 2/3 of the raw checkpoint, so the
full-checkpoint ratio is bounded by how well a system compresses them).

## Why mvc is behind where it is (diagnosed while building this benchmark)

* **Compressed optimizer state inflates the first Adam steps after a restore.** mvc quantizes
  the first moment m with linear k-means (absolute error) and the second moment v in the log
  domain (relative error), independently. Where v is tiny, the absolute error of m is huge
  relative to sqrt(v), so the restored Adam step m/sqrt(v) explodes: on the CNN after 40 steps,
  max |m/sqrt(v)| over conv2/fc1 is about 6 in the live optimizer and about 4000 (conv2) / 370
  (fc1) after `Tracker.restore`, with ~7,700 entries above 10. The next steps throw those weights
  far off, the first commit after the restore finds no feasible configuration and is stored
  lossless (1.2x), and the end-to-end degradation rises. `mvc (exact optimizer)` does not have the
  problem (same runs, all commits quantized). Suggested fix in mvc/quant/optimizer.py: quantize the
  normalized update m/sqrt(v) (bounded by (1-b1)/sqrt((1-b2)(1-b1^2/b2)) ~ 7.3 for Adam) instead of
  m, or at least clamp |m_hat| <= 7.3 sqrt(v_hat) on restore.
* **Optimizer-state ratio.** ExCP-like prunes both Adam moments wherever |m| < mean|m| or the
  weight residual is pruned (most entries), then LZMA-codes 4-bit indices; mvc keeps v unpruned by
  design (see mvc/quant/optimizer.py) and prunes m only where the weight is pruned, so its
  optimizer ratio is lower and the full-checkpoint ratio follows.
* **Small models, short runs.** With 10-15 commits per run, one lossless or base commit weighs
  heavily on the whole-run ratio; and final-loss differences of a few percent on the CNN (359 test
  images) are within run-to-run noise (peers show negative "degradation" of similar size).
"""


def _closing(all_runs: dict, trans: list[dict]) -> list[str]:
    """Where mvc is or is not ahead, computed from the figures above."""
    out = ["## Where mvc is (not) ahead", ""]
    for wl_name, runs in all_runs.items():
        mv = next((r for r in runs if r["key"] == "mvc"), None)
        if mv is None:
            continue
        for field, label in (("ratio_total", "full-checkpoint"), ("ratio_w", "weights-only")):
            better = [r for r in runs if r["key"] not in ("mvc", "mvc-exact-opt")
                      and r[field] >= mv[field]]
            if better:
                out.append(f"* {wl_name}, {label} ratio: mvc {mv[field]:.1f}x is behind " + ", ".join(
                    f"{r['system']} {r[field]:.1f}x (degradation {r['degradation_pct']:+.2f}% vs "
                    f"mvc {mv['degradation_pct']:+.2f}%)" for r in better) + ".")
            else:
                out.append(f"* {wl_name}, {label} ratio: mvc {mv[field]:.1f}x is ahead of every peer.")
        ok = mv["ratio_total"] >= 25 and mv["degradation_pct"] < 1
        out.append(f"* {wl_name}: target full ratio >= 25x at < 1% degradation: "
                   f"{'met' if ok else 'NOT met'} ({mv['ratio_total']:.1f}x, {mv['degradation_pct']:+.2f}%).")
    if trans:
        mv = next(t for t in trans if t["system"].startswith("mvc"))
        ref = trans[0]
        out.append(f"* transfer: mvc {mv['ratio_w']:.1f}x, test acc {100 * mv['acc']:.1f}% vs "
                   f"{100 * ref['acc']:.1f}% uncompressed (target >= 10x, no measurable loss); "
                   f"best peer ratio {max(t['ratio_w'] for t in trans if not t['system'].startswith('mvc')):.1f}x.")
    return out + [""]


def _plot(all_runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_runs), figsize=(6 * len(all_runs), 4.2), squeeze=False)
    for ax, (wl_name, runs) in zip(axes[0], all_runs.items()):
        for r in runs:
            xs = list(range(1, len(r["saves"]) + 1))
            ys = [s["raw_total"] / s["stored_total"] for s in r["saves"]]
            ax.plot(xs, ys, marker="o", ms=3, label=r["system"])
        ax.set_yscale("log")
        ax.set_xlabel("commit # (one per checkpoint interval)")
        ax.set_ylabel("full-checkpoint compression ratio")
        ax.set_title(wl_name)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=0.01)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--cnn-steps", type=int, default=200)
    ap.add_argument("--lm-steps", type=int, default=300)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default="cnn,lm")
    ap.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs"))
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    if a.quick:
        a.cnn_steps, a.lm_steps, a.every = 40, 40, 10
    keys = a.systems.split(",")
    if "exact" not in keys:
        keys.insert(0, "exact")
    t_start = time.perf_counter()
    all_runs: dict = {}
    meta: dict = {}
    pretrained = None
    for wname in a.workloads.split(","):
        wl = make_workload(wname)
        steps = a.cnn_steps if wname == "cnn" else a.lm_steps
        # failures half-way between checkpoints, spread over the run (>= 3)
        n_ck = steps // a.every
        fails = sorted({(k * n_ck // 4) * a.every + a.every // 2 for k in (1, 2, 3)})
        runs = []
        for key in keys:
            t0 = time.perf_counter()
            r = train_run(wl, key, steps, a.every, fails, a.epsilon)
            print(f"[{wl.name}] {r['system']:<24} ratio w {r['ratio_w']:7.1f}x full "
                  f"{r['ratio_total']:7.1f}x  test {r['final']['test']:.4f}  "
                  f"overhead {r['overhead_pct']:5.0f}%  ({time.perf_counter() - t0:.0f}s)", flush=True)
            runs.append(r)
        all_runs[wl.name] = runs
        meta[wl.name] = {"params": n_params(wl.build()), "steps": steps, "every": a.every,
                         "failures": fails}
        if wname == "cnn":
            pretrained = next(r for r in runs if r["key"] == "exact")["state"]
            cnn_wl = wl
    trans = transfer(cnn_wl, pretrained, a.epsilon, 30) if pretrained is not None else []
    elapsed = time.perf_counter() - t_start

    cmd = "python benchmarks/bench_e2e.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# mvc end-to-end results", "",
             f"Command: `{cmd.strip()}` (one run; {elapsed / 60:.1f} min on "
             f"{os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}).",
             f"epsilon = {a.epsilon} (relative held-out loss degradation per commit).", ""]
    lines += ["## Fault-tolerant training", ""]
    for wl_name, runs in all_runs.items():
        m = meta[wl_name]
        lines += [f"{wl_name}: {m['params']:,} parameters, {m['steps']} Adam steps, a checkpoint "
                  f"every {m['every']} steps, failures at steps {m['failures']} (each resumes from "
                  "the restored checkpoint only).", ""]
        lines += _fmt_table(runs, wl_name) + [""]
    if trans:
        lines += ["## Transfer (one-shot compression of the pretrained CNN, then 30 fine-tune "
                  "steps on the held-out split)", "",
                  "| system | ratio weights | knob | test loss | test acc | after fine-tune: loss | acc |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for t in trans:
            lines.append(f"| {t['system']} | {t['ratio_w']:.1f}x | {t['knob']} | {t['test_loss']:.4f} | "
                         f"{100 * t['acc']:.1f}% | {t['ft_test_loss']:.4f} | {100 * t['ft_acc']:.1f}% |")
        lines.append("")
    lines += _closing(all_runs, trans)
    text = "\n".join(lines)
    print(text)
    if a.json:
        print(json.dumps({"runs": {k: [{kk: vv for kk, vv in r.items() if kk != "state"} for r in v]
                                   for k, v in all_runs.items()},
                          "transfer": trans, "meta": meta}, indent=1, default=str))
    if not a.quick:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        _plot(all_runs, out / "results.png")
        (out / "results.md").write_text(text + "\n![per-commit compression ratio](results.png)\n\n"
                                        + NOTES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
