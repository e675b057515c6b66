"""`MvcStorageWriter`: a `torch.distributed.checkpoint` save as one mvc commit.

DCP drives a StorageWriter through plan -> write -> finish; mvc's commit pipeline has the
same three stages (`mvc.repo.pipeline`), and they line up:

    prepare_global_plan  (coordinator)  the branch to move and its commit (the parent every
                                        rank writes against), the tensor names -> every rank
    write_data           (every rank)   encode and store this rank's tensors and shards
                                        (`pipeline.write`; a shard is its own record, see
                                        `mvc.repo.shards`); lossy: the search runs here, its
                                        sketches and verdicts agreed over the process group
                                        (`mvc.dcp.lossy`)
    finish               (coordinator)  the skeleton from DCP's metadata, then
                                        `pipeline.publish` under the repository write lock:
                                        the snapshot, the commit, one compare-and-swap

So one `dcp.save` is one commit, and a rank that fails in `write_data` fails the save
before `finish`: its siblings' chunks stay unreachable (gc removes them), no ref moves.
A branch moved by someone else between plan and finish is `RefConflictError`: the save
fails rather than overwrite that commit.

What the caller is told (issue 25): the compare-and-swap is the last step of `finish` that
can fail, and the coordinator's `commit_id` is set the moment it succeeds.  DCP broadcasts
finish's outcome afterwards, and a peer dying then fails the coordinator's `dcp.save` although
the commit landed: `commit_id` (set) says so, and `save` turns that into `DcpPublishedError`.
No two-phase protocol can make the ranks agree when one dies after the commit point, so a
retry must be harmless instead: a save whose message, step and metrics equal the branch
head's is written against the head's parent, as its earlier attempt was, and when it yields
the head's snapshot no commit is made (`commit_id` is the head, `reused` is True).
"""
from __future__ import annotations

import dataclasses
import gc
import io
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.futures import Future
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from mvc.errors import DataError, MvcError, MvcWarning, UsageError
from mvc.quant import QuantConfig, QuantizedTensor, QuantPolicy
from mvc.repo import pipeline
from mvc.repo.objects import Commit, TensorRecord
from mvc.integrations.repo_handle import RepoOnDemand
from mvc.repo.repository import Repo
from mvc.repo.shards import SHARD_KEY, covers_whole, shard_meta, shard_name, shard_of
from mvc.repo.transaction import Published
from mvc.search.record import QualityRecord
from mvc.search.space import SearchSpace
from mvc.state import flatten
from mvc.state.device_memory import DEVICE_OUT_OF_MEMORY, device_bytes, host_copies

from mvc.dcp import lossy, moments
from mvc.dcp.layout import Paths, merged_paths, skeleton, tensor_names
from mvc.dcp.remote import (RemoteCommitTransaction, RemoteSide, RemoteTarget, UsesTarget,
                            is_url, open_target)

#: Options `MvcStorageWriter` takes besides `lossless` (as `Repo.commit` takes them).
COMMIT_OPTIONS = ("step", "metrics", "quant", "policy", "space", "epsilon", "tensor_cap")


class DcpOptionError(UsageError):
    """`MvcStorageWriter` was given an option it does not take, or one of the wrong type."""

    exit_code = 161


class DcpValueError(UsageError):
    """A non-tensor value of the saved state cannot be stored safely (it needs pickle code
    that `torch.load(weights_only=True)` refuses)."""

    exit_code = 162


class DcpPublishedError(MvcError):
    """`dcp.save` failed on the coordinator after its commit had landed on the branch (a peer
    died, or a collective failed, after the commit point).  `commit_id` is that commit; a
    retry of the same save does not make a second one."""

    exit_code = 166

    def __init__(self, commit_id: str, cause: BaseException) -> None:
        self.commit_id = commit_id
        super().__init__(f"commit {commit_id} was published, then the save failed: "
                         f"{_describe(cause)} (the other ranks may not know; saving the same "
                         "state again does not make a second commit)")


