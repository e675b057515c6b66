"""A state's host copy in memory another process maps, and the socket frames that hand it over.

A background commit in a child process (`mvc.integrations.commit_process`) needs the training
state's copy without a second copy on the way: pickling 1.5 GB of tensors through a pipe would
cost the training loop more than the commit saves it. So `SharedArena` gives
`host_copy.clone_to_cpu` its memory from anonymous shared files (``memfd_create``): the copy
is written once, by the parent, and the child maps the same pages. The files have no name, so
nothing is left behind if either process dies: the memory goes when the last process holding
it does.

`dumps` pickles an object whose arena tensors become references (segment, offset, byte
count, dtype, shape; an empty tensor its dtype and shape); `loads` in the other process turns
them back into tensors over its own mappings, one tensor object per reference (tied weights
stay tied). Tensors not in the arena are pickled as torch pickles them.

Frames on a Unix stream socket: a 12-byte header (payload length, descriptor count) sent with
the descriptors as ancillary data, then the payload.
"""
from __future__ import annotations

import gc
import io
import mmap
import os
import pickle
import socket
import struct
import traceback
import weakref
from typing import Any

import torch

from mvc.dtypes import dtype_name, parse_dtype
from mvc.errors import DataError, MvcError
from mvc.integrations.host_copy import view_key

#: Smallest shared file the arena makes; later ones double, so a state takes O(log size) files
#: (a descriptor each in one message: Linux passes at most 253).
SEGMENT_BYTES = 256 << 20
#: Offsets are aligned so (a tensor's dtype never needs more).
ALIGN = 64
#: Descriptors one frame may carry (Linux's SCM_MAX_FD).
MAX_FDS = 253

_HEADER = struct.Struct("<QI")


class ChannelClosedError(MvcError):
    """The process at the other end of a commit channel went away (or sent a broken frame)."""

    exit_code = 87


