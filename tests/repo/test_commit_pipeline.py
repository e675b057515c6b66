"""The commit pipeline's stages apart: plan in one process, write in several, publish once (issue 13)."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoints import assert_same
from locations import HELPERS

import mvc
from mvc.quant import QuantConfig
from mvc.repo import lossy, pipeline
from mvc.repo import refs as R
from mvc.repo.repository import Repo
from mvc.search.plan import Quantization
from mvc.state import flatten
from mvc.store import RefConflictError

FIXED = QuantConfig(bins=8, prune=0.1, protect=0.001)


def trained_state(steps: int, seed: int = 0) -> dict:
    """A small model with Adam state after `steps` steps (moments are compressed too)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 64, generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": steps,
            "ids": torch.arange(7)}


def open_repo(path: Path, mode: str) -> Repo:
    repo = Repo.init(path)
    repo.config.set("commit.mode", mode)
    if mode == "fixed":
        repo.config.set("commit.quant", FIXED.to_dict())
    return repo


def reader(repo: Repo):
    return repo.reader.read_quantized


def settings(repo: Repo) -> pipeline.CommitSettings:
    return repo.commit_settings()


def parent_of(repo: Repo) -> pipeline.ParentInfo:
    head = repo.head()
    if head is None:
        return pipeline.ParentInfo()
    c = repo.read_commit(head)
    return pipeline.ParentInfo.of(head, c, c.snapshot, repo.read_snapshot(c.snapshot))


def make_plan(repo: Repo, state, how: Quantization) -> pipeline.CommitPlan:
    return pipeline.plan(flatten(state), how, parent_of(repo),
                         read_centroids=repo.reader.read_centroids, settings=settings(repo))