def _describe(exc: BaseException) -> str:
    """One line for `exc`; DCP's CheckpointException by the errors it gathered per rank."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {rank}: {_describe(err)}"
                         for rank, (err, _) in sorted(exc.failures.items()))
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@dataclass(frozen=True)
class Landed:
    """What the coordinator's `finish` leaves in DCP's `Metadata.storage_data` (which DCP
    broadcasts and `dcp.save` returns on every rank): the commit, and whether it was made
    by an earlier attempt of this save (`MvcStorageWriter.reused`)."""

    commit_id: str
    reused: bool


@dataclass(frozen=True)
class _Shared:
    """What the coordinator decides for every rank (sent in each `SavePlan.storage_data`)."""

    ref: str
    head: str | None          # the branch's commit: the new commit's parent, the CAS's "old"
    parent: str | None        # what the records are written against (deltas, warm starts)
    again: bool               # head looks like an earlier attempt of this save
    names: dict[str, str]     # fqn -> tensor name in the commit
    paths: Paths              # fqn -> path in the nested state
    how: lossy.How
    glob: dict[str, tuple[list[int], torch.dtype]]   # tensor name -> global shape, dtype


@dataclass(frozen=True)
class _Value:
    """A non-tensor leaf, as one rank's `WriteResult` carries it to the coordinator."""

    value: Any