def supported() -> bool:
    """Whether this system has what the arena and its frames need (Linux's memfd, fd passing)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")


class SharedArena:
    """Memory for one state's copy in shared files; `allocate` is `clone_to_cpu`'s allocator.

    The arena keeps each tensor it handed out (so `dumps` can name it by identity) until
    `release`. Dtypes torch cannot view as bytes get plain memory and are pickled whole.
    """

    def __init__(self, min_segment: int = SEGMENT_BYTES) -> None:
        self._min = max(int(min_segment), mmap.PAGESIZE)
        self._fds: list[int] = []
        self._maps: list[mmap.mmap] = []
        self._sizes: list[int] = []
        self._seg = -1           # the segment being filled
        self._used = 0           # bytes used in it
        self._slots: dict[int, tuple[torch.Tensor, tuple[Any, ...]]] = {}
        # `view_key` -> reference: another object over a tensor handed out (a tied weight's
        # second name) crosses as a reference too, and arrives as another object
        self._views: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    @property
    def sizes(self) -> list[int]:
        """Each shared file's size in bytes, in order."""
        return list(self._sizes)

    @property
    def fds(self) -> list[int]:
        """The shared files' descriptors (until `release`)."""
        return list(self._fds)

    def allocate(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor | None:
        """An empty contiguous tensor of `shape` and `dtype` in shared memory (None for a dtype
        that is more than its bytes: the copy is then torch's, pickled whole)."""
        numel = 1
        for n in shape:
            numel *= int(n)
        itemsize = _itemsize(dtype)
        if not itemsize:
            return None
        nbytes = numel * itemsize
        if nbytes == 0:   # no bytes to share (torch cannot unpickle every empty tensor either)
            out = torch.empty(shape, dtype=dtype)
            self._slots[id(out)] = (out, ("mvc-empty", dtype_name(dtype),
                                          tuple(int(n) for n in shape)))
            return out
        at = -(-self._used // ALIGN) * ALIGN
        while self._seg < 0 or at + nbytes > self._sizes[self._seg]:
            if self._seg + 1 == len(self._sizes):
                self._grow(nbytes)
            self._seg, self._used, at = self._seg + 1, 0, 0
        seg = self._seg
        raw = torch.frombuffer(self._maps[seg], dtype=torch.uint8, count=nbytes, offset=at)
        out = raw.view(dtype).view(shape)
        self._used = at + nbytes
        ref = ("mvc-arena", seg, at, nbytes, dtype_name(dtype), tuple(int(n) for n in shape))
        self._slots[id(out)] = (out, ref)
        key = view_key(out)
        if key is not None:
            self._views[key] = ref
        return out

    def _grow(self, nbytes: int) -> None:
        if len(self._sizes) >= MAX_FDS:
            raise MemoryError(f"a state copy needs more than {MAX_FDS} shared files")
        size = max(nbytes, self._min, sum(self._sizes))
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("mvc-state-copy", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:   # 2 MiB pages where the system allows them for shared memory: fewer faults
                mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self._fds.append(fd)
        self._maps.append(mm)
        self._sizes.append(size)

    def reuse(self) -> None:
        """Start over at the first byte, keeping the shared files and their pages: a later copy
        writes into memory already faulted in (3-4x faster than fresh pages). Only for an arena
        whose earlier tensors nobody reads any more."""
        self._slots.clear()
        self._views.clear()
        self._seg, self._used = -1, 0

    def release(self) -> None:
        """Forget the tensors and the mappings: the memory is freed once no tensor made here
        is referenced any more. Never unmapped explicitly: a tensor from ``torch.frombuffer``
        holds its mapping by reference, not by a buffer export, so an explicit close would
        pull the pages from under a tensor still in use."""
        close_all(self._fds)
        self._fds = []
        self._slots.clear()
        self._views.clear()
        self._maps = []

    def dumps(self, obj: Any) -> bytes:
        """`obj` pickled, its arena tensors as references to the shared files."""
        buf = io.BytesIO()
        _ArenaPickler(buf, self._slots, self._views).dump(obj)
        return buf.getvalue()


class _ArenaPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, slots: dict[int, tuple[torch.Tensor, tuple[Any, ...]]],
                 views: dict[tuple[Any, ...], tuple[Any, ...]]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._slots = slots
        self._views = views

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            hit = self._slots.get(id(obj))
            if hit is not None and hit[0] is obj:
                return hit[1]
            key = view_key(obj)
            ref = self._views.get(key) if key is not None else None
            if ref is not None:
                return ("mvc-view",) + ref[1:]
        return None


class MappedSegments:
    """The other process's side: the shared files mapped, and `loads` that views them."""

    def __init__(self, fds: list[int], sizes: list[int]) -> None:
        if len(fds) != len(sizes):
            raise ChannelClosedError(f"{len(fds)} shared files arrived for {len(sizes)} segments")
        self._maps: list[mmap.mmap] = []
        try:
            for fd, size in zip(fds, sizes):
                if os.fstat(fd).st_size < size:
                    raise ChannelClosedError(f"a shared file holds {os.fstat(fd).st_size} bytes, "
                                             f"not the {size} announced")
                self._maps.append(mmap.mmap(fd, size))
        finally:
            close_all(fds)

    def loads(self, data: bytes) -> Any:
        """Unpickle `data` made by `SharedArena.dumps`, its references as tensors over the maps."""
        return _ArenaUnpickler(io.BytesIO(data), self._maps).load()

    def close(self) -> bool:
        """Drop the mappings; whether every one is gone (False: a tensor still views one, and
        keeps it mapped while it lives, so the sender must not write there again)."""
        alive = [weakref.ref(mm) for mm in self._maps]
        self._maps = []
        if any(ref() is not None for ref in alive):
            gc.collect()   # a view held only by a cycle (an exception's frames, say)
        return all(ref() is None for ref in alive)


class _ArenaUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, maps: list[mmap.mmap]) -> None:
        super().__init__(file)
        self._maps = maps
        self._memo: dict[tuple[Any, ...], torch.Tensor] = {}

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 3 and pid[0] == "mvc-empty":
            dtype = _dtype(pid)
            if 0 not in tuple(pid[2]):
                raise pickle.UnpicklingError(f"bad empty-tensor reference {pid!r}")
            return torch.empty(tuple(pid[2]), dtype=dtype)
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] in ("mvc-arena", "mvc-view")):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        key = tuple(pid[1:])
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._view_of(pid, key)
        # another object over the same values: a tied weight's second name, as it was sent
        return hit.detach() if pid[0] == "mvc-view" else hit

    def _view_of(self, pid: tuple[Any, ...], key: tuple[Any, ...]) -> torch.Tensor:
        seg, at, nbytes, _, shape = key
        dtype = _dtype(pid)
        if not 0 <= seg < len(self._maps):
            raise pickle.UnpicklingError(f"bad arena reference {pid!r}")
        if at < 0 or nbytes <= 0 or at + nbytes > len(self._maps[seg]):
            raise pickle.UnpicklingError(f"arena reference {pid!r} outside its shared file")
        raw = torch.frombuffer(self._maps[seg], dtype=torch.uint8, count=nbytes, offset=at)
        return raw.view(dtype).view(shape)


