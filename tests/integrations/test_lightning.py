"""PyTorch Lightning with mvc: MvcCheckpointIO (pointer files, one commit per checkpoint, resume)
and MvcCallback (gradient EMA, logged metrics, quality function).

Real Trainers run on CPU with a tiny MLP over sklearn's digits (data shipped in the package,
nothing downloaded).  The Trainer-facing tests run once per Lightning package (`lightning`,
`pytorch_lightning`), each with its own mvc module's classes (`lightning_ns`).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

datasets = pytest.importorskip("sklearn.datasets")

from cli_helpers import run  # noqa: E402
from lightning_tiny import PACKAGES, loader, namespace, tiny_trainer  # noqa: E402
from mvc.integrations.lightning_core import PointerFileError, read_pointer, tag_for  # noqa: E402
from mvc.repo.repository import Repo  # noqa: E402

@pytest.fixture(params=sorted(PACKAGES))
def lightning_ns(request) -> SimpleNamespace:
    return namespace(request.param)


def test_fit_commits_each_checkpoint_and_resumes_from_a_pointer(tmp_path, lightning_ns):
    ns = lightning_ns
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    model = ns.Digits()
    tiny_trainer(ns, tmp_path, io, max_steps=6, callbacks=[ns.mvc.MvcCallback(io)]).fit(model, loader())
    pointers = sorted((tmp_path / "ckpts").glob("*.ckpt"))
    assert [p.name for p in pointers] == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt"]
    repo = Repo(tmp_path / "runs")
    log = repo.log()
    assert [c.step for c in log] == [6, 4, 2], "one commit per checkpoint"
    assert "train_loss" in log[0].metrics
    for p in pointers:
        assert p.stat().st_size < 600, "a pointer file is small"
        pointer = read_pointer(p)
        assert pointer["commit"] in [c.id for c in log] and dict(repo.tags())[pointer["tag"]] == pointer["commit"]
    # Bit-exact restore (lossless): the step-6 weights are the trained model's.
    restored = io.load_checkpoint(pointers[-1])
    assert restored["global_step"] == 6
    for k, v in model.state_dict().items():
        assert torch.equal(restored["state_dict"][k], v)

    # fit(ckpt_path=pointer) resumes at step 4 and runs to 8.
    resumed, seen = ns.Digits(), ns.Seen()
    t = tiny_trainer(ns, tmp_path / "second", io, max_steps=8, callbacks=[seen])
    t.fit(resumed, loader(), ckpt_path=str(pointers[1]))
    assert seen.steps == [5, 6, 7, 8] and t.global_step == 8

    # remove_checkpoint drops the pointer and its tag; the commit stays in history.
    io.remove_checkpoint(pointers[0])
    assert not pointers[0].exists() and tag_for(pointers[0]) not in dict(repo.tags())
    assert len(repo.log()) >= 3


def test_top_k_removal_and_plain_ckpt_checkout(tmp_path, lightning_ns):
    ns = lightning_ns
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    trainer = tiny_trainer(ns, tmp_path, io, max_steps=6, callbacks=[ns.mvc.MvcCallback(io)], save_top_k=1,
                       monitor="train_loss", save_last=True)
    trainer.fit(ns.Digits(), loader())
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert len(names) == 2 and "last.ckpt" in names, names
    repo = Repo(tmp_path / "runs")
    assert sorted(t for t, _ in repo.tags()) == sorted(tag_for(tmp_path / "ckpts" / n) for n in names)
    # `mvc checkout COMMIT -o x.ckpt` writes a plain checkpoint Lightning resumes from without mvc.
    last = read_pointer(tmp_path / "ckpts" / "last.ckpt")
    code, _, err = run(repo.path, "checkout", last["commit"], "-o", str(tmp_path / "x.ckpt"))
    assert code == 0, err
    seen = ns.Seen()
    plain = ns.L.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, callbacks=[seen])
    plain.fit(ns.Digits(), loader(), ckpt_path=str(tmp_path / "x.ckpt"))
    assert seen.steps == [7, 8]


def test_save_last_makes_one_commit_per_save_and_resumes_from_last(tmp_path, lightning_ns):
    """`save_last=True` saves each state twice (the top-k file, then last.ckpt): the second save
    is the head's checkpoint again and makes no commit; last.ckpt points at the same commit.
    Only the first save differs: ModelCheckpoint records `last_model_path` in the checkpoint from
    its first last.ckpt on, so that one is a change (Lightning's resume reads it back)."""
    ns = lightning_ns
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    tiny_trainer(ns, tmp_path, io, max_steps=8, callbacks=[ns.mvc.MvcCallback(io)], save_last=True).fit(
        ns.Digits(), loader())
    saves = [(p.split("/")[-1], cid) for p, cid in io.commits]
    assert [name for name, _ in saves] == ["epoch=0-step=2.ckpt", "last.ckpt", "epoch=0-step=4.ckpt", "last.ckpt",
                                           "epoch=0-step=6.ckpt", "last.ckpt", "epoch=0-step=8.ckpt", "last.ckpt"]
    for i in (2, 4, 6):
        assert saves[i][1] == saves[i + 1][1], f"{saves[i]}: last.ckpt is the same commit"
    repo = Repo(tmp_path / "runs")
    log = repo.log()
    assert [c.step for c in log] == [8, 6, 4, 2, 2], "one commit per save (the first: two)"
    code, out, err = run(repo.path, "log", "--oneline")
    assert code == 0 and len(out.splitlines()) == 5 and "last.ckpt" in out.splitlines()[-2], (out, err)
    last = read_pointer(tmp_path / "ckpts" / "last.ckpt")
    assert last["commit"] == log[0].id == read_pointer(tmp_path / "ckpts" / "epoch=0-step=8.ckpt")["commit"]
    # Both pointers hold the commit by their own tag: dropping one keeps the other.
    io.remove_checkpoint(tmp_path / "ckpts" / "epoch=0-step=8.ckpt")
    assert dict(repo.tags())[last["tag"]] == log[0].id
    # Resuming from last.ckpt continues from step 8; its saves go on one per save.
    seen = ns.Seen()
    io2 = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    tiny_trainer(ns, tmp_path, io2, max_steps=10, callbacks=[seen, ns.mvc.MvcCallback(io2)], save_last=True).fit(
        ns.Digits(), loader(), ckpt_path=str(tmp_path / "ckpts" / "last.ckpt"))
    assert seen.steps == [9, 10]
    assert [c.step for c in repo.log()][:2] == [10, 8] and len(repo.log()) == 6
    assert not (tmp_path / "ckpts" / "last-v1.ckpt").exists()


def test_allow_empty_commits_every_save(tmp_path, lightning_ns):
    ns = lightning_ns
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True, allow_empty=True)
    tiny_trainer(ns, tmp_path, io, max_steps=4, save_last=True).fit(ns.Digits(), loader())
    assert len(Repo(tmp_path / "runs").log()) == 4, "allow_empty=True: a commit per save, as before"


