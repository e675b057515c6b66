"""A compressed Adam first moment's record names its second moment (`meta.moment.partner`),
whose restored values clamp it. A record naming something else is damage, said as such
(`BrokenChainError`), before anything is decoded: a partner of another shape used to leave the
first moment unclamped without a word, and one that is itself a first moment was clamped by
one pool thread while another read it."""
from __future__ import annotations

import copy

import pytest
from checkpoints import adam_state

from mvc.quant import QuantConfig
from mvc.repo.objects import Commit, Snapshot
from mvc.repo.records import BrokenChainError
from mvc.repo.repository import Repo


def crafted(repo: Repo, cid: str, edit) -> str:
    """A commit on top of `cid` whose snapshot's records went through `edit`."""
    odb = repo.reader.odb
    com = odb.read_commit(cid)
    snap = odb.read_snapshot(com.snapshot)
    recs = copy.deepcopy(snap.tensors)
    edit({r.name: r for r in recs})
    sid = odb.blobs.put(Snapshot(recs, snap.skeleton).encode())
    return odb.blobs.put(Commit(parents=[cid], snapshot=sid, message="crafted", time=com.time,
                                author=com.author).encode())


def test_a_partner_that_is_no_second_moment_of_it_is_broken(tmp_path):
    with Repo.init(tmp_path / "r") as repo:
        repo.config.set("commit.mode", "fixed")
        repo.config.set("commit.quant", QuantConfig(bins=16).to_dict())
        cid = repo.commit(adam_state(64, 96, 48), "c")
        recs = {r.name: r for r in repo.read_snapshot(repo.read_commit(cid).snapshot).tensors}
        firsts = sorted(n for n, r in recs.items() if r.meta.get("moment"))
        assert len(firsts) >= 2
        a, b = firsts[0], firsts[1]
        other_shape = next(n for n, r in recs.items()
                           if n.endswith("exp_avg_sq") and list(r.shape) != list(recs[a].shape))

        def to(name):
            def edit(rs):
                rs[a].meta["moment"]["partner"] = name
            return edit

        for partner, why in ((other_shape, "has shape"), (b, "is a bound first moment")):
            bad = crafted(repo, cid, to(partner))
            with pytest.raises(BrokenChainError, match=why):
                repo.read_state(bad)
        assert repo.read_state(cid) is not None      # the good commit still restores
