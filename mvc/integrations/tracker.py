"""`Tracker`: commit checkpoints from a training loop (Inshrinkerator §4.5, §7).

    tracker = Tracker(repo, model, optimizer, quality=eval_loss, every=500)
    for step in ...:
        loss.backward()
        tracker.after_backward()          # gradient EMA, only near a scheduled commit
        optimizer.step(); optimizer.zero_grad()
        if tracker.should_commit():
            tracker.commit(f"step {tracker.steps}", background=True)
    tracker.wait()

Gradient EMA.  `after_backward()` folds each parameter's gradient into a
`GradientEMA` (mvc/integrations/grad_ema.py: EMA_t = beta g_t + (1 - beta) EMA_{t-1},
beta = 0.9, §4.5), but only during the `grad_window` steps before a scheduled commit
(every `every` steps; with every=None, always).  The EMA restarts after every commit.
It feeds sensitivity pruning/protection and is keyed by the flattened state name
``model/<parameter name>``.

Quality.  `quality(model) -> float` (a loss, lower is better) becomes the
`quality(candidate_state)` that `Repo.commit` judges its search trials with: the
candidate's model tensors are copied into the model under `torch.no_grad()`, `quality`
runs, and the live values (and the train/eval mode) are put back exactly.  Background
commits evaluate on a private copy of the model (made once, with `copy.deepcopy`, at the
first background commit), since the live one keeps training meanwhile.  A model wrapped in
`DistributedDataParallel` (or `DataParallel`) is evaluated through the module it wraps
(`quality` gets ``model.module``): DDP's forward broadcasts buffers on the training group,
which hangs while each rank evaluates a different trial, or a background commit evaluates
beside training, and would give every rank rank 0's candidate buffers.

The search itself is `Repo.commit`'s (with `space=`, `policy=`, `epsilon=` passed
through): the Tracker keeps only the training-loop parts.

Background commits.  `commit(..., background=True)` blocks only while the state
is copied to CPU memory; search, encoding and writing run elsewhere, in order.  Where it
can (`background_process`, default: Linux, a repository on disk and no distributed
search), the commit runs in a child process (`mvc.integrations.commit_process`): the copy is
made in shared memory the child maps, and the training loop's Python thread keeps its
interpreter lock, which a commit on a thread of its own process takes between native calls (a
GPU loop launching kernels needs it between every two, and ran 2.7x slower beside such a
thread).  A `quality` callable still evaluates here, on the model's copy: the child's search
sends each candidate's model tensors back through shared memory, and the worker thread that
waits for the commit evaluates them and answers (`mvc.integrations.parent_calls`); the rest
of the search runs in the child.  Otherwise the commit runs on one worker thread.  Either runs
`background_nice` steps below the training loop (Linux; `mvc.native.parallel.lower_this_thread`),
so a commit's encoding threads leave the loop its core; where the training itself keeps every
CPU busy, the background commit then gets what is left (`background_nice=0`: the same
priority).  Each pending commit holds a host copy of the state, so at most one waits behind
the running one: a commit beyond that blocks until there is room.  `wait()` joins them.  An
exception in the worker is re-raised by the next Tracker call (and by `wait()`), never lost;
the returned Future carries it too.  A foreground commit or `restore` first waits for them.

Data-parallel training.  When `torch.distributed` is initialized with more than one rank
(or `distributed=True`), every rank constructs the Tracker and calls `commit` at the same
steps; the config search is spread over the replicas (`mvc.search.ranks`: each round
evaluates one trial per rank, Inshrinkerator §5), rank 0 alone writes the commit, and every
rank's `commit` returns its id.  The replicas' states must be identical (as DDP keeps them)
and `quality` must measure the same batch on every rank.  The search runs over a gloo group
of its own, made when the Tracker is constructed, so a background commit's collectives never
interleave with the training loop's.
"""
from __future__ import annotations

