"""The `Repo` porcelain: init/open, commit, checkout, refs, log, gc, fsck, diff, stats.

`Repo` is the composition root: it opens the store, builds the object database
(`objectdb.ObjectDB`) and the tensor reader (`reader.TensorReader`, which owns
the level caches) over it, and hands each service the parts it needs with plain
settings read from the config -- revisions and refs (`refops.py`), which every
command shares, the commit pipeline (`pipeline.py`, its settings from `commitopts.py`),
gc (`gc.py`), fsck (`fsck.py`), diff and stats (`inspect.py`).  Everything that touches
tensors (torch) is imported on first use, so opening a repository to read refs, commits
or config does not load it.
"""
from __future__ import annotations

import functools
import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping, Sequence

from mvc.errors import MvcError, MvcWarning, UsageError
from mvc.progress import Progress, phase
from mvc.repo import refs as R
from mvc.repo.config import Config
from mvc.repo.objectdb import ObjectDB
from mvc.repo.objects import Commit, Snapshot, check_metrics, check_step
from mvc.repo.pruned import pruned_ids
from mvc.repo.refops import RefOps
from mvc.store import RefUpdate, open_store

if TYPE_CHECKING:
    # The tensor side (torch, the pipeline, the reader and the services over it) is imported
    # where it is first used: commands that only read refs, commits and config never load it.
    import torch

    from mvc.quant import QuantConfig, QuantPolicy
    from mvc.repo import pipeline
    from mvc.repo.fsck import FsckReport
    from mvc.repo.gc import GcReport
    from mvc.repo.inspect import RepoStats, TensorDiff
    from mvc.repo.levelcache import DiskLevelCache
    from mvc.repo.levelfile import LevelFiles
    from mvc.repo.reader import TensorReader
    from mvc.repo.transaction import CommitTransaction
    from mvc.search.space import SearchSpace

MVC_DIR = ".mvc"
DEFAULT_BRANCH = "main"


class NotARepositoryError(MvcError):
    """No mvc repository at (or above) the given path."""

    exit_code = 3