def write_in_processes(tmp: Path, repo: Repo, plan: pipeline.CommitPlan, shares: list[list[str]]):
    """Run the write stage for each share of names in its own process, all at once."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(mvc.__file__).parents[1]), str(HELPERS),
                                         env.get("PYTHONPATH", "")])
    procs, outs = [], []
    for i, names in enumerate(shares):
        job, out = tmp / f"job{i}.pkl", tmp / f"records{i}.pkl"
        with open(job, "wb") as fh:  # each writer is sent only the tensors it writes
            pickle.dump((str(repo.path), plan.write.subset(names), names), fh)
        procs.append(subprocess.Popen([sys.executable, str(HELPERS / "pipeline_worker.py"), str(job),
                                       str(out)], env=env, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    records = []
    for out in outs:
        with open(out, "rb") as fh:
            records += pickle.load(fh)
    return records


def publish(repo: Repo, plan, records, message: str) -> tuple[str, str]:
    info = pipeline.CommitInfo(message=message, author="test <t@example.com>")
    with repo.store.maintenance.write_lock(10.0):
        return pipeline.publish(plan.manifest, records, info, blobs=repo.store.blobs,
                                refs=repo.store.refs, ref=R.HEADS + "main")


def halves(plan: pipeline.CommitPlan) -> list[list[str]]:
    # Interleaved, so each writer gets quantized and exact tensors alike.
    return [plan.write.names[0::2], plan.write.names[1::2]]


def test_lossless_writes_from_two_processes_then_one_publish_restore_exactly(tmp_path):
    repo = open_repo(tmp_path / "r", "lossless")
    state = trained_state(3)
    plan = make_plan(repo, state, Quantization("lossless"))
    assert not plan.write.quantized and len(plan.manifest.names) >= 8
    records = write_in_processes(tmp_path, repo, plan, halves(plan))
    assert sorted(r.name for r in records) == sorted(plan.manifest.names)
    cid, _ = publish(repo, plan, records, "two writers")
    assert repo.head() == cid and repo.fsck().ok
    assert_same(repo.read_state(cid), state)
    # A second commit on top (two writers in this process): the parent is the first.
    state2 = trained_state(5)
    plan2 = make_plan(repo, state2, Quantization("lossless"))
    kw = {"blobs": repo.store.blobs, "read_quantized": reader(repo)}
    records2 = [r for names in halves(plan2) for r in pipeline.write(plan2.write, names, **kw)]
    cid2, _ = publish(repo, plan2, records2, "2")
    assert repo.read_commit(cid2).parents == [cid]
    assert_same(repo.read_state(cid2), state2)


def test_lossy_writes_from_two_processes_equal_the_single_process_commit(tmp_path):
    states = [trained_state(3), trained_state(6)]
    single = open_repo(tmp_path / "single", "fixed")
    for i, s in enumerate(states):
        single.commit(s, f"c{i}")
    split = open_repo(tmp_path / "split", "fixed")
    split.commit(states[0], "c0")  # the same parent, made the ordinary way
    plan = make_plan(split, states[1], Quantization("fixed", config=FIXED,
                                                            optimizer="compressed"))
    assert plan.write.quantized and plan.write.domains and plan.write.moments  # weights and Adam moments
    # first moments are bounded by the correctly rounded sqrt: the same bits on any device
    assert all(m["sqrt"] == "ieee" for m in plan.write.moments.values())
    records = write_in_processes(tmp_path, split, plan, halves(plan))
    assert any(lossy.is_delta(r) for r in records)  # deltas against the parent were written
    cid, sid = publish(split, plan, records, "c1")
    want = single.read_commit(single.head())
    assert sid == want.snapshot  # the very same records, so the same snapshot object
    assert split.read_commit(cid).quant == want.quant == FIXED.to_dict()
    fresh_single, fresh_split = Repo(single.path), Repo(split.path)  # no in-memory levels
    assert_same(fresh_split.read_state(cid), fresh_single.read_state("HEAD"))
    assert split.fsck().ok


def test_plan_is_picklable_and_subsets_carry_only_their_tensors(tmp_path):
    repo = open_repo(tmp_path / "r", "fixed")
    repo.commit(trained_state(2), "c0")
    plan = make_plan(repo, trained_state(4), Quantization("fixed", config=FIXED,
                                                                  optimizer="compressed"))
    back = pickle.loads(pickle.dumps(plan))
    assert back.manifest.names == plan.manifest.names and back.write.parent == plan.write.parent \
        and back.manifest.config == plan.manifest.config
    assert set(back.write.quantized) == set(plan.write.quantized)
    names = plan.write.names
    part = plan.write.subset(names[:3])
    assert set(part.tensors) == set(names[:3]) and part.names == names
    with pytest.raises(mvc.errors.UsageError):
        pipeline.write(part, names[3:4], blobs=repo.store.blobs, read_quantized=reader(repo))


def test_overlapping_writes_agree_and_publish_checks_what_it_is_given(tmp_path):
    repo = open_repo(tmp_path / "r", "fixed")
    repo.commit(trained_state(2), "c0")
    plan = make_plan(repo, trained_state(4), Quantization("fixed", config=FIXED))
    kw = {"blobs": repo.store.blobs, "read_quantized": reader(repo)}
    names = plan.write.names
    a = pipeline.write(plan.write, names, **kw)
    b = pipeline.write(plan.write, names[::-1][:5], **kw)  # idempotent: the same records again
    assert b == [r for r in a if r.name in set(names[::-1][:5])]
    with pytest.raises(pipeline.IncompleteCommitError) as ei:
        publish(repo, plan, a[1:], "missing one")
    assert ei.value.exit_code == 117
    other = pipeline.write(make_plan(repo, trained_state(9), Quantization(
        "fixed", config=FIXED)).write, names[-1:], **kw)
    if other[0] != a[-1]:
        with pytest.raises(pipeline.IncompleteCommitError):
            publish(repo, plan, a + other, "two different records for one name")
    ghost = a[0].__class__(**{**a[0].__dict__, "chunks": ["0" * 32]})
    with pytest.raises(pipeline.MissingChunkError) as ei:
        publish(repo, plan, [ghost] + a[1:], "a chunk gc removed")
    assert ei.value.exit_code == 118
    head = repo.head()
    repo.commit(trained_state(5), "the branch moves meanwhile")
    with pytest.raises(RefConflictError):
        publish(repo, plan, a + b, "against a stale parent")
    assert repo.read_commit(repo.head()).parents == [head]
