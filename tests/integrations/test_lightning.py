"""PyTorch Lightning with mvc: MvcCheckpointIO (pointer files, one commit per checkpoint, resume)
and MvcCallback (gradient EMA, logged metrics, quality function).

Real `lightning.Trainer` runs on CPU with a tiny MLP over sklearn's digits (data shipped in the
package, nothing downloaded).
"""
from __future__ import annotations

import json

import pytest
import torch

L = pytest.importorskip("lightning.pytorch")
datasets = pytest.importorskip("sklearn.datasets")

from cli_helpers import run  # noqa: E402
from mvc.integrations.lightning import (MvcCallback, MvcCheckpointIO, PointerFileError,  # noqa: E402
                                        read_pointer, tag_for)
from mvc.repo.repository import Repo  # noqa: E402


def _loader() -> torch.utils.data.DataLoader:
    x, y = datasets.load_digits(return_X_y=True)
    ds = torch.utils.data.TensorDataset(torch.tensor(x[:256] / 16.0, dtype=torch.float32),
                                        torch.tensor(y[:256], dtype=torch.long))
    return torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False)


class Digits(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 4)}


def _trainer(tmp_path, io, *, max_steps, callbacks=()):
    ckpt = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)
    return L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, plugins=[io] if io is not None else [],
                     callbacks=[ckpt, *callbacks], default_root_dir=tmp_path)


def test_fit_commits_each_checkpoint_and_resumes_from_a_pointer(tmp_path):
    io = MvcCheckpointIO(tmp_path / "runs", lossless=True)
    model = Digits()
    _trainer(tmp_path, io, max_steps=6, callbacks=[MvcCallback(io)]).fit(model, _loader())
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
    resumed = Digits()
    steps: list[int] = []

    class Seen(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            steps.append(trainer.global_step)

    t = _trainer(tmp_path / "second", io, max_steps=8, callbacks=[Seen()])
    t.fit(resumed, _loader(), ckpt_path=str(pointers[1]))
    assert steps == [5, 6, 7, 8] and t.global_step == 8

    # remove_checkpoint drops the pointer and its tag; the commit stays in history.
    io.remove_checkpoint(pointers[0])
    assert not pointers[0].exists() and tag_for(pointers[0]) not in dict(repo.tags())
    assert len(repo.log()) >= 3


def test_top_k_removal_and_plain_ckpt_checkout(tmp_path):
    io = MvcCheckpointIO(tmp_path / "runs", lossless=True)
    ckpt = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=1,
                                       monitor="train_loss", save_last=True)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[io], callbacks=[ckpt, MvcCallback(io)])
    trainer.fit(Digits(), _loader())
    names = sorted(p.name for p in (tmp_path / "ckpts").glob("*.ckpt"))
    assert len(names) == 2 and "last.ckpt" in names, names
    repo = Repo(tmp_path / "runs")
    assert sorted(t for t, _ in repo.tags()) == sorted(tag_for(tmp_path / "ckpts" / n) for n in names)
    # `mvc checkout COMMIT -o x.ckpt` writes a plain checkpoint Lightning resumes from without mvc.
    last = read_pointer(tmp_path / "ckpts" / "last.ckpt")
    code, _, err = run(repo.path, "checkout", last["commit"], "-o", str(tmp_path / "x.ckpt"))
    assert code == 0, err
    steps: list[int] = []

    class Seen(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            steps.append(trainer.global_step)

    plain = L.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, callbacks=[Seen()])
    plain.fit(Digits(), _loader(), ckpt_path=str(tmp_path / "x.ckpt"))
    assert steps == [7, 8]


def test_quality_function_and_grad_ema_reach_the_commit(tmp_path):
    x, y = datasets.load_digits(return_X_y=True)
    xs, ys = torch.tensor(x[256:512] / 16.0, dtype=torch.float32), torch.tensor(y[256:512])
    calls: list[float] = []

    def val_loss(module) -> float:
        with torch.no_grad():
            loss = float(torch.nn.functional.cross_entropy(module.net(xs), ys))
        calls.append(loss)
        return loss

    io = MvcCheckpointIO(tmp_path / "runs")  # the default commit mode: the quantization search
    cb = MvcCallback(io, quality=val_loss)
    model = Digits()
    _trainer(tmp_path, io, max_steps=2, callbacks=[cb]).fit(model, _loader())
    c = Repo(tmp_path / "runs").log()[0]
    assert calls, "the quality function judged the search"
    assert c.quality is not None and "lightning:" in json.dumps(c.quality)
    assert set(cb.ema.names) == {"state_dict/" + n for n, _ in model.named_parameters()}


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
    io = MvcCheckpointIO(tmp_path / "runs", lossless=True)
    ckpt = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=1,
                                       monitor="train_loss")
    L.Trainer(max_steps=10, accelerator="cpu", logger=False, enable_progress_bar=False,
              enable_model_summary=False, plugins=[io], callbacks=[ckpt]).fit(Digits(), _loader())
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
