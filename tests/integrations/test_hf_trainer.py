"""The Hugging Face Trainer with mvc: MvcCallback commits each checkpoint-N/, resume from mvc.

Real `transformers.Trainer` runs on a tiny GPT-2 built from a config (no downloads), trained on
the bytes of a stdlib module's source (real text, no tokenizer needed: byte ids are the tokens).
"""
from __future__ import annotations

import inspect
import json as json_module
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cli_helpers import run  # noqa: E402
from mvc.integrations.hf import (HfIntegrationError, MvcCallback, checkout_checkpoint,  # noqa: E402
                                 step_metrics, train_from_mvc)
from mvc.repo.repository import Repo  # noqa: E402

MAX_STEPS = 6


class _Bytes(torch.utils.data.Dataset):
    """Blocks of 32 bytes of json/decoder.py: input ids and labels (the model shifts them)."""

    def __init__(self) -> None:
        text = inspect.getsource(json_module.decoder).encode()
        self.blocks = torch.tensor(list(text[: 64 * 32]), dtype=torch.long).view(-1, 32)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def _model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _args(out: Path, **kw) -> "transformers.TrainingArguments":
    return transformers.TrainingArguments(
        str(out), max_steps=MAX_STEPS, save_steps=2, save_strategy="steps", per_device_train_batch_size=4,
        logging_steps=1, report_to=[], use_cpu=True, disable_tqdm=True, seed=0, **kw)


