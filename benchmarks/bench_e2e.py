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
            "parts": _sum_parts(s["parts"] for s in saves),
            "ratio_w": rw / sw, "ratio_total": rt / stt, "train_s": train_s,
            "save_s": sum(s["seconds"] for s in saves), "restore_s": restores,
            "overhead_pct": 100 * sum(s["seconds"] for s in saves) / train_s,
            "state": state}


def _task(wname: str, seed: int, key: str, steps: int, every: int, failures: list[int],
          epsilon: float) -> dict:
    """One `train_run` in a worker process (workloads hold closures: built where they run)."""
    torch.set_num_threads(2)
    return train_run(make_workload(wname, seed), key, steps, every, failures, epsilon)


def _sum_parts(items) -> dict:
    """{component: [raw, stored]} summed over several such dicts."""
    out: dict = {}
    for parts in items:
        for comp, (raw, stored) in parts.items():
            acc = out.setdefault(comp, [0, 0])
            acc[0] += raw
            acc[1] += stored
    return out


def _merge_seeds(per_seed: list[list[dict]]) -> list[dict]:
    """One row per system over all seeds: bytes summed (ratios over every checkpoint of every
    run), degradation vs the same seed's exact run as a list (mean and spread in the table)."""
    merged = []
    for i, first in enumerate(per_seed[0]):
        runs = [seed_runs[i] for seed_runs in per_seed]
        refs = [next(r for r in seed_runs if r["key"] == "exact") for seed_runs in per_seed]
        saves = [s for r in runs for s in r["saves"]]
        row = dict(first, saves=saves, saves_seed0=first["saves"],
                   restore_s=[t for r in runs for t in r["restore_s"]])
        row["degradations"] = [100 * (r["final"]["test"] - ref["final"]["test"]) / ref["final"]["test"]
                               for r, ref in zip(runs, refs)]
        row["final"] = {k: sum(r["final"][k] for r in runs) / len(runs) for k in first["final"]}
        for fld in ("train_s", "save_s"):
            row[fld] = sum(r[fld] for r in runs)
        row["overhead_pct"] = 100 * row["save_s"] / row["train_s"]
        rw, sw = sum(s["raw_w"] for s in saves), sum(s["stored_w"] for s in saves)
        rt, st = sum(s["raw_total"] for s in saves), sum(s["stored_total"] for s in saves)
        row["ratio_w"], row["ratio_total"] = rw / sw, rt / st
        row["parts"] = _sum_parts(r["parts"] for r in runs)
        merged.append(row)
    return merged


def _fmt_parts(parts: dict) -> str:
    """Stored bytes (and ratio) per checkpoint component, summed over the run."""
    out = []
    for comp, (raw, stored) in parts.items():
        ratio = f" ({raw / stored:.1f}x)" if raw and stored else ""
        out.append(f"{comp} {stored / 1e3:,.0f} kB{ratio}")
    return ", ".join(out)


def transfer(wl: Workload, pretrained: dict, epsilon: float, ft_steps: int) -> list[dict]:
    """One-shot compression of a pretrained model, then a brief fine-tune on the val split."""
    out = []
    for key in SYSTEMS:
        if key in ("mvc-exact-opt", "excp-control"):
            continue   # no optimizer state in a one-shot model checkpoint: same as "mvc" / "exact"
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
        degs = r.get("degradations") or [
            100 * (r["final"]["test"] - ref["final"]["test"]) / ref["final"]["test"]]
        deg = sum(degs) / len(degs)
        r["degradation_pct"] = deg
        spread = f" ({min(degs):+.2f}..{max(degs):+.2f})" if len(degs) > 1 else ""
        knobs = [s["knob"] for s in r["saves"] if s["knob"]]
        ks = ", ".join(sorted(set(knobs)))[:60] if knobs else "-"
        acc = f" (acc {100 * r['final']['acc']:.1f}%)" if "acc" in r["final"] else ""
        ro = ((sum(x["raw_total"] - x["raw_w"] for x in r["saves"]))
              / max(1, sum(x["stored_total"] - x["stored_w"] for x in r["saves"])))
        r["ratio_opt"] = ro
        lines.append(f"| {r['system']} | {r['ratio_w']:.1f}x | {ro:.1f}x | {r['ratio_total']:.1f}x | "
                     f"{r['final']['test']:.4f}{acc} | {deg:+.2f}%{spread} | {r['overhead_pct']:.0f}% | "
                     f"{1e3 * sum(r['restore_s']) / max(1, len(r['restore_s'])):.0f} ms | {ks} |")
    parts = [f"* {r['system']}: " + _fmt_parts(r["parts"]) for r in runs if r.get("parts")]
    if parts:
        lines += ["", "Stored bytes by component over the run (ratio vs raw; \"other\" = commit and "
                  "snapshot objects):", ""] + parts
    return lines


