"""What checking every zip record's CRC-32 costs when mvc reads a .pt (issue 25, defect 6).

mvc's reader (`mvc.io.torch_zip`) maps a torch.save file and hands out each storage as a
slice of the map; it checks each record's CRC-32 over that slice as the storage is made
(torch checks none), in 8 MiB pieces on mvc's thread pool ($MVC_THREADS, else every CPU)
whose CRCs are then combined.  The map is lazy, so the check is the first thing to touch
the bytes: it moves the page faults the caller's first read would take, and adds zlib's
crc32 on top.  This builds a ~1.5 GB checkpoint (12 float32 tensors of 32M elements by default)
in a temporary directory and times, each in its own child process on a warm page cache:

    torch.load          torch.load(weights_only=True): reads (copies) every record, no CRC
    torch.load mmap     torch.load(weights_only=True, mmap=True): maps, reads nothing
    mvc, no CRC         mvc.io.load_checkpoint with the check switched off (the old reader)
    mvc, CRC            mvc.io.load_checkpoint as shipped
    crc32 alone         zlib.crc32 over the same bytes already in memory (one core's throughput)
    crc32 in pieces     mvc's parallel_crc32 over the same bytes already in memory

After each load the child reads one byte of every 4 KiB page of every tensor ("then read":
what a commit's first pass over the tensors pays in page faults before any work), timed
apart; "load + read" is the sum.  Each is run `--repeat` times, interleaved, and the run
with the best load + read kept.  Peak RSS is the child's
high-water mark during the load minus its RSS before it; anonymous RSS after the load shows
what was copied (torch.load's copy) against what is only mapped file pages.  Ratios are
against torch.load measured in the same run: compare ratios, not seconds.

    python benchmarks/bench_pt_crc.py                         # 12 x 32M float32, ~1.5 GB
    python benchmarks/bench_pt_crc.py --tensors 4 --numel 4e6 --json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("torch.load", "torch.load mmap", "mvc, no CRC", "mvc, CRC")


def _status(field: str) -> int:
    """One of /proc/self/status's kB fields, in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the next peak is the load's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _tensors(state: Any) -> list[torch.Tensor]:
    return [v for v in state.values() if isinstance(v, torch.Tensor)]


def _read_pages(tensors: list[torch.Tensor]) -> int:
    """Read one byte of every 4 KiB page of each tensor (what faults a lazily mapped tensor in)."""
    return sum(int(t.view(torch.uint8)[::4096].sum()) for t in tensors)


def child(task: dict) -> dict:
    """One load of task["path"] by task["kind"]; seconds (load, then read), peak extra RSS, anonymous RSS after."""
    from mvc.io import files, torch_zip

    path, kind = task["path"], task["kind"]
    torch_zip._VERIFY_CRC = kind != "mvc, no CRC"
    # crc32 alone times the checksum over tensors already in memory: loaded before the clocks start.
    loaded = torch.load(path, weights_only=True, map_location="cpu") if kind.startswith("crc32") else None
    _reset_peak()
    rss0, anon0 = _status("VmRSS"), _status("RssAnon")
    t0 = time.perf_counter()
    if kind == "torch.load":
        state = torch.load(path, weights_only=True, map_location="cpu")
    elif kind == "torch.load mmap":
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    elif kind.startswith("mvc"):
        state = files.load_checkpoint(path)
    elif kind == "crc32 alone":
        state = loaded
        for t in _tensors(state):
            view: Any = t.view(torch.uint8).numpy()  # a buffer, though numpy's stubs do not say so
            zlib.crc32(view)
    elif kind == "crc32 in pieces":
        state = loaded
        for t in _tensors(state):
            torch_zip.parallel_crc32(t.view(torch.uint8).numpy())
    else:
        raise ValueError(kind)
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    _read_pages(_tensors(state))
    read = time.perf_counter() - t0
    peak = max(_status("VmHWM") - rss0, 0)
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    return {"seconds": seconds, "read_seconds": read, "total_seconds": seconds + read, "peak_extra_rss": peak,
            "anon_rss_added": _status("RssAnon") - anon0, "bytes": nbytes}


def run_child(task: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)],
                          capture_output=True, text=True, timeout=1800, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"{task['kind']} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build(path: Path, tensors: int, numel: int) -> int:
    """torch.save `tensors` float32 tensors of `numel` elements to `path`; returns the file's size."""
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.rand(numel, generator=gen) for i in range(tensors)}
    torch.save(state, path)
    return path.stat().st_size


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=12)
    ap.add_argument("--numel", type=float, default=32 * 2**20, help="elements per float32 tensor")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each load, the best kept")
    ap.add_argument("--dir", default=None, help="where the temporary checkpoint goes")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        print(json.dumps(child(json.loads(a.child))))
        return {}
    with tempfile.TemporaryDirectory(prefix="mvc-bench-crc-", dir=a.dir) as work:
        path = Path(work) / "ckpt.pt"
        size = build(path, a.tensors, int(a.numel))
        runs: dict[str, list[dict]] = {k: [] for k in (*KINDS, "crc32 alone", "crc32 in pieces")}
        for _ in range(a.repeat):
            for kind in runs:  # interleaved, so a slow spell of a shared machine hits every kind
                runs[kind].append(run_child({"kind": kind, "path": str(path)}))
    rows = {k: min(r, key=lambda x: x["total_seconds"]) for k, r in runs.items()}
    peer, peer_total = rows["torch.load"]["seconds"], rows["torch.load"]["total_seconds"]
    from mvc.native.parallel import worker_count

    print(f"checkpoint: {a.tensors} x {int(a.numel)} float32, {size / 1e9:.2f} GB; best of {a.repeat}; "
          f"{worker_count()} threads")
    print(f"{'':<16} {'load s':>7} {'x torch.load':>12} {'GB/s':>6} {'then read s':>11} {'load+read s':>11} "
          f"{'x torch.load':>12} {'peak +RSS':>10} {'+anon RSS':>10}")
    for kind, r in rows.items():
        rate = f"{r['bytes'] / r['seconds'] / 1e9:6.2f}" if kind != "torch.load mmap" else f"{'-':>6}"
        print(f"{kind:<16} {r['seconds']:7.3f} {r['seconds'] / peer:12.2f} {rate} {r['read_seconds']:11.3f} "
              f"{r['total_seconds']:11.3f} {r['total_seconds'] / peer_total:12.2f} "
              f"{r['peak_extra_rss'] / 2**20:8.0f} M {r['anon_rss_added'] / 2**20:8.0f} M")
    with_crc, without = rows["mvc, CRC"], rows["mvc, no CRC"]
    print(f"the CRC check: load {with_crc['seconds']:.3f} s against {without['seconds']:.3f} s; load + read "
          f"{with_crc['total_seconds']:.3f} s against {without['total_seconds']:.3f} s "
          f"(+{(with_crc['total_seconds'] - without['total_seconds']) / peer_total:.2f}x torch.load's load + read); "
          f"mvc with it loads in {with_crc['seconds'] / peer:.2f}x torch.load's time")
    result = {"file_bytes": size, "threads": worker_count(), "tensors": a.tensors, "numel": int(a.numel), "repeat": a.repeat,
              "rows": rows, "runs": runs}
    if a.json:
        print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
