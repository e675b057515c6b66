"""Commit and checkout at real scale (issue 14): mvc against torch.save / torch.load and ZipNN.

The workload is built here: a GPT-2-small-shaped model (12 layers, d = 768,
vocabulary 50257, 124M parameters) trained a few AdamW steps on real text (the
Python standard library's sources, word-level tokens by frequency rank), and two
consecutive checkpoints (weights + Adam moments), `--gap` steps apart.  Then,
each measurement in its own child process (so its peak RSS is its own):

    torch.save        the checkpoint to a file, fsync included
    torch.load        that file (warm page cache)
    first commit      repo.commit(state, epsilon=0.05) into a new repository (search, proxy)
    next commit       the second checkpoint on top (neighbourhood search, deltas)
    lossless commit   repo.commit(state, lossless=True) into another repository (durable:
                      LMDB with fsync), against ZipNN compressing the same tensors in
                      memory (its ratio and time); and mvc's lossless codec alone in
                      memory, ZipNN's like for like
    checkout HEAD     repo.read_state("HEAD", cache_levels=False): what `mvc checkout`
                      reads (the on-disk level cache the commit left; no decoded levels
                      kept in memory afterwards, since no commit follows in its process)
    ... levels kept   repo.read_state("HEAD"), the API's default: the decoded levels stay
                      in memory for a next commit in the same process (a Tracker resume)
    checkout worst    the deepest commit under the default chain policy, with the
                      on-disk level cache off (the delta chain is walked from its base),
                      as `mvc checkout` reads it
    mvc checkout      `mvc checkout HEAD -o FILE -q` run in-process: the read above, then
                      the file written (fsync included), against torch.load + torch.save

Peak extra RSS: the child's peak RSS during the step minus its RSS once the input
was in memory (for save and commit: the loaded state; for load and checkout: the
bare interpreter with torch imported).  Ratios are against peers timed in the same
run.  Timings on a shared machine are noisy: compare ratios, not seconds.

    python benchmarks/bench_scale.py                  # 124M parameters
    python benchmarks/bench_scale.py --params 30e6    # d scaled down (CI: --params 2e6)
    python benchmarks/bench_scale.py --repeat 3       # medians of 3 alternated rounds
    python benchmarks/bench_scale.py --device cuda --json
    python benchmarks/bench_scale.py --warm           # each step in a process that committed before
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.child_memory import AnonPeak, WritePhase, peak, reset_peak, rss  # noqa: E402
from benchmarks.scale_workload import GPT2_SMALL, shape_for, tensor_bytes, train  # noqa: E402

# --only's names, in the order they run
STEPS = ("save", "load", "first", "next", "lossless", "encode", "zipnn", "checkout", "levels",
         "cli", "worst")


# ------------------------------------------------------------------ children

def _to(state: Any, device: str) -> Any:
    if device == "cpu":
        return state
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: _to(v, device) for k, v in state.items()}
    if isinstance(state, list):
        return [_to(v, device) for v in state]
    return state


def _load(path: str, device: str) -> Any:
    return _to(torch.load(path, map_location="cpu", weights_only=True), device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def child(task: dict) -> dict:
    """One measurement; returns seconds, peak extra RSS and what the step reports."""
    from mvc.repo.repository import Repo
    from mvc.search.quality import PROXY_EPSILON

    kind, device, work = task["kind"], task["device"], task["dir"]
    out: dict[str, Any] = {}
    state = None
    write_phase: WritePhase | None = None
    cleanup = ""
    if kind in ("save", "commit_first", "commit_next", "commit_lossless", "zipnn", "encode"):
        state = _load(task["ckpt"], device)
        _sync(device)
    # mvc imports its tensor side on first use; a module import is not the work measured (the
    # peers' imports happened above too), so warm it as a training process would have.
    import mvc.repo.pipeline  # noqa: F401
    import mvc.repo.reader  # noqa: F401
    if kind == "cli_checkout":
        import mvc.cli.commands_work  # noqa: F401
        import mvc.cli.main  # noqa: F401
        import mvc.io.files  # noqa: F401
    if task.get("warm"):
        out["warm"] = warm_up(device, work)
    # A step's peak is what it adds on top of its input in memory: the high-water mark is
    # reset after setup where the kernel allows, else the setup's own peak is subtracted.
    setup_peak = 0 if reset_peak() else peak()
    base_rss = rss()
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_gpu = torch.cuda.memory_allocated()
    profiler = None
    if os.environ.get("MVC_BENCH_PROFILE") and kind in os.environ.get(
            "MVC_BENCH_PROFILE_KINDS", "commit_first,commit_next").split(","):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    tprof = None
    if task.get("torch_profile"):
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        tprof = profile(activities=acts)
        tprof.__enter__()
    anon = AnonPeak()
    t0 = time.perf_counter()
    if kind == "save":
        with open(os.path.join(work, "save.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        cleanup = os.path.join(work, "save.pt")
    elif kind == "load":
        state = torch.load(task["ckpt"], map_location=device, weights_only=True)
        _sync(device)
    elif kind.startswith("commit"):
        root = os.path.join(work, task["repo"])
        repo = Repo.init(root) if kind != "commit_next" else Repo(root)
        write_phase = WritePhase(base_rss)
        try:
            # The proxy is opted in explicitly (without a quality function or epsilon a commit
            # is lossless): its default bound, as the issue's figures measured.
            lossy = {"epsilon": PROXY_EPSILON} if kind != "commit_lossless" else {"lossless": True}
            with write_phase:
                cid = repo.commit(state, kind, step=task.get("step"), **lossy)
            c = repo.read_commit(cid)
            out.update(commit=cid, chain_depth=c.chain_depth,
                       quant=c.quant, stored=_stored_bytes(repo, c.snapshot),
                       value=(c.quality or {}).get("value"),
                       mode=(c.quality or {}).get("mode"),
                       trials=len((c.quality or {}).get("trials") or []))
        finally:
            repo.close()
    elif kind == "zipnn":
        import zipnn

        z = zipnn.ZipNN(input_format="torch")
        tensors = _leaves(state)
        copies = [t.detach().cpu().clone() for t in tensors]  # compress() mutates its input
        t0 = time.perf_counter()
        out["stored"] = sum(len(z.compress(t)) for t in copies)
    elif kind == "encode":
        # the lossless codec alone, in memory: what ZipNN's compress does (no store, no fsync)
        from mvc.codecs.base import tensor_codec

        codec = tensor_codec("lossless/1")
        out["stored"] = sum(sum(len(p) for p in codec.encode(t).parts) for t in _leaves(state))
    elif kind == "checkout":
        repo = Repo(os.path.join(work, task["repo"]))
        try:
            if not task.get("cache", True):
                repo.disk_levels = None
            rev = task.get("rev", "HEAD")
            state = repo.read_state(rev, map_location=device,
                                    cache_levels=task.get("keep_levels", False))
            _sync(device)
        finally:
            repo.close()
    elif kind == "cli_checkout":
        from mvc.cli.main import main as mvc_main

        os.chdir(os.path.join(work, task["repo"]))
        code = mvc_main(["checkout", task.get("rev", "HEAD"), "-o", os.path.join(work, "out.pt"), "-q"])
        if code:
            raise SystemExit(f"mvc checkout exited {code}")
        cleanup = os.path.join(work, "out.pt")
    else:
        raise SystemExit(f"unknown task {kind}")
    out["seconds"] = time.perf_counter() - t0
    anon.stop()
    out["peak_extra_anon"] = anon.extra
    if cleanup:   # the written file is measured, not kept: at 1.3B it is 16 GB of disk
        os.unlink(cleanup)
    out["peak_extra_rss"] = max(0, peak() - max(setup_peak, base_rss))
    if write_phase is not None and write_phase.seconds:
        out["write_seconds"] = write_phase.seconds
    if write_phase is not None and write_phase.peak is not None:
        # the host side of a commit after its plan: the same for a state on any device
        out["write_extra_rss"] = write_phase.peak
        out["peak_extra_rss"] = max(out["peak_extra_rss"], write_phase.before)
    out["base_rss"] = base_rss
    if on_gpu:
        # what the step allocated on the device beyond its input (the caching allocator's
        # own high-water mark, not nvidia-smi's reserved pool)
        out["peak_extra_gpu"] = max(0, torch.cuda.max_memory_allocated() - base_gpu)
    if tprof is not None:
        _sync(device)
        tprof.__exit__(None, None, None)
        ka = tprof.key_averages()
        sort = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
        text = (ka.table(sort_by=sort, row_limit=40) + "\n\n"
                + ka.table(sort_by="self_cpu_time_total", row_limit=40))
        dest = Path(task["torch_profile"]) / f"torch_profile_{kind}.txt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(45)
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(30)
        dest = Path(os.environ["MVC_BENCH_PROFILE"]) / f"profile_{kind}_{task.get('repo', '')}.txt"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(buf.getvalue())
    return out


def warm_up(device: str, work: str) -> dict:
    """What a training process has done before the step measured after this: a tiny model of
    the workload's kind trained two AdamW steps on `device`, then saved and loaded with torch,
    committed twice with mvc (a first commit with its search, a next one with deltas) and
    checked out onto `device`. The step then leaves out what only a process's first commit
    pays: device kernels loaded on first launch, Triton compiles, the native pool's threads.
    Returns the time of the saves, commits and checkout (the one-time costs, about: a tiny
    state's own work is milliseconds) and the RSS all of it kept."""
    import gc
    import shutil

    from mvc.native.heap import release_free_heap
    from mvc.repo.repository import Repo
    from mvc.search.quality import PROXY_EPSILON

    before = rss()
    t0 = time.perf_counter()
    shape = shape_for(1e5)
    tokens = torch.randint(0, shape["vocab"], (4096,), generator=torch.Generator().manual_seed(0))
    cks = train(shape, [1, 2], device, batch=2, seq=16, data=tokens)
    trained = time.perf_counter()
    where = tempfile.mkdtemp(prefix="warm-", dir=work)
    try:
        path = os.path.join(where, "ck.pt")
        torch.save(cks[0], path)
        torch.load(path, map_location=device, weights_only=True)
        repo = Repo.init(os.path.join(where, "repo"))
        try:
            for i, ck in enumerate(cks):
                repo.commit(ck, f"warm {i}", epsilon=PROXY_EPSILON)
            repo.read_state("HEAD", map_location=device, cache_levels=False)
        finally:
            repo.close()
        _sync(device)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    seconds = time.perf_counter() - trained
    del cks
    gc.collect()
    release_free_heap()
    return {"seconds": seconds, "train_seconds": trained - t0, "kept_rss": rss() - before}


def _leaves(state: Any) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _leaves(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _leaves(v)]
    return []


def _stored_bytes(repo: Any, snapshot_id: str) -> int:
    # The record's own bytes (a delta's, not its chain's): what this commit added.
    return sum(r.stored_bytes for r in repo.read_snapshot(snapshot_id).tensors)


def run_child(task: dict, timeout: float = 3600, *, script: str = __file__,
              env: dict[str, str] | None = None, label: str = "") -> dict:
    """`script --child TASK` in a fresh process (its peak RSS its own); its last stdout line's JSON."""
    proc = subprocess.run([sys.executable, script, "--child", json.dumps(task)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"{task['kind']} failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # progress as each step lands, so a run cut short still says what it measured
    print(f"  {label}{task['kind']}: {json.dumps(out, default=str)}", file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------ the run
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=124e6, help="model size (default GPT-2 small)")
    ap.add_argument("--steps", type=int, default=3, help="AdamW steps before the first checkpoint")
    ap.add_argument("--gap", type=int, default=3, help="steps between the two checkpoints")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    ap.add_argument("--docs", default=None, metavar="MD",
                    help="write the table into this markdown file's bench_scale section "
                         "(e.g. docs/results.md; the section is replaced, the rest kept)")
    ap.add_argument("--layers", type=int, default=None,
                    help="blocks, d scaled to --params (default GPT-2 small's 12; 48 is GPT-2-XL's)")
    ap.add_argument("--only", default=",".join(STEPS), metavar="STEPS",
                    help="the steps to run, comma-separated, from: " + ", ".join(STEPS)
                    + " (save, load, first and next always run; a 1.3B state's every step "
                      "is minutes and 16 GB of disk)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="rounds of torch.save, torch.load, first and next commit (each commit "
                         "pair in a repository of its own), alternated; each step reports the "
                         "round with its median time and lists every round's (this host's "
                         "torch.save with fsync swings 2x between runs)")
    ap.add_argument("--warm", action="store_true",
                    help="before each step, its process trains a tiny model and saves, commits "
                         "and checks it out (`warm_up`): the step then measures a process that "
                         "has committed before, as a training run's later commits are, without "
                         "one-time costs (lazy device kernel loads, Triton compiles), which the "
                         "table reports on their own")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) | {"save", "load", "first", "next"}
    if only - set(STEPS):
        ap.error(f"--only: unknown steps {sorted(only - set(STEPS))}")
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return {}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    shape = GPT2_SMALL if args.params == 124e6 and not args.layers else shape_for(args.params, args.layers)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mvc-bench-scale-", dir=args.dir) as work:
        t0 = time.perf_counter()
        cks = train(shape, [args.steps, args.steps + args.gap], args.device, args.batch, args.seq)
        train_s = time.perf_counter() - t0
        paths = []
        for i, ck in enumerate(cks):
            paths.append(os.path.join(work, f"ck{i}.pt"))
            torch.save(_to(ck, "cpu"), paths[-1])
        nbytes = tensor_bytes(cks[0])
        nparams = sum(t.numel() for t in cks[0]["model"].values())
        del cks
        dev = args.device
        r: dict[str, Any] = {}
        common = {"device": dev, "dir": work, "warm": args.warm}
        rounds: dict[str, list[dict]] = {}
        for i in range(max(1, args.repeat)):
            repo = "repo" if i == 0 else f"repo-{i + 1}"   # the later steps read round 1's
            for step, task in (
                    ("torch.save", {"kind": "save", "ckpt": paths[0]}),
                    ("torch.load", {"kind": "load", "ckpt": paths[0]}),
                    ("first commit", {"kind": "commit_first", "ckpt": paths[0], "repo": repo,
                                      "step": args.steps}),
                    ("next commit", {"kind": "commit_next", "ckpt": paths[1], "repo": repo,
                                     "step": args.steps + args.gap})):
                rounds.setdefault(step, []).append(run_child({**task, **common}))
        r.update({step: median_round(runs) for step, runs in rounds.items()})
        if "lossless" in only:
            r["lossless commit"] = run_child({"kind": "commit_lossless", "ckpt": paths[0],
                                              "repo": "repo-lossless", **common})
        if "encode" in only:
            r["lossless encode"] = run_child({"kind": "encode", "ckpt": paths[0], **common})
        if "zipnn" in only:
            try:
                r["zipnn compress"] = run_child({"kind": "zipnn", "ckpt": paths[0], **common})
            except RuntimeError as exc:  # bench extra not installed
                print(f"zipnn: {exc}", file=sys.stderr)
        if "checkout" in only:
            r["checkout HEAD"] = run_child({"kind": "checkout", "repo": "repo", **common})
        if "levels" in only:
            r["checkout HEAD, levels kept"] = run_child({"kind": "checkout", "repo": "repo",
                                                         "keep_levels": True, **common})
        if "cli" in only:
            r["mvc checkout"] = run_child({"kind": "cli_checkout", "repo": "repo", **common})
        if "worst" in only:
            deepest = max(("first commit", "next commit"), key=lambda k: r[k]["chain_depth"])
            r["checkout worst"] = run_child({"kind": "checkout", "repo": "repo", "cache": False,
                                             "rev": r[deepest]["commit"], **common})
            r["checkout worst"]["of"] = deepest
        if os.environ.get("MVC_BENCH_TORCH_PROFILE"):
            # after the timed steps, on a repository of their own: torch.profiler's view of the
            # commits and the checkout (device kernels, host ops), written under that folder
            prof = {**common, "torch_profile": os.environ["MVC_BENCH_TORCH_PROFILE"]}
            run_child({"kind": "commit_first", "ckpt": paths[0], "repo": "repo-prof",
                       "step": args.steps, **prof})
            run_child({"kind": "commit_next", "ckpt": paths[1], "repo": "repo-prof",
                       "step": args.steps + args.gap, **prof})
            run_child({"kind": "checkout", "repo": "repo-prof", **prof})
    report = {"params": nparams, "shape": shape, "device": dev, "checkpoint_bytes": nbytes,
              "warm": args.warm,
              "train_s": train_s, "steps": [args.steps, args.steps + args.gap],
              "cpus": os.cpu_count(), "torch": torch.__version__, "results": r,
              "ratios": ratios(r, nbytes)}
    print(table(report))
    if args.docs:
        write_section(Path(args.docs), table(report))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    return report


def median_round(runs: list[dict]) -> dict:
    """The round with the median time (the lower middle one of an even count), with every
    round's time under "rounds" when there were several."""
    ranked = sorted(runs, key=lambda m: m["seconds"])
    out = dict(ranked[(len(ranked) - 1) // 2])
    if len(runs) > 1:
        out["rounds"] = [m["seconds"] for m in runs]
    return out


def ratios(r: dict, nbytes: int) -> dict[str, float | None]:
    """Each step's figure against its peer's, for the steps that ran (`--only`)."""
    save, load = r["torch.save"]["seconds"], r["torch.load"]["seconds"]
    z = r.get("zipnn compress")

    def of(step: str, peer: float | None) -> float | None:
        m = r.get(step)
        return m["seconds"] / peer if m and peer else None

    out: dict[str, float | None] = {
        "first commit / torch.save": of("first commit", save),
        "next commit / torch.save": of("next commit", save),
        "lossless commit / zipnn": of("lossless commit", z["seconds"] if z else None),
        "lossless encode / zipnn": of("lossless encode", z["seconds"] if z else None),
        "lossless ratio": (nbytes / r["lossless commit"]["stored"]) if "lossless commit" in r else None,
        "zipnn ratio": (nbytes / z["stored"]) if z else None,
        "checkout HEAD / torch.load": of("checkout HEAD", load),
        "checkout worst / torch.load": of("checkout worst", load),
        "checkout HEAD, levels kept / torch.load": of("checkout HEAD, levels kept", load),
        "mvc checkout / (torch.load + torch.save)": of("mvc checkout", load + save),
        "first commit ratio": nbytes / r["first commit"]["stored"],
        "next commit ratio": nbytes / r["next commit"]["stored"],
    }
    for k in ("first commit", "next commit", "lossless commit", "checkout HEAD", "checkout worst",
              "checkout HEAD, levels kept", "mvc checkout"):
        if k not in r:
            continue
        out[f"{k} peak extra RSS / checkpoint"] = r[k]["peak_extra_rss"] / nbytes
        if "write_seconds" in r[k]:
            out[f"{k} write-phase seconds"] = r[k]["write_seconds"]
        if "write_extra_rss" in r[k]:
            out[f"{k} write-phase extra RSS / checkpoint"] = r[k]["write_extra_rss"] / nbytes
        if "peak_extra_gpu" in r[k]:
            out[f"{k} peak extra GPU memory / checkpoint"] = r[k]["peak_extra_gpu"] / nbytes
    return out


SECTION_START, SECTION_END = "<!-- bench_scale -->", "<!-- /bench_scale -->"


def write_section(path: Path, body: str) -> None:
    """Put `body` between the bench_scale markers of `path` (appended when absent)."""
    text = path.read_text() if path.exists() else ""
    block = f"{SECTION_START}\n## Commit and checkout at real scale (benchmarks/bench_scale.py)\n\n" \
            f"{body}\n{SECTION_END}"
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        text = head + block + rest.split(SECTION_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def table(rep: dict) -> str:
    r, q, nb = rep["results"], rep["ratios"], rep["checkpoint_bytes"]
    gpu = any("peak_extra_gpu" in m for m in r.values() if isinstance(m, dict))
    worst = r.get("checkout worst")
    rows = [("torch.save (incl. fsync)", "torch.save", "1x"),
            ("torch.load", "torch.load", "1x"),
            ("first commit (search, proxy)", "first commit",
             f"{q['first commit / torch.save']:.2f}x torch.save"),
            ("next commit (neighbourhood)", "next commit", f"{q['next commit / torch.save']:.2f}x torch.save"),
            ("lossless commit", "lossless commit",
             f"{q['lossless commit / zipnn']:.2f}x ZipNN" if q["lossless commit / zipnn"] else "-"),
            ("lossless encode only (in memory, no store)", "lossless encode",
             f"{q['lossless encode / zipnn']:.2f}x ZipNN" if q["lossless encode / zipnn"] else "-"),
            ("ZipNN compress (in memory)", "zipnn compress", "1x"),
            ("checkout HEAD (as `mvc checkout` reads)", "checkout HEAD",
             f"{q['checkout HEAD / torch.load'] or 0:.2f}x torch.load"),
            ("checkout HEAD, levels kept for a next commit (API default)", "checkout HEAD, levels kept",
             f"{q['checkout HEAD, levels kept / torch.load'] or 0:.2f}x torch.load"),
            (f"checkout worst ({worst['of']}, depth {r[worst['of']]['chain_depth']}, no level cache)"
             if worst else "", "checkout worst", f"{q['checkout worst / torch.load'] or 0:.2f}x torch.load"),
            ("`mvc checkout HEAD -o FILE` (read + write, fsync)", "mvc checkout",
             f"{q['mvc checkout / (torch.load + torch.save)'] or 0:.2f}x torch.load + torch.save")]
    lines = [f"bench_scale: {rep['params'] / 1e6:.1f}M parameters {rep['shape']}, checkpoint "
             f"{nb / 1e9:.2f} GB (weights + AdamW moments), device {rep['device']}, "
             f"{rep['cpus']} CPUs, torch {rep['torch']}",
             "", "| step | time | vs peer | peak extra RSS (x checkpoint) | ratio |"
             + (" peak extra GPU (x checkpoint) |" if gpu else ""),
             "|---|---|---|---|---|" + ("---|" if gpu else "")]
    for name, step, peer in rows:
        m = r.get(step)
        if m is None:   # not in --only
            continue
        ratio = f"{nb / m['stored']:.2f}x" if m.get("stored") else ""
        extra = (f" {m['peak_extra_gpu'] / 1e9:.2f} GB ({m['peak_extra_gpu'] / nb:.2f}x) |"
                 if gpu and "peak_extra_gpu" in m else (" - |" if gpu else ""))
        lines.append(f"| {name} | {m['seconds']:.2f} s | {peer} | "
                     f"{m['peak_extra_rss'] / 1e9:.2f} GB ({m['peak_extra_rss'] / nb:.2f}x) | {ratio} |"
                     + extra)
    lines.append("")
    rounds = [f"{step} {', '.join(f'{t:.2f}' for t in r[step]['rounds'])} s" for _, step, _ in rows
              if step in r and "rounds" in r[step]]
    if rounds:
        lines.append("each round's time (the table: the median round): " + "; ".join(rounds))
    warm = [f"{step} {r[step]['warm']['seconds']:.2f} s, +{r[step]['warm']['kept_rss'] / 1e6:.0f} MB"
            for _, step, _ in rows if step in r and "warm" in r[step]]
    if warm:
        lines.append("warm processes (--warm: each step ran after a tiny model's training, save, "
                     "load, two commits and a checkout in its process); their one-time costs: "
                     + "; ".join(warm))
    anon = [f"{step} {r[step]['peak_extra_anon'] / nb:.2f}x" for _, step, _ in rows
            if step in r and "peak_extra_anon" in r[step]]
    if anon:
        lines.append("peak extra anonymous RSS (no file pages: libraries, the store's map), x "
                     "checkpoint: " + ", ".join(anon))
    for k in ("first commit", "next commit"):
        if "write_seconds" in r[k]:
            w = r[k]["write_seconds"]
            lines.append(f"{k}: write phase (encode and store, on the host) {w:.2f} s; the "
                         f"rest (the quantization hook, reading the parent, publishing) "
                         f"{r[k]['seconds'] - w:.2f} s")
        if "write_extra_rss" in r[k]:
            lines.append(f"{k}: peak extra RSS of the write phase (the host side of a commit "
                         f"after its plan, on any device) {r[k]['write_extra_rss'] / 1e9:.2f} GB "
                         f"({r[k]['write_extra_rss'] / nb:.2f}x)")
    for k in ("first commit", "next commit"):
        m = r[k]
        lines.append(f"{k}: mode {m['mode']}, {m['trials']} trials, proxy {m['value']}, "
                     f"config {json.dumps(m['quant'], separators=(',', ':'))}")
    if q["lossless ratio"] and math.isfinite(q["lossless ratio"]) and q["zipnn ratio"]:
        lines.append(f"lossless ratio {q['lossless ratio']:.3f} vs ZipNN {q['zipnn ratio']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
