"""When a device runs out of memory: what counts as that, and the host copies the work moves to.

A training process often leaves its GPU nearly full (the batch size is tuned until it is), and
a commit's hook or a checkout's lookups need room beside the state. Running out there is no
reason to lose the commit or the restore: the same work runs on the host, which gives the same
levels and the same bits (issue 27: same answers on every device), only slower.  The callers
(`mvc.repo.pipeline.plan`, `mvc.repo.reader`) decide when to retry; this module only names the
error and makes the copies.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

#: What torch raises when a device's allocator cannot serve a request (torch.OutOfMemoryError
#: in torch >= 2.5, of which this is an alias there; a RuntimeError subclass either way).
DEVICE_OUT_OF_MEMORY: type[BaseException] = torch.cuda.OutOfMemoryError


def off_host(t: torch.Tensor) -> bool:
    """Whether `t` is outside host memory."""
    return t.device.type != "cpu"


def other_accelerators(t: torch.Tensor) -> bool:
    """Whether `t` is on an accelerator other than a CUDA GPU (Apple's MPS, XLA, ...): the
    quantizer's device path is CUDA's (float64 sums, which MPS lacks; CUDA streams), so such a
    tensor is quantized from a host copy."""
    return t.device.type not in ("cpu", "cuda", "meta")


def host_copies(tensors: Mapping[str, torch.Tensor],
                which: Callable[[torch.Tensor], bool] = off_host) -> dict[str, torch.Tensor]:
    """`tensors` with every tensor `which` selects (default: every one not in host memory)
    copied to host memory, the others as they are (so nothing is copied twice). The copies keep
    each tensor's values, dtype and shape."""
    return {name: t.detach().cpu() if which(t) and off_host(t) else t
            for name, t in tensors.items()}


def on_devices(candidate: Mapping[str, torch.Tensor], originals: Mapping[str, torch.Tensor],
               copies: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host-made candidate state moved back to where each tensor came from (`originals`,
    whose host copies are `copies`), for a quality function that expects the state where the
    model lives.  A tensor the candidate left as it was (its host copy) is the original itself:
    no second copy of it goes to the device."""
    out: dict[str, torch.Tensor] = {}
    for name, t in candidate.items():
        orig = originals.get(name)
        if orig is None or orig.device == t.device:
            out[name] = t
        elif t is copies.get(name):
            out[name] = orig
        else:
            out[name] = t.to(orig.device)
    return out


def device_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes of `tensors` that are not in host memory (what a move to the host copies)."""
    return sum(t.numel() * t.element_size() for t in tensors.values() if t.device.type != "cpu")
