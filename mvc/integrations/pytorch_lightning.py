"""Lightning integration for the ``pytorch_lightning`` package (``import pytorch_lightning as pl``).

    from mvc.integrations.pytorch_lightning import MvcCallback, MvcCheckpointIO
    io = MvcCheckpointIO("runs/exp1")
    trainer = pl.Trainer(plugins=[io], callbacks=[ModelCheckpoint(...), MvcCallback(io, quality=val_loss)])

The same plugin and callback as `mvc.integrations.lightning` (see there; both are built on
`mvc.integrations.lightning_core`), subclassing ``pytorch_lightning``'s / ``lightning_fabric``'s
classes, which a ``pytorch_lightning.Trainer`` requires.  Pointer files, tags and commits are the
same for both: a run saved with one package resumes with the other.  Needs
``pip install mvc[lightning]``.
"""
from __future__ import annotations

from mvc.integrations.lightning_core import (POINTER_FORMAT, POINTER_MARK, STATE_DICT_PREFIX, TAG_PREFIX,
                                             CallbackCore, CheckpointIOCore, LightningNotInstalledError,
                                             LightningSetupError, PointerFileError, not_installed, read_pointer,
                                             tag_for)

try:
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import Callback
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO  # installed with pytorch_lightning
except ModuleNotFoundError as exc:
    raise not_installed("pytorch_lightning", exc) from None

__all__ = ["MvcCallback", "MvcCheckpointIO", "LightningNotInstalledError", "LightningSetupError",
           "PointerFileError", "POINTER_FORMAT", "POINTER_MARK", "STATE_DICT_PREFIX", "TAG_PREFIX",
           "read_pointer", "tag_for"]


class MvcCheckpointIO(CheckpointIOCore, CheckpointIO):
    """A `pytorch_lightning` `CheckpointIO` that commits checkpoints to mvc and leaves pointer
    files: `mvc.integrations.lightning.MvcCheckpointIO` for ``pytorch_lightning.Trainer``."""

    package = "pytorch_lightning"


class MvcCallback(CallbackCore, Callback):
    """`mvc.integrations.lightning.MvcCallback` for ``pytorch_lightning.Trainer``: gradient EMA,
    logged metrics and the quality function, handed to this module's `MvcCheckpointIO`."""

    package = "pytorch_lightning"
    io_class = MvcCheckpointIO
    trainer_class = Trainer