class MvcStorageWriter(UsesTarget, StorageWriter):
    """Write a DCP checkpoint as one commit of the mvc repository at `repo`: a path or `Repo`
    (it must exist: ``mvc init``), or a remote's URL (``s3://bucket/prefix``,
    ``file:///dir``: no local repository on any host, `mvc.dcp.remote`).

    ``dcp.save(state, storage_writer=MvcStorageWriter("runs/exp1", message="step 1000"))``:
    every rank encodes and stores its own tensors and shards, the coordinator publishes.
    `lossless=True` stores every tensor exactly; otherwise the repository's ``commit.mode``
    decides, as for `Repo.commit`: ``fixed`` (``commit.quant``, or `quant=`), ``search``
    (the default: the config search with the proxy gate, its sketches merged and its
    verdicts agreed over the ranks; `space=`, `epsilon=`, `tensor_cap=`) or ``lossless``.
    `step=`, `metrics=` and `policy=` as for `Repo.commit`.  After the save the
    coordinator's writer holds the new commit's id in `commit_id` -- also when `dcp.save`
    raised after the commit landed (`save` says so with `DcpPublishedError`).  A save of
    the branch head's state with the head's message, step and metrics (a retry of a save
    whose outcome was lost) makes no commit: `commit_id` is the head, `reused` is True.
    `allow_empty=False`: a save whose snapshot is exactly the head's is
    `NothingToCommitError` (git's "nothing to commit"), as for `Repo.commit`.
    `process_group`: the group given to `dcp.save` / `dcp.async_save`, on which the lossy
    path's own collectives then run too (None: the default group).  Picklable, for DCP's
    process-based async executor (the repository travels by path or URL).

    A remote only: `branch=` (default ``main``) is the branch the save moves; `config=` a
    mapping of mvc config keys (``commit.mode``, ``commit.quant``, ``quality.epsilon`` ...)
    standing in for a repository's config, which a remote does not hold; `cache_dir=` a
    local directory keeping the remote objects this process reads (the parent's).
    """

    def __init__(self, repo: str | os.PathLike | Repo, message: str, *, lossless: bool = False,
                 allow_empty: bool = True, process_group: Any = None, branch: str | None = None,
                 config: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike | None = None, **commit_options: Any) -> None:
        super().__init__()
        if not isinstance(message, str) or not message.strip():
            raise DcpOptionError("a commit needs a non-empty message")
        unknown = sorted(set(commit_options) - set(COMMIT_OPTIONS))
        if unknown:
            raise DcpOptionError(f"MvcStorageWriter takes {', '.join(COMMIT_OPTIONS)} and "
                                 f"lossless; not {', '.join(unknown)}")
        _check_types(commit_options)
        self._repo = open_target(repo, write=True, branch=branch, settings=config,
                                 cache_dir=cache_dir)
        self.message = message
        self.lossless = bool(lossless)
        self.allow_empty = bool(allow_empty)
        #: the group the save's own collectives (the lossy path's) run on: the one given to
        #: `dcp.save` / `dcp.async_save` as `process_group` (None: the default group)
        self.process_group = process_group
        self.options = dict(commit_options)
        self.is_coordinator = True
        self.rank = 0
        self.commit_id: str | None = None
        self.reused = False
        self._shared: _Shared | None = None
        self._chosen: tuple[dict | None, dict | None] = (None, None)

    @property
    def last_config(self) -> dict | None:
        """The quantization config this rank stored the last save with (None: lossless); the
        same on every rank."""
        return self._chosen[0]

    @property
    def last_quality(self) -> dict | None:
        """The quality record of the last save's quantization (the same on every rank)."""
        return self._chosen[1]

    # -------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """Picklable (DCP's process-based async executor ships the writer to a checkpoint
        process): the repository by path (a remote by URL), reopened there on first use; no
        process group (the checkpoint process makes its own, which DCP passes as the default
        one)."""
        state = dict(self.__dict__)
        state["_repo"] = (self._repo.detached() if isinstance(self._repo, RemoteTarget)
                          else RepoOnDemand(self._repo.path))
        state["process_group"] = None
        return state

    # -------------------------------------------------------------- StorageWriter
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """A new save begins; `checkpoint_id`, when given, is another repository's path (or
        remote's URL).  A remote is opened again: the save reads its branch as it is now."""
        if checkpoint_id:
            self._repo.retarget(checkpoint_id)
        if isinstance(self._repo, RemoteTarget):
            self._repo.close()
        self.commit_id = None
        self.reused = False
        self._shared = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """True for the work tree of an mvc repository, or a remote's URL."""
        return is_url(checkpoint_id) or (Path(checkpoint_id) / ".mvc" / "store").is_dir()

    @property
    def checkpoint_id(self) -> Path | str:
        """The repository's work tree, or the remote's URL."""
        return self.path

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = bool(is_coordinator)
        self.rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        repo = self.repo
        ref, head = repo.commit_transaction().target()
        again, parent = False, head
        if head is not None:
            commit = _readable(repo, head)
            if commit is not None and self._same_request(commit):
                # written as the earlier attempt was, so that the same state gives the same
                # records (lossy ones are deltas against, and warm-started from, that parent)
                again, parent = True, (commit.parents[0] if commit.parents else None)
        items = [item for p in plans for item in p.items]
        fqns = list(dict.fromkeys(item.index.fqn for item in items))
        paths = merged_paths([p.planner_data for p in plans], fqns)
        tensors = [item.index.fqn for item in items if item.type != WriteItemType.BYTE_IO]
        names = tensor_names(paths, dict.fromkeys(tensors))
        how = lossy.How.of(repo.config, self.lossless, self.options)
        glob: dict[str, tuple[list[int], torch.dtype]] = {}
        for item in items:
            td = item.tensor_data
            if item.type != WriteItemType.BYTE_IO and td is not None:
                glob.setdefault(names[item.index.fqn], (list(td.size), td.properties.dtype))
        glob = {n: glob[n] for n in names.values() if n in glob}   # in the state's order
        self._shared = _Shared(ref, head, parent, again, names, paths, how, glob)
        return [dataclasses.replace(p, storage_data=self._shared) for p in plans]

    def _same_request(self, commit: Commit) -> bool:
        """Whether `commit` says what this save would (message, step, metrics)."""
        return commit.message == self.message and commit.step == self.options.get("step") \
            and commit.metrics == dict(self.options.get("metrics") or {})

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        shared: _Shared = plan.storage_data
        tx = self.repo.commit_transaction()
        results: list[WriteResult] = []
        tensors: dict[str, torch.Tensor] = {}
        shards: dict[str, dict] = {}
        index: dict[str, WriteItem] = {}
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                results.append(_value_result(item, planner.resolve_data(item)))
                continue
            name, meta, t = _shard(item, planner.resolve_data(item), shared.names)
            tensors[name] = t
            index[name] = item
            if meta is not None:
                shards[name] = meta
        parent = tx.parent(shared.parent, shared.how.lossy)
        quantized: dict[str, QuantizedTensor] = {}
        config = quality = None
        opt = moments.Moments()
        if shared.how.lossy:
            # this rank's records' warm starts only (the group merges them): a rank reads
            # nothing of the parent's other shards -- on a remote, nothing of them is fetched
            mine_parent = {n: r for n, r in parent.records.items() if n in tensors}
            if isinstance(tx, RemoteCommitTransaction):
                tx.prefetch(parent.snapshot, mine_parent.values())
            init = pipeline.parent_centroids(dataclasses.replace(parent, records=mine_parent),
                                             tx.read_centroids)
            with lossy.collective_group(self.process_group):
                quantized, config, quality, opt, tensors = _decide(tensors, shards, shared, init)
            quantized.update(opt.quantized)
            if opt.report and quality is not None:
                quality = QualityRecord.from_json(quality).updated(**opt.report).to_json()
        self._chosen = (config, quality)
        mine = pipeline.WritePlan(names=list(tensors), tensors=tensors, parent=parent,
                                  settings=tx.settings, quantized=quantized,
                                  domains=opt.domains, moments=opt.bounds)
        records = tx.write(mine, mine.names)
        if parent.snapshot is not None and quantized:
            # The write cached the parent's levels: the next save's parent (this commit) is one
            # delta from them. Older snapshots' serve no save to come: a long-lived writer (a
            # remote's cache lives as long as the process) would hold them up to its bound.
            self.repo.reader.levels.retain(parent.snapshot)
        for rec in records:
            if rec.name in shards:
                rec = dataclasses.replace(rec, meta=dict(rec.meta, **{SHARD_KEY: shards[rec.name]}))
            results.append(WriteResult(index=index[rec.name].index,
                                       size_in_bytes=rec.stored_bytes, storage_data=rec))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        shared = self._shared
        if shared is None:
            raise UsageError("MvcStorageWriter.finish() before prepare_global_plan()")
        tx = self.repo.commit_transaction()
        records = [wr.storage_data for rank in results for wr in rank
                   if isinstance(wr.storage_data, TensorRecord)]
        values = {wr.index.fqn: wr.storage_data.value for rank in results for wr in rank
                  if isinstance(wr.storage_data, _Value)}
        globals_ = {}
        for fqn in shared.names:
            md = metadata.state_dict_metadata[fqn]
            assert isinstance(md, TensorStorageMetadata)
            globals_[fqn] = (md.properties.dtype, list(md.size))
        skel = skeleton(shared.paths, globals_, values, shared.names)
        config, quality = self._chosen
        manifest = pipeline.Manifest(names=_record_order(skel, records), skeleton=skel,
                                     config=config, quality=quality, parent=shared.head)
        info = tx.info(self.message, step=self.options.get("step"),
                       metrics=self.options.get("metrics"))

        def landed(out: Published) -> None:   # under the lock, the moment the commit is made
            self.commit_id, self.reused = out.commit, out.reused

        out = tx.publish(manifest, records, info, ref=shared.ref, again=shared.again,
                         landed=landed, allow_empty=self.allow_empty)
        # Past the commit point nothing here may fail: DCP broadcasts this to every rank.
        metadata.storage_data = Landed(out.commit, out.reused)