def test_quality_function_and_grad_ema_reach_the_commit(tmp_path):
    """The default commit mode (the quantization search) judged by a quality function, with the
    gradient EMA, and save_last=True: last.ckpt's save after the first one commits nothing new
    (it gets the same gradients, so the search plans the same commit)."""
    ns = namespace("lightning")
    x, y = datasets.load_digits(return_X_y=True)
    xs, ys = torch.tensor(x[256:512] / 16.0, dtype=torch.float32), torch.tensor(y[256:512])
    calls: list[float] = []

    def val_loss(module) -> float:
        with torch.no_grad():
            loss = float(torch.nn.functional.cross_entropy(module.net(xs), ys))
        calls.append(loss)
        return loss

    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs")  # the default commit mode: the quantization search
    cb = ns.mvc.MvcCallback(io, quality=val_loss)
    model = ns.Digits()
    tiny_trainer(ns, tmp_path, io, max_steps=4, callbacks=[cb], save_last=True).fit(model, loader())
    log = Repo(tmp_path / "runs").log()
    assert calls, "the quality function judged the search"
    assert log[0].quality is not None and "lightning:" in json.dumps(log[0].quality)
    assert set(cb.ema.names) == {"state_dict/" + n for n, _ in model.named_parameters()}
    assert [c.step for c in log] == [4, 2, 2] and io.commits[-1][1] == io.commits[-2][1] == log[0].id


def test_the_gradient_ema_sees_16_mixed_gradients_unscaled(tmp_path):
    """A 16-mixed loss scaler multiplies the gradients by its scale until it unscales them
    before the optimizer step: the EMA folds them there, as a 32-bit run's."""
    ns = namespace("lightning")
    mixed = pytest.importorskip("lightning.pytorch.plugins").MixedPrecision

    def ema_after(steps: int, *plugins) -> dict[str, torch.Tensor]:
        io = ns.mvc.MvcCheckpointIO(tmp_path / f"runs{len(plugins)}", epsilon=0.05)
        cb = ns.mvc.MvcCallback(io)
        trainer = tiny_trainer(ns, tmp_path, io, max_steps=steps, callbacks=[cb], plugins=plugins,
                           every_n_train_steps=10**6)   # no saves: nothing takes the EMA
        trainer.fit(ns.Digits(), loader())
        assert cb.ema is not None
        return cb.ema.take()

    plain = ema_after(3)
    scaled = ema_after(3, mixed("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10)))
    assert plain.keys() == scaled.keys() and plain
    for k in plain:
        ratio = float(scaled[k].norm() / plain[k].norm())
        assert 0.5 < ratio < 2.0, (k, ratio)   # fp16 autocast's own noise; scaled: ~1024


def test_an_async_checkpoint_io_commits_each_save_with_its_own_arguments(tmp_path):
    """Lightning's AsyncCheckpointIO saves on a thread of its own: each checkpoint carries its
    own gradients and metrics there (not the plugin's, which the next save could replace), and
    they are not part of the commit."""
    ns = namespace("lightning")
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", epsilon=0.05)
    cb = ns.mvc.MvcCallback(io)
    ckpt = ns.L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2,
                                          save_top_k=-1)
    trainer = ns.L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False,
                           enable_progress_bar=False, enable_model_summary=False,
                           plugins=[ns.L.plugins.AsyncCheckpointIO(io)],
                           callbacks=[ckpt, cb], default_root_dir=tmp_path)
    trainer.fit(ns.Digits(), loader())
    with Repo(tmp_path / "runs") as repo:
        log = repo.log()
        assert [c.step for c in log] == [6, 4, 2]
        assert all(c.metrics and "train_loss" in c.metrics for c in log)
        assert all(c.quant for c in log)   # lossy: the proxy, with the EMA's gradients
        assert all("_mvc_pending" not in repo.read_state(c.id) for c in log)


