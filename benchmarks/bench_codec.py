"""Entropy-coding benchmark: mvc lossless vs zstd and ZipNN; RLE+Huffman vs zlib and zstd.

One run on this machine, every figure measured against its peers in the same
run.  Part 1 trains an MLP on scikit-learn's digits (a few seconds), or reads
the tensors of a `.safetensors` file (`--weights`, e.g. a pretrained encoder),
and codes them tensor by tensor in fp32 and bf16; the table gives each coder's
encode and decode time as a multiple of ZipNN's compress and decompress.
Part 2 codes realistic level-delta streams (90-99.9% zeros, changes in bursts).

    python benchmarks/bench_codec.py [--json] [--steps 300] [--hidden 2048,2048,512]
                                     [--weights model.safetensors]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from typing import Any, Callable

import numpy as np
import torch
import zstandard

from mvc.codecs import get_codec
from mvc.codecs.lossless import LosslessCodec
from mvc.native import rle
from mvc.native.parallel import worker_count

MB = 1e6


def train_digits_mlp(steps: int, hidden: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """A real trained model: an MLP fitted to sklearn's digits for a fixed number of Adam steps."""
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    layers: list[torch.nn.Module] = []
    prev = x.shape[1]
    for h in hidden:
        layers += [torch.nn.Linear(prev, h), torch.nn.ReLU()]
        prev = h
    layers.append(torch.nn.Linear(prev, 10))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (128,))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Fastest of `repeat` runs (these machines are shared and noisy) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bytes, for exact comparisons (NaN-safe)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