_Decision = tuple[dict[str, QuantizedTensor], dict | None, dict | None, moments.Moments,
                  dict[str, torch.Tensor]]


def _decide(tensors: dict[str, torch.Tensor], shards: dict[str, dict], shared: _Shared,
            init: dict[str, torch.Tensor]) -> _Decision:
    """(quantized shards, config, quality record, moments, the tensors they were made from) of
    this rank; every rank of the group calls it. Where a rank runs out of device memory, every
    rank runs the decision again on host copies of its shards (`pipeline.plan` does the same
    for a one-process commit): the host path decides what the device path decides, so the
    commit is the same. Every rank learns of any rank's error inside the decision's own
    gathers, so all of them reach the one gather that says whether to retry."""
    def run(ts: dict[str, torch.Tensor]) -> _Decision:
        quantized, config, quality = lossy.choose(ts, shards, shared.how, init)
        opt = moments.Moments()
        if config is not None and shared.how.optimizer == "compressed":
            # after the weights, as `plan_quantization` does: joint pruning reads them
            opt = moments.compress(ts, shards, quantized, shared.glob, init, shared.how.moment_cap)
        return quantized, config, quality, opt, ts

    try:
        return run(tensors)
    except Exception as exc:   # noqa: BLE001 - every rank is here: its own error or a peer's
        if not any(lossy.all_gather(isinstance(exc, DEVICE_OUT_OF_MEMORY))):
            raise
    # out of the except block: the failed attempt's device tensors go with its frames
    gc.collect()
    warnings.warn(MvcWarning(
        "a rank of the sharded save ran out of device memory choosing the quantization; every "
        f"rank chooses again on host copies of its shards ({device_bytes(tensors) / 2**30:.2f} "
        "GiB here): the same commit, slower"), stacklevel=2)
    return run(host_copies(tensors))


