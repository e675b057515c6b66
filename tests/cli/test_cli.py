"""The `mvc` command line: commands, output, exit codes, bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from checkpoints import assert_same
from cli_helpers import run
from locations import ROOT

from mvc.repo.repository import Repo


def test_commit_log_show_checkout_roundtrip(work, state):
    torch.save(state, work / "ckpt.pt")
    code, out, err = run(work, "commit", "-m", "epoch 1", "ckpt.pt", "--step", "10",
                         "--metric", "loss=0.5", "--metric", "acc=0.9")
    assert code == 0, err
    code, out, _ = run(work, "log", "--json")
    entries = json.loads(out)
    assert len(entries) == 1 and entries[0]["step"] == 10
    assert entries[0]["metrics"] == {"loss": 0.5, "acc": 0.9}
    cid = entries[0]["id"]
    code, out, _ = run(work, "log", "--oneline")
    assert out.startswith(cid[:12]) and "HEAD -> main" in out and "epoch 1" in out
    code, out, _ = run(work, "show", cid[:8])
    assert code == 0 and "model/embed.weight" in out and "codec" in out
    code, out, _ = run(work, "show", "HEAD", "--json")
    shown = json.loads(out)
    assert shown["id"] == cid and shown["tensors"][0]["stored_bytes"] > 0
    code, out, err = run(work, "checkout", "HEAD", "-o", "restored.pt")
    assert code == 0, err
    from mvc.io.files import load_checkpoint

    assert_same(state, load_checkpoint(work / "restored.pt"))


def test_configured_checkpoint_path_and_status(work):
    torch.save({"w": torch.ones(4)}, work / "model.pt")
    assert run(work, "config", "checkpoint.path", "model.pt")[0] == 0
    code, out, err = run(work, "commit", "-m", "epoch 12")
    assert code == 0, err
    assert "unchanged since HEAD" in run(work, "status")[1]
    torch.save({"w": torch.zeros(4)}, work / "model.pt")
    assert "modified" in run(work, "status")[1]
    run(work, "commit", "-m", "epoch 13")
    code, out, err = run(work, "checkout", "HEAD~1")
    assert code == 0, err
    assert torch.equal(torch.load(work / "model.pt", weights_only=True)["w"], torch.ones(4))
    assert "detached" in run(work, "status")[1]


def test_safetensors_in_and_out(work):
    from safetensors.torch import load_file, save_file

    sd = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    save_file(sd, str(work / "m.safetensors"))
    assert run(work, "commit", "-m", "st", "m.safetensors")[0] == 0
    code, _, err = run(work, "checkout", "HEAD", "-o", "out.safetensors")
    assert code == 0, err
    back = load_file(str(work / "out.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in sd.items())


def test_branch_tag_switch_diff_gc_fsck_stats(work):
    torch.save({"w": torch.ones(8)}, work / "c.pt")
    run(work, "commit", "-m", "one", "c.pt")
    assert run(work, "branch", "exp")[0] == 0
    assert run(work, "switch", "exp")[0] == 0
    torch.save({"w": torch.ones(8) * 2}, work / "c.pt")
    run(work, "commit", "-m", "two", "c.pt")
    out = run(work, "branch")[1]
    assert "* exp" in out and "  main" in out
    code, out, _ = run(work, "branch", "-d", "exp")
    assert code == 18  # refuses the current branch
    assert run(work, "tag", "v1", "main")[0] == 0
    code, out, _ = run(work, "diff", "main", "exp")
    assert code == 0 and "changed" in out
    assert run(work, "switch", "main")[0] == 0
    assert run(work, "branch", "-d", "exp")[0] == 135  # unmerged: "two" is on no other ref
    assert run(work, "branch", "-D", "exp")[0] == 0
    code, out, _ = run(work, "gc", "--dry-run")
    assert code == 0 and "would remove" in out
    code, out, _ = run(work, "gc")
    assert code == 0 and "removed" in out
    code, out, _ = run(work, "fsck")
    assert code == 0 and "ok" in out
    code, out, _ = run(work, "stats", "--json")
    assert json.loads(out)["commits"][0]["raw_bytes"] == 32
    assert run(work, "log", "--graph")[1].startswith("* commit")


def test_unknown_revision_and_not_a_repo(tmp_path, work):
    code, _, err = run(work, "show", "nope")
    assert code == 4 and err.count("\n") == 1 and "nope" in err
    code, _, err = run(tmp_path.parent, "log")
    assert code == 3 and "not an mvc repository" in err


def _bad_inputs(d: Path) -> dict[str, Path]:
    torch.save({"w": torch.randn(64, 64)}, d / "good.pt")
    data = (d / "good.pt").read_bytes()
    (d / "truncated.pt").write_bytes(data[: len(data) // 2])
    (d / "text.pt").write_text("this is not a checkpoint\n")
    (d / "adir.pt").mkdir()
    marker = d / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": torch.ones(2), "evil": Evil()}, d / "evil.pt")
    return {"truncated": d / "truncated.pt", "text": d / "text.pt", "dir": d / "adir.pt",
            "missing": d / "missing.pt", "evil": d / "evil.pt"}


def test_bad_input_one_line_distinct_codes_repo_untouched(work):
    torch.save({"w": torch.ones(3)}, work / "ok.pt")
    assert run(work, "commit", "-m", "base", "ok.pt")[0] == 0
    with Repo(work) as repo:
        before = (sorted(repo.store.blobs.iter_ids()), repo.head())
    codes, errors = {}, {}
    for kind, path in _bad_inputs(work).items():
        proc = subprocess.run([sys.executable, "-m", "mvc", "commit", "-m", "bad", str(path)],
                              cwd=work, capture_output=True, text=True)
        codes[kind], errors[kind] = proc.returncode, proc.stderr
        assert proc.returncode not in (0, 1, 70), (kind, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert path.name in proc.stderr
    assert not (work / "PWNED").exists()
    # distinct classes: missing is "not found", truncated/text share "corrupt"
    assert codes["evil"] not in (codes["truncated"], codes["missing"])
    assert codes["truncated"] == codes["text"] != codes["missing"]
    # A directory is committed as a checkpoint directory (mvc.io.dirs): an empty one has nothing in it.
    assert codes["dir"] == 150 and "no files to commit" in errors["dir"]
    with Repo(work) as repo:
        assert (sorted(repo.store.blobs.iter_ids()), repo.head()) == before


def test_python_dash_m_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mvc", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "commit" in proc.stdout


def test_exit_codes_are_distinct_per_class():
    import importlib
    import pkgutil

    import mvc
    from mvc.errors import MvcError

    for m in pkgutil.walk_packages(mvc.__path__, "mvc."):
        if m.name.startswith("mvc._mvc_native") or m.name == "mvc.__main__":
            continue
        try:
            importlib.import_module(m.name)
        except ImportError:
            pass

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    seen: dict[int, type] = {}
    for cls in set(subclasses(MvcError)):
        if "exit_code" in cls.__dict__:
            assert cls.exit_code not in seen, f"{cls.__name__} and {seen[cls.exit_code].__name__} share {cls.exit_code}"
            seen[cls.exit_code] = cls


def test_every_exit_code_is_documented():
    import importlib
    import pkgutil

    import mvc
    from mvc.errors import MvcError

    for m in pkgutil.walk_packages(mvc.__path__, "mvc."):
        if not (m.name.startswith("mvc._mvc_native") or m.name == "mvc.__main__"):
            importlib.import_module(m.name)
    doc = (ROOT / "docs" / "cli.md").read_text()

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    for cls in set(subclasses(MvcError)):
        if "exit_code" in cls.__dict__:
            assert f"| {cls.exit_code} | `{cls.__name__}` |" in doc, f"{cls.__name__} missing from docs/cli.md"


def test_every_config_key_is_documented_with_its_default():
    from mvc.repo.config import DEFAULTS

    doc = (ROOT / "docs" / "cli.md").read_text()
    for key, default in DEFAULTS.items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{key}`")), None)
        assert row is not None, f"{key} missing from docs/cli.md"
        if isinstance(default, str):
            assert f"`{default}`" in row, f"{key}: documented default differs from {default!r}"
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            assert f"| {default:g} |" in row, f"{key}: documented default differs from {default!r}"
