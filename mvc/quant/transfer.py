"""Quantizations across the host/accelerator boundary.

A commit made from CUDA tensors quantizes them on the GPU, then entropy-codes the levels in C
on the host; a checkout does the reverse. What crosses is the levels (1-2 bytes a value) and
small tables, never the float values: a quarter of a float32 state or less.

Plain (pageable) copies on purpose: an H200 profile of a 124M-parameter commit (issue 27)
spent 0.2-0.3 s in `cudaHostAlloc` when the levels went through one pinned staging buffer,
more than the copies themselves take from pageable memory.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import torch

from mvc.quant.tensor import QuantizedTensor

K = TypeVar("K")

HOST = torch.device("cpu")


def quantized_to_host(qs: Mapping[K, QuantizedTensor]) -> dict[K, QuantizedTensor]:
    """`qs` with every quantization in host memory (those there already as they are), moved
    in one pass before any of them is encoded: the encoders' threads then never wait for the
    device."""
    return {key: q.to(HOST) for key, q in qs.items()}


def quantized_to_device(q: QuantizedTensor, device: torch.device) -> QuantizedTensor:
    """`q` on `device`: its levels, centroids and protected values (a checkout then looks the
    values up there)."""
    return q.to(device)
