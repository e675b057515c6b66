"""A real `transformers.Trainer` small enough for CPU tests: a one-layer GPT-2 built from a
config (no downloads), trained on the bytes of a stdlib module's source (real text, no
tokenizer: byte ids are the tokens).  Shared by tests/integrations/test_hf_*.py and
tests/helpers/hf_ranks_worker.py; import it only where transformers is installed."""
from __future__ import annotations

import inspect
import json as json_module
from pathlib import Path
from typing import Any

import torch
import transformers

#: Steps a `trainer()` runs, saving every 2.
MAX_STEPS = 6


class ByteBlocks(torch.utils.data.Dataset):
    """Blocks of 32 bytes of json/decoder.py: input ids and labels (the model shifts them)."""

    def __init__(self) -> None:
        text = inspect.getsource(json_module.decoder).encode()
        self.blocks = torch.tensor(list(text[: 64 * 32]), dtype=torch.long).view(-1, 32)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def tiny_gpt2() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def training_args(out: Path, **kw: Any) -> Any:
    """CPU TrainingArguments: MAX_STEPS steps, a save every 2, logs every step (`kw` override)."""
    base: dict[str, Any] = dict(max_steps=MAX_STEPS, save_steps=2, save_strategy="steps",
                                per_device_train_batch_size=4, logging_steps=1, report_to=[],
                                use_cpu=True, disable_tqdm=True, seed=0)
    return transformers.TrainingArguments(str(out), **{**base, **kw})


def trainer(out: Path, callbacks: Any = (), **kw: Any) -> Any:
    return transformers.Trainer(model=tiny_gpt2(), args=training_args(out, **kw),
                                train_dataset=ByteBlocks(), callbacks=list(callbacks))
