"""Background commits in a child process, so that the training loop keeps Python to itself.

A background commit on a thread of the training process shares its interpreter lock with the
training loop. Much of a commit runs in native code without it, but its Python parts (the
config search, the writer's bookkeeping) take it for milliseconds at a time, and a training
loop that launches kernels needs it between every two: a GPU loop's steps ran 2.7x slower
while a background commit ran beside it. A child process has a lock of its own.

`CommitProcess` starts the child (``python -c``, never re-running the training script: a
script without a ``__main__`` guard stays safe) on the first commit, opens the repository
there by path, and keeps both for later commits (the child keeps its in-memory level cache for
the next delta, as a thread would). Each commit's state copy is written by the training
process straight into shared memory the child maps (`mvc.integrations.shared_copy`); only the
state's structure and the commit's arguments are pickled. The child runs ``Repo.commit`` with
them, ``nice`` steps below the training loop, with no CUDA device (it commits the host copy),
and answers with the commit id, or the exception it raised, and the warnings it caught. A
function only the training process can run (a Tracker's quality callable, on its model) goes
as a stand-in the child calls back through the channel (`mvc.integrations.parent_calls`): the
thread waiting for the commit runs it and answers.

A child that dies mid-commit leaves the repository as any interrupted commit does (nothing, or
the whole commit): the call raises `CommitProcessError` and the next commit starts a new child.
The child exits when its channel closes, so it never outlives the training process by more than
the commit it is writing.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mvc.errors import MvcError
from mvc.integrations.host_copy import clone_to_cpu
from mvc.integrations.parent_calls import ChildChannel, close_channel, open_channel, serve_call
from mvc.integrations.shared_copy import (ChannelClosedError, MappedSegments, SharedArena,
                                          close_all, pickled_exception, rebuilt_exception,
                                          recv_frame, send_frame, supported)
from mvc.native.parallel import worker_count
from mvc.repo.repository import Repo

#: What the child runs: argv[1] its socket's descriptor, argv[2] how many nice steps to drop.
#: The nice value is set before torch is imported, so every thread the child starts inherits it.
#: It stays in the training's session: Linux's autogroup scheduling shares the CPUs equally
#: between sessions, whatever their nice values, so a child in a session of its own took half
#: of them from the loop. The terminal's ^C is the training loop's to handle: the child
#: ignores it, finishes the commit it is writing and exits when its channel closes.
_CHILD = ("import signal, sys\n"
          "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
          "from mvc.native.parallel import lower_this_thread\n"   # imports no torch
          "if int(sys.argv[2]):\n"
          "    lower_this_thread(int(sys.argv[2]))\n"
          "from mvc.integrations.commit_process import serve\n"
          "serve(int(sys.argv[1]))\n")


class CommitProcessError(MvcError):
    """The background commit process could not start, or ended before it answered."""

    exit_code = 86


class SharedState:
    """A state's host copy in shared memory (`CommitProcess.copy`), until
    `CommitProcess.release`."""

    def __init__(self, arena: SharedArena, obj: Any) -> None:
        self.arena, self.obj = arena, obj
        #: Whether the child has let go of every tensor of it (the memory may be written again).
        self.reusable = False

    def add(self, obj: Any) -> Any:
        """`obj` with its tensors copied into this copy's shared memory too."""
        return clone_to_cpu(obj, allocate=self.arena.allocate)



