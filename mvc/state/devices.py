"""Where a restore puts its tensors: a `map_location` checked before anything is read.

torch takes a device string it cannot parse, or a CUDA device this process cannot use, with an
`AssertionError` or a `RuntimeError` from deep inside the first copy; a checkout asked for one
says so up front, as a `UsageError` naming the argument.
"""
from __future__ import annotations

import torch

from mvc.errors import UsageError


def target_device(map_location: str | torch.device | None) -> torch.device | None:
    """`map_location` as a device (None stays None: each tensor goes back to the device it was
    committed from). Raises `UsageError` for what names no device, a CUDA device where CUDA
    is not available, or a device index this host does not have."""
    if map_location is None:
        return None
    if not isinstance(map_location, (str, torch.device)):
        raise UsageError(f"map_location must be a device name or a torch.device (e.g. 'cpu', "
                         f"'cuda:0'), got {type(map_location).__name__}")
    try:
        device = torch.device(map_location)
    except (RuntimeError, ValueError):
        raise UsageError(f"map_location {map_location!r} is not a device "
                         "(e.g. 'cpu', 'cuda', 'cuda:1')") from None
    check_usable(device, f"map_location {str(map_location)!r}")
    if device.type == "cuda" and device.index is None:
        # "cuda" is this thread's current device; a pool thread's is device 0, so a rank that
        # set its own would decode onto GPU 0 (memory there, a copy across) unless resolved here
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_usable(device: torch.device, what: str) -> None:
    """Raise `UsageError` (naming `what`) when `device` is one this process cannot put tensors
    on: CUDA with no CUDA or too few devices, or another accelerator its torch lacks."""
    if device.type in ("cpu", "meta"):
        return
    if device.type != "cuda":
        try:   # each backend refuses in its own way (an AssertionError, a RuntimeError)
            torch.empty(0, device=device)
        except Exception as exc:  # noqa: BLE001 - whatever the backend raises, the device is unusable
            raise UsageError(f"{what}: {device.type} is not available here ({exc}); pass "
                             "map_location='cpu'") from None
        return
    if not torch.cuda.is_available():
        raise UsageError(f"{what}: CUDA is not available here; pass map_location='cpu'")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"{what}: this host has {torch.cuda.device_count()} CUDA device(s), "
                         f"no index {device.index}; pass map_location='cuda:0' or 'cpu'")
