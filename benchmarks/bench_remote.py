"""Remote benchmark: push and clone against a local S3 server vs copying the checkpoint files.

A small MLP is trained with AdamW on sklearn's digits (shipped with scikit-learn;
nothing is downloaded) and checkpointed every few steps (model + optimizer
state); each checkpoint is committed (lossy, a fixed quantization config, so
the run is quick and repeatable) and also saved as a ``.pt`` file.  Against one
moto S3 server on 127.0.0.1 (tests/helpers/s3_server.py, which counts the bytes it
receives), measured in the same run:

* **baseline**: the ``.pt`` files uploaded and downloaded with the same client
  (obstore), 8 requests in flight, as a checkpoint sync without mvc would;
* **push**: the history pushed one commit at a time, as a training job would
  (bytes on the wire per push, from the server's counter, vs the checkpoint's size;
  requests per push, against those of the listing of the whole remote that every push
  made before issue 28, measured after each push on a fresh view of the remote),
  then a clone of it into a fresh directory; throughput in checkpoint (raw) bytes
  per second, so the rows compare time to move the same checkpoints.
* peak RSS of ``mvc push`` and ``mvc clone`` (whole history) in child processes.

    python benchmarks/bench_remote.py [--commits 8] [--hidden 512] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mvc.quant import QuantConfig  # noqa: E402
from mvc.remote.porcelain import clone  # noqa: E402
from mvc.remote.transfer import push  # noqa: E402
from mvc.repo.repository import Repo  # noqa: E402
from mvc.store.objstore import open_remote  # noqa: E402


class Server:
    """tests/helpers/s3_server.py (moto + byte counters) in a child process."""

    def __init__(self, workdir: Path) -> None:
        portfile = workdir / "port"
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "helpers" / "s3_server.py"), str(portfile)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not portfile.exists():
            time.sleep(0.05)
        self.endpoint = f"http://127.0.0.1:{int(portfile.read_text())}"
        os.environ.update({"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "bench",
                           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
        self.bucket = "mvc-bench"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT",
                                                      data=b"")).read()

    def ctl(self, what: str) -> dict:
        req = urllib.request.Request(f"{self.endpoint}/__mvc/{what}", method="POST", data=b"")
        return json.loads(urllib.request.urlopen(req).read())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def checkpoints(n: int, hidden: int, every: int = 5):
    """(step, state) of an MLP on sklearn digits trained with AdamW, every `every` steps."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    xt, yt = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    for _ in range(n):
        for _ in range(every):
            idx = torch.randint(0, len(xt), (128,))
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        yield step, {"model": {k: v.clone() for k, v in model.state_dict().items()},
                     "optimizer": opt.state_dict(), "step": step}


_CHILD = ("import sys\nfrom mvc.cli.main import main\ncode = main(sys.argv[1:])\n"
          "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
          "print('VMHWM', hwm, file=sys.stderr)\nsys.exit(code)\n")


def peak_rss_mib(args: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of a child `mvc` command. The child reports its own VmHWM:
    ru_maxrss of a child started from this (big) process would count the parent's pages."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"mvc {' '.join(args)} failed: {proc.stderr}")
    hwm = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("VMHWM"))
    return time.perf_counter() - t, int(hwm) / 1024


