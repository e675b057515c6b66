"""DCP straight to object storage (issue 28 item 1): an FSDP2 state on 4 CPU gloo ranks saved to
a local S3 server, mvc against torch's FileSystemWriter followed by an upload.

The state: a GPT-2-small-shaped model (token embedding + MLP blocks, ~124M parameters by
default, `--params`) sharded with `fully_shard`, plus AdamW's moments after one step.  Against
one moto S3 server on 127.0.0.1 (tests/helpers/s3_server.py, which counts the bytes it
receives), in the same run, each timed from a barrier before to a barrier after on every rank:

* **files + upload**: `dcp.save` with torch's `FileSystemWriter` to a local directory, then
  each rank uploads the files it wrote (rank 0 the ``.metadata`` too) with the same client mvc
  uses (obstore), the way a job without a shared file system would;
* **mvc lossless**: `dcp.save` with `MvcStorageWriter("s3://...", lossless=True)`: every rank
  encodes and uploads its own chunks, rank 0 publishes;
* **mvc lossy**: the same state, then the next one (one more training step: its quantized
  shards are deltas against the first), a fixed quantization config given as `config=`
  (Adam's moments compressed as a one-process commit does).

Bytes uploaded are counted by the server (PUT bodies).  Targets from the issue: mvc lossless
<= 1.0x the time of files + upload, mvc lossy <= 0.1x its bytes.

    python benchmarks/bench_distributed_s3.py [--params 124e6] [--reps 1] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
WORLD = 4
FIXED = {"commit.mode": "fixed", "commit.quant": {"bins": 16, "prune": 0.1, "protect": 0.005}}


class Server:
    """tests/helpers/s3_server.py (moto + byte counters) in a child process."""

    def __init__(self, workdir: Path) -> None:
        portfile = workdir / "port"
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "s3_server.py"),
                                      str(portfile)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        while not portfile.exists():
            time.sleep(0.05)
        self.endpoint = f"http://127.0.0.1:{int(portfile.read_text())}"
        self.bucket = "mvc-bench"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{self.bucket}",
                                                      method="PUT", data=b"")).read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def ctl(endpoint: str, what: str) -> dict:
    req = urllib.request.Request(f"{endpoint}/__mvc/{what}", method="POST", data=b"")
    return json.loads(urllib.request.urlopen(req).read())


# ------------------------------------------------------------------ the model
def shape(params: float) -> tuple[int, int, int]:
    """(width, vocabulary, blocks) of a model of about `params` parameters: GPT-2 small's
    proportions (embedding ~31%, blocks of two 4x linear layers the rest)."""
    d = 768 if params >= 50e6 else 256 if params >= 4e6 else 64
    vocab = max(64, int(0.31 * params / d))
    blocks = max(1, round((params - vocab * d) / (8 * d * d + 5 * d)))
    return d, vocab, blocks


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, d: int, vocab: int, blocks: int) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(blocks))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids)
        for b in self.blocks:
            x = b(x)
        return x


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, vocab: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    loss = model(ids).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


# ------------------------------------------------------------------ one rank
def rank_main(args: argparse.Namespace) -> None:
    import obstore
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from obstore.store import S3Store
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from mvc.dcp import MvcStorageWriter

    torch.set_num_threads(1)
    rank = args.rank
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(minutes=30))
    d, vocab, blocks = shape(args.params)
    torch.manual_seed(0)
    model = Model(d, vocab, blocks)
    n_params = sum(p.numel() for p in model.parameters())
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step(model, opt, vocab, 0)
    work = Path(args.out)
    url = f"s3://{args.bucket}/mvc-{args.run}"
    store = S3Store(args.bucket, prefix=f"files-{args.run}",
                    config={"endpoint": args.endpoint, "allow_http": True, "region": "us-east-1"})

    def timed(fn):  # (seconds, bytes the server received), barrier to barrier
        dist.barrier()
        if rank == 0:
            ctl(args.endpoint, "reset")
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        s = time.perf_counter() - t
        got = ctl(args.endpoint, "stats") if rank == 0 else {}
        return s, got.get("put_bytes", 0), got.get("puts", 0)

    def files(rep: int) -> None:
        where = work / f"fs-{rep}"
        state = dict(zip(("model", "optim"), get_state_dict(model, opt)))
        dcp.save(state, storage_writer=FileSystemWriter(where, thread_count=1))
        mine = [f for f in where.iterdir()
                if f.name.startswith(f"__{rank}_") or (rank == 0 and f.name == ".metadata")]
        for f in mine:
            obstore.put(store, f"{rep}/{f.name}", f)

    def mvc(lossless: bool, message: str) -> None:
        state = dict(zip(("model", "optim"), get_state_dict(model, opt)))
        dcp.save(state, storage_writer=MvcStorageWriter(
            url, message=message, lossless=lossless, config=None if lossless else FIXED))

    rows: dict[str, list] = {"files": [], "lossless": []}
    for rep in range(args.reps):   # alternated: drift on a shared machine hits both
        rows["files"].append(timed(lambda: files(rep)))
        rows["lossless"].append(timed(lambda: mvc(True, f"lossless {rep}")))
    rows["lossy"] = [timed(lambda: mvc(False, "lossy"))]
    step(model, opt, vocab, 1)
    rows["lossy_next"] = [timed(lambda: mvc(False, "lossy next"))]
    if rank == 0:
        state_bytes = sum(f.stat().st_size for f in (work / "fs-0").iterdir())
        Path(work / "result.json").write_text(json.dumps(
            {"params": n_params, "width": d, "vocab": vocab, "blocks": blocks,
             "state_bytes": state_bytes, "rows": rows}))
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ the parent
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=124e6)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    for hidden in ("--port", "--endpoint", "--bucket", "--out", "--run"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        rank_main(args)
        return
    work = Path(tempfile.mkdtemp(prefix="mvc-bench-dcp-s3-"))
    server = Server(work)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID="bench",
               AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    common = ["--port", str(port), "--endpoint", server.endpoint, "--bucket", server.bucket,
              "--out", str(work), "--run", uuid.uuid4().hex, "--params", str(args.params),
              "--reps", str(args.reps)]
    try:
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), *common], env=env)
                 for r in range(WORLD)]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a rank failed: exit codes {codes}")
        res = json.loads((work / "result.json").read_text())
    finally:
        server.stop()
    rows = res["rows"]
    best = {k: min(v, key=lambda r: r[0]) for k, v in rows.items()}
    base_s, base_b = best["files"][0], best["files"][1]
    res["ratios"] = {
        "lossless_time": best["lossless"][0] / base_s,
        "lossless_bytes": best["lossless"][1] / base_b,
        "lossy_time": best["lossy"][0] / base_s,
        "lossy_bytes": best["lossy"][1] / base_b,
        "lossy_next_time": best["lossy_next"][0] / base_s,
        "lossy_next_bytes": best["lossy_next"][1] / base_b,
    }
    res["targets"] = {"lossless_time_le_1": res["ratios"]["lossless_time"] <= 1.0,
                      "lossy_bytes_le_0.1": res["ratios"]["lossy_bytes"] <= 0.1}
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{res['params'] / 1e6:.1f}M parameters (width {res['width']}, vocab {res['vocab']}, "
          f"{res['blocks']} blocks) + AdamW: {res['state_bytes'] / 2**20:.1f} MiB of DCP files; "
          f"{WORLD} gloo ranks on {os.cpu_count()} cpus, local moto S3; best of {args.reps}")
    print(f"{'':34}{'time s':>9}{'uploaded MiB':>14}{'PUTs':>7}{'x time':>8}{'x bytes':>9}")
    names = {"files": "FileSystemWriter + obstore upload", "lossless": "mvc lossless",
             "lossy": "mvc lossy (first: bases)", "lossy_next": "mvc lossy (next: deltas)"}
    for key, label in names.items():
        s, b, n = best[key]
        print(f"{label:34}{s:9.2f}{b / 2**20:14.2f}{n:7d}{s / base_s:8.2f}{b / base_b:9.3f}")
    t = res["targets"]
    print(f"targets: mvc lossless <= 1.0x the time: {'met' if t['lossless_time_le_1'] else 'NOT met'}"
          f"; mvc lossy <= 0.1x the bytes: {'met' if t['lossy_bytes_le_0.1'] else 'NOT met'}")


if __name__ == "__main__":
    main()