import copy
import os
import pickle
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from mvc.errors import MvcError, MvcWarning, UsageError
from mvc.integrations.commit_process import CommitProcess, SharedState
from mvc.integrations.parent_calls import ParentCall
from mvc.integrations.grad_ema import BETA, GradientEMA
from mvc.integrations.host_copy import clone_to_cpu as clone_to_cpu
from mvc.integrations.shared_copy import supported as processes_supported
from mvc.native.parallel import callers_cuda, lower_this_thread
from mvc.quant import QuantConfig, QuantPolicy
from mvc.repo.objects import check_metrics
from mvc.integrations.repo_handle import RepoOnDemand
from mvc.repo.repository import Repo
from mvc.search import SearchSpace, serve_trials
from mvc.search.parallel import Ranks
from mvc.search.parallel import ranks as search_ranks
from mvc.search.record import QualityRecord
from mvc.search.space import short
from mvc.state import flatten, unflatten
from mvc.store.lmdb_store import LmdbStore

_RESERVED = ("model", "optimizer")
#: Nice steps below the training loop at which background commits run (module docstring):
#: CFS then gives a loop thread sharing a core with a commit thread ~90% of it.
BACKGROUND_NICE = 10
#: Background commits that may wait behind the running one (`Tracker._wait_for_room`).
MAX_QUEUED = 1


