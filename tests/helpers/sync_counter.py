"""Counting what would make the host wait for a GPU, on a machine without one (issue 27).

On CUDA a host synchronisation is a device-to-host copy (`.cpu()`, `.tolist()`), a value
read on the host (`.item()`, `bool()`, `int()`: aten's `_local_scalar_dense`), an op whose
output size depends on the data (`nonzero`, `masked_select`, boolean indexing, `unique`), or
one that reads its input's range back inside (CUDA's `bincount`, and `histc` given no range). On
the host all of these are plain work on host tensors, so this counter follows where the data
came from instead: the tensors it is told "live on the device" (`SyncCounter(device=...)`) and,
op by op, every output computed from one of them (a taint). One of the ops above on such a
tensor counts as a synchronisation; the same op on a small host-built table (thresholds,
centroids, the counts already copied back) does not, as on a GPU. Every aten op on such a tensor that
is not a view counts as one kernel launch (`ops`; host-built tables moved to the device do not
count, nor do the ops that make them: a lower bound on launches). A move to "the device" (`.to(device)` with device
the host here) cannot be told from a move to the host: the code under count skips moves to
where a tensor already is.

It also keeps the bytes the device would hold: every storage an op on device data wrote
(views share their base's), from the op that made it until the last tensor on it is gone
(`live_bytes`, `peak_bytes`; the tensors given as `device` are the baseline, not counted).
Like the launches, a lower bound: a device buffer made by a factory (`torch.empty(...,
device=)`) counts from the first op that writes device data into it.

    with SyncCounter(device=tensors) as c:
        run()
    c.syncs, c.waits, c.kinds, c.ops, c.peak_bytes

`waits` counts the synchronisations that find work queued: one that follows another with no
launch between them finds the queue empty (on a GPU it returns without waiting).
"""
from __future__ import annotations

import threading
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

_DATA_DEPENDENT = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "unique_dim",
                   "_unique2", "bincount", "histc")


def _histc_range(args: tuple, kwargs: dict) -> tuple[float, float]:
    lo = kwargs.get("min", args[2] if len(args) > 2 else 0)
    hi = kwargs.get("max", args[3] if len(args) > 3 else 0)
    return float(lo), float(hi)