class _Coder:
    """One contender: compress / decompress a list of tensors, one call per tensor."""

    def __init__(self, name: str, enc: Callable[[torch.Tensor], Any], dec: Callable[[Any, torch.Tensor], Any],
                 size: Callable[[Any], int], rounds: int, check: bool = True, threads: str | None = None,
                 fresh_input: bool = False) -> None:
        self.name, self.enc, self.dec, self.size = name, enc, dec, size
        self.rounds, self.check, self.threads, self.fresh_input = rounds, check, threads, fresh_input
        self.enc_s = self.dec_s = float("inf")
        self.nbytes = 0

    def round(self, tensors: list[torch.Tensor]) -> None:
        old = os.environ.get("MVC_THREADS")
        if self.threads:
            os.environ["MVC_THREADS"] = self.threads
        try:
            inputs = [t.clone() for t in tensors] if self.fresh_input else tensors
            t0 = time.perf_counter()
            comp = [self.enc(t) for t in inputs]
            self.enc_s = min(self.enc_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            outs = [self.dec(c, t) for c, t in zip(comp, tensors)]
            self.dec_s = min(self.dec_s, time.perf_counter() - t0)
        finally:
            if self.threads:
                os.environ.pop("MVC_THREADS") if old is None else os.environ.__setitem__("MVC_THREADS", old)
        self.nbytes = sum(self.size(c) for c in comp)
        if self.check:
            for o, t in zip(outs, tensors):
                assert torch.equal(_bits(o), _bits(t)), f"{self.name} round trip failed"


def bench_lossless(tensors: list[torch.Tensor], repeat: int) -> dict[str, dict[str, float]]:
    """Ratio and throughput of every lossless coder over `tensors`, coded one by one.

    Rounds are interleaved (every coder once per round, best round kept) so
    that load from other processes hits all contenders alike.
    """
    raw = sum(t.numel() * t.element_size() for t in tensors)
    codec = get_codec("lossless/1")

    def payload(parts: Any) -> Any:
        # The codec's one part is what the store writes as it is: no join copy is timed.
        return parts[0] if len(parts) == 1 else b"".join(bytes(p) for p in parts)

    def mvc_enc(t: torch.Tensor) -> Any:
        e = codec.encode(t)
        return e.meta, payload(e.parts)

    def mvc_dec(c: Any, t: torch.Tensor) -> torch.Tensor:
        return codec.decode(c[0], c[1], t.dtype, tuple(t.shape))

    def size(c: Any) -> int:
        return memoryview(c[1]).nbytes

    def raw_bytes(t: torch.Tensor) -> bytes:
        return _bits(t).numpy().tobytes()

    def from_raw(b: bytes, t: torch.Tensor) -> torch.Tensor:
        return torch.frombuffer(bytearray(b), dtype=torch.uint8).view(t.dtype).reshape(t.shape)

    # The default codes exponents with rANS wherever that is smaller (about 1.4% of the plane
    # on weights) at ~1.5x Huffman's decode cost with AVX-512 (more without): this row shows
    # the other side of that trade.
    huffman_exp = LosslessCodec(rans_saving=1.0)

    def huf_enc(t: torch.Tensor) -> Any:
        e = huffman_exp.encode(t)
        return e.meta, payload(e.parts)

    coders = [
        _Coder("mvc lossless", mvc_enc, mvc_dec, size, repeat),
        _Coder("mvc lossless 1 thread", mvc_enc, mvc_dec, size, repeat, threads="1"),
        _Coder("mvc Huffman exponents", huf_enc, mvc_dec, size, repeat),
    ]
    for level, rounds in ((3, repeat), (19, 1)):
        cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
        coders.append(_Coder(f"zstd -{level}", lambda t, c=cctx: c.compress(raw_bytes(t)),
                             lambda c, t, d=dctx: from_raw(d.decompress(c), t), len, rounds))
    try:
        import zipnn

        z = zipnn.ZipNN(input_format="torch")
        # compress() mutates its input: each round codes fresh copies (made outside the timer).
        coders.append(_Coder("zipnn", z.compress, lambda c, t: z.decompress(c).reshape(t.shape), len,
                             repeat, fresh_input=True))
    except ImportError:  # pragma: no cover - bench extra not installed
        pass
    for r in range(repeat):
        for coder in coders:
            if r < coder.rounds:
                coder.round(tensors)
    out: dict[str, dict[str, float]] = {c.name: {"ratio": raw / c.nbytes, "compress_MBps": raw / c.enc_s / MB,
                    "decompress_MBps": raw / c.dec_s / MB, "bytes": c.nbytes,
                    "compress_s": c.enc_s, "decompress_s": c.dec_s} for c in coders}
    peer = out.get("zipnn")
    for row in out.values():  # time as a multiple of ZipNN's, same tensors, same run
        row["compress_x_zipnn"] = row["compress_s"] / peer["compress_s"] if peer else float("nan")
        row["decompress_x_zipnn"] = row["decompress_s"] / peer["decompress_s"] if peer else float("nan")
    return out


def bench_commit(tensors: list[torch.Tensor], repeat: int) -> dict[str, float]:
    """`repo.commit(state, lossless=True)` end to end: tensor bytes stored and wall time.

    Each round commits into a fresh repository (a second commit of the same
    tensors would be deduplicated to nothing) and the best round is kept.
    """
    import shutil
    import tempfile

    from mvc.repo.repository import Repo

    state = {f"t{i}": t for i, t in enumerate(tensors)}
    best, stored = float("inf"), 0
    for _ in range(repeat):
        root = tempfile.mkdtemp(prefix="mvc-bench-commit-")
        try:
            repo = Repo.init(root)
            t0 = time.perf_counter()
            cid = repo.commit(state, "bench", lossless=True)
            best = min(best, time.perf_counter() - t0)
            snap = repo.read_snapshot(repo.read_commit(cid).snapshot)
            stored = sum(r.stored_bytes for r in snap.tensors)
            repo.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    raw = sum(t.numel() * t.element_size() for t in tensors)
    return {"bytes": stored, "seconds": best, "ratio": raw / stored, "MBps": raw / best / MB}


def level_delta_stream(n: int, zeros: float, levels: int, seed: int) -> np.ndarray:
    """Cyclic level deltas (B = `levels`) as a quantized model produces them between
    commits: a two-state chain (quiet / active regions) gives changes in bursts;
    most changes are +-1 level, a few jump further."""
    rng = np.random.default_rng(seed)
    p_change = 1.0 - zeros
    # Active regions are 8x denser than quiet ones and cover ~10% of the stream.
    p_active, p_quiet = min(1.0, 8 * p_change / 1.7), p_change / 1.7
    region = np.repeat(rng.random(n // 256 + 1) < 0.1, 256)[:n]
    change = rng.random(n) < np.where(region, p_active, p_quiet)
    step = np.where(rng.random(n) < 0.5, 1, levels - 1)
    jump = rng.integers(2, levels - 1, n)
    delta = np.where(change, np.where(rng.random(n) < 0.1, jump, step), 0) % levels
    return delta.astype(np.uint8 if levels <= 256 else np.uint16)


def bench_rle(n: int, repeat: int) -> list[dict[str, Any]]:
    """RLE+Huffman vs zlib -9 and zstd -3/-19 on level-delta streams."""
    rows = []
    for zeros in (0.90, 0.99, 0.999):
        v = level_delta_stream(n, zeros, levels=16, seed=int(zeros * 1000))
        raw = v.tobytes()
        row: dict[str, Any] = {"zeros": zeros, "measured_zeros": float((v == 0).mean()), "n": n}
        enc_s, enc = best_time(lambda: rle.encode_huffman(v), repeat)
        dec_s, back = best_time(lambda: rle.decode_huffman(enc, n, v.dtype), repeat)
        assert np.array_equal(back, v), "RLE+Huffman round trip failed"
        row["mvc rle+huffman"] = {"ratio": len(raw) / len(enc), "compress_MBps": len(raw) / enc_s / MB,
                                  "decompress_MBps": len(raw) / dec_s / MB}
        peers: list[tuple[str, Callable[[bytes], bytes], Callable[[bytes], bytes], int]] = [
            ("zlib -9", lambda b: zlib.compress(b, 9), zlib.decompress, repeat),
            ("zstd -3", zstandard.ZstdCompressor(level=3).compress,
             zstandard.ZstdDecompressor().decompress, repeat),
            ("zstd -19", zstandard.ZstdCompressor(level=19).compress,
             zstandard.ZstdDecompressor().decompress, 1),
        ]
        for name, comp, decomp, rep in peers:
            enc_s, c = best_time(lambda: comp(raw), rep)
            dec_s, _ = best_time(lambda: decomp(c), rep)
            row[name] = {"ratio": len(raw) / len(c), "compress_MBps": len(raw) / enc_s / MB,
                         "decompress_MBps": len(raw) / dec_s / MB}
        rows.append(row)
    return rows


def targets(lossless: dict[str, dict[str, dict[str, float]]], rows: list[dict[str, Any]],
            commits: dict[str, dict[str, float]]) -> dict[str, bool]:
    """The issue's "Must show" checks, evaluated on this run's figures."""
    out = {}
    for dtype, res in lossless.items():
        if "zipnn" not in res:
            continue
        m, z = res["mvc lossless"], res["zipnn"]
        out[f"{dtype}: ratio >= ZipNN"] = m["ratio"] >= z["ratio"]
        out[f"{dtype}: compress <= 1.0x ZipNN's time"] = m["compress_x_zipnn"] <= 1.0
        out[f"{dtype}: decompress <= 1.0x ZipNN's time"] = m["decompress_x_zipnn"] <= 1.0
    for dtype, c in commits.items():
        z = lossless[dtype].get("zipnn")
        if z is None:
            continue
        z_seconds = z["bytes"] * z["ratio"] / MB / z["compress_MBps"]
        out[f"{dtype}: repo.commit(lossless) bytes <= ZipNN"] = c["bytes"] <= z["bytes"]
        out[f"{dtype}: repo.commit(lossless) time <= 1.5x ZipNN"] = c["seconds"] <= 1.5 * z_seconds
    for row in rows:
        m, z = row["mvc rle+huffman"], row["zstd -19"]
        out[f"rle {row['zeros']:.1%} zeros: ratio >= zstd -19"] = m["ratio"] >= z["ratio"]
        out[f"rle {row['zeros']:.1%} zeros: encode >= 10x zstd -19"] = m["compress_MBps"] >= 10 * z["compress_MBps"]
    return out


def print_table(report: dict[str, Any]) -> None:
    print(f"model: {report['model']}, {report['params']:,} parameters, {report['tensors']} tensors; "
          f"{report['threads']} threads")
    hdr = f"{'coder':<24}{'ratio':>9}{'compress MB/s':>15}{'decompress MB/s':>17}"
    for dtype, res in report["lossless"].items():
        print(f"\n[{dtype}]\n{hdr}{'enc x ZipNN':>13}{'dec x ZipNN':>13}")
        for name, r in res.items():
            print(f"{name:<24}{r['ratio']:>9.4f}{r['compress_MBps']:>15.0f}{r['decompress_MBps']:>17.0f}"
                  f"{r['compress_x_zipnn']:>12.2f}x{r['decompress_x_zipnn']:>12.2f}x")
    for dtype, c in report["commit"].items():
        print(f"\n[repo.commit(lossless=True), {dtype}] ratio {c['ratio']:.4f}, "
              f"{c['MBps']:.0f} MB/s end to end ({c['seconds'] * 1e3:.0f} ms, {c['bytes']:,} bytes)")
    for row in report["rle"]:
        print(f"\n[level deltas, {row['measured_zeros']:.2%} zeros, {row['n']:,} uint8]\n{hdr}")
        for name, r in row.items():
            if isinstance(r, dict):
                print(f"{name:<24}{r['ratio']:>9.1f}{r['compress_MBps']:>15.0f}{r['decompress_MBps']:>17.0f}")
    print("\ntargets:")
    for name, ok in report["targets"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--steps", type=int, default=300, help="Adam steps of model training")
    ap.add_argument("--hidden", default="2048,2048,512", help="hidden layer widths")
    ap.add_argument("--rle-n", type=int, default=10_000_000, help="values per level-delta stream")
    ap.add_argument("--repeat", type=int, default=5, help="timing rounds (best is kept)")
    ap.add_argument("--weights", help="a .safetensors file whose floating-point tensors are coded "
                    "instead of the digits MLP's")
    args = ap.parse_args(argv)
    if args.weights:
        from safetensors.torch import load_file

        state = {k: v for k, v in load_file(args.weights).items() if v.is_floating_point()}
        model = os.path.basename(args.weights)
    else:
        state = train_digits_mlp(args.steps, [int(h) for h in args.hidden.split(",")])
        model = "digits MLP"
    tensors = {str(dt).replace("torch.", ""): [v.to(dt).contiguous() for v in state.values()]
               for dt in (torch.float32, torch.bfloat16)}
    lossless = {dt: bench_lossless(ts, args.repeat) for dt, ts in tensors.items()}
    commits = {dt: bench_commit(ts, args.repeat) for dt, ts in tensors.items()}
    rows = bench_rle(args.rle_n, args.repeat)
    report = {"model": model, "params": sum(v.numel() for v in state.values()), "tensors": len(state),
              "threads": worker_count(), "lossless": lossless, "commit": commits, "rle": rows}
    report["targets"] = targets(lossless, rows, commits)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
