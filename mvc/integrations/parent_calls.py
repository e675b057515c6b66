"""Calls a background commit process makes back into the training process.

A Tracker's `quality` callable judges each search trial on the training process's model (a
copy of it, the candidate's tensors loaded), with its data; none of that needs to pickle, and
none of it is in the child (`mvc.integrations.commit_process`). So the child's commit gets
stand-ins: a `ParentCall` takes the place of the quality function (and of the Hessians a
fidelity gate collects), and calling it sends its arguments over the commit's channel. Their
tensors go in shared memory the child writes once (`SharedArena`; reused for the next call
once the training process let go of it), everything else pickled. The worker thread that is
waiting for the commit in the training process runs the real function there (`serve_call`)
and sends back its value (tensors in shared memory too), or the exception it raised, which
the stand-in raises in the child: the commit fails with it, as on a thread.

Only the calls cross. The rest of the commit -- quantizing the trials, the moments, encoding,
writing -- runs in the child, off the training loop's interpreter lock.
"""
from __future__ import annotations

import pickle
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mvc.errors import InternalError, MvcError
from mvc.integrations.host_copy import clone_to_cpu
from mvc.integrations.shared_copy import (MappedSegments, SharedArena, close_all,
                                          pickled_exception, rebuilt_exception, recv_frame,
                                          send_frame)
from mvc.search.fidelity import Fidelity, FidelityError, FidelityOutputs


class ParentCallError(MvcError):
    """A function the background commit called in the training process raised an exception
    that cannot be rebuilt in the commit process, or returned a value that cannot cross."""

    exit_code = 88


class ParentCall:
    """A stand-in, in the commit process, for a function of the training process.

    `kind` names it to the training process (`serve_call`'s `calls`); `name` is the real
    function's ``__name__`` (a commit records its quality function's name). `keep`, for a
    call whose first argument is a nested state: its top-level keys the function reads (the
    Tracker's evaluator reads ``"model"``); the rest does not cross. Pickles by value: it is
    sent to the child with the commit's arguments."""

    def __init__(self, kind: str, name: str | None = None,
                 keep: tuple[str, ...] | None = None) -> None:
        self.kind, self.keep = kind, keep
        self.__name__ = name or kind

    def __call__(self, *args: Any) -> Any:
        channel = _CHANNEL
        if channel is None:
            raise InternalError(f"the training process's {self.kind!r} function was called "
                                "outside a background commit process's commit")
        if self.keep is not None and args and isinstance(args[0], Mapping):
            args = ({k: v for k, v in args[0].items() if k in self.keep}, *args[1:])
        return channel.call(self.kind, args)

    def __repr__(self) -> str:
        return f"ParentCall({self.kind!r}, {self.__name__!r})"


class ChildChannel:
    """The commit process's end of the calls, over the commit's socket (one call at a time:
    the commit waits for each)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._spare: SharedArena | None = None
        self._gates: dict[int, Fidelity] = {}   # see `_GateOutputs`
        #: The exception the last call raised (the commit's answer says whether it failed it).
        self.raised: BaseException | None = None

    def call(self, kind: str, args: tuple[Any, ...]) -> Any:
        """Run `kind` on `args` in the training process; its value, or raise what it raised."""
        arena, self._spare = self._spare, None
        if arena is None:
            arena = SharedArena()
        else:
            arena.reuse()
        try:
            sent = clone_to_cpu(args, allocate=arena.allocate)
            payload = arena.dumps(sent)
            del sent
            send_frame(self.sock, pickle.dumps(("call", kind, arena.sizes, payload)), arena.fds)
            data, fds = recv_frame(self.sock)
        except BaseException:
            arena.release()
            raise
        try:
            reply = pickle.loads(data)
            ok = isinstance(reply, tuple) and len(reply) in (4, 5) and reply[0] in ("value", "raised")
            if not ok:
                raise InternalError(f"the training process answered a call with {reply!r:.80}")
        except BaseException:
            close_all(fds)
            arena.release()
            raise
        if reply[-1] is True:   # it let go of every view of the arguments: written again next call
            self._spare = arena
        else:
            arena.release()
        if reply[0] == "value":
            return self._local(MappedSegments(fds, reply[1]).loads(reply[2]))
        close_all(fds)
        _, blob, summary, _tb, _clean = reply
        exc = rebuilt_exception(blob, f"the training process's {kind} function raised {summary}",
                                ParentCallError)
        self.raised = exc
        raise exc

    def _local(self, value: Any) -> Any:
        if not isinstance(value, _GateOutputs):
            return value
        gate = self._gates.get(value.gate)
        if gate is None:
            metric, threshold, confidence = value.spec
            gate = self._gates[value.gate] = Fidelity(_judges_only, None, metric, threshold,
                                                      confidence)
        return FidelityOutputs(value.outputs, gate)

    def close(self) -> None:
        """Free the shared memory kept for the next call."""
        arena, self._spare = self._spare, None
        if arena is not None:
            arena.release()


#: The channel of the commit the commit process is running (None between commits).
_CHANNEL: ChildChannel | None = None


def open_channel(sock: socket.socket) -> ChildChannel:
    """Make `sock` the channel `ParentCall`s use, for the commit about to run."""
    global _CHANNEL
    _CHANNEL = ChildChannel(sock)
    return _CHANNEL


def close_channel() -> None:
    """The commit ended: no more calls, and the call arguments' memory freed."""
    global _CHANNEL
    channel, _CHANNEL = _CHANNEL, None
    if channel is not None:
        channel.close()


