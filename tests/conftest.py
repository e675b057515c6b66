"""Shared fixtures: repositories and realistic checkpoints."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import realistic_state  # noqa: E402


@pytest.fixture
def repo(tmp_path):
    from mvc.repo.repository import Repo

    r = Repo.init(tmp_path / "r")
    # These tests pin the exact (lossless) path; lossy ones pass quant= or set the mode.
    r.config.set("commit.mode", "lossless")
    yield r
    r.close()


@pytest.fixture
def state():
    return realistic_state(seed=0)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