class SyncCounter(TorchDispatchMode):
    """Counts the synchronisations and aten ops of the code run inside it (module docstring)."""

    def __init__(self, device: Iterable[torch.Tensor] = (), trace_bytes: int = 0) -> None:
        """`trace_bytes` > 0: remember where each device storage of at least that many bytes
        was made, and `at_peak` lists what was held at the peak (largest first)."""
        super().__init__()
        self._trace = trace_bytes
        self._origin: dict[int, str] = {}
        self.at_peak: list[tuple[int, str]] = []
        self._on: dict[int, weakref.ref] = {}  # by id (a tensor's == is elementwise)
        self._held: dict[int, int] = {}  # storage address -> bytes
        self._baseline: set[int] = set()  # the given tensors' storages: never counted
        self._lock = threading.Lock()  # finalizers may run on any thread
        self._live = 0
        self._freed: list[int] = []  # storages freed since `_drain` last ran
        self.peak_bytes = 0
        for t in device:
            self._mark(t, hold=False)
            self._baseline.add(t.untyped_storage().data_ptr())
        self.kinds: Counter[str] = Counter()
        self.ops = 0
        # a synchronisation with no launch since the last one finds the queue empty: on a GPU
        # it does not wait (`waits` counts those that do)
        self.waits = 0
        self._ops_at_wait = 0
        self._saved: dict[str, Any] = {}
        self._paused = 0

    @property
    def syncs(self) -> int:
        return sum(self.kinds.values())

    def _synced(self, kind: str) -> None:
        self.kinds[kind] += 1
        if self.ops > self._ops_at_wait:
            self.waits += 1
            self._ops_at_wait = self.ops

    def _mark(self, t: torch.Tensor, hold: bool = True, op: str = "") -> None:
        if hold:  # also when t is marked already: an in-place op may have resized it
            self._hold(t, op)
        if not self.on_device(t):
            self._on[id(t)] = weakref.ref(t)

    def _hold(self, t: torch.Tensor, op: str = "") -> None:
        # Storages keep their Python object while any tensor uses them (PyObject preservation),
        # so a finalizer on it runs when the memory is freed, however many views it had.
        storage = t.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if not key or not nbytes:
            return
        with self._lock:
            self._drain()
            if key in self._held or key in self._baseline:
                return
            self._held[key] = nbytes
            self._live += nbytes
            if self._trace and nbytes >= self._trace:
                self._origin[key] = f"{op} {_caller()}"
            if self._live > self.peak_bytes:
                self.peak_bytes = self._live
                if self._trace:
                    self.at_peak = sorted(((n, self._origin.get(k, "(small)"))
                                           for k, n in list(self._held.items())), reverse=True)
        weakref.finalize(storage, self._freed.append, key)

    def _drain(self) -> None:
        # Finalizers only queue the storages they free: one may run from a garbage collection
        # set off inside `_hold`, under the lock, and must neither wait for it nor change
        # `_held` under its loops.
        while self._freed:
            key = self._freed.pop()
            nbytes = self._held.pop(key, None)
            if nbytes is not None:
                self._live -= nbytes
                self._origin.pop(key, None)

    @property
    def live_bytes(self) -> int:
        """The bytes the device would hold now."""
        with self._lock:
            self._drain()
            return self._live

    def on_device(self, t: Any) -> bool:
        """Whether tensor `t` would live on the device: marked, an op's output (a view
        included) with a marked input, or on a storage that holds device data."""
        if not isinstance(t, torch.Tensor):
            return False
        ref = self._on.get(id(t))
        if ref is not None and ref() is t:
            return True
        # a tensor on memory that device data was written into (a buffer filled through a view)
        key = t.untyped_storage().data_ptr()
        if not key:
            return False
        with self._lock:
            self._drain()  # a freed storage's address may be a host tensor's now
            return key in self._held or key in self._baseline

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._paused:  # inside a Triton launch in the interpreter (`__enter__`)
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        tainted = any(self.on_device(a) for a in flat)
        if tainted and not func.is_view:  # a view launches nothing
            self.ops += 1
        name = str(func.overloadpacket.__name__)
        if tainted and name == "histc" and _histc_range(args, kwargs)[0] != _histc_range(args, kwargs)[1]:
            pass  # CUDA's histc reads its input's range back only when none is given (min == max)
        elif tainted and name in _DATA_DEPENDENT:
            self._synced(name)
        elif tainted and name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self._synced("bool index")
        out = func(*args, **kwargs)
        if tainted:
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor):
                    self._mark(o, op=name)
        return out

    def __enter__(self) -> SyncCounter:
        counter = self
        cpu, to, tolist = torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.tolist

        def host(t: torch.Tensor, orig: Any, *a: Any, **k: Any) -> Any:
            # a device-to-host copy: counted, and its result is a host tensor (on the host the
            # copy may be `t` itself: a new tensor stands for it, outside the count)
            counter._synced("to host")
            with _disable_current_modes():
                got = orig(t, *a, **k)
                return got.clone() if got.untyped_storage().data_ptr() == \
                    t.untyped_storage().data_ptr() else got

        def cpu_(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            return host(t, cpu, *a, **k) if counter.on_device(t) else cpu(t, *a, **k)

        def to_(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            dest = [x for x in (*a, k.get("device")) if isinstance(x, (str, torch.device))]
            if counter.on_device(t) and dest and torch.device(dest[0]).type == "cpu":
                return host(t, to, *a, **k)
            return to(t, *a, **k)

        def tolist_(t: torch.Tensor) -> Any:
            if counter.on_device(t):
                counter._synced("tolist")
            return tolist(t)

        # a Triton kernel (mvc.quant.triton_assign) is a launch aten does not see: counted, and
        # what it wrote followed as device data, when it read device data
        from mvc.quant import triton_assign

        @contextmanager
        def kernel(inputs: Any, outputs: Any) -> Iterator[None]:
            # the interpreter's own copies inside the launch are not the GPU's launches
            counter._paused += 1
            try:
                yield
            finally:
                counter._paused -= 1
            if any(counter.on_device(t) for t in inputs):
                counter.ops += 1
                for o in outputs:
                    counter._mark(o, op="triton kernel")

        triton_assign.launch_observers.append(kernel)
        self._saved["observer"] = kernel
        self._saved.update({"cpu": cpu, "to": to, "tolist": tolist})
        torch.Tensor.cpu = cpu_  # type: ignore[method-assign]
        torch.Tensor.to = to_  # type: ignore[method-assign,assignment]
        torch.Tensor.tolist = tolist_  # type: ignore[method-assign]
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        observer = self._saved.pop("observer", None)
        if observer is not None:
            from mvc.quant import triton_assign
            triton_assign.launch_observers.remove(observer)
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)


def _caller() -> str:
    """file:line of the innermost frames in mvc's own code that led here."""
    frames = [f for f in traceback.extract_stack() if "/mvc/" in f.filename]
    return " < ".join(f"{f.filename.rsplit('/mvc/', 1)[1]}:{f.lineno}" for f in frames[::-1][:3])


def cuda_syncs(fn: Any) -> int:
    """The synchronisations CUDA reports while `fn` runs (`torch.cuda.set_sync_debug_mode`)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in seen)
