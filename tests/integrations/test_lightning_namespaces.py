"""Lightning's two packages (`lightning`, `pytorch_lightning`): each Trainer takes only its own
mvc classes, and saying so is mvc's job; a module whose package is missing says which to use.

Real Trainers of both packages (each test needs both installed; CI installs both).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lightning.pytorch")
pytest.importorskip("pytorch_lightning")

from lightning_tiny import loader, namespace, tiny_trainer  # noqa: E402

from mvc.integrations.lightning_core import LightningNotInstalledError, LightningSetupError  # noqa: E402
from mvc.repo.repository import Repo  # noqa: E402


@pytest.fixture
def both():
    return namespace("lightning"), namespace("pytorch_lightning")


@pytest.mark.parametrize("order", ["lightning plugin, pytorch_lightning Trainer",
                                   "pytorch_lightning plugin, lightning Trainer"])
def test_a_plugin_of_the_other_package_is_refused_naming_the_right_module(tmp_path, both, order):
    mine, other = both if order.startswith("lightning") else both[::-1]
    io = mine.mvc.MvcCheckpointIO(tmp_path / "runs")
    with pytest.raises(Exception, match="Found invalid type for plugin") as caught:
        other.L.Trainer(plugins=[io], logger=False, accelerator="cpu", enable_progress_bar=False)
    # Lightning's own message names the plugin by its repr, which says where the right one is.
    assert f"for a `{mine.package}` Trainer only" in str(caught.value)
    assert f"{other.mvc.__name__}.MvcCheckpointIO" in str(caught.value)


def test_a_callback_of_the_other_package_is_refused_at_setup(tmp_path, both):
    lightning, pl = both
    pl_io = pl.mvc.MvcCheckpointIO(tmp_path / "runs")
    # The callback checks its plugin's package when built ...
    with pytest.raises(LightningSetupError, match="needs that module's MvcCheckpointIO"):
        lightning.mvc.MvcCallback(pl_io)
    # ... and its Trainer's when the Trainer sets it up (Lightning accepts any callback object).
    stray = lightning.mvc.MvcCallback(lightning.mvc.MvcCheckpointIO(tmp_path / "runs"))
    trainer = tiny_trainer(pl, tmp_path, pl_io, max_steps=2, callbacks=[stray])
    with pytest.raises(LightningSetupError, match="is for a `lightning` Trainer, got a `pytorch_lightning` one: "
                                                  "use mvc.integrations.pytorch_lightning"):
        trainer.fit(pl.Digits(), loader())
    assert not (tmp_path / "ckpts").exists()
    assert LightningSetupError.exit_code == 105


def test_a_callback_whose_plugin_the_trainer_does_not_use_is_refused(tmp_path, both):
    _, pl = both
    io = pl.mvc.MvcCheckpointIO(tmp_path / "runs")
    trainer = tiny_trainer(pl, tmp_path, None, max_steps=2, callbacks=[pl.mvc.MvcCallback(io)])
    with pytest.raises(LightningSetupError, match=r"pass it as Trainer\(plugins=\[io\]\)"):
        trainer.fit(pl.Digits(), loader())


def test_a_run_saved_with_one_package_resumes_with_the_other(tmp_path, both):
    lightning, pl = both
    io = pl.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    tiny_trainer(pl, tmp_path, io, max_steps=4, callbacks=[pl.mvc.MvcCallback(io)]).fit(pl.Digits(), loader())
    seen = lightning.Seen()
    io2 = lightning.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    tiny_trainer(lightning, tmp_path / "second", io2, max_steps=6, callbacks=[seen, lightning.mvc.MvcCallback(io2)]).fit(
        lightning.Digits(), loader(), ckpt_path=str(tmp_path / "ckpts" / "epoch=0-step=4.ckpt"))
    assert seen.steps == [5, 6]
    assert [c.step for c in Repo(tmp_path / "runs").log()] == [6, 4, 2]


_BLOCKED = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # as if not installed
try:
    import {module}
except ImportError as exc:
    print(type(exc).__name__, exc.exit_code, exc.name, "|", exc)
"""


@pytest.mark.parametrize("module,blocked,says", [
    ("mvc.integrations.lightning", ["lightning"],
     "mvc.integrations.lightning needs the `lightning` package, which is not installed; `pytorch_lightning` is: "
     "with `import pytorch_lightning`, use mvc.integrations.pytorch_lightning"),
    ("mvc.integrations.pytorch_lightning", ["pytorch_lightning", "lightning_fabric"],
     "mvc.integrations.pytorch_lightning needs the `pytorch_lightning` package, which is not installed; "
     "`lightning` is: with `import lightning`, use mvc.integrations.lightning"),
    ("mvc.integrations.lightning", ["lightning", "pytorch_lightning"],
     "mvc.integrations.lightning needs the `lightning` package; neither `lightning` nor `pytorch_lightning` is "
     "installed: pip install 'mvc[lightning]' (installs both)"),
])
def test_a_missing_package_names_the_module_to_use_or_what_to_install(module, blocked, says):
    code = textwrap.dedent(_BLOCKED.format(blocked=blocked, module=module))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind, exit_code, name, _, message = proc.stdout.strip().split(" ", 4)
    assert (kind, int(exit_code), name) == ("LightningNotInstalledError", LightningNotInstalledError.exit_code,
                                           blocked[0])
    assert says in message and "\n" not in message
