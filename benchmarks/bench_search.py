"""Config search and Tracker benchmark on a real training run (digits MLP, Adam).

Trains an MLP on scikit-learn's bundled digits (no download) with the Tracker
committing every `--every` steps, and reports, all measured in this run:

1. search cost: quality evaluations per commit (first commit vs steady state), how
   many commits needed an exhaustive search (paper: 2-3 per run), the search time
   relative to the training time between commits, and the chosen config over time;
2. background-commit overhead: wall time of the run with background commits
   against the same run without any commits (target <= 1%), and the blocking part
   of a commit against the commit interval (target <= 0.5%).  Runs alternate
   (none, background, none, background, ...) and the minimum of each is compared,
   which filters out other load on the machine;
3. compression of the whole history (raw bytes / stored bytes).

`--proxy-study` instead reproduces the study behind `mvc.search.quality.PROXY_EPSILON`:
over the whole Table 9 cube, which configs each proxy bound admits and the worst
eval-loss degradation among them.

Torch runs with `--threads` intra-op threads (default 1): the matmuls are tiny, and
the background commit then has the second core, as it would have spare CPU next
to GPU training.

Usage: python benchmarks/bench_search.py [--json] [--steps N] [--every K] [--reps R]
                                          [--hidden H] [--threads T] [--proxy-study]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mvc.integrations import Tracker
from mvc.io import flatten
from mvc.quant import QuantConfig, quantize_state
from mvc.repo.repository import Repo
from mvc.search import default_policy
from mvc.search.quality import _weighted


SEARCH_TIMES: list[float] = []
OPT_PRETRAIN, OPT_RESUME = 1000, 1000


def digits(seed: int = 0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    return x[:1400], y[:1400], x[1400:], y[1400:]


def mlp(hidden: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def eval_loss(data):
    _, _, xte, yte = data

    def quality(model: torch.nn.Module) -> float:
        return float(F.cross_entropy(model(xte), yte).detach())
    return quality


def train(data, hidden: int, steps: int, *, tracker_kw: dict | None, every: int,
          background: bool, batch: int, seed: int = 0) -> dict:
    """One training run; with tracker_kw, a Tracker commits every `every` steps."""
    xtr, ytr, _, _ = data
    model = mlp(hidden, seed)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, len(ytr), (batch,), generator=g) for _ in range(steps)]
    tmp = tempfile.TemporaryDirectory()
    repo = tracker = None
    SEARCH_TIMES.clear()
    if tracker_kw is not None:
        repo = Repo.init(Path(tmp.name) / "r")
        repo.config.set("commit.mode", "search")
        tracker = Tracker(repo, model, opt, every=every, **tracker_kw)
    t0 = last = time.perf_counter()
    intervals = []
    for n, i in enumerate(batches, 1):
        loss = F.cross_entropy(model(xtr[i]), ytr[i])
        opt.zero_grad()
        loss.backward()
        if tracker is not None:
            tracker.after_backward()
        opt.step()
        if tracker is not None and tracker.should_commit():
            tracker.commit(f"step {tracker.steps}", background=background)
        if n % every == 0:
            now = time.perf_counter()
            intervals.append(now - last)
            last = now
    train_wall = time.perf_counter() - t0
    out = {"wall_s": train_wall, "intervals_s": intervals, "final_eval_loss": eval_loss(data)(model)}
    if tracker is not None:
        tracker.close()
        out["wall_incl_drain_s"] = time.perf_counter() - t0
        out["history"] = tracker.history
        out["search_s"] = list(SEARCH_TIMES)
        st = repo.stats()
        out["raw_bytes"], out["stored_bytes"] = st.raw_bytes, st.stored_bytes
        repo.close()
    tmp.cleanup()
    return out


def timed_search(times: list[float]) -> None:
    """Append the duration of every find_config call to `times` (Repo.commit runs the
    search inside; the benchmark wraps the function it imports at call time)."""
    import mvc.search as search_mod

    inner = search_mod.find_config

    def find_config(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            times.append(time.perf_counter() - t0)
    search_mod.find_config = find_config


def summarize(history: list[dict], interval_s: float, search: list[float]) -> dict:
    evals = [h["evaluations"] for h in history]
    modes = [h["mode"] for h in history]
    steady = [h for h in history[1:] if h["mode"] == "neighbourhood"]
    return {
        "commits": len(history),
        "evaluations_first": evals[0],
        "evaluations_steady_median": (statistics.median([h["evaluations"] for h in steady])
                                      if steady else None),
        "evaluations_steady_max": max((h["evaluations"] for h in steady), default=None),
        "evaluations_total": sum(evals),
        "exhaustive_searches": sum(m != "neighbourhood" for m in modes),
        "modes": modes,
        "search_s_first": search[0] if search else None,
        "search_s_steady_median": statistics.median(search[1:]) if len(search) > 1 else None,
        "search_over_interval_first": search[0] / interval_s if search else None,
        "search_over_interval_steady": (statistics.median(search[1:]) / interval_s
                                        if len(search) > 1 else None),
        "job_s_median": statistics.median(h["job_s"] for h in history),
        "blocking_s_median": statistics.median(h["blocking_s"] for h in history),
        "blocking_s_max": max(h["blocking_s"] for h in history),
        "configs": [h["config"] for h in history],
        "degradations": [h["degradation"] for h in history],
    }


def bench(args) -> dict:
    data = digits()
    quality = eval_loss(data)
    kw = {"quality": quality, "epsilon": args.epsilon, "grad_window": args.grad_window}
    # Clean search timings and evaluation counts: foreground commits, a shorter run.
    fore = train(data, args.hidden, args.fg_every * 22, tracker_kw=kw, every=args.fg_every,
                 background=False, batch=args.batch)
    plain, back = [], []
    for _ in range(args.reps):
        plain.append(train(data, args.hidden, args.steps, tracker_kw=None, every=args.every,
                           background=False, batch=args.batch))
        back.append(train(data, args.hidden, args.steps, tracker_kw=kw, every=args.every,
                          background=True, batch=args.batch))
    t_plain = min(r["wall_s"] for r in plain)
    t_back = min(r["wall_s"] for r in back)
    t_back_drained = min(r["wall_incl_drain_s"] for r in back)
    interval = t_plain * args.every / args.steps
    fg_interval = t_plain * args.fg_every / args.steps
    ratios = [b / p for pr, br in zip(plain, back)
              for p, b in zip(pr["intervals_s"], br["intervals_s"])]
    best_back = min(back, key=lambda r: r["wall_s"])
    blocking = [h["blocking_s"] for h in best_back["history"]]
    params = sum(p.numel() for p in mlp(args.hidden).parameters())
    return {
        "setup": {"model": f"MLP 64-{args.hidden}-{args.hidden}-10", "params": params,
                  "batch": args.batch, "steps": args.steps, "every": args.every,
                  "reps": args.reps, "epsilon": args.epsilon, "grad_window": args.grad_window,
                  "threads": torch.get_num_threads(), "interval_s": interval,
                  "step_ms": 1000 * t_plain / args.steps, "foreground_every": args.fg_every,
                  "foreground_interval_s": fg_interval},
        "search_foreground": summarize(fore["history"], fg_interval, fore["search_s"]),
        "search_background": summarize(best_back["history"], interval, best_back["search_s"]),
        "overhead": {
            "wall_no_commits_s": t_plain, "wall_background_s": t_back,
            "wall_background_incl_drain_s": t_back_drained,
            "background_overhead": t_back / t_plain - 1.0,
            "background_overhead_incl_drain": t_back_drained / t_plain - 1.0,
            "interval_ratio_median": statistics.median(ratios) - 1.0,
            "interval_ratio_mean": statistics.fmean(ratios) - 1.0,
            "job_over_interval_median":
                statistics.median(h["job_s"] for h in best_back["history"]) / interval,
            "blocking_over_interval_median": statistics.median(blocking) / interval,
            "blocking_over_interval_max": max(blocking) / interval,
            "all_wall_no_commits_s": [r["wall_s"] for r in plain],
            "all_wall_background_s": [r["wall_s"] for r in back],
        },
        "compression": {"raw_bytes": best_back["raw_bytes"], "stored_bytes": best_back["stored_bytes"],
                        "ratio": best_back["raw_bytes"] / max(best_back["stored_bytes"], 1)},
        "final_eval_loss": {"no_commits": plain[0]["final_eval_loss"],
                            "background": back[0]["final_eval_loss"]},
        "optimizer_state": optimizer_study(data, args),
    }


# ------------------------------------------------------------------ optimizer state
def optimizer_study(data, args) -> dict:
    """Adam state exact vs compressed (mvc.quant.optimizer): stored size of the moments
    (lossless codec vs quantized base codec) and the losses after resuming from each
    (both resumes start from the same searched, quantized weights)."""
    from mvc.codecs.lossless import LosslessCodec
    from mvc.codecs.quantized import encode_base, encoded_size
    from mvc.quant.optimizer import parse_state_name, quantize_optimizer_state, restore
    from mvc.search import find_config

    xtr, ytr, _, _ = data
    quality = eval_loss(data)

    def steps(model, opt, n, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(n):
            i = torch.randint(0, len(ytr), (args.batch,), generator=g)
            loss = F.cross_entropy(model(xtr[i]), ytr[i])
            opt.zero_grad()
            loss.backward()
            opt.step()

    model = mlp(args.hidden)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    steps(model, opt, OPT_PRETRAIN, 0)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    flat = flatten(state).tensors

    def evaluate(t):
        sd = {k[6:]: v for k, v in t.items() if k.startswith("model/")}
        with torch.no_grad():
            return float(F.cross_entropy(torch.func.functional_call(model, sd, (data[2],)), data[3]))
    res = find_config(flat, evaluate=evaluate, epsilon=args.epsilon)
    out = quantize_optimizer_state(flat, res.qmap)
    lossless = LosslessCodec()
    exact_b = sum(encoded_size(lossless.encode(flat[n])) for n in out)
    comp_b = sum(encoded_size(encode_base(o.q)) for o in out.values())
    raw_b = sum(flat[n].numel() * flat[n].element_size() for n in out)
    resumed = {}
    for label in ("exact", "compressed"):
        m2 = mlp(args.hidden, seed=9)
        o2 = torch.optim.Adam(m2.parameters(), 1e-3)
        qm = {k: res.qmap.get("model/" + k) for k in state["model"]}
        m2.load_state_dict({k: (qm[k].dequantize() if qm[k] is not None else v)
                            for k, v in state["model"].items()})
        sd = clone_state(state["optimizer"])
        if label == "compressed":
            for name, o in out.items():
                _, idx, key = parse_state_name(name)
                sd["state"][idx][key] = restore(*o)
        o2.load_state_dict(sd)
        with torch.no_grad():
            at = (quality(m2), float(F.cross_entropy(m2(xtr), ytr)))
        steps(m2, o2, OPT_RESUME, 1)
        with torch.no_grad():
            resumed[label] = {"eval_loss_at_restore": at[0], "eval_loss_after": quality(m2),
                              "train_loss_at_restore": at[1],
                              "train_loss_after": float(F.cross_entropy(m2(xtr), ytr))}
    return {"moments": len(out), "raw_bytes": raw_b, "exact_bytes": exact_b,
            "compressed_bytes": comp_b, "exact_ratio": raw_b / exact_b,
            "compressed_ratio": raw_b / comp_b, "resumed": resumed,
            "resume_steps": OPT_RESUME}


def clone_state(obj):
    from mvc.integrations import clone_to_cpu

    return clone_to_cpu(obj)


# ------------------------------------------------------------------ proxy study
def proxy_study(args) -> dict:
    data = digits()
    runs = [(0, 100, 128), (1, 300, 128), (2, 1000, 256), (3, 3000, 128), (4, 2000, 512), (5, 600, 64)]
    if args.quick:
        runs = runs[:2]
    bounds = (0.03, 0.04, 0.05, 0.06, 0.08, 0.1)
    out: dict = {"runs": [], "bounds": list(bounds)}
    xtr, ytr, xte, yte = data
    for seed, steps, hidden in runs:
        model = mlp(hidden, seed)
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        g = torch.Generator().manual_seed(seed)
        ema: dict = {}
        for _ in range(steps):
            i = torch.randint(0, len(ytr), (64,), generator=g)
            loss = F.cross_entropy(model(xtr[i]), ytr[i])
            opt.zero_grad()
            loss.backward()
            for n, p in model.named_parameters():
                k = "model/" + n
                ema[k] = p.grad.clone() if k not in ema else ema[k].mul(0.1).add(p.grad, alpha=0.9)
            opt.step()
        flat = flatten({"model": model.state_dict()}).tensors

        def ev(t):
            sd = {k[6:]: v for k, v in t.items()}
            with torch.no_grad():
                return float(F.cross_entropy(torch.func.functional_call(model, sd, (xte,)), yte))
        base = ev(flat)
        rows = []
        for b, pr, mt, pt in itertools.product((4, 6, 8, 12, 16, 32), (0, .1, .2, .3, .4, .5),
                                               ("magnitude", "sensitivity"), (0.0005, 0.005, 0.01)):
            if pr == 0 and mt == "sensitivity":
                continue
            q = quantize_state(flat, QuantConfig(bins=b, prune=pr, prune_metric=mt, protect=pt),
                               default_policy(), ema, nonfinite="lossless")
            deg = (ev({k: (q[k].dequantize() if q[k] is not None else v) for k, v in flat.items()})
                   - base) / base
            names = [k for k, v in q.items() if v is not None]
            mag = _weighted(flat, q, names, None)
            grad = _weighted(flat, q, names, ema)
            rows.append({"magnitude": mag, "grad": grad, "max": max(mag, grad), "deg": deg})
        res = {"seed": seed, "steps": steps, "hidden": hidden, "baseline": base}
        for proxy in ("magnitude", "grad", "max"):
            res[proxy] = {str(bd): {"admitted": sum(r[proxy] <= bd for r in rows),
                                    "worst_degradation": max((r["deg"] for r in rows if r[proxy] <= bd),
                                                             default=None)} for bd in bounds}
        out["runs"].append(res)
    return out


def print_bench(r: dict) -> None:
    s, o = r["setup"], r["overhead"]
    print(f"{s['model']} ({s['params']} params), batch {s['batch']}, {s['step_ms']:.2f} ms/step, "
          f"eps {s['epsilon']}, {s['threads']} torch thread(s)")
    for label, every, iv in (("search_foreground", s["foreground_every"], s["foreground_interval_s"]),
                             ("search_background", s["every"], s["interval_s"])):
        x = r[label]
        print(f"\n{label}: {x['commits']} commits, one every {every} steps ({iv * 1000:.0f} ms)")
        print(f"  quality evaluations: first {x['evaluations_first']}, steady median "
              f"{x['evaluations_steady_median']} (max {x['evaluations_steady_max']}), "
              f"total {x['evaluations_total']}")
        print(f"  exhaustive searches: {x['exhaustive_searches']} (paper: 2-3 per run)")
        if x["search_s_first"] is not None:
            print(f"  search: first {x['search_s_first'] * 1000:.0f} ms, steady median "
                  f"{x['search_s_steady_median'] * 1000:.1f} ms = {x['search_over_interval_first']:.3f}"
                  f" / {x['search_over_interval_steady']:.4f} of the training interval")
        print(f"  job (search+encode+write) median {x['job_s_median'] * 1000:.1f} ms; blocking median "
              f"{x['blocking_s_median'] * 1000:.2f} ms (max {x['blocking_s_max'] * 1000:.2f})")
        print("  configs over time:")
        last = None
        for i, (c, m, d) in enumerate(zip(x["configs"], x["modes"], x["degradations"])):
            if c != last or m != "neighbourhood":
                dd = d if d is None else round(d, 4)
                print(f"    commit {i:2d}: {m:20s} {c}  degradation {dd}")
            last = c
    print(f"\nwall, {s['steps']} steps: no commits {o['wall_no_commits_s']:.2f} s, background "
          f"{o['wall_background_s']:.2f} s -> overhead {o['background_overhead'] * 100:+.2f}% "
          f"(target <= 1%); incl. draining the last commit "
          f"{o['background_overhead_incl_drain'] * 100:+.2f}%")
    print(f"per-interval wall ratio (background / none): median "
          f"{o['interval_ratio_median'] * 100:+.2f}%, mean {o['interval_ratio_mean'] * 100:+.2f}%; "
          f"background job = {o['job_over_interval_median'] * 100:.2f}% of an interval")
    print(f"blocking part of a commit / interval: median "
          f"{o['blocking_over_interval_median'] * 100:.3f}%, max "
          f"{o['blocking_over_interval_max'] * 100:.3f}% (target <= 0.5%)")
    c = r["compression"]
    print(f"history: {c['raw_bytes']} raw bytes -> {c['stored_bytes']} stored ({c['ratio']:.1f}x)")
    o = r["optimizer_state"]
    print(f"optimizer moments ({o['moments']} tensors, {o['raw_bytes']} raw bytes): exact "
          f"{o['exact_ratio']:.2f}x, compressed (16 bins, log-domain 2nd moment) "
          f"{o['compressed_ratio']:.1f}x (one base each, no delta)")
    for label, v in o["resumed"].items():
        print(f"  resumed with {label:10s} state: train loss {v['train_loss_at_restore']:.5f} -> "
              f"{v['train_loss_after']:.5f}, eval loss {v['eval_loss_at_restore']:.4f} -> "
              f"{v['eval_loss_after']:.4f} after {o['resume_steps']} steps")


def print_study(r: dict) -> None:
    for run in r["runs"]:
        print(f"seed {run['seed']} steps {run['steps']} hidden {run['hidden']} "
              f"baseline {run['baseline']:.4f}")
        for proxy in ("magnitude", "grad", "max"):
            cells = []
            for b, v in run[proxy].items():
                w = v["worst_degradation"]
                cells.append(f"{b}: {v['admitted']:3d} / {'  -   ' if w is None else format(w, '6.3f')}")
            print(f"  {proxy:9s} " + " | ".join(cells))
    print("(cells: bound: configs admitted / worst relative eval-loss degradation among them)")


def _clean(x):
    """JSON-ready: non-finite floats become None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=40000)
    ap.add_argument("--every", type=int, default=2000)
    ap.add_argument("--fg-every", type=int, default=200, help="commit interval of the foreground run")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epsilon", type=float, default=0.01)
    ap.add_argument("--grad-window", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--proxy-study", action="store_true")
    ap.add_argument("--quick", action="store_true", help="proxy study on two runs only")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    timed_search(SEARCH_TIMES)
    if args.proxy_study:
        r = proxy_study(args)
        print(json.dumps(_clean(r), indent=1, allow_nan=False)) if args.json else print_study(r)
        return 0
    if args.steps // args.every < 20:
        print("note: fewer than 20 commits", file=sys.stderr)
    r = bench(args)
    if args.json:
        print(json.dumps(_clean(r), indent=1, allow_nan=False))
    else:
        print_bench(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
