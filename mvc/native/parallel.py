"""One process-wide thread pool for independent native calls.

cffi's API-mode calls release the GIL, so native block coders run truly in
parallel on these threads.  Tasks must not call `pmap` themselves expecting
parallelism: inside a worker it runs inline, so nesting never deadlocks.

Work that must not slow the thread it runs beside -- a background commit next to the
training loop -- runs on a second pool whose threads are niced (`lower_this_thread`): a
thread that lowered its own priority hands its `pmap` calls to that pool.  On Linux the nice
value is per thread; elsewhere it is per process, so there nothing is lowered.

A task runs on the calling thread's CUDA device and streams (`callers_cuda`): a new thread's
are device 0 and each device's default stream, so a task that touched a tensor a caller made
inside ``torch.cuda.stream(s)`` -- a commit's levels crossing to the host, a moment measured,
a checkout's lookup -- would be ordered after none of the caller's work on `s`.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K", bound=Hashable)

_lock = threading.Lock()
#: The pools, by how many steps below normal their threads run (0: the shared one).
_pools: dict[int, ThreadPoolExecutor] = {}
_local = threading.local()


def worker_count() -> int:
    """Threads to use: $MVC_THREADS if set, else the CPUs this process may run on."""
    env = os.environ.get("MVC_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def scratch(nbytes: int) -> np.ndarray:
    """A per-thread reusable uint8 buffer of at least `nbytes`.

    Fresh multi-megabyte numpy buffers are mmapped, so every use would pay
    page faults and kernel zeroing; reusing one per thread avoids that.  The
    buffer is only valid until the same thread asks again.
    """
    import numpy as np

    buf = getattr(_local, "scratch", None)
    if buf is None or buf.size < nbytes:
        buf = np.empty(max(nbytes, 1 << 16), dtype=np.uint8)
        _local.scratch = buf
    return buf


#: Values per task when one large array's pass is split across the pool (`segments`): a few
#: milliseconds of work each, so dispatch costs nothing next to it.  A large tensor then takes
#: the whole pool instead of one thread (commits encode the largest tensors one at a time,
#: mvc.repo.pipeline); what a split pass computes does not depend on it.
SPLIT = 1 << 21


def segments(n: int, size: int | None = None) -> list[slice]:
    """`range(n)` cut into slices of `size` (default `SPLIT`; the last one shorter): one large
    array's pieces for `pmap`, so a single array's pass takes the whole pool."""
    size = max(1, SPLIT if size is None else size)
    return [slice(lo, min(n, lo + size)) for lo in range(0, n, size)]


#: An item over this share of one thread's part of a batch's work runs alone (`large_alone`).
LARGE_SHARE = 1 / 2
#: No item this small runs alone: its split passes would not fill the pool.
LARGE_FLOOR = 1 << 22


def large_alone(sizes: Mapping[K, int], threads: int | None = None) -> tuple[list[K], list[K]]:
    """(alone, shared): how a batch of items of these sizes (values of work each) runs.

    One per pool thread, an item over half a thread's part of the work is that thread's
    critical path, and `threads` of the largest ones hold their temporaries at once: at 124M
    parameters on 16 threads, the embedding and its two Adam moments, a third of all values.
    So those run alone, biggest first, each one's passes split across the pool (`segments`,
    the native kernels' chunks); the rest then share the pool, biggest first.  On a narrow
    pool (2 threads at 124M) nothing is that large: one item per thread packs it best, and
    the memory in flight is two items'.  `threads`: default `worker_count()`."""
    threads = worker_count() if threads is None else threads
    cut = max(LARGE_FLOOR, sum(sizes.values()) * LARGE_SHARE / max(1, threads))
    order = sorted(sizes, key=lambda k: -sizes[k])
    return [k for k in order if sizes[k] > cut], [k for k in order if sizes[k] <= cut]


def pmap_sized(fn: Callable[[K], R], sizes: Mapping[K, int]) -> dict[K, R]:
    """{k: fn(k)} for the keys of `sizes`, scheduled by `large_alone`: the large items one at
    a time on this thread (their own passes take the pool), then the rest on the pool.  The
    results must not depend on the schedule (they are the same calls)."""
    alone, shared = large_alone(sizes)
    out = {k: fn(k) for k in alone}
    out.update(zip(shared, pmap(fn, shared)))
    return out


def in_worker() -> bool:
    """True on a pool thread, where `pmap` runs inline (a split pass would only cost more)."""
    return bool(getattr(_local, "in_pool", False))


def _mark_worker() -> None:
    _local.in_pool = True