# ---------------------------------------------------------------------- the training process
def serve_call(msg: tuple[Any, ...], fds: list[int], calls: Mapping[str, Callable[..., Any]]
               ) -> tuple[bytes, list[int], BaseException | None, SharedArena | None]:
    """Run one call the commit process sent (`msg`, with the descriptors of its arguments'
    shared memory) with the function `calls` names for it.

    Returns (the answer to send, the descriptors to send with it, the exception the function
    raised or None, the arena holding the value's tensors: release it once sent)."""
    try:
        _, kind, sizes, payload = msg
    except (TypeError, ValueError):
        close_all(fds)
        raise InternalError(f"a malformed call from the commit process: {msg!r:.80}") from None
    maps = MappedSegments(fds, sizes)
    args: Any = None
    try:
        fn = calls.get(kind)
        if fn is None:
            raise InternalError(f"the commit process called {kind!r}, which this commit did not send")
        args = maps.loads(payload)
        value = fn(*args)
        args = None
    except BaseException as exc:
        args = None   # the exception's frames may still view them: then the child writes elsewhere
        return _raised(exc, maps.close()), [], exc, None
    clean = maps.close()
    arena = SharedArena()
    try:
        out = _portable(value, arena.allocate)
        answer = pickle.dumps(("value", arena.sizes, arena.dumps(out), clean))
    except Exception as exc:
        arena.release()
        why = ParentCallError(f"the {kind} function returned a {type(value).__name__}, which "
                              f"cannot be sent to the background commit process ({exc})")
        return _raised(why, clean), [], why, None
    return answer, arena.fds, None, arena


@dataclass(frozen=True)
class _GateOutputs:
    """A fidelity gate's outputs as they cross: the search judges outputs by the gate they came
    from, one object for the whole search (`mvc.search.fidelity.FidelityJudge`), and a gate
    from a module pickles its model and inputs. So only the gate's identity here and its
    judging parameters cross; the commit process makes one gate per identity that judges
    (`ChildChannel._local`) and cannot evaluate."""

    outputs: Any
    gate: int
    spec: tuple[str, float, float | None]


def _portable(value: Any, allocate: Callable[..., Any]) -> Any:
    """`value` as it crosses to the commit process: its tensors copied to the host, into
    `allocate`'s shared memory; a fidelity gate's outputs (a GPU model's logits, on the GPU)
    copied so too, where a dataclass holding them would be pickled whole, device and all, and
    the commit process (no CUDA) could not load it."""
    if isinstance(value, FidelityOutputs):
        g = value.gate
        return _GateOutputs(clone_to_cpu(value.outputs, allocate=allocate), id(g),
                            (g.metric, g.threshold, g.confidence))
    return clone_to_cpu(value, allocate=allocate)


def _judges_only(subject: Any, inputs: Any) -> Any:
    raise FidelityError("this fidelity gate stands in, in a background commit process, for one "
                        "in the training process: it judges outputs, it cannot compute them")


def _raised(exc: BaseException, clean: bool) -> bytes:
    return pickle.dumps(("raised", *pickled_exception(exc), clean))
