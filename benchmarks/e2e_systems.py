"""Checkpointing systems compared by the end-to-end benchmark (benchmarks only).

Every system stores each checkpoint as real bytes (kept in memory, or in an mvc
repository on disk) and rebuilds model + optimizer from those bytes alone on
`restore()`.  The lossy baselines are simplified re-implementations from the
papers' descriptions (Inshrinkerator §8.2 / appendix A.2, ExCP §3):

* `Exact`     torch.save of the whole state (the reference).
* `ZipNN`     every tensor through the zipnn lossless float compressor.
* `Uniform`, `Adaptive`, `ExCP`  QD-compressor-, Check-N-Run- and ExCP-like
              peers (described in benchmarks/e2e_baselines.py).
* `ExactMomentPruned`  control: exact checkpoints, ExCP's momentum mask applied to
              both Adam moments on restore.
* `Mvc`       an mvc repository driven by `mvc.Tracker` (commit.mode=search with the
              held-out quality function; commit.optimizer compressed or exact).

The shared base classes, `Exact` and `ZipNN` are in benchmarks/e2e_base.py, the
re-implemented peers in benchmarks/e2e_baselines.py; this module adds `Mvc` and the
registry (`SYSTEMS`, `make_system`).

All lossy searches use the same quality function (held-out loss) and epsilon,
and pick the most compressive knob whose relative degradation is <= epsilon.
Small tensors (< 1024 values: biases, norms, step counters) are lossless everywhere.
"""
from __future__ import annotations

import shutil
import tempfile
import time

from benchmarks.e2e_base import SaveStat, System, Exact, ZipNN
from benchmarks.e2e_baselines import Uniform, Adaptive, ExCP, ExactMomentPruned

__all__ = ["SaveStat", "System", "Exact", "ZipNN", "Uniform", "Adaptive", "ExCP",
           "ExactMomentPruned", "Mvc", "make_system", "SYSTEMS"]


# ---------------------------------------------------------------- mvc
class Mvc(System):
    """An mvc repository in a temp dir, driven by mvc.Tracker."""

    lossy = True

    def __init__(self, epsilon: float = 0.01, optimizer: str = "compressed",
                 families: tuple[str, ...] | None = None, refine: bool = True,
                 mirror: bool = True) -> None:
        super().__init__(epsilon)
        self.optimizer_policy = optimizer
        self.families, self.refine, self.mirror = families, refine, mirror
        self.name = "mvc (default)" if optimizer == "compressed" else "mvc (exact optimizer)"
        if families is not None:
            self.name = f"mvc ({' + '.join(families)})"
        if not refine:
            self.name = "mvc (default space, refine off)"
        if not mirror:
            self.name = "mvc (scalar gate without mirror check)"
        self._dir = tempfile.mkdtemp(prefix="mvc-e2e-")
        self.tracker = None

    def attach(self, model, opt, quality) -> None:
        import mvc

        super().attach(model, opt, quality)
        self.repo = mvc.Repo.init(self._dir)
        self.repo.config.set("commit.mode", "search")
        self.repo.config.set("commit.optimizer", self.optimizer_policy)
        self.repo.config.set("quality.mirror", self.mirror)
        space = None
        if self.families is not None or not self.refine:  # the search space (issue 29)
            from mvc.search import SearchSpace

            space = SearchSpace(family=self.families or ("kmeans",))
        self.tracker = mvc.Tracker(self.repo, model, opt, quality=quality, epsilon=self.epsilon,
                                   space=space)

    def after_backward(self) -> None:
        self.tracker.after_backward()

    def save(self, step: int) -> SaveStat:
        t0 = time.perf_counter()
        cid = self.tracker.commit(f"step {step}", step=step)
        dt = time.perf_counter() - t0
        c = self.repo.read_commit(cid)
        snap = self.repo.read_snapshot(c.snapshot)
        recs = snap.tensors
        raw_w = sum(r.raw_bytes for r in recs if r.name.startswith("model/"))
        sw = sum(r.stored_bytes for r in recs if r.name.startswith("model/"))
        raw_t = sum(r.raw_bytes for r in recs)
        st = sum(r.stored_bytes for r in recs)
        meta = self.repo.store.blobs.size(cid) + self.repo.store.blobs.size(c.snapshot)
        st += meta
        parts = {"weights": [raw_w, sw], "exp_avg": [0, 0], "exp_avg_sq": [0, 0],
                 "other": [0, meta]}
        for r in recs:
            if not r.name.startswith("model/"):
                key = r.name.rsplit("/", 1)[-1]
                part = parts[key if key in ("exp_avg", "exp_avg_sq") else "other"]
                part[0] += r.raw_bytes
                part[1] += r.stored_bytes
        knob = self.tracker.history[-1].get("config") or "lossless"
        if isinstance(knob, dict):
            cfg = knob
            knob = f"{cfg.get('bins')}b/p{cfg.get('prune')}"
            if cfg.get("family", "kmeans") != "kmeans":  # e.g. a refined search's grid
                knob += f"/{cfg['family']}"
            if cfg.get("feedback"):
                knob += "+fb"
        return SaveStat(raw_w, sw, raw_t, st, dt, str(knob), parts)

    def restore(self) -> int:
        self.tracker.restore("HEAD")
        return int(self.repo.read_commit(self.repo.resolve("HEAD")).step)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        shutil.rmtree(self._dir, ignore_errors=True)


SYSTEMS = ["exact", "zipnn", "uniform", "adaptive", "excp", "excp-control", "mvc", "mvc-exact-opt"]
#: Also runnable (--systems): mvc with both quantizer families in the search space, with the
#: uniform family only (issue 29), with the default space unrefined, and without the scalar gate's
#: mirror check (for A/B runs).
EXTRA_SYSTEMS = ["mvc-both", "mvc-uniform-only", "mvc-norefine", "mvc-nomirror"]


def make_system(key: str, epsilon: float = 0.01) -> System:
    """A fresh system by key (see SYSTEMS)."""
    return {"exact": lambda: Exact(epsilon), "zipnn": lambda: ZipNN(epsilon),
            "uniform": lambda: Uniform(epsilon), "adaptive": lambda: Adaptive(epsilon),
            "excp": lambda: ExCP(epsilon), "excp-control": lambda: ExactMomentPruned(epsilon),
            "mvc": lambda: Mvc(epsilon, "compressed"),
            "mvc-exact-opt": lambda: Mvc(epsilon, "exact"),
            "mvc-both": lambda: Mvc(epsilon, "compressed", ("kmeans", "uniform")),
            "mvc-uniform-only": lambda: Mvc(epsilon, "compressed", ("uniform",)),
            "mvc-norefine": lambda: Mvc(epsilon, "compressed", refine=False),
            "mvc-nomirror": lambda: Mvc(epsilon, "compressed", mirror=False)}[key]()