def _evaluated(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The module a quality function runs on, and the prefix its keys carry in `model`'s
    state dict: a data-parallel wrapper's module (see the module docstring)."""
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        return model.module, "module."
    return model, ""


class TrackerError(UsageError):
    """The Tracker was used in a way it cannot serve (bad arguments, reserved keys)."""

    exit_code = 84


class Tracker:
    """Commits a model (+ optimizer + extra state) to an mvc repository from a training loop.

    `history` gets one dict per finished commit: commit id, step, background,
    blocking_s (time the training loop was blocked), job_s (search + encode + write),
    evaluations, mode, degradation, config (short form) and the full quality record.
    `previous` is the config of the last commit (the next neighbourhood search starts
    from HEAD's).  `grad_ema` is the `GradientEMA` fed by `after_backward`.
    """

    def __init__(self, repo: Any, model: torch.nn.Module, optimizer: Any = None, *,
                 quality: Callable[[torch.nn.Module], float] | None = None,
                 epsilon: float | None = None, every: int | None = None, grad_window: int = 50,
                 extra_state: Callable[[], dict] | None = None, beta: float = BETA,
                 policy: QuantPolicy | None = None, space: SearchSpace | None = None,
                 distributed: bool | None = None, background_nice: int = BACKGROUND_NICE,
                 background_process: bool | None = None, lossless: bool | None = None) -> None:
        """repo: an mvc `Repo`, or a path (a repository is created there if none exists);
        quality(model) -> loss, or None (then commits are lossless unless `epsilon` is given:
        it opts in to the proxy metric and bounds it); epsilon: bound on the relative
        degradation (None: quality.epsilon with `quality`); every: commit interval in steps
        (schedules the gradient window); extra_state() -> dict of extra top-level state entries;
        distributed: spread the search over the ranks of `torch.distributed` (None: when
        it is initialized with more than one rank; see the module docstring);
        background_nice: how many steps (0-19) below the training loop background commits
        run (0: the same priority; Linux only); background_process: run background commits
        in a child process (None: wherever it can, see the module docstring; True: always,
        a `TrackerError` where it cannot; False: on a thread); lossless: True stores every
        commit exactly, whatever `epsilon` or the repository's `quality.epsilon` say."""
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise TrackerError(f"every must be a positive int or None, got {every!r}")
        if isinstance(grad_window, bool) or not isinstance(grad_window, int) or grad_window < 0:
            raise TrackerError(f"grad_window must be an int >= 0, got {grad_window!r}")
        if not 0.0 < float(beta) <= 1.0:
            raise TrackerError(f"beta must be in (0, 1], got {beta!r}")
        if (isinstance(background_nice, bool) or not isinstance(background_nice, int)
                or not 0 <= background_nice <= 19):
            raise TrackerError(f"background_nice must be an int in 0..19, got {background_nice!r}")
        if quality is not None and not callable(quality):
            raise TrackerError("quality must be a callable taking the model")
        for key, flag in (("background_process", background_process), ("lossless", lossless)):
            if flag is not None and not isinstance(flag, bool):
                raise TrackerError(f"{key} must be True, False or None, got {flag!r}")
        if isinstance(repo, (str, os.PathLike)):
            repo = RepoOnDemand(repo, create=True).get()
        self.repo, self.model, self.optimizer = repo, model, optimizer
        self.quality, self.epsilon, self.every = quality, epsilon, every
        self.grad_window, self.extra_state, self.beta = grad_window, extra_state, float(beta)
        self.policy, self.space = policy, space
        self.background_nice = background_nice
        self.background_process, self.lossless = background_process, lossless
        self._process: CommitProcess | None = None
        self._in_child = False   # whether a background commit has run in the child
        self.steps = 0
        self.history: list[dict[str, Any]] = []
        self.grad_ema = GradientEMA(model, beta=self.beta)
        self._executor: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        self._eval_model: torch.nn.Module | None = None
        self.previous = self._head_config()
        self._ranks = _search_ranks(distributed)
        if background_process:
            self._why_no_process(raising=True)
        #: The revision last restored, until the next lossless fallback names it.
        self._restored_from: str | None = None

    # ------------------------------------------------------------------ schedule
    def in_window(self, step: int | None = None) -> bool:
        """Whether gradients of `step` (default: the next one) feed the EMA."""
        n = self.steps + 1 if step is None else step
        if self.every is None:
            return True
        return (-n) % self.every < self.grad_window

    def should_commit(self) -> bool:
        """True right after the backward pass of a scheduled commit step."""
        return self.every is not None and self.steps > 0 and self.steps % self.every == 0

    # ------------------------------------------------------------------ gradients
    def after_backward(self) -> None:
        """Call after `loss.backward()`: counts the step and accumulates the gradient EMA."""
        self._raise_pending()
        self.grad_ema.fold_pending()
        self.steps += 1
        if self.in_window(self.steps):
            self.grad_ema.accumulate()

    def _take_grads(self) -> dict[str, torch.Tensor]:
        return self.grad_ema.take()

    # ------------------------------------------------------------------ commit
    def commit(self, message: str, *, step: int | None = None,
               metrics: Mapping[str, float] | None = None, background: bool = False
               ) -> str | Future:
        """Commit the current model / optimizer / extra state; returns the commit id, or a
        Future of it with background=True (the call then blocks only for the CPU copy)."""
        self._raise_pending()
        # as floats now: a bad one is the caller's error at the call, and a GPU scalar (a CUDA
        # loss) would cross to a background commit process whole, which cannot load it
        metrics = check_metrics(metrics)
        if not background:
            self.wait()
        t0 = time.perf_counter()
        if background:
            self._wait_for_room()
        grads = self._take_grads()
        state = self._state()
        step = step if step is not None else (self.steps or None)
        if background:
            proc = self._commit_process()
            # Into pages the last commit faulted in; else plain pages, which fault in fastest,
            # and a child's commit moves them into shared memory on the worker thread.
            shared = proc.copy(state, warm_only=True) if proc is not None else None
            state = shared.obj if shared is not None else clone_to_cpu(state)
            evaluate = None
            if self.quality is not None:
                if self._eval_model is None:
                    self._eval_model = copy.deepcopy(_evaluated(self.model)[0])
                evaluate = self._evaluator(self._eval_model, live=False)
            blocking = time.perf_counter() - t0
            if self._executor is None:
                nice = self.background_nice
                self._executor = ThreadPoolExecutor(
                    1, thread_name_prefix="mvc-tracker",
                    initializer=(lambda: lower_this_thread(nice)) if nice else None)
            # The state in a box the job empties (a copy it moves into shared memory is freed
            # then); the job runs on this thread's CUDA device and streams (a new thread's are
            # device 0 and the default stream: a rank's batch moved by .cuda() would go to GPU 0)
            fut = self._executor.submit(self._background_job, [state], message, step, metrics,
                                        grads, evaluate, blocking, shared, proc is not None,
                                        callers_cuda())
            with self._lock:
                self._futures.append(fut)
            return fut
        evaluate = self._evaluator(self.model, live=True) if self.quality else None
        cid = self._job(state, message, step, metrics, grads, evaluate, 0.0, False)
        self.history[-1]["blocking_s"] = time.perf_counter() - t0  # all of it, in the foreground
        return cid

    def _why_no_process(self, raising: bool = False) -> str | None:
        """Why a background commit cannot run in a child process now (None: it can)."""
        if not processes_supported():
            why = "this system cannot share a state's copy with a child process (Linux only)"
        elif self._ranks is not None:
            why = "the config search is spread over the training's ranks"
        elif not isinstance(self.repo, Repo) or not isinstance(self.repo.store, LmdbStore):
            why = "the repository is not one on disk that another process can open"
        else:
            return None
        if raising:
            raise TrackerError(f"background_process=True, but {why}")
        return why

    def _commit_process(self) -> CommitProcess | None:
        """The child process background commits run in (started with the first), or None
        where they run on a thread (`background_process`)."""
        if self.background_process is False or self._why_no_process(
                raising=bool(self.background_process)):
            return None
        if self._process is None:
            self._process = CommitProcess(self.repo.path, nice=self.background_nice)
        return self._process

    @property
    def background_in_process(self) -> bool:
        """Whether a background commit has run in a child process (`background_process`)."""
        return self._in_child

    def _wait_for_room(self) -> None:
        """Let at most `MAX_QUEUED` background commits wait behind the running one: each holds
        a host copy of the state, so a loop that commits faster than its commits finish (a
        low-priority commit beside CPU training) waits here, as long as it takes, instead of
        piling copies up; `history`'s blocking_s counts the wait."""
        with self._lock:
            pending = [f for f in self._futures if not f.done()]
        if len(pending) > MAX_QUEUED:
            futures_wait(pending[:len(pending) - MAX_QUEUED])
        self._raise_pending()

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"model": self.model.state_dict()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        if self.extra_state is not None:
            extra = self.extra_state()
            if not isinstance(extra, Mapping):
                raise TrackerError(f"extra_state() must return a dict, got {type(extra).__name__}")
            clash = [k for k in extra if k in _RESERVED]
            if clash:
                raise TrackerError(f"extra_state() may not use the reserved key(s) {clash}")
            state.update(extra)
        return state

    def _background_job(self, box: list[dict], message: str, step: int | None,
                        metrics: Mapping | None, grads: dict[str, torch.Tensor],
                        evaluate: Callable | None, blocking: float,
                        shared: SharedState | None = None, to_child: bool = False,
                        on_callers: Callable[[], AbstractContextManager] = nullcontext) -> str:
        state = box.pop()
        try:
            with on_callers():
                if to_child and shared is None and self._process is not None:
                    shared = self._process.copy(state)
                    assert shared is not None
                    state = shared.obj
                return self._job(state, message, step, metrics, grads, evaluate, blocking, True,
                                 shared)
        except BaseException as exc:
            # Re-raised later, from another call: say which commit it came from (the quality
            # function's own exception would otherwise arrive with no mvc context).
            exc.add_note(f"mvc: raised by the Tracker's background commit {message!r}"
                         f"{f' (step {step})' if step is not None else ''}; nothing was committed")
            raise
        finally:
            if shared is not None and self._process is not None:   # close() waits for this job
                self._process.release(shared)   # kept for the next copy when it can be

    def _job(self, state: dict, message: str, step: int | None, metrics: Mapping | None,
             grads: dict[str, torch.Tensor], evaluate: Callable | None, blocking: float,
             background: bool, shared: SharedState | None = None) -> str:
        par = self._ranks
        if par is None:
            return self._commit_job(state, message, step, metrics, grads, evaluate, blocking,
                                    background, shared)
        if par.leader:
            try:
                with search_ranks(par.group):
                    cid = self._commit_job(state, message, step, metrics, grads, evaluate,
                                           blocking, background)
            except BaseException as exc:
                par.send(("failed", f"{type(exc).__name__}: {exc}"))
                raise
            par.send(("commit", cid))
            return cid
        # A worker: serve rank 0's search on this replica, as Repo.commit would run it.
        t0 = time.perf_counter()
        flat = flatten(state)
        ev = None
        if evaluate is not None:
            skeleton = flat.skeleton

            def ev(candidate: dict[str, torch.Tensor]) -> Any:
                return evaluate(unflatten(skeleton, candidate))
        grads = {k: g for k, g in grads.items()
                 if k in flat.tensors and tuple(flat.tensors[k].shape) == tuple(g.shape)}
        msg = serve_trials(flat.tensors, evaluate=ev, grads=grads, group=par.group)
        if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "commit"):
            raise TrackerError(f"rank 0 did not commit: {msg[1] if isinstance(msg, tuple) else msg}")
        cid = msg[1]
        c = self.repo.read_commit(cid)
        self.previous = QuantConfig.from_dict(c.quant) if c.quant else None
        self.history.append({"commit": cid, "step": step, "background": background,
                             "blocking_s": blocking, "job_s": time.perf_counter() - t0,
                             "rank": par.rank, "config": short(self.previous)})
        return cid

    def _commit_job(self, state: dict, message: str, step: int | None, metrics: Mapping | None,
                    grads: dict[str, torch.Tensor], evaluate: Callable | None, blocking: float,
                    background: bool, shared: SharedState | None = None) -> str:
        t0 = time.perf_counter()
        flat = flatten(state).tensors
        grads = {k: g for k, g in grads.items()
                 if k in flat and tuple(flat[k].shape) == tuple(g.shape)}
        kw: dict[str, Any] = {"quality": evaluate, "epsilon": self.epsilon, "grads": grads}
        hessians_of = getattr(evaluate, "hessians_of", None)
        if hessians_of is not None:  # a gate from mvc.quality.from_module: error feedback's data
            kw["hessians"] = lambda: hessians_of(state)
        # passed only when set, so a Repo stand-in without them keeps working
        kw.update({k: v for k in ("policy", "space", "lossless") if (v := getattr(self, k)) is not None})
        cid = self._commit_in(shared, state, message, step=step, metrics=metrics, **kw)
        c = self.repo.read_commit(cid)
        record = QualityRecord.from_json(c.quality or {})
        self.previous = QuantConfig.from_dict(c.quant) if c.quant else None
        restored, self._restored_from = self._restored_from, None
        if not c.quant and c.quality and record.lossless_fallback:
            self._warn_lossless(cid, record, restored)
        self.history.append({
            "commit": cid, "step": step, "background": background, "blocking_s": blocking,
            "job_s": time.perf_counter() - t0,
            "evaluations": record.evaluations, "mode": record.mode,
            "degradation": record.degradation, "config": short(self.previous),
            "quality": c.quality,
        })
        return cid

    def _commit_in(self, shared: SharedState | None, state: dict, message: str,
                   **kw: Any) -> str:
        """`repo.commit(state, message, **kw)`, in the child process when `state` is its
        shared copy; on this thread when an argument cannot cross to it (unless
        background_process=True asked for the child)."""
        if shared is None or self._process is None:
            return self.repo.commit(state, message, **kw)
        # The quality function and the gate's Hessians run here, on this process's model: the
        # child gets stand-ins that call back (only the candidate's model tensors cross).
        sent, calls = dict(kw), {}
        if kw.get("quality") is not None:
            calls["evaluate"] = kw["quality"]
            sent["quality"] = ParentCall("evaluate", getattr(kw["quality"], "__name__", None),
                                         keep=("model",))
        if kw.get("hessians") is not None:
            calls["hessians"] = kw["hessians"]
            sent["hessians"] = ParentCall("hessians")
        try:
            if kw.get("grads"):  # the EMA's own host tensors: copied here, not in the loop's time
                kw["grads"] = sent["grads"] = shared.add(kw["grads"])
            payload = self._process.pack(shared, state, message, **sent)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            if self.background_process:
                raise TrackerError(f"background_process=True, but this commit's arguments cannot "
                                   f"be sent to a child process: {exc}") from exc
            return self.repo.commit(state, message, **kw)
        cid = self._process.commit(shared, payload, calls)
        self._in_child = True
        return cid

    def _warn_lossless(self, cid: str, record: QualityRecord, restored: str | None) -> None:
        """Say so when the search found no configuration within the bound: the commit is
        stored exactly (full size), which must never pass silently."""
        deg, cfg = record.closest_degradation, record.closest_config
        if deg is not None:
            grid = f" {cfg['family']}" if cfg.get("family") else ""
            measured = (f"the closest trial, {cfg.get('bins')}{grid} bins / prune "
                        f"{cfg.get('prune')}, "
                        f"measured {deg:+.3g}")
            if record.closest_refused:
                measured += f" and was refused by {record.closest_refused}"
        else:
            measured = "no trial measured"
        after = f" (the first since restore({restored!r}))" if restored else ""
        warnings.warn(MvcWarning(
            f"Tracker: commit {cid[:12]}{after} was stored losslessly: no quantization config kept "
            f"{record.metric if record.metric is not None else 'the quality metric'} within epsilon "
            f"{record.epsilon} ({measured}); check the quality function and epsilon "
            f"(mvc show {cid[:12]})"), stacklevel=3)

    def _metric_name(self) -> str | None:
        if self.quality is None:
            return None
        return "tracker:" + getattr(self.quality, "__qualname__", type(self.quality).__name__)

    def _evaluator(self, model: torch.nn.Module, *, live: bool,
                   fn: Callable[[torch.nn.Module], Any] | None = None) -> Callable[[Mapping], Any]:
        """evaluate(candidate) -> quality(model) with the candidate's model tensors loaded
        (`fn(model)` instead of quality when given).

        `candidate` is either the nested candidate state (``{"model": state_dict, ...}``,
        what `Repo.commit(quality=)` passes) or flat tensors (``{"model/<key>": ...}``,
        what `mvc.search.find_config(evaluate=)` passes).  When `quality` is a gate from
        `mvc.quality.from_module`, the evaluator's `hessians_of(state)` gives its layers' input
        Hessians with `state` loaded the same way (on the same model: never the live one
        while a background commit's training goes on).
        """
        quality = fn or self.quality
        assert quality is not None  # callers build an evaluator only when there is one
        model = _evaluated(model)[0]
        prefix = _evaluated(self.model)[1]  # what the state's keys carry beyond model's own
        targets = model.state_dict(keep_vars=True)
        saved: dict[str, torch.Tensor] = {}

        def model_entries(candidate: Mapping) -> Mapping[str, Any]:
            nested = candidate.get("model")
            if not isinstance(nested, Mapping):
                nested = {k[len("model/"):]: v for k, v in candidate.items()
                          if isinstance(k, str) and k.startswith("model/")}
            return {k[len(prefix):]: v for k, v in nested.items()
                    if isinstance(k, str) and k.startswith(prefix)} if prefix else nested

        def evaluate(candidate: Mapping) -> Any:
            entries = model_entries(candidate)
            with torch.no_grad():
                mode = model.training
                if live and not saved:  # the live values, kept for the whole search
                    saved.update({k: t.detach().clone() for k, t in targets.items() if k in entries})
                try:
                    for k, t in targets.items():
                        c = entries.get(k)
                        if isinstance(c, torch.Tensor) and c is not t:
                            t.detach().copy_(c)
                    out = quality(model)
                    # a gate's Hessians are by the model's names: give them the state's
                    return {prefix + k: v for k, v in out.items()} \
                        if prefix and fn is not None and isinstance(out, Mapping) else out
                finally:
                    for k, v in saved.items():
                        targets[k].detach().copy_(v)
                    model.train(mode)

        evaluate.__name__ = evaluate.__qualname__ = self._metric_name() or "evaluate"
        collect = getattr(self.quality, "hessians_of", None)
        if fn is None and callable(collect):
            evaluate.hessians_of = self._evaluator(  # type: ignore[attr-defined]
                model, live=live, fn=collect)
        return evaluate

    # ------------------------------------------------------------------ background
    def _raise_pending(self) -> None:
        """Raise the first failure among finished background commits (later ones as notes)."""
        with self._lock:
            done = [f for f in self._futures if f.done()]
            self._futures = [f for f in self._futures if not f.done()]
        errors = [e for e in (f.exception() for f in done if not f.cancelled()) if e is not None]
        if not errors:
            return
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"a later background commit also failed: {other!r}")
        raise first

    def wait(self) -> None:
        """Wait for every pending background commit; re-raise the first failure."""
        with self._lock:
            pending = list(self._futures)
        futures_wait(pending)
        self._raise_pending()

    def close(self) -> None:
        """Wait for pending commits and stop the worker thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._process is not None:
                self._process.close()
                self._process = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ restore
    def restore(self, rev: str = "HEAD") -> dict[str, Any]:
        """Load commit `rev` into the model (and optimizer) to resume training.

        HEAD moves to `rev` unless it already points there (so restoring HEAD keeps
        the branch attached).  Returns the extra state (entries other than "model"
        and "optimizer").  The step counter resumes from the commit's step.
        """
        self.wait()
        repo = self.repo
        cid = repo.resolve(rev)
        state = repo.read_state(cid) if cid == repo.head() else repo.checkout(rev)
        if repo.current_branch() is None:
            warnings.warn(MvcWarning(f"restored {rev!r}: HEAD is detached at {cid[:12]}, so the "
                                     "commits that follow go on no branch; name them with "
                                     "repo.switch(NAME, create=True)"), stacklevel=2)
        if not isinstance(state, Mapping) or "model" not in state:
            raise TrackerError(f"commit {cid[:12]} holds no 'model' state: not made by a Tracker")
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        c = repo.read_commit(cid)
        if c.step is not None:
            self.steps = int(c.step)
        self.previous = QuantConfig.from_dict(c.quant) if c.quant else None
        self.grad_ema.reset()
        self._restored_from = rev
        return {k: v for k, v in state.items() if k not in _RESERVED}

    def _head_config(self) -> QuantConfig | None:
        try:
            head = self.repo.head()
            quant = self.repo.read_commit(head).quant if head else None
            return QuantConfig.from_dict(quant) if quant else None
        except MvcError:
            return None


def _search_ranks(distributed: bool | None) -> Ranks | None:
    """The group a Tracker spreads its search over (None: it searches alone)."""
    up = dist.is_available() and dist.is_initialized()
    if distributed is False or (distributed is None and not (up and dist.get_world_size() > 1)):
        return None
    if not up:
        raise TrackerError("distributed=True needs torch.distributed initialized")
    # A gloo group of its own: background commits' collectives stay off the training's group.
    return Ranks(dist.new_group(backend="gloo"))