class _Crash(transformers.TrainerCallback):
    """A simulated failure after step `at` (its checkpoint, if any, is already saved)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise RuntimeError("simulated failure")


class _Steps(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(state.global_step)


def _trainer(out: Path, callbacks=(), **kw):
    return transformers.Trainer(model=_model(), args=_args(out, **kw), train_dataset=_Bytes(),
                                callbacks=list(callbacks))


def test_callback_commits_each_checkpoint_deletes_dirs_and_resume_finishes(tmp_path):
    out = tmp_path / "out"
    mvc = MvcCallback(tmp_path / "runs", delete=True, grad_ema=True)  # a path: the repository is created
    with pytest.raises(RuntimeError, match="simulated failure"):
        _trainer(out, [mvc, _Crash(at=5)]).train()
    assert [step for step, _ in mvc.commits] == [2, 4]
    assert not list(out.glob("checkpoint-*")), "committed directories are deleted"
    repo = Repo(tmp_path / "runs")
    log = repo.log()
    assert [c.step for c in log] == [4, 2] and [c.message for c in log] == ["checkpoint-4", "checkpoint-2"]
    assert {"loss", "learning_rate", "epoch"} <= set(log[0].metrics)
    # Resume in a new Trainer from `mvc checkout REV -o DIR`.
    code, _, err = run(repo.path, "checkout", mvc.commits[-1][1], "-o", str(out / "checkpoint-4"))
    assert code == 0, err
    steps = _Steps()
    resumed = _trainer(out, [steps])
    result = resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert result.global_step == MAX_STEPS == resumed.state.global_step
    assert steps.seen == [5, 6], "the resumed Trainer runs only the steps after the checkpoint"
    assert [e["step"] for e in resumed.state.log_history if "loss" in e] == [1, 2, 3, 4, 5, 6]


def test_resume_helper_and_step_metrics(tmp_path):
    out = tmp_path / "out"
    mvc = MvcCallback(tmp_path / "runs", delete=False, lossless=True)
    _trainer(out, [mvc], save_total_limit=1).train()
    assert [s for s, _ in mvc.commits] == [2, 4, 6]
    metrics = step_metrics(out / "checkpoint-6" / "trainer_state.json", 6)
    assert Repo(tmp_path / "runs").read_commit(mvc.commits[-1][1]).metrics == metrics
    # mvc keeps every checkpoint though the Trainer rotated the directories away.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6"]
    fresh = tmp_path / "fresh"
    path = checkout_checkpoint(tmp_path / "runs", fresh, "HEAD~1")
    assert path == str(fresh / "checkpoint-4")
    result = train_from_mvc(_trainer(tmp_path / "again"), tmp_path / "runs", "HEAD~2")
    assert result.global_step == MAX_STEPS
    with pytest.raises(HfIntegrationError, match="load_best_model_at_end"):
        MvcCallback(tmp_path / "runs", delete=True).on_train_begin(
            _args(out, load_best_model_at_end=True, eval_strategy="steps"), None, None)


def test_train_from_mvc_leaves_no_checkout_behind_a_delete_run(tmp_path):
    """A delete=True run keeps no checkpoint directory; resuming it with train_from_mvc removes
    the checkpoint-N/ it checked out too (when training ends, as when it fails)."""
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated failure"):
        _trainer(out, [MvcCallback(tmp_path / "runs", delete=True), _Crash(at=3)]).train()
    assert not list(out.glob("checkpoint-*"))
    # The resumed run fails too: its checkout is removed all the same.
    with pytest.raises(RuntimeError, match="simulated failure"):
        train_from_mvc(_trainer(out, [MvcCallback(tmp_path / "runs", delete=True), _Crash(at=5)]),
                       tmp_path / "runs")
    assert not list(out.glob("checkpoint-*")), "the checked-out checkpoint-2/ is gone"
    mvc = MvcCallback(tmp_path / "runs", delete=True)
    result = train_from_mvc(_trainer(out, [mvc]), tmp_path / "runs", "HEAD")
    assert result.global_step == MAX_STEPS and [s for s, _ in mvc.commits] == [6]
    assert not list(out.glob("checkpoint-*")), "the checked-out checkpoint-4/ is gone"
    code, log, err = run(tmp_path / "runs", "log", "--oneline")
    assert code == 0 and [line.split()[-1] for line in log.splitlines()] == [
        "checkpoint-6", "checkpoint-4", "checkpoint-2"], (log, err)
    # cleanup=False keeps it; without a delete=True callback it stays by default (the Trainer's).
    train_from_mvc(_trainer(tmp_path / "keep"), tmp_path / "runs", "HEAD~1", cleanup=False)
    train_from_mvc(_trainer(tmp_path / "plain"), tmp_path / "runs", "HEAD~1")
    assert (tmp_path / "keep" / "checkpoint-4").is_dir() and (tmp_path / "plain" / "checkpoint-4").is_dir()
    # An empty directory the caller made stays, empty.
    (tmp_path / "mine" / "checkpoint-4").mkdir(parents=True)
    train_from_mvc(_trainer(tmp_path / "mine"), tmp_path / "runs", "HEAD~1", cleanup=True)
    assert (tmp_path / "mine" / "checkpoint-4").is_dir() and not list((tmp_path / "mine" / "checkpoint-4").iterdir())


class _KeepWeights(transformers.TrainerCallback):
    def on_save(self, args, state, control, model=None, **kwargs):
        torch.save(model.state_dict(), Path(args.output_dir) / f"weights-{state.global_step}.pt")


def test_real_hf_directory_round_trip_and_trainer_resumes(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated failure"):
        _trainer(out, [_KeepWeights(), _Crash(at=5)]).train()
    d = out / "checkpoint-4"
    (d / "model.safetensors").unlink()
    model = _model()
    model.load_state_dict(torch.load(out / "weights-4.pt", weights_only=True))
    model.save_pretrained(str(d), max_shard_size="20KB")
    from tokenizers import Tokenizer, models

    vocab = {chr(i): i for i in range(33, 127)} | {"[UNK]": 0}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")), unk_token="[UNK]")
    tok.save_pretrained(str(d))
    names = sorted(p.name for p in d.iterdir())
    assert "model.safetensors.index.json" in names and sum(n.endswith(".safetensors") for n in names) >= 2
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin",
            "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    original = tmp_path / "orig" / "checkpoint-4"
    shutil.copytree(d, original)

    repo = Repo.init(tmp_path / "repo")
    repo.config.set("commit.mode", "lossless")
    code, _, err = run(repo.path, "commit", "-m", "hf dir", str(d), "--step", "4")
    assert code == 0, err
    shutil.rmtree(d)
    code, _, err = run(repo.path, "checkout", "HEAD", "-o", str(d))
    assert code == 0, err
    assert sorted(p.name for p in d.iterdir()) == names
    for name in names:
        if not name.endswith((".safetensors", ".pt", ".pth")):
            assert (d / name).read_bytes() == (original / name).read_bytes(), name

    # The restored tree resumes exactly like the original one (lossless commit, CPU, seeded).
    finals = []
    for ckpt in (original, d):
        t = _trainer(ckpt.parent)
        assert t.train(resume_from_checkpoint=str(ckpt)).global_step == MAX_STEPS
        finals.append({k: v.clone() for k, v in t.model.state_dict().items()})
    assert finals[0].keys() == finals[1].keys()
    for k in finals[0]:
        assert torch.equal(finals[0][k], finals[1][k]), k