def _requests(stats: dict) -> int:
    return sum(stats["requests"].values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    import obstore
    from obstore.store import S3Store

    work = Path(tempfile.mkdtemp(prefix="mvc-bench-remote-"))
    server = Server(work)
    try:
        repo = Repo.init(work / "src")
        repo.config.set("commit.mode", "fixed")
        cfg = QuantConfig(bins=16, prune=0.1, prune_metric="magnitude", protect=0.005, embedding_bins=32)
        files: list[Path] = []
        ids: list[str] = []
        for step, state in checkpoints(args.commits, args.hidden):
            f = work / f"ckpt-{step}.pt"
            torch.save(state, f)
            files.append(f)
            ids.append(repo.commit(state, f"step {step}", step=step, quant=cfg))
        raw = [f.stat().st_size for f in files]
        total_raw = sum(raw)

        # baseline: the files themselves, same client, 8 in flight
        store = S3Store(server.bucket, prefix=f"files-{uuid.uuid4().hex}",
                        config={"endpoint": server.endpoint, "allow_http": True, "region": "us-east-1"})
        server.ctl("reset")
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda f: obstore.put(store, f.name, f.read_bytes()), files))
        base_up = time.perf_counter() - t
        base_put_bytes = server.ctl("stats")["put_bytes"]
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda f: bytes(obstore.get(store, f.name).bytes()), files))
        base_down = time.perf_counter() - t

        # mvc: push after each commit (what a training job does), then clone
        url = f"s3://{server.bucket}/mvc-{uuid.uuid4().hex}"
        remote = open_remote(url)
        per_commit = []
        t = time.perf_counter()
        listing_s = 0.0
        for i, cid in enumerate(ids):
            before = server.ctl("stats")
            push(repo.odb, remote, {"refs/heads/main": cid})
            after = server.ctl("stats")
            # What the push before issue 28 added to its own requests: one listing of the remote
            # (loose keys, every pack index), as a new process sees it. Not part of push_s.
            t_list = time.perf_counter()
            open_remote(url).blobs.known_ids()
            listing_s += time.perf_counter() - t_list
            listed = server.ctl("stats")
            per_commit.append({"commit": i, "checkpoint_bytes": raw[i],
                               "wire_bytes": after["put_bytes"] - before["put_bytes"],
                               "requests": _requests(after) - _requests(before),
                               "listing_requests": _requests(listed) - _requests(after)})
        push_s = time.perf_counter() - t - listing_s
        remote.close()
        t = time.perf_counter()
        clone(url, work / "clone")
        clone_s = time.perf_counter() - t
        c = Repo(work / "clone")
        assert [x.id for x in c.log()] == ids[::-1]
        c.close()

        # whole-history push and clone as CLI commands in child processes: time and peak RSS
        url2 = f"s3://{server.bucket}/mvc-{uuid.uuid4().hex}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), MVC_PROGRESS="0")
        subprocess.run([sys.executable, "-m", "mvc", "remote", "add", "bench", url2], cwd=work / "src",
                       env=env, check=True)
        cli_push_s, push_rss = peak_rss_mib(["push", "bench", "main"], work / "src", env)
        cli_clone_s, clone_rss = peak_rss_mib(["clone", url2, str(work / "clone2")], work, env)
        _, idle_rss = peak_rss_mib(["--version"], work, env)
        repo.close()
    finally:
        server.stop()

    mib = 1 << 20
    wire = sum(p["wire_bytes"] for p in per_commit)
    later = per_commit[1:] or per_commit
    res = {
        "commits": args.commits, "checkpoint_mib_each": raw[0] / mib, "checkpoint_mib_total": total_raw / mib,
        "baseline": {"upload_s": base_up, "download_s": base_down, "wire_mib": base_put_bytes / mib,
                     "upload_mib_s": total_raw / mib / base_up, "download_mib_s": total_raw / mib / base_down},
        "mvc": {"push_s": push_s, "clone_s": clone_s, "wire_mib": wire / mib,
                "push_ckpt_mib_s": total_raw / mib / push_s, "clone_ckpt_mib_s": total_raw / mib / clone_s},
        "ratios": {"push_speedup_vs_upload": base_up / push_s, "clone_speedup_vs_download": base_down / clone_s,
                   "wire_reduction": base_put_bytes / max(wire, 1)},
        "per_commit": per_commit,
        "later_commit_wire_fraction": sum(p["wire_bytes"] for p in later) / sum(p["checkpoint_bytes"] for p in later),
        "cli": {"push_s": cli_push_s, "push_peak_rss_mib": push_rss, "clone_s": cli_clone_s,
                "clone_peak_rss_mib": clone_rss, "python_mvc_idle_rss_mib": idle_rss},
        "cpu_count": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
        "self_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return
    b, m, r = res["baseline"], res["mvc"], res["ratios"]
    print(f"{args.commits} checkpoints of {res['checkpoint_mib_each']:.2f} MiB (model + AdamW state), "
          f"{res['checkpoint_mib_total']:.1f} MiB in all; local moto S3, {os.cpu_count()} cpus, "
          f"load {res['loadavg_1m']:.1f}")
    print(f"{'':28}{'time s':>9}{'ckpt MiB/s':>12}{'wire MiB':>10}")
    print(f"{'upload .pt files (obstore)':28}{b['upload_s']:9.2f}{b['upload_mib_s']:12.1f}{b['wire_mib']:10.2f}")
    print(f"{'mvc push, one per commit':28}{m['push_s']:9.2f}{m['push_ckpt_mib_s']:12.1f}{m['wire_mib']:10.2f}")
    print(f"{'download .pt files':28}{b['download_s']:9.2f}{b['download_mib_s']:12.1f}")
    print(f"{'mvc clone':28}{m['clone_s']:9.2f}{m['clone_ckpt_mib_s']:12.1f}")
    print(f"push {r['push_speedup_vs_upload']:.2f}x the upload's speed, clone {r['clone_speedup_vs_download']:.2f}x "
          f"the download's; {r['wire_reduction']:.1f}x fewer bytes on the wire")
    print("bytes on the wire per pushed commit vs its checkpoint file:")
    for p in per_commit:
        print(f"  commit {p['commit']}: {p['wire_bytes'] / mib:7.3f} MiB of {p['checkpoint_bytes'] / mib:.2f} MiB "
              f"({p['wire_bytes'] / p['checkpoint_bytes']:.1%}); {p['requests']} requests "
              f"(a listing of the remote, as pushes made before: {p['listing_requests']} more)")
    c = res["cli"]
    print(f"CLI (child processes, incl. start-up): mvc push {c['push_s']:.1f} s, "
          f"peak RSS {c['push_peak_rss_mib']:.0f} MiB; mvc clone {c['clone_s']:.1f} s, {c['clone_peak_rss_mib']:.0f} MiB; "
          f"mvc --version {c['python_mvc_idle_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