def test_a_quality_function_with_an_async_checkpoint_io_is_refused(tmp_path):
    """The search's candidates would be copied into the live module on the saving thread while
    training goes on (training on them, and losing the updates made meanwhile)."""
    ns = namespace("lightning")
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs")
    cb = ns.mvc.MvcCallback(io, quality=lambda module: 0.0)
    trainer = ns.L.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False,
                           enable_progress_bar=False, enable_model_summary=False,
                           plugins=[ns.L.plugins.AsyncCheckpointIO(io)], callbacks=[cb],
                           default_root_dir=tmp_path)
    with pytest.raises(ns.mvc.LightningSetupError, match="AsyncCheckpointIO"):
        trainer.fit(ns.Digits(), loader())


def test_bad_pointer_file(tmp_path):
    p = tmp_path / "bad.ckpt"
    p.write_text('{"mvc_checkpoint_pointer": 1, "repo": 3}')
    with pytest.raises(PointerFileError):
        read_pointer(p)
    assert read_pointer(_write(tmp_path / "plain.txt", b"PK\x03\x04")) is None


def _write(path, data):
    path.write_bytes(data)
    return path


def test_removed_checkpoints_are_freed_by_retention(tmp_path):
    """ModelCheckpoint's top-k removal drops a pointer and its tag; `gc --keep-last 1` then prunes
    every commit no pointer holds (tags are always kept) and frees their bytes, while each
    remaining pointer still restores bit-identically."""
    ns = namespace("lightning")
    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    tiny_trainer(ns, tmp_path, io, max_steps=10, save_top_k=1, monitor="train_loss").fit(ns.Digits(), loader())
    pointers = sorted((tmp_path / "ckpts").glob("*.ckpt"))
    repo = Repo(tmp_path / "runs")
    before = {p: io.load_checkpoint(p)["state_dict"] for p in pointers}
    held = {read_pointer(p)["commit"] for p in pointers} | {repo.head()}
    stored = repo.stats().object_bytes
    report = repo.gc(keep_last=1, reflog_expire=0)
    assert report.removed_objects > 0 and report.freed_bytes > 0
    assert repo.pruned() == {c.id for c in repo.log()} - held
    assert repo.stats().object_bytes < stored
    for p, sd in before.items():
        restored = io.load_checkpoint(p)["state_dict"]
        assert all(torch.equal(restored[k], v) for k, v in sd.items())
    assert not repo.fsck().problems


def test_hyperparameters_with_paths_are_saved_and_unstorable_ones_refused_at_setup(tmp_path):
    """`save_hyperparameters()` of a `pathlib.Path` argument (a data directory): stored as a
    path and restored as one. A value mvc cannot store fails when fit starts, not at the first
    save an epoch of training later."""
    from pathlib import Path

    from mvc.state.leaves import UnsupportedStateError

    ns = namespace("lightning")

    class WithPath(ns.Digits):
        def __init__(self, data_dir: Path = Path("/data/digits"), lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

    io = ns.mvc.MvcCheckpointIO(tmp_path / "runs", lossless=True)
    tiny_trainer(ns, tmp_path, io, max_steps=2, callbacks=[ns.mvc.MvcCallback(io)]).fit(WithPath(), loader())
    back = io.load_checkpoint(sorted((tmp_path / "ckpts").glob("*.ckpt"))[-1])
    assert back["hyper_parameters"]["data_dir"] == Path("/data/digits")
    assert isinstance(back["hyper_parameters"]["data_dir"], Path)

    import argparse

    class WithObject(ns.Digits):   # an argparse.Namespace needs checkpoint.safe_globals
        def __init__(self, thing: object = argparse.Namespace(depth=2)) -> None:
            super().__init__()
            self.save_hyperparameters()

    io2 = ns.mvc.MvcCheckpointIO(tmp_path / "runs2", lossless=True)
    seen = ns.Seen()
    t = tiny_trainer(ns, tmp_path / "two", io2, max_steps=2, callbacks=[ns.mvc.MvcCallback(io2), seen])
    with pytest.raises(UnsupportedStateError, match="hyper_parameters"):
        t.fit(WithObject(), loader())
    assert seen.steps == []            # refused before any training step
