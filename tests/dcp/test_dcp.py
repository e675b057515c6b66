"""torch.distributed.checkpoint through mvc (issue 17): 2 ranks on gloo, FSDP2 + AdamW, CPU.

The two ranks run once per module (tests/helpers/dcp_worker.py says what they do); the tests
below check what they left: the commits, the loads on 2 ranks, a resharded load into one
process, `repo.checkout` of the sharded commits, and the crash.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from rank_procs import run_ranks

from mvc.dcp import MvcStorageReader, MvcStorageWriter
from mvc.repo import lossy
from mvc.repo.repository import Repo
from mvc.repo.shards import ShardLayoutError, assemble, shard_name, shard_of
from mvc.repo.objects import TensorRecord

WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("dcp")
    Repo.init(root / "repo").close()
    Repo.init(root / "repo_nan").close()
    return root, run_ranks("dcp_worker.py", [str(WORLD), str(root)],
                           lambda r: root / f"rank{r}.pt", world=WORLD)


def plain_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def load_one_process(repo: Path, rev: str) -> dict:
    """dcp.load into an unsharded model in this process (no process group): a reshard 2 -> 1."""
    model, opt = plain_model(5)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=MvcStorageReader(repo, rev=rev))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def flat(state: dict) -> dict:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(state)[0]


def assert_same(a: dict, b: dict) -> None:
    fa, fb = flat(a), flat(b)
    assert sorted(fa) == sorted(fb)
    for k, v in fa.items():
        if isinstance(v, torch.Tensor):
            w = fb[k]
            assert v.dtype == w.dtype and v.shape == w.shape, k
            assert torch.equal(v, w), k
        else:
            assert v == fb[k], k


def test_one_commit_per_save(ranks):
    root, (r0, r1) = ranks
    with Repo(root / "repo") as repo:
        log = [c.id for c in repo.log()]
    assert log == [r0["c3"], r0["c2"], r0["c1"]]    # the crashed save added nothing
    assert r1["c1"] is None                          # only the coordinator publishes


def test_lossless_two_ranks_bit_exact(ranks):
    _, reports = ranks
    for r in reports:
        assert r["same_keys"] and r["mismatch"] == []


def test_sharded_commit_records_shards(ranks):
    root, (r0, _) = ranks
    with Repo(root / "repo") as repo:
        snap = repo.read_snapshot(repo.read_commit(r0["c1"]).snapshot)
    shards = [r for r in snap.tensors if shard_of(r) is not None]
    # every weight, bias and Adam moment is split in two along dim 0
    assert len(shards) == 2 * 12
    w = [r for r in shards if shard_of(r)["of"] == "model/0.weight"]
    assert sorted(shard_of(r)["offsets"] for r in w) == [[0, 0], [64, 0]]
    assert all(shard_of(r)["shape"] == [128, 64] and r.shape == [64, 64] for r in w)


def test_checkout_and_one_process_load_restore_the_full_state(ranks):
    root, (r0, _) = ranks
    with Repo(root / "repo") as repo:
        out = repo.read_state(r0["c1"])
    ref = r0["full1"]
    assert_same(out["model"], ref["model"])
    assert_same(load_one_process(root / "repo", r0["c1"]), ref)


def test_lossy_same_config_on_both_ranks_and_deltas_continue(ranks):
    root, (r0, r1) = ranks
    for tag in ("c2", "c3"):
        assert r0[f"config_{tag}"] is not None
        assert r0[f"config_{tag}"] == r1[f"config_{tag}"]
        assert r0[f"quality_{tag}"] == r1[f"quality_{tag}"]
    with Repo(root / "repo") as repo:
        c3 = repo.read_commit(r0["c3"])
        assert c3.quant == r0["config_c3"] and c3.quality["gate"] == "proxy"
        snap = repo.read_snapshot(c3.snapshot)
    quant = [r for r in snap.tensors if lossy.is_quantized(r)]
    assert quant and all(shard_of(r) is not None for r in quant)
    assert any(lossy.is_delta(r) for r in quant)
    # both shards of a tensor carry the same centroids: one quantization of the whole
    with Repo(root / "repo") as repo:
        sid = repo.read_commit(r0["c3"]).snapshot
        by_of: dict[str, list] = {}
        for r in quant:
            by_of.setdefault(shard_of(r)["of"], []).append(
                repo.reader.read_quantized(sid, r).centroids)
    for cents in by_of.values():
        assert len(cents) == 2 and torch.equal(cents[0], cents[1])


def test_lossy_every_load_path_restores_checkout(ranks):
    root, (r0, _) = ranks
    with Repo(root / "repo") as repo:
        out = repo.read_state(r0["c3"])
    assert_same(out["model"], r0["full3"]["model"])                  # 2-rank dcp.load
    one = load_one_process(root / "repo", r0["c3"])                  # 1-process dcp.load
    assert_same(one["model"], out["model"])
    ofl, cfl = flat(one["optim"]), flat(out["optim"])
    for k, v in ofl.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, cfl[k]), k


def test_a_nan_in_one_rank_s_shard_keeps_that_tensor_exact_on_both(ranks):
    root, (r0, r1) = ranks
    assert r0["nan_config"] is not None and r0["nan_config"] == r1["nan_config"]
    with Repo(root / "repo_nan") as repo:
        snap = repo.read_snapshot(repo.read_commit(r0["nan"]).snapshot)
        out = repo.read_state(r0["nan"])
    by_of: dict[str, list[bool]] = {}
    for r in snap.tensors:
        info = shard_of(r)
        if info is not None and info["of"].startswith("model/"):
            by_of.setdefault(info["of"], []).append(lossy.is_quantized(r))
    assert by_of["model/2.weight"] == [False, False]          # exact on both ranks
    assert by_of["model/0.weight"] == [True, True]
    w = out["model"]["2.weight"]
    assert torch.isnan(w[32, 0]) and int(torch.isnan(w).sum()) == 1   # rank 1's first row


def test_crash_in_write_data_leaves_no_commit_and_fsck_clean(ranks):
    root, (r0, _) = ranks
    assert r0["crash"].startswith("failed")
    with Repo(root / "repo") as repo:
        assert repo.head() == r0["c3"]
        report = repo.fsck()
        assert report.ok, report
        # the dead save's chunks are unreachable: gc removes them, and nothing else
        before = repo.read_state(r0["c3"])
        assert repo.gc(dry_run=True).removed_objects > 0
        repo.gc()
        assert repo.gc(dry_run=True).removed_objects == 0
        assert_same(repo.read_state(r0["c3"]), before)
        assert repo.fsck().ok


def test_unsharded_save_after_sharded_starts_new_bases(ranks, tmp_path):
    """One process saves what 2 ranks saved before: the layout changed, so every quantized
    tensor is a base (its shards' chains end), and the commit restores what it saved."""
    root, (r0, _) = ranks
    model, opt = plain_model(0)
    state = load_one_process(root / "repo", r0["c3"])
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    msd, osd = get_state_dict(model, opt)
    w = MvcStorageWriter(root / "repo", message="one process", epsilon=0.05)
    dcp.save({"model": msd, "optim": osd}, storage_writer=w)
    with Repo(root / "repo") as repo:
        snap = repo.read_snapshot(repo.read_commit(w.commit_id).snapshot)
        quant = [r for r in snap.tensors if lossy.is_quantized(r)]
        assert quant and not any(lossy.is_delta(r) or shard_of(r) for r in quant)
        assert_same(repo.read_state(w.commit_id)["model"],
                    load_one_process(root / "repo", w.commit_id)["model"])
        # leave the module's history as it was for the other tests
        repo.store.refs.update_ref("refs/heads/main", w.commit_id, r0["c3"], "test: reset")


def test_a_save_without_epsilon_is_lossless(tmp_path):
    """No model to judge a lossy save: as for Repo.commit without a quality function, the proxy
    is opt-in (epsilon=), and without it the save stores every tensor exactly."""
    model, opt = plain_model(0)
    msd, osd = get_state_dict(model, opt)
    Repo.init(tmp_path / "repo").close()
    w = MvcStorageWriter(tmp_path / "repo", message="default")
    dcp.save({"model": msd, "optim": osd}, storage_writer=w)
    with Repo(tmp_path / "repo") as repo:
        c = repo.read_commit(w.commit_id)
        assert c.quant is None and w.last_config is None
        assert not [r for r in repo.read_snapshot(c.snapshot).tensors if lossy.is_quantized(r)]
        assert_same(repo.read_state(w.commit_id)["model"], dict(msd))


def test_a_tuple_holding_tensors_is_refused_by_name_and_nothing_is_committed(tmp_path):
    # DCP saves a tuple as one pickled object, tensors and all: the commit would hold tensors
    # that no write stored (a KeyError in the writer's finish). A list's tensors are tensors.

    from mvc.dcp import DcpValueError

    Repo.init(tmp_path / "repo").close()
    w = MvcStorageWriter(tmp_path / "repo", message="m")
    with pytest.raises(CheckpointException) as info:
        dcp.save({"w": torch.ones(4), "pair": (torch.ones(3), 7)}, storage_writer=w, no_dist=True)
    raised = [f[0] if isinstance(f, tuple) else f for f in info.value.failures.values()]
    assert any(isinstance(e, DcpValueError) and "'pair'" in str(e) for e in raised), raised
    with Repo(tmp_path / "repo") as repo:
        assert repo.head() is None
    ok = MvcStorageWriter(tmp_path / "repo", message="m")
    dcp.save({"w": torch.ones(4), "pair": [torch.ones(3), 7]}, storage_writer=ok, no_dist=True)
    with Repo(tmp_path / "repo") as repo:
        assert torch.equal(repo.read_state(ok.commit_id)["pair"][0], torch.ones(3))


def _rec(name: str, shape: list[int], of: str, offsets: list[int], full: list[int]
         ) -> TensorRecord:
    return TensorRecord(name, "float32", shape, "raw/1", [], 0, 0,
                        meta={"shard": {"of": of, "offsets": offsets, "shape": full}})


def test_assemble_refuses_bad_layouts():
    a = _rec(shard_name("w", [0, 0], [2, 4]), [2, 4], "w", [0, 0], [4, 4])
    b = _rec(shard_name("w", [2, 0], [2, 4]), [2, 4], "w", [2, 0], [4, 4])
    t = {a.name: torch.ones(2, 4), b.name: torch.zeros(2, 4)}
    out = assemble([a, b], t)
    assert list(out) == ["w"] and torch.equal(out["w"][:2], torch.ones(2, 4))
    with pytest.raises(ShardLayoutError):            # a part is missing
        assemble([a], {a.name: t[a.name]})
    c = _rec(shard_name("w", [1, 0], [2, 4]), [2, 4], "w", [1, 0], [4, 4])
    d = _rec(shard_name("w", [2, 0], [2, 4]), [2, 4], "w", [3, 0], [4, 4])
    with pytest.raises(ShardLayoutError):            # overlapping / outside
        assemble([a, c], {a.name: t[a.name], c.name: torch.ones(2, 4)})
    with pytest.raises(ShardLayoutError):
        assemble([a, d], {a.name: t[a.name], d.name: torch.ones(2, 4)})


def _recorded_as(repo: Repo, cid: str, rec_edit, entry_shape: list[int]) -> str:
    """A commit on top of `cid` whose one record is edited by `rec_edit` and whose skeleton says
    the tensor has `entry_shape`: a damaged or hostile commit, written as a commit would be."""
    import copy

    from mvc.repo.objects import Commit, Snapshot

    odb = repo.reader.odb
    com = odb.read_commit(cid)
    snap = odb.read_snapshot(com.snapshot)
    rec = copy.deepcopy(snap.tensors[0])
    rec_edit(rec)
    skel = copy.deepcopy(snap.skeleton)
    skel["entries"]["w"]["shape"] = entry_shape
    for o in skel["objects"]:
        o["shape"], o["stride"] = entry_shape, [entry_shape[1], 1]
    sid = odb.blobs.put(Snapshot([rec], skel).encode())
    return odb.blobs.put(Commit(parents=[cid], snapshot=sid, message="crafted", time=com.time,
                                author=com.author).encode())


def test_a_load_refuses_records_that_do_not_make_up_the_tensor(tmp_path):
    """DCP copies each stored chunk into its place in the caller's tensor: a commit whose
    shards cover half of a tensor loaded the half and left the rest as the caller's tensor
    was. The reader now checks, from the records, that they make up each tensor (the tiling
    a checkout checks when it assembles), before DCP plans anything."""
    repo = Repo.init(tmp_path / "repo")
    cid = repo.commit({"w": torch.arange(32 * 64, dtype=torch.float32).reshape(32, 64)}, "half")

    def half_shard(rec):
        rec.name = shard_name("w", [0, 0], [32, 64])
        rec.meta = dict(rec.meta, shard={"of": "w", "offsets": [0, 0], "shape": [64, 64]})

    def narrower(rec):   # a whole record of another shape than the skeleton's
        pass

    for edit, why in ((half_shard, "its shards hold 2048 elements, the tensor 4096"),
                      (narrower, r"the commit says float32 \[64, 64\], its records hold "
                                 r"float32 \[32, 64\]")):
        bad = _recorded_as(repo, cid, edit, [64, 64])
        with pytest.raises(ShardLayoutError, match=why):
            MvcStorageReader(repo, rev=bad).read_metadata()
        target = {"w": torch.full((64, 64), 7.0)}
        with pytest.raises(CheckpointException, match=why):   # DCP's, naming ours
            dcp.load(target, storage_reader=MvcStorageReader(repo, rev=bad), no_dist=True)
        assert bool((target["w"] == 7.0).all())          # nothing was loaded
    repo.close()


def test_a_long_lived_writer_keeps_the_levels_of_one_snapshot(tmp_path):
    """Saves through one Repo keep, in its in-memory level cache, only the snapshot the next
    save's parent is a delta from (the last parent): not every earlier save's levels."""
    model, opt = plain_model(0)
    Repo.init(tmp_path / "repo").close()
    ids = []
    with Repo(tmp_path / "repo") as repo:
        for step in range(4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            msd, osd = get_state_dict(model, opt)
            w = MvcStorageWriter(repo, message=f"save {step}", epsilon=0.05)
            dcp.save({"model": msd, "optim": osd}, storage_writer=w)
            ids.append(w.commit_id)
            cached = {sid for sid, _ in repo.reader.levels._items}
            parent_snap = repo.read_commit(ids[-2]).snapshot if step else None
            assert cached <= ({parent_snap} if parent_snap else set())
        snap = repo.read_snapshot(repo.read_commit(ids[-1]).snapshot)
        assert any(lossy.is_delta(r) for r in snap.tensors)
        restored = repo.read_state(ids[-1], cache_levels=False)["model"]
    assert_same(restored, load_one_process(tmp_path / "repo", ids[-1])["model"])
