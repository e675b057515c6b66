"""Child process of the corruption sweep (tests/repo/test_corruption_sweep.py).

Reads one damaged repository per line of stdin (a JSON object: {"dir", "expected"}), and
prints one JSON line per repository saying what happened: for every commit, "same",
"detected" (a typed MvcError) or "different" (silently wrong data: the failure we hunt),
and what fsck said.  Runs in its own process so that a crash or a hang is seen by the
parent as exactly that, not as a dead test run.
"""
from __future__ import annotations

import json
import sys
import traceback

import torch

from mvc.errors import MvcError
from mvc.state import flatten
from mvc.repo.repository import Repo


def _bits(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _same(a: object, b: object) -> bool:
    fa, fb = flatten(a), flatten(b)
    if fa.skeleton != fb.skeleton or list(fa.tensors) != list(fb.tensors):
        return False
    return all(x.dtype == y.dtype and x.shape == y.shape and _bits(x) == _bits(y)
               for x, y in zip(fa.tensors.values(), fb.tensors.values()))


def check(directory: str, expected: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {"reads": {}, "fsck": None}
    try:
        repo = Repo(directory)
    except MvcError as exc:
        return {"open": f"{type(exc).__name__}: {exc}"}
    with repo:
        try:
            report = repo.fsck()
            out["fsck"] = "ok" if not report.problems else "problems"
        except MvcError as exc:
            out["fsck"] = f"error {type(exc).__name__}"
        reads: dict[str, str] = {}
        for cid, state in expected.items():
            try:
                got = repo.read_state(cid)
            except MvcError as exc:
                reads[cid] = f"detected {type(exc).__name__}: {str(exc)[:200]}"
                continue
            reads[cid] = "same" if _same(got, state) else "different"
        out["reads"] = reads
    return out


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        expected = torch.load(job["expected"], weights_only=True)
        try:
            result = check(job["dir"], expected)
        except Exception:  # anything but a typed error is a finding
            result = {"crash": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