class Repo:
    """An mvc repository: a `.mvc/` directory holding the store and the config."""

    def __init__(self, path: str | os.PathLike = ".", *, store=None):
        """Open the repository whose work tree is `path` (the directory containing `.mvc`)."""
        self.path = Path(path).resolve()
        self.mvc_dir = self.path / MVC_DIR
        if store is None:
            if not (self.mvc_dir / "store").is_dir():
                raise NotARepositoryError(f"not an mvc repository: {self.path} (run `mvc init`)")
            store = open_store(self.mvc_dir)
        self.store = store
        self.config = Config(self.mvc_dir / "config.json")
        #: Commits and snapshots, and the one walker of history.
        self.odb = ObjectDB(store.blobs, store.refs)
        #: Revisions, branches, tags and HEAD.
        self.refops = RefOps(store.refs, self.odb)
        self._levels_keep = int(self.config.get("cache.levels_keep"))  # as opened
        self._tensor_lock = threading.Lock()
        self._tensor_side: tuple[DiskLevelCache, TensorReader] | None = None

    def _tensors(self) -> tuple[DiskLevelCache, TensorReader]:
        """The level cache and the reader, built on first use: they import torch, which
        commands that only read refs, commits and config never need."""
        with self._tensor_lock:
            if self._tensor_side is None:
                from mvc.repo.levelcache import DiskLevelCache
                from mvc.repo.reader import TensorReader

                # Each lossy commit leaves its levels in `.mvc/cache/levels` for the next process
                # (a resume after a failure, the next CLI commit): `cache.levels_keep` newest
                # commits. fsck checks the directory even when the cache is off.
                cache = DiskLevelCache(self.mvc_dir / "cache" / "levels", self._levels_keep,
                                       blobs=self.store.blobs, meta=self.store.maintenance)
                disk = cache if self._levels_keep > 0 else None
                self._tensor_side = (cache, TensorReader(self.odb, disk=disk))
            return self._tensor_side

    @property
    def reader(self) -> TensorReader:
        """Tensors of snapshots (checkout, diff, gc's compaction, the commit's parent levels)."""
        return self._tensors()[1]

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def init(cls, path: str | os.PathLike = ".") -> "Repo":
        """Create a repository in `path` (created if needed); HEAD is the unborn branch `main`."""
        root = Path(path).resolve()
        mvc_dir = root / MVC_DIR
        if (mvc_dir / "store").is_dir():
            return cls(root)
        mvc_dir.mkdir(parents=True, exist_ok=True)
        store = open_store(mvc_dir, create=True)
        if store.refs.read_ref(R.HEAD) is None:
            store.refs.update_refs([RefUpdate(R.HEAD, None, R.SYMREF + R.HEADS + DEFAULT_BRANCH)], "init")
        return cls(root, store=store)

    @classmethod
    def discover(cls, start: str | os.PathLike | None = None) -> "Repo":
        """Open the repository containing `start` (default: the current directory) or any parent."""
        here = Path(start if start is not None else os.getcwd()).resolve()
        for d in (here, *here.parents):
            if (d / MVC_DIR / "store").is_dir():
                return cls(d)
        raise NotARepositoryError(f"not an mvc repository (or any parent): {here}")

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Repo":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Repo({str(self.path)!r})"

    # ------------------------------------------------------------------ objects
    def read_commit(self, oid: str) -> Commit:
        """The commit `oid` (an id, not a revision: see `resolve`)."""
        return self.odb.read_commit(oid)

    def read_snapshot(self, oid: str) -> Snapshot:
        """The snapshot a commit names (following gc's replacement, if any)."""
        return self.odb.read_snapshot(oid)

    def pruned(self) -> set[str]:
        """The commits a retention policy pruned (`gc --keep-last/--keep-every`): in history,
        without a checkpoint."""
        return pruned_ids(self.store.refs)

    @property
    def disk_levels(self) -> DiskLevelCache | None:
        """The on-disk level cache reads use (None: off, `cache.levels_keep = 0`)."""
        return self.reader.disk

    @disk_levels.setter
    def disk_levels(self, cache: DiskLevelCache | None) -> None:
        self.reader.disk = cache

    # ------------------------------------------------------------------ refs
    # Revisions and the branch / tag / HEAD commands live in `refops.RefOps`; these delegates
    # are the public surface.
    def resolve(self, rev: str = "HEAD") -> str:
        """The commit id a revision names (`HEAD`, branch, tag, id or prefix, with ~n / ^n).

        A full id of an existing commit always means that commit, whatever refs are named;
        `refs/heads/X` / `refs/tags/X` mean exactly that ref; a revision with whitespace
        is unknown (never trimmed)."""
        return self.refops.resolve(rev)

    def resolve_rev(self, rev: str) -> tuple[str, str | None]:
        """(commit id, branch) for `rev`: the branch name when `rev` names a branch exactly as
        resolved (no suffix; `HEAD` counts as the branch it is attached to), else None --
        what `move_head` attaches HEAD to after a checkout of `rev`."""
        return self.refops.resolve_rev(rev)

    def head(self) -> str | None:
        """The commit HEAD points at, or None on an unborn branch."""
        return self.refops.head()

    def current_branch(self) -> str | None:
        """The branch HEAD is attached to, or None when detached."""
        return self.refops.current_branch()

    def commit_target(self) -> tuple[str, str | None]:
        """(the ref the next commit moves, its current value): what a sharded save
        (`mvc.dcp`) plans against and publishes to, with one compare-and-swap."""
        return self.refops.commit_target()

    def commit_settings(self) -> pipeline.CommitSettings:
        """The `commit.*` configuration values, read now: what every rank of a sharded save
        (`mvc.dcp`) hands the pipeline's write stage."""
        from mvc.repo.commitopts import commit_settings

        return commit_settings(self.config)

    def branches(self) -> list[tuple[str, str]]:
        """(name, commit id) of every branch, sorted by name."""
        return self.refops.branches()

    def tags(self) -> list[tuple[str, str]]:
        """(name, commit id) of every tag, sorted by name."""
        return self.refops.tags()

    def branch(self, name: str, rev: str | None = None) -> str:
        """Create branch `name` at `rev` (default HEAD); returns the commit id."""
        return self.refops.branch(name, rev)

    def move_branch(self, name: str, rev: str) -> str:
        """Point branch `name` at `rev`, creating it if needed (git's `branch -f`); never the
        current branch (that is a checkout). Returns the commit id."""
        return self.refops.move_branch(name, rev)

    def rename_branch(self, old: str, new: str) -> str:
        """Rename branch `old` to `new` (which must not exist), in one ref transaction; HEAD
        follows when attached to it. `old`'s reflog stays, ending in the rename, for the
        gc.reflog_expire grace period. Returns the branch's commit id."""
        return self.refops.rename_branch(old, new)

    def tag(self, name: str, rev: str | None = None) -> str:
        """Create tag `name` at `rev` (default HEAD); returns the commit id."""
        return self.refops.tag(name, rev)

    def delete_branch(self, name: str, force: bool = False) -> str:
        """Delete a branch (never the current one). Returns its old id.

        Its reflog stays, ending in the deletion, for `gc.reflog_expire` days: until then
        gc keeps its commits, and `NAME@{0}` names its last tip (`mvc branch NAME NAME@{0}`
        brings it back).

        Like git's `branch -d`, a branch whose tip no other branch, tag or HEAD reaches is
        refused (UnmergedBranchError): its commits would be left for gc. `force=True` (-D)
        deletes it anyway."""
        return self.refops.delete_branch(name, force)

    def delete_tag(self, name: str) -> str:
        """Delete a tag; returns its old id (its reflog stays, as a deleted branch's does)."""
        return self.refops.delete_tag(name)

    def switch(self, name: str, *, create: bool = False) -> None:
        """Attach HEAD to branch `name` (creating it at HEAD with `create=True`).

        `refs/heads/X` names branch X, as in revisions."""
        self.refops.switch(name, create=create)

    def move_head(self, oid: str, branch: str | None, rev: str) -> None:
        """Point HEAD at `oid`: attached to `branch` (from `resolve_rev(rev)`: set only when
        `rev` named that branch exactly as resolved), detached otherwise; the reflog entry
        names `rev`."""
        self.refops.move_head(oid, branch, rev)

    # ------------------------------------------------------------------ commit
    def _lock_timeout(self) -> float:
        return float(self.config.get("core.lock_timeout"))

    def safe_globals(self) -> ContextManager[list[Any]]:
        """A context in which torch's weights-only unpickler also allows the globals the config
        key `checkpoint.safe_globals` names (`mvc.state.safe_globals`): `commit`, `read_state`,
        `checkout` and `diff_state` enter it around the state's non-tensor values, the CLI
        around loading a checkpoint file."""
        from mvc.state.safe_globals import allowing

        return allowing(self.config.get("checkpoint.safe_globals"))

    def commit(self, state: Any, message: str, *, step: int | None = None,
               metrics: Mapping[str, float] | None = None, lossless: bool | None = None,
               quant: QuantConfig | None = None, policy: QuantPolicy | None = None,
               grads: Mapping[str, torch.Tensor] | None = None,
               quality: Callable[[Any], float] | None = None,
               epsilon: float | None = None, space: SearchSpace | None = None,
               progress: Progress | None = None, allow_empty: bool = True,
               hessians: Mapping[str, torch.Tensor]
               | Callable[[], Mapping[str, torch.Tensor]] | None = None) -> str:
        """Store `state` (any nested checkpoint structure) as a new commit on HEAD; returns its id.

        Objects are written first, then the snapshot and the commit object, and
        the branch moves last, in one small transaction: a crash at any moment
        leaves either the old history or the complete new commit.

        How tensors are stored (repository config `commit.mode`, default "search"):

        * "search": the commit hook picks the most compressive quantization
          config whose degradation stays within `epsilon` on `quality`
          (`quality(candidate_state) -> loss`, lower is better), starting from
          the parent's config (Inshrinkerator §5). The chosen config, the
          metric, its baseline and measured value are recorded in the commit.
          Without `quality` (and no `quality.hook` passed by the CLI) the commit
          is lossless, unless `epsilon` (or a configured `quality.epsilon`) or
          `space` opts in to the proxy: a weighted reconstruction error bounded
          by `epsilon` (default 0.05 with `space`), not a loss (docs/quality.md).
        * "fixed": quantize with `commit.quant`.
        * "lossless": store every tensor exactly.

        `lossless=True` or an explicit `quant=` bypass the search; an explicit
        `space=` (a `mvc.search.SearchSpace`) searches that cube whatever the
        mode. `policy` chooses which tensors are quantized (default: big float
        tensors, not biases / norms / optimizer state); `grads` (by flattened
        tensor name, e.g. an EMA of gradients) enables sensitivity-based
        protect / prune.  `hessians`: input Hessians of linear layers (by module parameter
        name, ``layers.0.fc.weight``, or flattened name; `mvc.quant.feedback.collect_hessians`),
        or a function returning them: a config or search space with error feedback
        (`QuantConfig.feedback`, `SearchSpace.feedback`) re-assigns those weights' levels with
        GPTQ.  A quality gate from `mvc.quality.from_module` gives its own when none are passed.

        The work runs as the pipeline of `mvc.repo.pipeline`: plan (outside the
        lock: the search is the slow part), then, under the write lock, write
        and publish against the branch's commit at that moment.

        `progress` (a `mvc.progress.Progress`; default: none) hears of the plan ("choosing
        storage") and of each tensor written (its raw bytes).

        `allow_empty=False`: when the snapshot this commit would record is exactly HEAD's
        (the same tensors, stored the same way, and the same structure), no commit is made
        and `mvc.repo.transaction.NothingToCommitError` (`.head`: HEAD's id) is raised, as
        git says "nothing to commit".  The default makes the commit anyway.
        """
        from mvc.native.heap import release_free_heap
        from mvc.repo import commitopts, pipeline
        from mvc.state import flatten

        if not isinstance(message, str) or not message.strip():
            raise UsageError("a commit needs a non-empty message")
        clean_metrics = check_metrics(metrics)
        check_step(step)
        how = commitopts.quantization(self.config, lossless, quant, policy, quality, epsilon, space,
                                      hessians)
        commitopts.warn_lossless_after_lossy(how, lossless, self.config, self.odb, self.head())
        # the parent's levels are read one tensor at a time for its deltas and not kept: this
        # commit's own are kept once it lands (`_remember_levels`), and a plan holding both
        # sets at once would double the levels a commit holds in host memory
        tx = self.commit_transaction(keep_parent_levels=False)
        lossy_plan = how.mode != "lossless"
        # HEAD now is only a hint for the plan (warm start, the search's starting config):
        # the branch may move before the lock is taken, which costs nothing but compression.
        with self.safe_globals():
            flat = flatten(state)
        with phase(progress, "choosing storage", total_items=len(flat.tensors)) as p:
            plan = pipeline.plan(flat, how, tx.parent(self.head(), lossy_plan),
                                 read_centroids=tx.read_centroids, settings=tx.settings,
                                 grads=grads,
                                 progress=p)
        info = tx.info(message, step=step, metrics=clean_metrics)
        bases: pipeline.Bases = {}
        landed = tx.commit(plan, info, bases=bases, progress=progress, allow_empty=allow_empty)
        # what the writer's threads freed goes back to the OS before the level cache takes its
        # copies (host copies of a device state's levels, made on this thread: its arena does
        # not reuse the pool threads' free pieces, so they would land on top of them)
        release_free_heap()
        self._remember_levels(landed.commit, landed.snapshot, plan.write.quantized, bases,
                              superseded=plan.write.parent.snapshot)
        del plan, bases
        release_free_heap()   # a training process keeps running: not at this commit's peak
        return landed.commit

    def commit_transaction(self, *, keep_parent_levels: bool = True) -> CommitTransaction:
        """The commit transaction over this repository (`mvc.repo.transaction`), with the
        `commit.*` settings, the lock timeout and the author read from the config now: what
        `commit` and a sharded save (`mvc.dcp`) plan against, write and publish through.

        `keep_parent_levels=False`: the parent levels its deltas read are not kept in the
        in-memory level cache (for a caller that keeps the new commit's instead)."""
        from mvc.repo.transaction import CommitTransaction

        get = self.config.get
        read = self.reader.read_quantized
        return CommitTransaction(
            blobs=self.store.blobs, refs=self.store.refs, maintenance=self.store.maintenance,
            odb=self.odb,
            read_quantized=read if keep_parent_levels else functools.partial(read, cache_levels=False),
            read_centroids=self.reader.read_centroids,
            settings=self.commit_settings(), lock_timeout=self._lock_timeout(),
            user_name=get("user.name"), user_email=get("user.email"))

    def _remember_levels(self, cid: str, snap_id: str, quantized: Mapping[str, Any],
                         bases: pipeline.Bases, *,
                         superseded: str | None = None) -> None:
        """Keep a landed commit's levels for later commits and checkouts.

        Only a speed-up: a failure here (a full disk) is a warning, never a reported
        failed commit."""
        try:
            self.reader.remember(snap_id, quantized, bases, superseded=superseded)
        except (OSError, MvcError) as exc:
            warnings.warn(MvcWarning(
                f"commit {cid[:12]} is stored, but its level cache was not written "
                f"({getattr(exc, 'strerror', None) or exc}); checkouts of it walk its "
                "delta chains instead"), stacklevel=3)

    # ------------------------------------------------------------------ checkout
    def read_state(self, rev: str = "HEAD", *, map_location: str | torch.device | None = None,
                   only: Sequence[str] | None = None, weights_only: bool = False,
                   progress: Progress | None = None, cache_levels: bool = True) -> Any:
        """The checkpoint stored at `rev`, rebuilt with its original structure; HEAD does not move.

        `map_location`: the device its tensors go to (a name or a `torch.device`; default the
        CPU). One that names no device, or a CUDA device this process cannot use, raises
        `UsageError` before anything is read.

        `only` (name patterns like ``model.*``) and `weights_only` (drop optimizer state)
        restore part of it, reading only the payloads that part needs (`mvc.state.prune`).
        `progress`: hears of each tensor restored (default: none). `cache_levels=False`: keep
        no decoded levels in memory afterwards (about a quarter of a float32 state less at
        the peak), for a process that will not commit on top of this state; by default they
        are kept, so the next commit here reads its parent without decoding."""
        with self.safe_globals():
            return self.reader.read_state(self.resolve(rev), map_location=map_location,
                                          only=only, weights_only=weights_only, progress=progress,
                                          cache_levels=cache_levels)

    def checkout(self, rev: str = "HEAD", *, move_head: bool = True,
                 map_location: str | torch.device | None = None,
                 only: Sequence[str] | None = None, weights_only: bool = False,
                 progress: Progress | None = None, cache_levels: bool = True) -> Any:
        """Rebuild the checkpoint at `rev` and move HEAD there: attached if `rev` names a branch
        (`main`, `refs/heads/main`, or `HEAD` while attached), detached otherwise.
        `only` / `weights_only` / `progress` / `cache_levels`: as for `read_state`."""
        cid, branch = self.resolve_rev(rev)
        # By the id resolved: never through revision parsing again, where a ref could be
        # named like it.
        with self.safe_globals():
            state = self.reader.read_state(cid, map_location=map_location, only=only,
                                           weights_only=weights_only, progress=progress,
                                           cache_levels=cache_levels)
        if move_head:
            self.move_head(cid, branch, rev)
        return state

    # ------------------------------------------------------------------ history
    def iter_log(self, rev: str = "HEAD") -> Iterator[Commit]:
        """Commits reachable from `rev`, newest first (by commit time)."""
        if rev == "HEAD":
            # Read HEAD once: an unborn branch has an empty log, even if a commit lands meanwhile.
            start = self.head()
            if start is None:
                return
        else:
            start = self.resolve(rev)
        yield from self.odb.walk_commits([start], order="date")

    def log(self, rev: str = "HEAD", n: int | None = None, *, all_refs: bool = False) -> list[Commit]:
        """Up to `n` commits reachable from `rev`, newest first; `all_refs`: from every branch,
        remote-tracking branch, tag and HEAD instead (git's `log --all`)."""
        out: list[Commit] = []
        commits: Iterator[Commit]
        if all_refs:
            roots = {oid for _, oid in self.branches()} | {oid for _, oid in self.tags()}
            roots |= {oid for _, oid in self.refops.remote_branches()}
            head = self.head()
            commits = self.odb.walk_commits(roots | ({head} if head else set()), order="date")
        else:
            commits = self.iter_log(rev)
        for c in commits:
            if n is not None and len(out) >= n:
                break
            out.append(c)
        return out

    # ------------------------------------------------------------------ maintenance / inspection
    def gc(self, *, dry_run: bool = False, max_chain: int | None = None,
           shrink: bool = False, progress: Progress | None = None,
           keep_last: int | None = None, keep_every: int | None = None,
           reflog_expire: float | None = None) -> GcReport:
        """Bound delta chains (`gc.max_chain`, `commit.chain_budget`), remove objects unreachable
        from refs and reflogs, and with `shrink` give the freed space back to the file system.

        The reflog of a deleted branch or tag (and so its last tip) is kept `reflog_expire`
        days after the deletion (default: `gc.reflog_expire`; 0: expire now).
        `keep_last` / `keep_every`: a retention policy (`mvc.repo.retention`): the commits it
        does not keep are pruned -- they stay in history, marked, without their checkpoint.
        Never changes what any kept commit restores."""
        from mvc.repo.gc import GcSettings, collect_garbage
        from mvc.repo.retention import RetentionPolicy

        get = self.config.get
        settings = GcSettings(
            max_chain=int(get("gc.max_chain")) if max_chain is None else max_chain,
            chain_budget=float(get("commit.chain_budget")),
            chunk_size=int(get("commit.chunk_mib")) << 20, lock_timeout=self._lock_timeout(),
            reflog_expire_days=float(get("gc.reflog_expire")) if reflog_expire is None else reflog_expire)
        report = collect_garbage(self.odb, self.reader, self.store.refs, self.store.maintenance,
                                 settings, dry_run=dry_run, shrink=shrink, progress=progress,
                                 retention=RetentionPolicy(keep_last, keep_every)
                                 if keep_last is not None or keep_every is not None else None)
        if not dry_run:
            # The level cache is disposable: entries of snapshots gc freed or re-encoded go too,
            # so fsck has nothing to warn about after a gc.
            try:
                report.cache_files_removed = len(self.prune_level_cache())
            except OSError as exc:
                warnings.warn(MvcWarning(f"gc: stale level-cache files were not deleted ({exc.strerror or exc}); "
                                         "`mvc fsck --prune-cache` deletes them"), stacklevel=2)
        return report

    def fsck(self, *, progress: Progress | None = None, decode: bool = False) -> FsckReport:
        """Verify every object and every reference; warn about unusable level-cache entries.
        `decode`: also decode every tensor of every reachable snapshot, as a checkout would
        (`mvc.repo.fsck_decode`: a payload can pass its id check and still not decode)."""
        from mvc.repo.fsck import check_repository

        report = check_repository(self.odb, self.store.maintenance, self._level_files(), progress)
        if decode:
            from mvc.repo.fsck_decode import undecodable

            with self.safe_globals():
                report.problems.extend(undecodable(self.odb, report.snapshots, progress,
                                                   warnings=report.warnings))
        return report

    def prune_level_cache(self) -> list[str]:
        """Delete the level-cache files fsck warns about (the cache is disposable); returns the
        warnings that named them."""
        from mvc.repo.levelfile import check_level_cache

        return check_level_cache(self._level_files(), self.odb.read_snapshot, remove=True)

    def _level_files(self) -> LevelFiles:
        """The level cache's directory as fsck checks it: its files, read without torch (the
        reader's `DiskLevelCache` is the same directory)."""
        from mvc.repo.levelfile import LevelFiles

        return LevelFiles(self.mvc_dir / "cache" / "levels", self.store.maintenance)

    def diff(self, a: str, b: str) -> list[TensorDiff]:
        """Per-tensor differences between two revisions."""
        from mvc.repo import inspect

        return inspect.diff(self.odb, self.reader, self.resolve(a), self.resolve(b))

    def diff_state(self, rev: str, state: Any) -> list[TensorDiff]:
        """Per-tensor differences between revision `rev` and `state` (any checkpoint structure,
        e.g. the working checkpoint file loaded)."""
        from mvc.repo import inspect
        from mvc.state import flatten

        with self.safe_globals():
            flat = flatten(state)
        return inspect.diff_state(self.odb, self.reader, self.resolve(rev), flat.tensors)

    def stats(self) -> RepoStats:
        """Raw vs stored bytes per commit and in total, and what the repository occupies."""
        from mvc.repo import inspect

        return inspect.stats(self.odb, self.store.maintenance, self.mvc_dir / "cache")