class CommitProcess:
    """A child process that runs `Repo.commit` on the repository at `repo_path`.

    `copy(state)` makes the host copy (in the training loop: it is what the loop waits for);
    `commit(copy, pack(copy, state, message, **kwargs))` has the child commit it and returns
    the id (on a worker thread of the training process, which only waits). One commit at a
    time."""

    def __init__(self, repo_path: str | os.PathLike, *, nice: int = 0) -> None:
        if not supported():
            raise CommitProcessError("background commit processes need Linux (memfd_create and "
                                     "descriptor passing)")
        self.repo_path = Path(repo_path)
        self.nice = int(nice)
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()      # the channel, and `_spare`
        self._spare: SharedArena | None = None

    @property
    def pid(self) -> int | None:
        """The running child's pid (None before the first commit or after it ended)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def copy(self, obj: Any, *, warm_only: bool = False) -> SharedState | None:
        """`obj` (a nested state) with every tensor copied into shared host memory: the memory
        of the last copy the child let go of, when there is one (its pages already faulted in),
        else new; with `warm_only`, None instead of new memory (fresh shared pages fault about
        twice as slowly as a plain allocation's: a caller in a hurry copies to plain memory)."""
        with self._lock:
            arena, self._spare = self._spare, None
        if arena is None and warm_only:
            return None
        if arena is None:
            arena = SharedArena()
        else:
            arena.reuse()
        try:
            return SharedState(arena, clone_to_cpu(obj, allocate=arena.allocate))
        except BaseException:
            arena.release()
            raise

    def release(self, shared: SharedState) -> None:
        """Done with `shared`: its memory is kept for the next copy when the child let go of
        it (one copy's worth, until `close`), else freed."""
        shared.obj = None
        with self._lock:
            if shared.reusable and self._spare is None:
                self._spare = shared.arena
                return
        shared.arena.release()

    @staticmethod
    def pack(shared: SharedState, state: Any, message: str, **kwargs: Any) -> bytes:
        """The message for ``Repo.commit(state, message, **kwargs)``: the tensors of `shared`'s
        copy (which `state` and `kwargs` hold) go by reference. Raises what pickling raises for
        an argument that cannot cross (a lambda in a policy, say)."""
        return shared.arena.dumps((state, message, kwargs))

    def commit(self, shared: SharedState, payload: bytes,
               calls: Mapping[str, Callable[..., Any]] | None = None) -> str:
        """Have the child run the commit `payload` (`pack`) over `shared`'s memory; its id.

        `calls`: the functions the payload's `ParentCall` stand-ins name (`mvc.integrations.
        parent_calls`), run here, on this thread, when the child's commit calls them.
        Raises what the child's commit raised (re-made here when it unpickles, else a
        `CommitProcessError` naming it), with a note that it came from the child; an
        exception one of `calls` raised that failed the commit is raised as itself."""
        raised: BaseException | None = None
        with self._lock:
            sock = self._started()
            try:
                send_frame(sock, pickle.dumps(("commit", shared.arena.sizes, payload)),
                           shared.arena.fds)
                while True:
                    data, fds = recv_frame(sock)
                    try:
                        reply = pickle.loads(data)
                    except BaseException:
                        close_all(fds)
                        raise
                    if not (isinstance(reply, tuple) and reply and reply[0] == "call"):
                        close_all(fds)
                        break
                    answer, out_fds, exc, arena = serve_call(reply, fds, calls or {})
                    raised = exc if exc is not None else raised
                    try:
                        send_frame(sock, answer, out_fds)
                    finally:
                        if arena is not None:
                            arena.release()
            except (ChannelClosedError, OSError, pickle.UnpicklingError, EOFError) as exc:
                raise self._died(exc) from None
            except BaseException:
                self._stop()   # the channel is out of step: no later commit may read its rest
                raise
        return self._answer(reply, shared, raised)

    def _answer(self, reply: Any, shared: SharedState, raised: BaseException | None = None) -> str:
        kind = reply[0] if isinstance(reply, tuple) and reply else None
        if kind == "done":
            _, cid, caught, clean = reply
            shared.reusable = clean is True
            _rewarn(caught)
            return str(cid)
        if kind == "failed":
            _, blob, summary, tb, caught, from_call, clean = reply
            shared.reusable = clean is True
            _rewarn(caught)
            if from_call is True and raised is not None:
                raised.add_note(f"mvc: it failed the commit in the background commit process "
                                f"(pid {self.pid}), which called it here")
                raise raised
            exc = rebuilt_exception(blob, f"the background commit process raised {summary}",
                                    CommitProcessError)
            exc.add_note(f"mvc: raised in the background commit process (pid {self.pid}); "
                         f"its traceback:\n{tb.rstrip()}")
            raise exc
        raise CommitProcessError(f"the background commit process sent {kind!r}, not an answer")

    def _started(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        # The child imports the modules this process imported; it commits a host copy, so it
        # never holds a CUDA context (hundreds of MB on the device) of its own.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["CUDA_VISIBLE_DEVICES"] = ""
        # One CPU fewer than this process may use, so the loop's thread keeps one: a niced
        # thread sharing a CPU with it gets a tenth of that CPU, and every parallel pass of the
        # commit waits for its slowest thread.
        threads = max(1, worker_count() - 1)
        env.setdefault("MVC_THREADS", str(threads))
        try:
            omp = int(env.get("OMP_NUM_THREADS", ""))
        except ValueError:
            omp = 0
        if not 1 <= omp <= threads:
            env["OMP_NUM_THREADS"] = str(threads)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(theirs.fileno()), str(max(0, self.nice))],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise CommitProcessError(f"could not start the background commit process: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        try:
            send_frame(ours, pickle.dumps(("open", str(self.repo_path))))
        except OSError as exc:
            raise self._died(exc) from None
        return ours

    def _died(self, exc: BaseException) -> CommitProcessError:
        proc = self._proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        pid = proc.pid if proc is not None else None
        self._stop()
        return CommitProcessError(
            f"the background commit process (pid {pid}) ended with exit code {code} before it "
            f"answered ({exc}); the commit may or may not have been written (check `mvc log`); "
            f"the next commit starts a new process")

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self, timeout: float = 60.0) -> None:
        """Ask the child to exit (after the commit it is writing) and wait for it."""
        with self._lock:
            sock, proc = self._sock, self._proc
            self._sock = self._proc = None
            spare, self._spare = self._spare, None
            if spare is not None:
                spare.release()
            if sock is not None:
                try:
                    send_frame(sock, pickle.dumps(("exit",)))
                except OSError:
                    pass
                sock.close()
            if proc is not None:
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def __del__(self) -> None:
        # Closing the channel is enough: the child exits when it reads the end.
        if getattr(self, "_sock", None) is not None:
            self._sock.close()  # type: ignore[union-attr]


def _rewarn(caught: list[tuple[Any, str]]) -> None:
    for category, text in caught:
        if not (isinstance(category, type) and issubclass(category, Warning)):
            category = UserWarning
        warnings.warn(category(text), stacklevel=4)


# ---------------------------------------------------------------------- the child
def serve(fd: int) -> None:
    """The child's loop: open the repository, then commit each state sent until the channel
    closes or says exit."""
    sock = socket.socket(fileno=fd)
    repo: Any = None   # the Repo, or the exception opening it raised (each commit's answer)
    try:
        while True:
            try:
                data, fds = recv_frame(sock)
            except ChannelClosedError:
                return
            msg = pickle.loads(data)
            if msg[0] == "exit":
                return
            if msg[0] == "open":
                try:
                    repo = Repo(msg[1])
                except BaseException as exc:  # answered with the first commit
                    repo = exc
                continue
            if msg[0] == "commit":
                channel = open_channel(sock)
                try:
                    answer = _commit(repo, msg[1], msg[2], fds, channel)
                finally:
                    close_channel()
                send_frame(sock, pickle.dumps(answer))
    finally:
        if repo is not None and not isinstance(repo, BaseException):
            repo.close()
        sock.close()


def _commit(repo: Any, sizes: list[int], payload: bytes, fds: list[int],
            channel: ChildChannel | None = None) -> tuple[Any, ...]:
    """One commit's answer: ("done", id, warnings, clean) or ("failed", pickled exception or
    None, its text, traceback, warnings, from_call, clean); from_call: the exception is the one
    a call into the training process raised (`channel`'s), which that process still holds;
    clean: the shared memory is unmapped (no tensor over it survived the commit), so the
    training process may write there again."""
    caught: list[warnings.WarningMessage] = []
    maps: MappedSegments | None = None
    answer: tuple[Any, ...]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            maps = MappedSegments(fds, sizes)
            fds = []
            if isinstance(repo, BaseException):
                raise repo
            state, message, kwargs = maps.loads(payload)
            cid = repo.commit(state, message, **kwargs)
            del state, kwargs
        answer = ("done", cid, _warnings_out(caught))
    except BaseException as exc:  # everything goes back to the training process
        from_call = channel is not None and exc is channel.raised
        answer = ("failed", *pickled_exception(exc), _warnings_out(caught), from_call)
        del exc   # its traceback's frames view the state
    if channel is not None:
        channel.raised = None
    close_all(fds)
    clean = maps.close() if maps is not None else True
    return (*answer, clean)


def _warnings_out(caught: list[warnings.WarningMessage]) -> list[tuple[Any, str]]:
    out: list[tuple[Any, str]] = []
    for w in caught:
        category: Any = w.category
        try:
            pickle.dumps(category)
        except Exception:
            category = None
        out.append((category, str(w.message)))
    return out
