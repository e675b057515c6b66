"""Shared fixtures: repositories and realistic checkpoints."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

# Without CUDA, Triton kernels (mvc.quant.triton_assign) run on host tensors in Triton's
# interpreter, which Triton turns on only if this is set before it is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests/helpers is on sys.path (pyproject.toml: [tool.pytest.ini_options] pythonpath).
from checkpoints import realistic_state
from cli_helpers import init_work


@pytest.fixture
def repo(tmp_path):
    from mvc.repo.repository import Repo

    r = Repo.init(tmp_path / "r")
    # These tests pin the exact (lossless) path; lossy ones pass quant= or set the mode.
    r.config.set("commit.mode", "lossless")
    yield r
    r.close()


@pytest.fixture
def work(tmp_path):
    """A working directory holding a new repository (`mvc init`) that commits losslessly; the
    CLI tests run `mvc` in it. Modules needing more (a checkpoint path, a first commit) override
    it with a `work(work)` fixture of their own."""
    return init_work(tmp_path, {"commit.mode": "lossless"})


@pytest.fixture
def state():
    return realistic_state(seed=0)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures(...)`): on tiny
    matmuls a second thread only adds spin-wait contention on 2 cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