NOTES = """## Quality gates on a pretrained transformer

The CNN transfer above is one-shot compression judged by a loss. `benchmarks/bench_transfer.py`
(table: docs/transfer.md) commits a pretrained character transformer once per gate and measures
held-out top-1 agreement with the original: the scalar loss gate at epsilon 0.01 accepted a
config costing +1.23% held-out loss and 8.8% changed answers, the proxy (no quality function)
one costing +21%; the fidelity gate at its defaults refuses every config of the search space on
that model (stores it losslessly). `benchmarks/bench_nohook.py` measures commits without a
quality function on both models above. Evidence and the defaults chosen from it: docs/quality.md.

## How the peers were built (simplifications)

All peers are re-implemented in `benchmarks/e2e_baselines.py` from the papers' descriptions and
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
* **exact + ExCP moment pruning on restore (control)**: not a compressor: exact checkpoints, but
  each restore zeroes both Adam moments where |m| <= mean|m| (ExCP eq. 6's mask without the
  weight part), to isolate what that pruning alone does to the final loss.
* **mvc**: `mvc.Tracker` with the same held-out loss as `quality`, `commit.mode=search`,
  `commit.optimizer=compressed` (default) or `exact`; commits are foreground (mvc can commit in the
  background, which would hide most of its overhead; not used here so that all systems compare alike).
  Compressed Adam moments (mvc/quant/optimizer.py): the first moment m is pruned where the weight is
  pruned, then 85% of the rest by magnitude, and quantized to 2 levels; the second moment v is
  quantized in the log domain to 4 levels (k-means counting every entry once: the error that
  matters is each entry's own step), warm-started from the parent commit's centroids,
  and stored as a delta against the parent; on restore |m| is clamped to the exact state's largest
  |m| / sqrt(v) times the restored sqrt(v).

Degradation is the final test loss of the run with failures vs the exact run's (same seed,
same data order; the exact run is identical to a run without failures). Overhead is checkpoint
time / training-step time in the same run; restore time is the mean over the failures.
Ratios are raw bytes / stored bytes summed over every checkpoint of the run ("optimizer" = the
full checkpoint minus the model tensors; the Adam moments are 2/3 of the raw checkpoint, so the
full-checkpoint ratio is bounded by how well a system compresses them).

## What limits mvc's ratios here (diagnosed while building this benchmark)

* **Snapshot metadata.** Every commit writes a snapshot object: one record per tensor (name,
  codec, shape, sections, checksum, parent reference, ...; ~120 tensors for the LM with its Adam
  state) and the state's skeleton. Stored as plain JSON it was about 75 kB per LM commit, 37% of
  mvc's bytes; snapshots are now deflated (`mvc-snapshot 2`, docs/format.md), about 10x smaller:
  the "other" component in the per-component line below.
* **ExCP-like's negative degradation on the LM is not preserved state.** Zeroing both Adam moments
  on an entry makes its next steps about lr * 1.6 * sign(g) instead of Adam's usual smaller ones
  (v restarts from 0.001 g^2 while m restarts from 0.1 g), a learning-rate boost after every
  restore that helps this under-trained LM: the control row (exact checkpoints + only that
  pruning) ends below the exact run too. mvc's degradation should be read against "mvc (exact
  optimizer)" (same weights search, exact moments): the difference is what compressing the moments
  costs; the rest comes from the per-commit weight quantization (epsilon per commit, compounded
  over 15 commits and 3 restores: at epsilon = 1% per commit the LM ends about 1.4% worse, at
  0.5% about 0.8%, which is why the default run uses 0.5%).
* **First moment.** m is a fast EMA (beta1 = 0.9), mostly new at every checkpoint, so it does not
  delta against its parent and costs < 1 bit per entry even with 85% pruned and 2 levels; v, a slow
  EMA, costs far less as a delta.
* **Small models, short runs.** With 10-15 commits per run, one lossless or base commit weighs
  heavily on the whole-run ratio; and final-loss differences of about 1% on the LM and a few percent
  on the CNN (359 test images) are within run-to-run noise (peers show negative "degradation" of
  similar size; `--seeds N` repeats every run with other seeds and reports the spread).
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
            saves = r.get("saves_seed0", r["saves"])
            xs = list(range(1, len(saves) + 1))
            ys = [s["raw_total"] / s["stored_total"] for s in saves]
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
    # Per-commit bound; end-to-end degradation compounds over commits and restores (see NOTES).
    ap.add_argument("--epsilon", type=float, default=0.005)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--cnn-steps", type=int, default=200)
    ap.add_argument("--lm-steps", type=int, default=300)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default="cnn,lm")
    ap.add_argument("--seeds", type=int, default=1,
                    help="runs per system with different init / data order / split; the table "
                         "shows ratios over all runs and the mean degradation with its spread")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes for the independent (workload, seed, system) runs; "
                         "overhead figures then include the other workers' load")
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
    plan = {}
    for wname in a.workloads.split(","):
        steps = a.cnn_steps if wname == "cnn" else a.lm_steps
        # failures half-way between checkpoints, spread over the run (>= 3)
        n_ck = steps // a.every
        plan[wname] = (steps, sorted({(k * n_ck // 4) * a.every + a.every // 2 for k in (1, 2, 3)}))
    futures: dict = {}
    pool = None
    if a.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn"))
        futures = {(w, seed, key): pool.submit(_task, w, seed, key, st, a.every, fl, a.epsilon)
                   for w, (st, fl) in plan.items() for seed in range(a.seeds) for key in keys}
    for wname, (steps, fails) in plan.items():
        per_seed = []
        for seed in range(a.seeds):
            wl = make_workload(wname, seed)
            runs = []
            for key in keys:
                t0 = time.perf_counter()
                r = (futures[(wname, seed, key)].result() if pool is not None
                     else train_run(wl, key, steps, a.every, fails, a.epsilon))
                print(f"[{wl.name} seed {seed}] {r['system']:<24} ratio w {r['ratio_w']:7.1f}x full "
                      f"{r['ratio_total']:7.1f}x  test {r['final']['test']:.4f}  "
                      f"overhead {r['overhead_pct']:5.0f}%  ({time.perf_counter() - t0:.0f}s)",
                      flush=True)
                if r["parts"]:
                    print(f"[{wl.name} seed {seed}] {'':<24} " + _fmt_parts(r["parts"]), flush=True)
                runs.append(r)
            per_seed.append(runs)
            if wname == "cnn" and seed == 0:
                pretrained = next(r for r in runs if r["key"] == "exact")["state"]
                cnn_wl = wl
        all_runs[wl.name] = _merge_seeds(per_seed)
        meta[wl.name] = {"params": n_params(wl.build()), "steps": steps, "every": a.every,
                         "failures": fails, "seeds": a.seeds}
    if pool is not None:
        pool.shutdown()
    trans = transfer(cnn_wl, pretrained, a.epsilon, 30) if pretrained is not None else []
    elapsed = time.perf_counter() - t_start

    cmd = "python benchmarks/bench_e2e.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# mvc end-to-end results", "",
             f"Command: `{cmd.strip()}` ({elapsed / 60:.1f} min on "
             f"{os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}).",
             f"epsilon = {a.epsilon} (relative held-out loss degradation per commit).", ""]
    lines += ["## Fault-tolerant training", ""]
    for wl_name, runs in all_runs.items():
        m = meta[wl_name]
        lines += [f"{wl_name}: {m['params']:,} parameters, {m['steps']} Adam steps, a checkpoint "
                  f"every {m['every']} steps, failures at steps {m['failures']} (each resumes from "
                  "the restored checkpoint only)"
                  + (f"; {m['seeds']} seeds (init, data order, split): ratios over all runs, "
                     "degradation = mean (min..max) of each seed vs its exact run"
                     if m["seeds"] > 1 else "") + ".", ""]
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
