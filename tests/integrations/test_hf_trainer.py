"""The Hugging Face Trainer with mvc: MvcCallback commits each checkpoint-N/, resume from mvc.

Real `transformers.Trainer` runs on a tiny GPT-2 built from a config (no downloads), trained on
the bytes of a stdlib module's source (tests/helpers/hf_tiny.py).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from cli_helpers import run  # noqa: E402
from hf_tiny import MAX_STEPS, tiny_gpt2, trainer, training_args  # noqa: E402
from mvc.integrations.hf import (HfIntegrationError, MvcCallback, checkout_checkpoint,  # noqa: E402
                                 step_metrics, train_from_mvc)
from mvc.repo.repository import Repo  # noqa: E402


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


def test_callback_commits_each_checkpoint_deletes_dirs_and_resume_finishes(tmp_path):
    out = tmp_path / "out"
    mvc = MvcCallback(tmp_path / "runs", delete=True, grad_ema=True)  # a path: the repository is created
    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer(out, [mvc, _Crash(at=5)]).train()
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
    resumed = trainer(out, [steps])
    result = resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert result.global_step == MAX_STEPS == resumed.state.global_step
    assert steps.seen == [5, 6], "the resumed Trainer runs only the steps after the checkpoint"
    assert [e["step"] for e in resumed.state.log_history if "loss" in e] == [1, 2, 3, 4, 5, 6]


def test_resume_helper_and_step_metrics(tmp_path):
    out = tmp_path / "out"
    mvc = MvcCallback(tmp_path / "runs", delete=False, lossless=True)
    trainer(out, [mvc], save_total_limit=1).train()
    assert [s for s, _ in mvc.commits] == [2, 4, 6]
    metrics = step_metrics(out / "checkpoint-6" / "trainer_state.json", 6)
    assert Repo(tmp_path / "runs").read_commit(mvc.commits[-1][1]).metrics == metrics
    # mvc keeps every checkpoint though the Trainer rotated the directories away.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6"]
    fresh = tmp_path / "fresh"
    path = checkout_checkpoint(tmp_path / "runs", fresh, "HEAD~1")
    assert path == str(fresh / "checkpoint-4")
    result = train_from_mvc(trainer(tmp_path / "again"), tmp_path / "runs", "HEAD~2")
    assert result.global_step == MAX_STEPS
    with pytest.raises(HfIntegrationError, match="load_best_model_at_end"):
        MvcCallback(tmp_path / "runs", delete=True).on_train_begin(
            training_args(out, load_best_model_at_end=True, eval_strategy="steps"), None, None)


def test_train_from_mvc_leaves_no_checkout_behind_a_delete_run(tmp_path):
    """A delete=True run keeps no checkpoint directory; resuming it with train_from_mvc removes
    the checkpoint-N/ it checked out too (when training ends, as when it fails)."""
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer(out, [MvcCallback(tmp_path / "runs", delete=True), _Crash(at=3)]).train()
    assert not list(out.glob("checkpoint-*"))
    # The resumed run fails too: its checkout is removed all the same.
    with pytest.raises(RuntimeError, match="simulated failure"):
        train_from_mvc(trainer(out, [MvcCallback(tmp_path / "runs", delete=True), _Crash(at=5)]),
                       tmp_path / "runs")
    assert not list(out.glob("checkpoint-*")), "the checked-out checkpoint-2/ is gone"
    mvc = MvcCallback(tmp_path / "runs", delete=True)
    result = train_from_mvc(trainer(out, [mvc]), tmp_path / "runs", "HEAD")
    assert result.global_step == MAX_STEPS and [s for s, _ in mvc.commits] == [6]
    assert not list(out.glob("checkpoint-*")), "the checked-out checkpoint-4/ is gone"
    code, log, err = run(tmp_path / "runs", "log", "--oneline")
    assert code == 0 and [line.split()[-1] for line in log.splitlines()] == [
        "checkpoint-6", "checkpoint-4", "checkpoint-2"], (log, err)
    # cleanup=False keeps it; without a delete=True callback it stays by default (the Trainer's).
    train_from_mvc(trainer(tmp_path / "keep"), tmp_path / "runs", "HEAD~1", cleanup=False)
    train_from_mvc(trainer(tmp_path / "plain"), tmp_path / "runs", "HEAD~1")
    assert (tmp_path / "keep" / "checkpoint-4").is_dir() and (tmp_path / "plain" / "checkpoint-4").is_dir()
    # An empty directory the caller made stays, empty.
    (tmp_path / "mine" / "checkpoint-4").mkdir(parents=True)
    train_from_mvc(trainer(tmp_path / "mine"), tmp_path / "runs", "HEAD~1", cleanup=True)
    assert (tmp_path / "mine" / "checkpoint-4").is_dir() and not list((tmp_path / "mine" / "checkpoint-4").iterdir())


def test_train_from_mvc_after_a_crash_of_a_run_that_keeps_its_directories(tmp_path):
    """MvcCallback's default (delete=False) keeps the Trainer's checkpoint-N/: resuming the
    crashed run from mvc leaves it as it is, checks the commit out beside it and removes that
    after training (was: OutputDirectoryExistsError, the most common crash's resume refused)."""
    from mvc.errors import MvcWarning
    from mvc.integrations.hf import RESUME_PREFIX

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer(out, [MvcCallback(tmp_path / "runs", lossless=True), _Crash(at=5)]).train()
    kept = {p.name: p.read_bytes() for p in (out / "checkpoint-4").iterdir() if p.is_file()}
    steps = _Steps()
    with pytest.warns(MvcWarning, match="the Trainer's own checkpoint, kept"):
        result = train_from_mvc(trainer(out, [MvcCallback(tmp_path / "runs", lossless=True), steps]),
                                tmp_path / "runs", "HEAD")
    assert result.global_step == MAX_STEPS and steps.seen == [5, 6]
    assert {p.name: p.read_bytes() for p in (out / "checkpoint-4").iterdir() if p.is_file()} == kept
    assert not list(out.glob(RESUME_PREFIX + "*")), "the checkout beside it is removed"


class _KeepWeights(transformers.TrainerCallback):
    def on_save(self, args, state, control, model=None, **kwargs):
        torch.save(model.state_dict(), Path(args.output_dir) / f"weights-{state.global_step}.pt")


def test_real_hf_directory_round_trip_and_trainer_resumes(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer(out, [_KeepWeights(), _Crash(at=5)]).train()
    d = out / "checkpoint-4"
    (d / "model.safetensors").unlink()
    model = tiny_gpt2()
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
        t = trainer(ckpt.parent)
        assert t.train(resume_from_checkpoint=str(ckpt)).global_step == MAX_STEPS
        finals.append({k: v.clone() for k, v in t.model.state_dict().items()})
    assert finals[0].keys() == finals[1].keys()
    for k in finals[0]:
        assert torch.equal(finals[0][k], finals[1][k]), k
