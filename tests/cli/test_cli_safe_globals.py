"""`checkpoint.safe_globals` (issue 30 item 10): a checkpoint holding an `argparse.Namespace` is
refused by default, naming the global and how to allow it; once the repository allows it, it
is committed and restored identically; a repository without it refuses to rebuild it."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from helpers.cli_helpers import run
from mvc.io.files import UnsafeCheckpointError, load_checkpoint
from mvc.state.safe_globals import UnknownSafeGlobalError, allowing


def _save(path) -> dict:
    g = torch.Generator().manual_seed(0)
    state = {"state_dict": {"w": torch.randn(32, 32, generator=g)}, "epoch": 3,
             "hparams": argparse.Namespace(lr=0.1, name="run-1", layers=[64, 64], dropout=None)}
    torch.save(state, path)
    return state


def _load_trusted(path):
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, weights_only=True)


def test_namespace_checkpoint_refused_then_allowed_round_trips(work):
    state = _save(work / "model.ckpt")
    code, out, err = run(work, "commit", "-m", "e1", "model.ckpt")
    assert code == 22, (out, err)
    assert "argparse.Namespace" in err and "mvc config checkpoint.safe_globals argparse.Namespace" in err
    assert len(err.strip().splitlines()) == 1
    assert json.loads(run(work, "log", "--json")[1]) == []  # nothing was committed

    assert run(work, "config", "checkpoint.safe_globals", "argparse.Namespace")[0] == 0
    assert run(work, "config", "checkpoint.safe_globals")[1].strip() == "['argparse.Namespace']"
    code, out, err = run(work, "commit", "-m", "e1", "model.ckpt")
    assert code == 0, err
    code, out, err = run(work, "checkout", "HEAD", "-o", "restored.ckpt")
    assert code == 0, err
    back = _load_trusted(work / "restored.ckpt")
    assert back["hparams"] == state["hparams"] and type(back["hparams"]) is argparse.Namespace
    assert back["epoch"] == 3 and torch.equal(back["state_dict"]["w"], state["state_dict"]["w"])
    code, out, err = run(work, "diff", "HEAD", "--file", "model.ckpt")
    assert code == 0 and "1 unchanged" in out, (out, err)

    # A repository without the key (a clone: config stays local) cannot rebuild the value.
    assert run(work, "config", "--unset", "checkpoint.safe_globals")[0] == 0
    code, out, err = run(work, "checkout", "HEAD", "-o", "again.ckpt")
    assert code == 112, (out, err)
    assert "argparse.Namespace" in err and "checkpoint.safe_globals" in err
    assert not (work / "again.ckpt").exists()


@pytest.mark.parametrize("value, says", [
    ("argparse", "not module.qualname"),
    ("argparse.NoSuchThing", "does not resolve"),
    ("no_such_module_xyz.Thing", "does not resolve"),
    ("os.system", "never allowed"),
    ("builtins.eval", "never allowed"),
])
def test_bad_names_are_refused_when_set(work, value, says):
    code, out, err = run(work, "config", "checkpoint.safe_globals", value)
    assert code == UnknownSafeGlobalError.exit_code == 111, (out, err)
    assert says in err
    assert run(work, "config", "checkpoint.safe_globals")[1].strip() == "[]"


def test_a_list_of_names_and_the_printed_form_are_accepted(work):
    assert run(work, "config", "checkpoint.safe_globals", "argparse.Namespace, collections.Counter")[0] == 0
    shown = run(work, "config", "checkpoint.safe_globals")[1].strip()
    assert shown == "['argparse.Namespace', 'collections.Counter']"
    assert run(work, "config", "checkpoint.safe_globals", shown)[0] == 0  # what it prints reads back


def test_python_api_load_checkpoint_safe_globals(tmp_path):
    state = _save(tmp_path / "model.ckpt")
    before = list(torch.serialization.get_safe_globals())
    with pytest.raises(UnsafeCheckpointError, match="argparse.Namespace"):
        load_checkpoint(tmp_path / "model.ckpt")
    got = load_checkpoint(tmp_path / "model.ckpt", safe_globals=["argparse.Namespace"])
    assert got["hparams"] == state["hparams"]
    # Allowed for that load only, and nothing allowed before was dropped. (Not a comparison of
    # the whole list: torch registers its own entries, e.g. DTensor's, when a module of it is
    # first imported, which a load may do.)
    after = torch.serialization.get_safe_globals()
    assert argparse.Namespace not in after
    assert all(g in after for g in before)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(tmp_path / "model.ckpt")


def test_allowing_keeps_what_the_caller_allowed_before():
    with torch.serialization.safe_globals([argparse.Namespace]):  # the caller's own
        with allowing(["argparse.Namespace", "collections.Counter"]):
            pass
        # A nested torch safe_globals context would have removed it on exit.
        assert argparse.Namespace in torch.serialization.get_safe_globals()
    assert argparse.Namespace not in torch.serialization.get_safe_globals()
