"""Where the lossy DCP writer's sums are reduced (issue 27): on a GPU job's group, which is
usually NCCL's alone and reduces CUDA tensors only, a host tensor's all_reduce fails; gloo and
mixed groups take host tensors. The gloo path itself runs in the multi-process DCP tests."""
from __future__ import annotations

import pytest
import torch

from mvc.dcp.lossy import reduce_device

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("backend", ["gloo", "GLOO", "mpi", "cpu:gloo,cuda:nccl"])
def test_a_group_that_takes_host_tensors_reduces_on_the_host(backend):
    assert reduce_device(backend) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host-only case")
def test_without_cuda_every_group_reduces_on_the_host():
    assert reduce_device("nccl") == torch.device("cpu")


@cuda
def test_an_nccl_groups_sums_go_to_the_current_cuda_device():  # pragma: no cover - no GPU in CI
    assert reduce_device("nccl") == torch.device("cuda", torch.cuda.current_device())
