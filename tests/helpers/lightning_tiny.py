"""Real Lightning Trainers small enough for CPU tests: a tiny MLP over sklearn's digits (data
shipped in the package, nothing downloaded), per Lightning package (`lightning`,
`pytorch_lightning`) with that package's mvc module.  Shared by
tests/integrations/test_lightning*.py; import it only where Lightning and sklearn are."""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch
from sklearn import datasets

#: Each Lightning package's Trainer module and the mvc module built for it.
PACKAGES = {"lightning": ("lightning.pytorch", "mvc.integrations.lightning"),
            "pytorch_lightning": ("pytorch_lightning", "mvc.integrations.pytorch_lightning")}


def loader() -> torch.utils.data.DataLoader:
    x, y = datasets.load_digits(return_X_y=True)
    ds = torch.utils.data.TensorDataset(torch.tensor(x[:256] / 16.0, dtype=torch.float32),
                                        torch.tensor(y[:256], dtype=torch.long))
    return torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False)


def namespace(package: str) -> SimpleNamespace:
    """`package`'s Trainer module (L), its LightningModule over digits (Digits), a Callback that
    records the steps it sees (Seen), and the mvc module for it (mvc)."""
    trainer_module, mvc_module = PACKAGES[package]
    L = pytest.importorskip(trainer_module)

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

    class Seen(L.Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_train_batch_end(self, trainer, *args):
            self.steps.append(trainer.global_step)

    return SimpleNamespace(package=package, L=L, Digits=Digits, Seen=Seen, mvc=importlib.import_module(mvc_module))


def tiny_trainer(ns, tmp_path, io, *, max_steps, callbacks=(), plugins=(), **checkpoint):
    ckpt = ns.L.callbacks.ModelCheckpoint(**{"dirpath": tmp_path / "ckpts", "every_n_train_steps": 2,
                                             "save_top_k": -1, **checkpoint})
    return ns.L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[*([io] if io is not None else []), *plugins],
                        callbacks=[ckpt, *callbacks], default_root_dir=tmp_path)
