"""init, commit, checkout, status, config."""
from __future__ import annotations

import contextlib
import os
import shlex
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mvc.cli.commands_history import storage_line
from mvc.cli.format import echo, human_bytes
from mvc.cli.progress import quiet_option, terminal_progress
from mvc.errors import MvcError, MvcWarning, UsageError
from mvc.progress import phase
from mvc.repo import worktree

if TYPE_CHECKING:
    from mvc.repo.repository import Repo
else:
    from mvc.cli.lazy import Repo


def _parse_metrics(items: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--metric expects KEY=VALUE, got {item!r}")
        try:
            out[key] = float(value)
        except ValueError:
            raise UsageError(f"--metric {key}: {value!r} is not a number") from None
    return out


def _checkpoint_path(repo: Repo, given: str | None, what: str) -> Path:
    if given:
        return Path(given)
    configured = repo.config.get("checkpoint.path")
    if not configured:
        raise UsageError(f"no {what} given and none configured "
                         "(pass a path, or `mvc config checkpoint.path PATH`)")
    p = Path(configured)
    return p if p.is_absolute() else repo.path / p


@click.command()
@click.argument("path", required=False, default=".", type=click.Path(file_okay=False))
def init(path: str) -> None:
    """Create an empty repository in PATH (default: the current directory)."""
    existed = (Path(path) / ".mvc" / "store").is_dir()
    repo = Repo.init(path)
    echo(f"{'Reinitialized existing' if existed else 'Initialized empty'} mvc repository in {repo.mvc_dir}")


@click.command()
@click.option("-m", "--message", required=True, help="Commit message.")
@click.argument("checkpoint", required=False)
@click.option("--step", type=int, default=None, help="Training step of this checkpoint.")
@click.option("--metric", "metrics", multiple=True, metavar="KEY=VALUE",
              help="A metric to record (repeatable).")
@click.option("--lossless", is_flag=True, default=False, help="Store every tensor exactly.")
@click.option("--epsilon", type=float, default=None,
              help="Bound for the config search: the quality.hook's relative degradation, or without "
                   "a hook the proxy's weighted relative L2 error (opts in to lossy commits).")
@click.option("--allow-empty", is_flag=True, default=False,
              help="Make the commit even when the checkpoint is stored exactly as HEAD's.")
@quiet_option
def commit(message: str, checkpoint: str | None, step: int | None, metrics: tuple[str, ...],
           lossless: bool, epsilon: float | None, allow_empty: bool, quiet: bool) -> None:
    """Commit CHECKPOINT (.pt/.pth/.ckpt/.safetensors, or a checkpoint directory such as
    a Hugging Face checkpoint-N/; default: checkpoint.path).

    By default (commit.mode = search) the most compressive quantization whose
    quality loss stays within epsilon is chosen, measured by the quality.hook
    function. Without a hook the commit is lossless unless --epsilon (or
    quality.epsilon) bounds the proxy, a weighted reconstruction error, not a loss
    (docs/quality.md). On a terminal a progress bar shows the load, the search and
    the tensors written (-q: none).

    A checkpoint stored exactly as HEAD's makes no commit: "nothing to commit", exit 0,
    as git does (--allow-empty: commit anyway)."""
    from mvc.io.checkpoint_errors import CheckpointNotFoundError
    from mvc.repo.objects import check_metrics, check_step

    # Everything a user can get wrong is checked before torch is imported (issue 30 item 6).
    if not message.strip():
        raise UsageError("a commit needs a non-empty message")
    metric_values = check_metrics(_parse_metrics(metrics))
    check_step(step)
    repo = Repo.discover()
    path = _checkpoint_path(repo, checkpoint, "checkpoint")
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such file")
    hook = repo.config.get("quality.hook")
    quality = load_hook(hook, repo.path) if hook and not lossless else None

    from mvc.io.dirs import load_dir
    from mvc.io.files import load_checkpoint
    from mvc.repo.transaction import NothingToCommitError

    with terminal_progress(quiet=quiet) as progress:
        with phase(progress, f"loading {path.name}", total_items=1, unit="files"), repo.safe_globals():
            state = load_dir(path) if path.is_dir() else load_checkpoint(path)
        st = path.stat()
        try:
            cid = repo.commit(state, message, step=step, metrics=metric_values,
                              lossless=True if lossless else None, quality=quality, epsilon=epsilon,
                              progress=progress, allow_empty=allow_empty)
            unchanged = False
        except NothingToCommitError as nothing:
            cid, unchanged = nothing.head, True
    try:
        if not path.is_dir():  # `status` tracks a checkpoint file, not a tree
            worktree.record(repo.store.maintenance, worktree.Stamp.of(path, cid, st), track=True)
    except MvcError as exc:  # the commit has landed; only `status` loses its hint
        warnings.warn(MvcWarning(f"commit {cid[:12]} is stored, but {exc}"), stacklevel=1)
    if unchanged:  # the file is HEAD's checkpoint: stamped as such above, for `status`
        echo(f"nothing to commit, {path} matches HEAD ({cid[:12]})")
        return
    branch = repo.current_branch()
    c = repo.read_commit(cid)
    from mvc.repo.inspect import commit_sizes

    sizes = commit_sizes(repo.odb, cid)
    line = storage_line(c, sizes.raw_bytes, sizes.encoded_bytes, new=sizes.new_bytes)
    if not c.quant and c.quality is None and not lossless and repo.config.get("commit.mode") == "search":
        line += " (no quality.hook: lossy commits are opt-in; see docs/quality.md)"
    echo(f"[{branch or 'detached HEAD'} {cid[:12]}] {c.summary}  {line}")


class QualityHookError(UsageError):
    """The configured quality.hook cannot be imported or is not callable."""

    exit_code = 28


def load_hook(spec: str, root: Path):
    """Import `module:function` (searched in the current directory and the repository root)."""
    import importlib
    import sys

    module, sep, func = spec.partition(":")
    if not sep or not module or not func:
        raise QualityHookError(f"quality.hook must look like module:function, got {spec!r}")
    for p in (str(root), os.getcwd()):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise QualityHookError(f"cannot load quality.hook {spec!r}: {exc}") from None
    if not callable(fn):
        raise QualityHookError(f"quality.hook {spec!r} is not callable")
    return fn


class UncommittedChangesError(UsageError):
    """`checkout` would write over a checkpoint file holding work the repository does not
    have (modified since mvc committed or wrote it, or never committed); nothing was written."""

    exit_code = 172


def _refuse_to_destroy(repo: Repo, path: Path, rev: str, to_output: bool, force: bool) -> None:
    """Refuse, before anything is read, a checkout that would destroy work only `path` holds
    (DESIGN.md invariant 10): a file that is no committed or checked-out state, or a
    non-empty directory. `force` lets it go, except over the repository itself."""
    if path.is_dir() and not path.is_symlink() and any(path.iterdir()):
        if not force:
            from mvc.io.dirs import OutputDirectoryExistsError  # imports torch: only to refuse

            raise OutputDirectoryExistsError(
                f"{path}: exists and is not empty; nothing was written. Keep it: give another "
                f"directory with -o; discard it: `mvc checkout {rev} -o {path} --force` replaces it")
        here = path.resolve()
        for inside in (repo.path.resolve(), Path.cwd().resolve()):
            if inside == here or here in inside.parents:
                raise UsageError(f"{path}: holds {inside}; --force does not replace it")
        return
    if force or not worktree.holds_unstored_work(repo.store.maintenance, path):
        return
    if to_output:
        raise UncommittedChangesError(
            f"{path}: exists and is not a checkpoint mvc committed or checked out; nothing was "
            f"written. Keep it: `mvc commit -m MSG {path}` first, or write {rev} to another file "
            f"with -o OTHER_FILE; discard it: add --force")
    raise UncommittedChangesError(
        f"{path}: modified (not committed); checking out {rev} would overwrite it, so nothing "
        f"was written. Keep it: `mvc commit -m MSG` first, or `mvc checkout {rev} -o OTHER_FILE`; "
        f"discard it: `mvc checkout {rev} --force`")


@click.command()
@click.argument("rev")
@click.option("-o", "--output", type=click.Path(), default=None,
              help="Write a copy of REV's checkpoint to this file (a directory for a committed "
                   "directory: absent or empty); HEAD does not move.")
@click.option("--format", "fmt", type=click.Choice(["pt", "safetensors"]), default=None,
              help="File format (default: from the extension, else checkpoint.format, pt unless set).")
@click.option("--only", "only", multiple=True, metavar="PATTERN",
              help="Restore only the tensors whose flattened name matches PATTERN (glob, e.g. "
                   "'model.*'; repeatable). Needs -o.")
@click.option("--weights-only", is_flag=True,
              help="Leave out optimizer state (the optimizer/optimizer_states/... subtrees and "
                   ".../state/<i>/<key> tensors such as Adam moments). Needs -o.")
@click.option("-f", "--force", is_flag=True,
              help="Write over the target even when it holds work the repository does not have (a "
                   "modified or never committed file, a non-empty directory): that work is lost.")
@click.option("--remote", "remote_name", metavar="NAME", default=None,
              help="Read REV straight from remote NAME (or a remote URL), reading only the objects "
                   "its checkpoint needs, without a clone or fetch. Needs -o.")
@quiet_option
def checkout(rev: str, output: str | None, fmt: str | None, only: tuple[str, ...], weights_only: bool,
             force: bool, remote_name: str | None, quiet: bool) -> None:
    """Write the checkpoint of REV to checkpoint.path and move HEAD to REV, as git checkout
    does (attached for a branch name, detached otherwise).

    With -o FILE: write a copy of REV's checkpoint to FILE and leave HEAD, the branch and
    checkpoint.path alone (like git show REV:path > FILE); with --remote NAME too, read REV
    from that remote without cloning it. --only / --weights-only restore
    part of the state, reading only the payloads it needs; a partial state is never the
    working checkpoint, so they need -o. On a terminal a progress bar shows the tensors
    restored (-q: none).

    As git does, checkout refuses to write over work the repository does not have: a file
    modified since mvc committed or wrote it, or one it never did (exit 172), or a non-empty
    directory (exit 151). --force writes over it.
    """
    from mvc.repo.pruned import check_not_pruned

    # Everything a user can get wrong is checked before torch is imported (issue 30 item 6:
    # a usage error answers at once, not after seconds of imports).
    if (only or weights_only) and output is None:
        raise UsageError("--only / --weights-only write a partial copy: give the file with -o FILE")
    if remote_name is not None:
        if output is None:
            raise UsageError("--remote reads a checkpoint into a file: give it with -o FILE")
        from mvc.cli.commands_remote import checkout_remote

        checkout_remote(remote_name, rev, output, fmt=fmt, only=only, weights_only=weights_only,
                        force=force, quiet=quiet)
        return
    repo = Repo.discover()
    path = _checkpoint_path(repo, output, "output file (-o)")
    # Resolve once: the id read is the id HEAD moves to, and HEAD attaches only to the
    # branch that resolution went through.
    cid, branch_ref = repo.resolve_rev(rev)
    check_not_pruned(repo.store.refs, cid)
    _check_directory_target(repo, cid, rev, output, bool(only or weights_only))
    _refuse_to_destroy(repo, path, rev, output is not None, force)
    parents = _missing_parents(path)

    from mvc.io.dirs import is_dir_state, save_dir
    from mvc.io.files import save_checkpoint

    with terminal_progress(quiet=quiet) as progress, repo.safe_globals():
        # No commit follows in this process: keeping the decoded levels for one would only
        # raise the peak (issue 27: a quarter of a float32 state).
        state = repo.reader.read_state(cid, only=only or None, weights_only=weights_only,
                                       progress=progress, cache_levels=False)
    if is_dir_state(state):
        if output is None:
            raise UsageError(f"{rev} holds a checkpoint directory: give the directory to write with -o DIR")
        if only or weights_only:
            raise UsageError(f"{rev} holds a checkpoint directory, which is checked out whole "
                             "(--only / --weights-only select tensors of one checkpoint file)")
        with _made(parents):
            save_dir(state, path, replace=force)
        echo(f"Wrote directory {path} from {cid[:12]}; HEAD unchanged")
        return
    with _made(parents), terminal_progress(quiet=quiet) as progress:
        save_checkpoint(state, path, _output_format(repo, path, fmt), progress=progress)
    # Stamped before HEAD moves: a checkout interrupted between the two leaves a file a
    # later checkout may overwrite, never one it must refuse for no reason.
    try:
        worktree.record(repo.store.maintenance, worktree.Stamp.of(path, cid, partial=bool(only or weights_only)),
                        track=output is None)
    except MvcError as exc:  # the file is written; without its stamp it only counts as modified
        warnings.warn(MvcWarning(f"{path} is written, but not recorded as {cid[:12]} ({exc}); "
                                 "`mvc status` calls it modified"), stacklevel=1)
    if output is not None:
        echo(f"Wrote {path} ({human_bytes(path.stat().st_size)}) from {cid[:12]}; HEAD unchanged")
        return
    repo.move_head(cid, branch_ref, rev)
    branch = repo.current_branch()
    where = f"on branch {branch}" if branch else f"HEAD detached at {cid[:12]}"
    echo(f"Wrote {path} ({human_bytes(path.stat().st_size)}); {where}")


#: `mvc.io.dirs.DIR_MARK`: the first key of a directory state (the skeleton's root says so
#: without torch; tests/cli/test_cli_fast_failures.py checks the two agree).
DIR_MARK = "mvc.directory"


def _check_directory_target(repo: Repo, cid: str, rev: str, output: str | None, partial: bool) -> None:
    """The usage errors of checking out a committed directory, from the snapshot's skeleton
    (metadata: no tensor is read, torch is not needed): it needs -o DIR and is whole."""
    root = repo.read_snapshot(repo.read_commit(cid).snapshot).skeleton.get("root")
    items = root.get("items") if isinstance(root, dict) and root.get("t") == "dict" else None
    if not (isinstance(items, list) and any(isinstance(kv, list) and kv[:1] == [DIR_MARK] for kv in items)):
        return
    if output is None:
        raise UsageError(f"{rev} holds a checkpoint directory: give the directory to write with -o DIR")
    if partial:
        raise UsageError(f"{rev} holds a checkpoint directory, which is checked out whole "
                         "(--only / --weights-only select tensors of one checkpoint file)")


def _missing_parents(path: Path) -> list[Path]:
    """The directories above `path` that do not exist yet, outermost first: checkout makes
    them, as `torch.save` users expect of `-o out/checkpoint-20` (only these: the path the
    user named, nothing beside it). A non-directory in the way is a usage error, now."""
    missing: list[Path] = []
    parent = path.absolute().parent
    while not parent.is_dir():
        if parent.exists() or parent.is_symlink():
            raise UsageError(f"{parent}: not a directory, so {path} cannot be written there")
        missing.append(parent)
        parent = parent.parent
    return missing[::-1]


@contextlib.contextmanager
def _made(parents: list[Path]) -> Iterator[None]:
    """Make `parents` (from `_missing_parents`) for a write; if the write fails, remove the
    ones made here that are still empty, leaving the file system as the user had it."""
    made: list[Path] = []
    try:
        for d in parents:
            try:
                d.mkdir()
            except FileExistsError:  # made meanwhile by someone else: theirs, not removed
                if not d.is_dir():
                    raise
                continue
            made.append(d)
        yield
    except BaseException:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:  # not empty (the write left something) or gone: leave it
                break
        raise


def _output_format(repo: Repo, path: Path, given: str | None) -> str | None:
    """--format, else None when the extension decides, else the configured `checkpoint.format`."""
    from mvc.io.files import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES

    if given is not None:
        return given
    if path.suffix.lower() in TORCH_SUFFIXES | SAFETENSORS_SUFFIXES:
        return None
    return str(repo.config.get("checkpoint.format"))


@click.command()
def status() -> None:
    """Show the current branch and HEAD, and whether the checkpoint file (checkpoint.path) was
    modified since mvc last wrote or committed it.
    """
    repo = Repo.discover()
    branch = repo.current_branch()
    head = repo.head()
    echo(f"On branch {branch}" if branch else f"HEAD detached at {head[:12] if head else '?'}")
    if branch:  # ahead / behind its upstream, from local refs only (as of the last fetch)
        from mvc.remote.tracking import status_lines

        for line in status_lines(repo.config, repo.store.refs, repo.odb, branch, head):
            echo(line)
    if head is None:
        echo("No commits yet")
    else:
        c = repo.read_commit(head)
        echo(f"HEAD {head[:12]} {c.summary}")
    configured = repo.config.get("checkpoint.path")
    tracked = worktree.current(repo.store.maintenance)
    path = Path(configured) if configured else (Path(tracked.path) if tracked else None)
    if path is None:
        echo("No checkpoint file configured (`mvc config checkpoint.path PATH`"
             + ("; `mvc checkout HEAD -o FILE` writes HEAD's checkpoint to FILE)" if head else ")"))
        return
    if not path.is_absolute():
        path = repo.path / path
    if not path.exists():
        echo(f"Checkpoint {path}: missing")
        return
    # The commit the file was last written from or committed as, while it is untouched since.
    # HEAD may have moved without the file being rewritten (`switch` never writes it), which
    # is not a modification.
    known = worktree.stamp_of(repo.store.maintenance, path)
    if known is None:
        echo(f"Checkpoint {path}: modified (not committed)")
    elif known.partial:
        echo(f"Checkpoint {path}: part of {known.commit[:12]} (written by checkout --only/--weights-only)")
    elif known.commit == head:
        echo(f"Checkpoint {path}: unchanged since HEAD")
    else:
        # Without checkpoint.path, `mvc checkout HEAD` has nowhere to write (exit 2): name the file.
        how = "mvc checkout HEAD" if configured else f"mvc checkout HEAD -o {shlex.quote(str(path))}"
        echo(f"Checkpoint {path}: unchanged since {known.commit[:12]}, which is not HEAD "
             f"(`{how}` writes HEAD's checkpoint)")


@click.command("config")
@click.argument("key", required=False)
@click.argument("value", required=False)
@click.option("--unset", is_flag=True, help="Remove KEY (back to its default).")
def config_cmd(key: str | None, value: str | None, unset: bool) -> None:
    """Get or set repository configuration (no KEY: list everything)."""
    repo = Repo.discover()
    if key is None:
        for k, v in repo.config.items().items():
            echo(f"{k} = {'' if v is None else v}")
    elif unset:
        repo.config.set(key, None)
    elif value is None:
        v = repo.config.get(key)
        echo("" if v is None else str(v))
    else:
        if key == "quality.hook" and value:
            # Checked now, not at the next commit: a typo should fail where it is made.
            load_hook(value, repo.path)
        repo.config.set(key, value)


COMMANDS = [init, commit, checkout, status, config_cmd]