def _dtype(pid: tuple[Any, ...]) -> torch.dtype:
    """The dtype a reference names (its last field but one)."""
    try:
        return parse_dtype(pid[-2], "a state copy's reference")
    except DataError as exc:
        raise pickle.UnpicklingError(f"bad reference {pid!r}: {exc}") from None


_PLAIN_INTS = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                         torch.uint16, torch.uint32, torch.uint64})


def _itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of a dtype whose tensors are just their bytes; 0 for the others
    (quantized ones carry a scale, sub-byte ones pack bits), which the arena leaves to plain
    memory and pickling."""
    if dtype.is_floating_point or dtype.is_complex or dtype in _PLAIN_INTS:
        return int(dtype.itemsize)
    return 0


def close_all(fds: list[int]) -> None:
    """Close each descriptor (those a frame brought and nothing took over)."""
    for fd in fds:
        os.close(fd)


def pickled_exception(exc: BaseException) -> tuple[bytes | None, str, str]:
    """What crosses for an exception: (its pickle, or None where it does not pickle; its
    one-line text; its traceback). `rebuilt_exception` is the other side."""
    try:
        blob: bytes | None = pickle.dumps(exc)
    except Exception:
        blob = None
    return blob, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc))


def rebuilt_exception(blob: bytes | None, summary: str,
                      fallback: type[BaseException]) -> BaseException:
    """An exception the other process pickled (`blob`), rebuilt here; `fallback(summary)`
    when there is none or its class cannot be rebuilt here (its text still says what it was)."""
    exc: Any = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:
            exc = None
    return exc if isinstance(exc, BaseException) else fallback(summary)


# ---------------------------------------------------------------------- frames
def send_frame(sock: socket.socket, payload: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send one frame: the header (with `fds` attached), then `payload`."""
    header = _HEADER.pack(len(payload), len(fds))
    sent = socket.send_fds(sock, [header], list(fds)) if fds else sock.send(header)
    if sent < len(header):
        sock.sendall(header[sent:])
    sock.sendall(payload)


def recv_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """Receive one frame: its payload and the descriptors that came with it."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, MAX_FDS)
    try:
        if not data:
            raise ChannelClosedError("the other end closed the channel")
        header = bytearray(data)
        while len(header) < _HEADER.size:
            more = sock.recv(_HEADER.size - len(header))
            if not more:
                raise ChannelClosedError("the channel closed inside a frame header")
            header += more
        length, count = _HEADER.unpack(bytes(header))
        if count != len(fds):
            raise ChannelClosedError(f"a frame announced {count} descriptors and {len(fds)} came")
        payload = bytearray(length)
        view = memoryview(payload)
        got = 0
        while got < length:
            n = sock.recv_into(view[got:], length - got)
            if n == 0:
                raise ChannelClosedError(f"the channel closed after {got} of a frame's {length} bytes")
            got += n
        return bytes(payload), list(fds)
    except BaseException:
        close_all(fds)
        raise
