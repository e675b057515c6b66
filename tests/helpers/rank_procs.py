"""Real ranks for the distributed tests: a worker script of this folder started once per rank,
each leaving a report file the test reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from locations import HELPERS


def run_ranks(worker: str, args: Sequence[str], report: Callable[[int], Path], *,
              world: int = 2, env: Mapping[str, str] | None = None,
              timeout: float = 300) -> list[Any]:
    """Run ``python HELPERS/<worker> RANK *args`` for each rank of `world` at once (one
    intra-op thread each, `env` added), wait for all, and return what each left at
    `report(rank)` (a .json file read as JSON, anything else with `torch.load`).  A rank that
    left nothing fails the test with the end of its output."""
    full = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    procs = [subprocess.Popen([sys.executable, str(HELPERS / worker), str(r), *args], env=full,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    reports = []
    for r in range(world):
        path = report(r)
        assert path.exists(), f"rank {r} reported nothing:\n{outs[r][-4000:]}"
        reports.append(json.loads(path.read_text()) if path.suffix == ".json"
                       else torch.load(path, weights_only=False))
    return reports


def with_helpers_path() -> dict[str, str]:
    """PYTHONPATH for a worker that imports this folder's modules."""
    return {"PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])}