def save(state: dict[str, Any], writer: MvcStorageWriter, **dcp_kwargs: Any) -> str | None:
    """`dcp.save(state, storage_writer=writer, **dcp_kwargs)`, telling what it published.

    Returns the commit id on every rank (the coordinator's, as DCP broadcast it).  On the
    coordinator, a failure after the commit landed raises `DcpPublishedError` (carrying
    `commit_id`); any other error is dcp.save's own, and this save published nothing.  The
    other ranks cannot tell a failure after the commit point from one before it (a peer died
    before DCP's broadcast reached them): they see dcp.save's error, and a retry of the same
    save is harmless (`MvcStorageWriter`).
    """
    try:
        metadata = dcp.save(state, storage_writer=writer, **dcp_kwargs)
    except (Exception, CheckpointException) as exc:  # DCP's own is a BaseException
        if writer.commit_id is not None:
            raise DcpPublishedError(writer.commit_id, exc) from exc
        raise
    landed = metadata.storage_data
    return landed.commit_id if isinstance(landed, Landed) else writer.commit_id


def _readable(repo: Repo | RemoteSide, cid: str) -> Commit | None:
    """The commit, or None where it cannot be read (then no save is taken for a retry of it,
    and the save goes on as it did before retries were recognised)."""
    try:
        return repo.read_commit(cid)
    except DataError:
        return None


def _check_types(options: dict[str, Any]) -> None:
    types: dict[str, tuple[type, ...]] = {
        "step": (int,), "metrics": (dict,), "quant": (QuantConfig,), "policy": (QuantPolicy,),
        "space": (SearchSpace,), "epsilon": (int, float), "tensor_cap": (int, float)}
    for key, value in options.items():
        if value is not None and (not isinstance(value, types[key])
                                  or isinstance(value, bool)):
            raise DcpOptionError(f"{key}= must be {' or '.join(t.__name__ for t in types[key])},"
                                 f" got {type(value).__name__}")
    metrics = options.get("metrics") or {}
    for k, v in metrics.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(v):
            raise DcpOptionError(f"metrics must map names to finite numbers, got {k!r}: {v!r}")


def _value_result(item: WriteItem, data: Any) -> WriteResult:
    """A BYTE_IO item (DCP pickled it with `torch.save`) as a value for the skeleton."""
    buf = data if isinstance(data, io.BytesIO) else io.BytesIO(bytes(data))
    size = buf.getbuffer().nbytes
    buf.seek(0)
    try:
        value = torch.load(buf, weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError / RuntimeError / others here
        raise DcpValueError(f"state value {item.index.fqn!r} cannot be stored safely: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                            ) from None
    if flatten(value).tensors:
        # DCP pickles a tuple (or another object it does not walk) whole, tensors and all; the
        # commit's state, which mvc flattens, would then hold tensors no write stored
        raise DcpValueError(f"state value {item.index.fqn!r} is a {type(value).__name__} holding "
                            f"tensors, which DCP saves as one pickled object: put them in a "
                            f"list or a dict, whose tensors DCP saves as tensors")
    return WriteResult(index=item.index, size_in_bytes=size, storage_data=_Value(value))


def _shard(item: WriteItem, data: Any, names: dict[str, str]
           ) -> tuple[str, dict | None, torch.Tensor]:
    """(record name, shard meta or None, the values) of a tensor item."""
    td = item.tensor_data
    assert td is not None and isinstance(data, torch.Tensor)
    offsets, sizes = list(td.chunk.offsets), list(td.chunk.sizes)
    # Where it lives: a GPU's shards are quantized there (the commit hook's device path) and
    # only their levels cross, a chunk at a time; copying them all to host memory first held
    # a rank's whole state in pageable pages.
    t = data.detach().reshape(sizes).contiguous()
    base = names[item.index.fqn]
    if covers_whole(offsets, sizes, list(td.size)):
        return base, None, t
    return shard_name(base, offsets, sizes), shard_meta(base, offsets, list(td.size)), t


def _record_order(skel: dict, records: list[TensorRecord]) -> list[str]:
    """Record names in skeleton order, a tensor's shards by their offsets."""
    groups: dict[str, list[tuple[list[int], str]]] = {}
    for rec in records:
        info = shard_of(rec)
        of = info["of"] if info is not None else rec.name
        groups.setdefault(of, []).append((info["offsets"] if info else [], rec.name))
    order: list[str] = []
    for entry in skel["entries"]:
        order.extend(dict.fromkeys(name for _, name in sorted(groups.pop(entry, []))))
    for rest in groups.values():  # records the skeleton does not name: publish refuses them
        order.extend(name for _, name in sorted(rest))
    return order