def get_pool() -> ThreadPoolExecutor:
    """The shared executor, created on first use; a thread that lowered its priority
    (`lower_this_thread`) gets a pool niced as much: its threads, started from that thread,
    are as low as it (Linux threads inherit the nice value of the thread that starts them)."""
    nice = this_thread_lowered()
    with _lock:
        pool = _pools.get(nice)
        if pool is None:
            # the pool's threads each get a malloc arena, whose free top glibc would keep
            from mvc.native.heap import bound_arena_tops

            bound_arena_tops()
            pool = _pools[nice] = ThreadPoolExecutor(
                max_workers=worker_count(), thread_name_prefix="mvc-native-low" if nice else "mvc-native",
                initializer=_mark_worker)
        return pool


def _lower(nice: int) -> bool:
    if not sys.platform.startswith("linux") or nice <= 0:
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:  # pragma: no cover - a sandbox that forbids it: run at normal priority
        return False
    return True


def lower_this_thread(nice: int) -> bool:
    """Run the calling thread `nice` steps (1-19) below its priority from now on, and its
    `pmap` calls on a pool niced as much (started from it: Linux threads inherit their
    starter's nice value): for a thread that only ever does background work (an unprivileged
    thread cannot raise its priority again). True when lowered; False on a
    system whose nice value is per process (not Linux), where nothing changes."""
    if not 0 < nice < 20:
        raise ValueError(f"nice must be 1..19, got {nice}")
    if not _lower(nice):
        return False
    _local.nice = nice
    return True


def this_thread_lowered() -> int:
    """How many steps `lower_this_thread` lowered the calling thread (0: not lowered)."""
    return int(getattr(_local, "nice", 0))


def _forget_pool() -> None:
    # A forked child inherits the executor objects but not their threads.
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def pmap(fn: Callable[[T], R], items: Iterable[T], threads: int | None = None) -> list[R]:
    """`[fn(x) for x in items]`, run on the pool when that can help.

    `threads=1` forces inline execution (used to measure the pool's speedup).
    Every task has finished when this returns or raises: tasks write into
    buffers the caller releases once it sees an error, so a failing task, a
    refused submission or an interrupted wait never leaves siblings running
    (tasks not started yet are cancelled).  The first exception (in item
    order) then propagates.
    """
    seq = list(items)
    if (len(seq) <= 1 or (threads or worker_count()) <= 1 or worker_count() <= 1
            or in_worker()):
        return [fn(x) for x in seq]
    futures: list[Future] = []
    task = _under(callers_cuda(), fn)
    try:
        pool = get_pool()
        for x in seq:
            futures.append(pool.submit(task, x))
        wait(futures)
    except BaseException:
        _settle(futures)
        raise
    error = next((f.exception() for f in futures if f.exception() is not None), None)
    if error is None:
        return [f.result() for f in futures]
    try:
        raise error
    finally:
        # This frame holds the futures and the error holds this frame: break the cycle, so
        # the error and the frames its traceback keeps die by reference count.
        error = futures = None  # type: ignore[assignment]


def callers_cuda() -> Callable[[], AbstractContextManager[None]]:
    """A context factory that puts another thread on the calling thread's CUDA device and the
    streams it chose, both read now (a stream left at its device's default is not entered:
    making that device current would start a CUDA context on a GPU this process may never
    use). `nullcontext` where no CUDA work can be in flight: torch not imported (this module
    never imports it) or CUDA not initialized. `pmap`'s tasks run under it; so does work
    handed to any other thread (the Tracker's background commits)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return nullcontext
    cuda = torch.cuda
    device = cuda.current_device()
    streams = [s for s in (cuda.current_stream(d) for d in range(cuda.device_count()))
               if s != cuda.default_stream(s.device)]

    @contextmanager
    def on_callers() -> Iterator[None]:
        with ExitStack() as ctx:
            for s in streams:
                ctx.enter_context(cuda.stream(s))
            ctx.enter_context(cuda.device(device))   # last: each stream made its device current
            yield
    return on_callers


def _under(context: Callable[[], AbstractContextManager[None]], fn: Callable[[T], R]
           ) -> Callable[[T], R]:
    if context is nullcontext:
        return fn

    def task(x: T) -> R:
        with context():
            return fn(x)
    return task


def _settle(futures: list[Future]) -> None:
    """Cancel tasks not started and wait for the running ones, through further interrupts."""
    for f in futures:
        f.cancel()
    while True:
        try:
            wait(futures)
            return
        # A second Ctrl-C: the tasks still write into the caller's buffers.
        except BaseException:  # noqa: BLE001, S112
            continue
