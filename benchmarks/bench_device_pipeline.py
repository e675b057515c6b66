"""The commit hook's device (torch) path: batched passes against one tensor at a time (issue 27).

On a GPT-2-shaped checkpoint (bench_scale's workload, trained a few AdamW steps), each of the
device path's stages is run both ways on the same tensors, and for each the host
synchronisations, the aten ops (on a GPU, about one kernel launch each) and the wall time are
measured:

    sketches     the search's value sketches of every weight (`Prepared`'s first step)
    trial        one search trial: every weight quantized by one config and measured (the
                 error sums, level counts and bits the search reads), per layer type
    moments      every Adam moment compressed, with the guard rail's error sums
    bounds       the restore clamp's |m| / sqrt(v) bound of every first moment
    first hook   the whole commit hook of a first commit (`plan_quantization`: sketches, the
                 config search judged by the proxy, the moments), what `plan` runs before
                 the encoders
    next hook    the same for the next commit: the parent's config and centroids as its start

(`bench_scale --device cuda` times whole commits.)

"one by one" is the per-tensor torch path, which every device tensor took before the batched
passes (and a tensor they leave still takes); "batched" is what a commit of CUDA tensors now
runs; "triton" (`--triton`) is the batched path with each chunk's assignment, level counts and
error sums in one Triton kernel (`mvc.quant.triton_assign`, `MVC_TRITON=1` in a commit).
Synchronisations and launches are counted by tests/helpers/sync_counter.py (what would make the
host wait for a CUDA stream, following the data that would live on the GPU; "waits" are those
that find launches queued since the last one, the rest return at once). The counts are the
point on a machine without a GPU (`--device cpu` runs the device path on host tensors, in a
GPU's chunk size); the times, and each stage's peak extra GPU memory against the state's bytes,
mean something only on a GPU, where each synchronisation stalls the stream. On the host the
counter also estimates the device memory each stage would hold at its peak (what it computed
from device data and kept alive; a lower bound), against the state's bytes.

    python benchmarks/bench_device_pipeline.py                  # 30M parameters, CPU
    python benchmarks/bench_device_pipeline.py --device cuda --params 124e6 --json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from benchmarks.scale_workload import shape_for, train  # noqa: E402

import mvc.quant.batched_moments as batched_moments  # noqa: E402
import mvc.quant.device_chunks as device_chunks  # noqa: E402
import mvc.quant.moment_bound as moment_bound  # noqa: E402
import mvc.quant.optimizer as opt  # noqa: E402
import mvc.quant.triton_assign as triton_assign  # noqa: E402
import mvc.search.prepared as prepared  # noqa: E402
from mvc.quant import QuantConfig  # noqa: E402
from mvc.quant.backend import device_path  # noqa: E402
from mvc.search import Quantization, default_policy, plan_quantization  # noqa: E402
from mvc.state import flatten, unflatten  # noqa: E402
from sync_counter import SyncCounter  # noqa: E402

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], device: str, repeat: int, on_device: list[torch.Tensor]
            ) -> dict[str, Any]:
    """Counts from one counted run (`on_device`: the state's tensors), then the median wall
    time of `repeat` plain runs; `peak_extra_gpu`: the stage's peak GPU memory above what was
    allocated before it on CUDA, the counter's estimate of it on the host."""
    # inline, not on the pool's threads: the counter sees this thread's ops only
    kernels = triton_assign.launches
    with mock.patch.dict(os.environ, {"MVC_THREADS": "1"}), \
            SyncCounter(device=on_device, trace_bytes=1 << 20) as counter:
        fn()
    kernels = triton_assign.launches - kernels
    peak = None if device == "cuda" else counter.peak_bytes
    if device == "cuda":  # the stage's peak GPU memory above what was allocated before it
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    # (the counter counts a Triton kernel's launches among its ops)
    return {"seconds": times[len(times) // 2], "launches": counter.ops,
            "triton_launches": kernels,
            "syncs": counter.syncs, "waits": counter.waits, "sync_kinds": dict(counter.kinds),
            "peak_extra_gpu": peak,
            # the counter's view of the peak (on the host, what `peak_extra_gpu` estimates):
            # the largest device buffers it held, with where each was made
            "held_at_peak": [[n, where] for n, where in counter.at_peak[:8]]}


def stages(state: dict[str, Any], device: str, repeat: int, hooks: bool = True,
           triton: bool = False, one_by_one: bool = True) -> dict[str, dict[str, Any]]:
    whole = flatten({"model": state["model"], "optimizer": state["optimizer"]})
    flat = whole.tensors
    everything = {n: t for n, t in flat.items() if isinstance(t, torch.Tensor)}
    tensors = {n: t for n, t in everything.items() if n.startswith("model/")}
    config = QuantConfig(bins=16, prune=0.1, protect=0.001)
    prep = prepared.Prepared(tensors, {}, default_policy(), 0.01)
    out: dict[str, dict[str, Any]] = {}
    off = mock.patch.object(prepared, "batchable", lambda t: False)
    out_of = {"sketches": {}, "trial": {}, "moments": {}, "bounds": {}, "first hook": {},
              "next hook": {}}
    moment_off = mock.patch.object(opt, "batchable", lambda t: False)

    def sketches() -> Any:
        return prepared._sketches({n: tensors[n] for n in prep.names}, {}, 0.01)

    def keys() -> dict[str, list]:
        out_k: dict[str, list] = {}
        for lt, names in prep.groups.items():
            thr = prep.thresholds(config, lt)
            bins = config.for_layer_type(lt).bins
            out_k[lt] = [(n, bins, prep.tensor_thresholds(n, thr)) for n in names]
        return out_k

    def trial(batched: bool) -> Callable[[], Any]:
        def run() -> Any:
            pieces: dict = {}
            every = [key for group in keys().values() for key in group]
            if batched:  # every layer type's at once, as `quantize_config` asks a trial's
                pieces.update(prep.quantize_group(every, seed=0, sigma=0.2, init={}, weigh=True))
            else:
                for key in every:
                    pieces[key] = prep.quantize(key[0], key[1], key[2], seed=0, sigma=0.2,
                                                init=None, weigh=True)
            qmap = {n: q for got in pieces.values() for n, q in got.items()}
            return prep.measure({**{n: None for n in tensors}, **qmap}, pieces, proxy=True), qmap
        return run

    moments = {n: t for n, t in everything.items() if opt.parse_moment_name(n)}
    live = list(everything.values())
    pairs = [(moments[n], moments[n + "_sq"]) for n in moments
             if n.endswith("exp_avg") and n + "_sq" in moments]

    def moment_run() -> Any:
        got = opt.quantize_optimizer_state(moments)
        return [opt.moment_error_sums(o.q, o.domain, moments[n]) for n, o in got.items()]

    # on the host, the chunks a GPU takes: the launch counts are then a GPU's
    chunking = mock.patch.object(device_chunks, "_HOST_CHUNK", device_chunks._DEVICE_CHUNK)
    with (device_path() if device == "cpu" else nullcontext()), chunking:
        out.update(out_of)
        if one_by_one:
            with off:
                out["sketches"]["one by one"] = measure(sketches, device, repeat, live)
        out["sketches"]["batched"] = measure(sketches, device, repeat, live)
        if one_by_one:
            with off:
                out["trial"]["one by one"] = measure(trial(False), device, repeat, live)
        out["trial"]["batched"] = measure(trial(True), device, repeat, live)
        if triton:
            with triton_assign.triton_path():
                out["trial"]["triton"] = measure(trial(True), device, repeat, live)
        if one_by_one:
            with moment_off:
                out["moments"]["one by one"] = measure(moment_run, device, repeat, live)
                out["bounds"]["one by one"] = measure(
                    lambda: [moment_bound.moment_ratio_bound(m, v) for m, v in pairs], device, repeat, live)
        out["moments"]["batched"] = measure(moment_run, device, repeat, live)
        if triton:
            with triton_assign.triton_path():
                out["moments"]["triton"] = measure(moment_run, device, repeat, live)
        out["bounds"]["batched"] = measure(lambda: batched_moments.moment_ratio_bounds(pairs), device, repeat, live)
        if not hooks:
            del out["first hook"], out["next hook"]
        else:
            how = Quantization("search", epsilon=0.05, policy=default_policy(), optimizer="compressed")

            def hook(previous: Any = None, init: Any = None) -> Callable[[], Any]:
                return lambda: plan_quantization(
                    everything, how, to_state=lambda t: unflatten(whole.skeleton, t),
                    previous=previous, init=init)
            first = hook()()
            start = first.config.to_dict() if first.config is not None else None
            init = {n: q.centroids.cpu() for n, q in first.quantized.items()}
            del first
            for name, run in (("first hook", hook()), ("next hook", hook(start, init))):
                if one_by_one:
                    with off, moment_off:
                        out[name]["one by one"] = measure(run, device, 1, live)
                out[name]["batched"] = measure(run, device, 1, live)
                if triton:
                    with triton_assign.triton_path():
                        out[name]["triton"] = measure(run, device, 1, live)
    return out



def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=30e6)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-hooks", action="store_true", help="skip the whole-hook stages")
    ap.add_argument("--triton", action="store_true",
                    help="also run the trial, moments and hooks with the Triton assignment kernel "
                         "(mvc.quant.triton_assign; on the host in Triton's interpreter, which "
                         "needs TRITON_INTERPRET=1: its times mean nothing there, its counts do)")
    ap.add_argument("--no-one-by-one", action="store_true",
                    help="skip the per-tensor rows (the slowest at 124M on the host)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    shape = shape_for(args.params)
    state = train(shape, [args.steps], args.device, batch=4, seq=64)[0]
    n = sum(p.numel() for p in state["model"].values())
    with (mock.patch.object(triton_assign, "HOST_BLOCK", 1 << 18) if args.device == "cpu"
          else nullcontext()):
        # in Triton's interpreter each program is a Python call: on the host, longer blocks
        # (only the sums' summation order depends on them) keep a 124M run to minutes
        res = stages(state, args.device, args.repeat, hooks=not args.no_hooks,
                     triton=args.triton, one_by_one=not args.no_one_by_one)
    state_bytes = sum(t.numel() * t.element_size() for t in flatten(state).tensors.values()
                      if isinstance(t, torch.Tensor))
    report = {"device": args.device, "params": n, "shape": shape, "state_bytes": state_bytes,
              "torch_threads": torch.get_num_threads(), "stages": res,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"device {args.device}, {n / 1e6:.1f}M parameters "
              f"({len(state['model'])} weights), {torch.get_num_threads()} threads")
        print(f"{'stage':10s} {'path':11s} {'syncs':>6s} {'waits':>6s} {'launches':>8s} "
              f"{'seconds':>8s}  ratio")
        for stage, paths in res.items():
            base = next(iter(paths.values()))["seconds"]
            for path, m in paths.items():
                what = "GPU peak" if args.device == "cuda" else "device peak (est.)"
                gpu = f"  {what} {m['peak_extra_gpu'] / state_bytes:.3f}x the state"
                print(f"{stage:10s} {path:11s} {m['syncs']:6d} {m['waits']:6d} {m['launches']:8d} "
                      f"{m['seconds']:8.3f}  {m['seconds'] / base:5.2f}x{gpu}")
    return report


if __name__ == "__main__":
    main()
