"""The `mvc` command: a click group whose commands are thin calls into `mvc.repo`.

Errors: every `MvcError` becomes one line on stderr (escaped, like all user-provided
text) and the error class's own exit code; anything else is a bug and says so
(traceback only with MVC_DEBUG=1).
"""
from __future__ import annotations

import inspect
import os
import re
import sys
import traceback
import warnings

import click

from mvc.cli.format import echo
from mvc.errors import DiskFullError, InternalError, MvcError, MvcWarning, is_disk_full


class _LazyGroup(click.Group):
    """The command modules (and through them torch) are imported when a command is first
    looked up, not at start-up: `mvc --version` and usage errors of the group itself stay
    fast."""

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        if not getattr(self, "_loaded", False):
            self._loaded = True
            _register()
        return self._commands

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._commands = value


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mvc", prog_name="mvc")
@click.option("-C", "directory", type=click.Path(file_okay=False), default=None,
              help="Run as if started in this directory.")
def cli(directory: str | None) -> None:
    """mvc: version control for training checkpoints."""
    if directory:
        try:
            os.chdir(directory)
        except OSError as exc:
            raise click.UsageError(f"cannot change to {directory}: {exc.strerror}")


def _register() -> None:
    from mvc.cli import commands_history, commands_maint, commands_refs, commands_remote, commands_work

    for mod in (commands_work, commands_refs, commands_history, commands_maint, commands_remote):
        for cmd in mod.COMMANDS:
            if cmd.short_help is None and cmd.help:
                cmd.short_help = first_sentence(cmd.help)
            cli.add_command(cmd)


def first_sentence(help_text: str) -> str:
    """The first sentence of a command's help, whole: `mvc --help` lists it (wrapped), where
    click would cut it at about 45 characters with "..."."""
    paragraph = " ".join(inspect.cleandoc(help_text).split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0]


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, MvcWarning):
        echo(f"mvc: warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    """Entry point for the `mvc` console script and `python -m mvc`."""
    saved, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        # Every command says each of its warnings, even one an earlier command in this
        # process said (the default filter shows a message once per place).
        with warnings.catch_warnings():
            warnings.simplefilter("always", MvcWarning)
            return _run(argv)
    finally:
        warnings.showwarning = saved


def _run(argv: list[str] | None) -> int:
    try:
        cli.main(args=argv, prog_name="mvc", standalone_mode=False)
        return 0
    except MvcError as exc:
        echo(f"mvc: error: {exc}", err=True)
        if isinstance(exc, InternalError) and os.environ.get("MVC_DEBUG"):
            traceback.print_exc()
        return exc.exit_code
    except click.exceptions.Abort as exc:
        # click turns Ctrl-C inside a command into Abort (after printing a newline).
        ctrl_c = isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt)
        click.echo("mvc: interrupted" if ctrl_c else "mvc: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("mvc: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # disk full, permissions, ...: the environment, not a bug
        where = f": {exc.filename}" if exc.filename else ""
        echo(f"mvc: error: {exc.strerror or exc}{where}", err=True)
        return DiskFullError.exit_code if is_disk_full(exc) else 74
    except Exception as exc:  # a bug: say so plainly
        # A library's message may quote a request URL with credentials in it.
        from mvc.store.objstore.storage import redact_url

        echo(f"mvc: internal error (this is a bug): {type(exc).__name__}: {redact_url(str(exc))}",
             err=True)
        if os.environ.get("MVC_DEBUG"):
            traceback.print_exc()
        else:
            click.echo("mvc: rerun with MVC_DEBUG=1 for a traceback", err=True)
        return InternalError.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
