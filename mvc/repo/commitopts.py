"""How a commit stores tensors: its settings and storage mode, read from the repository config
and the commit's own arguments.

Kept apart from `Repo` so that opening a repository (log, branch, status, config) never
imports the pipeline and, through it, torch: `Repo.commit` imports this module on first use.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Callable

from mvc.errors import MvcWarning, UsageError
from mvc.quant import QuantConfig, QuantPolicy
from mvc.repo import pipeline
from mvc.repo.config import Config
from mvc.repo.objectdb import ObjectDB
from mvc.search.plan import Quantization
from mvc.search.space import SearchSpace


def commit_settings(config: Config) -> pipeline.CommitSettings:
    """The `commit.*` configuration values, read now."""
    get = config.get
    return pipeline.CommitSettings(
        lossless_codec=str(get("commit.lossless_codec")),
        chunk_size=int(get("commit.chunk_mib")) << 20,
        base_every=int(get("commit.base_every")),
        delta_max_ratio=float(get("commit.delta_max_ratio")),
        chain_budget=float(get("commit.chain_budget")))


def quantization(config: Config, lossless: bool | None, quant: QuantConfig | None,
                 policy: QuantPolicy | None, quality: Callable[[Any], float] | None,
                 epsilon: float | None, space: SearchSpace | None,
                 hessians: Any = None) -> Quantization:
    """How this commit stores tensors, from its arguments and `commit.*` config (`hessians`:
    input Hessians for error feedback, a mapping or a function returning one)."""
    if hessians is not None and not (isinstance(hessians, Mapping) or callable(hessians)):
        raise UsageError(f"hessians must be a mapping of name -> Hessian (or a function "
                         f"returning one), got {type(hessians).__name__}")
    if quant is not None and not isinstance(quant, QuantConfig):
        raise UsageError(f"quant must be a mvc.quant.QuantConfig, got {type(quant).__name__}")
    if quality is not None and not callable(quality):
        raise UsageError("quality must be a callable taking the candidate state")
    if space is not None:
        if not isinstance(space, SearchSpace):
            raise UsageError(f"space must be a mvc.search.SearchSpace, got {type(space).__name__}")
        if quant is not None or lossless:
            raise UsageError("space= selects the config search: it cannot be combined with "
                             "quant= or lossless=True")
    mode = config.get("commit.mode")
    if lossless or (quant is None and space is None and mode == "lossless"):
        return Quantization("lossless", policy=policy)
    optimizer = str(config.get("commit.optimizer"))
    if quant is None and space is None and mode == "fixed":
        configured = config.get("commit.quant")
        if not configured:
            raise UsageError("commit.mode is 'fixed' but commit.quant is not set")
        quant = QuantConfig.from_dict(configured)
    # quality.epsilon bounds a quality function's relative degradation; without one it
    # bounds the proxy (weighted relative L2 error, default PROXY_EPSILON 0.05), as
    # --epsilon does -- but only when set: its default is a loss bound, and as the
    # proxy's it would silently cut compression.
    if epsilon is None and (quality is not None or config.is_set("quality.epsilon")):
        epsilon = config.get("quality.epsilon")
    if quant is None and space is None and quality is None and epsilon is None:
        # Nothing judges a lossy commit: no proxy bound keeps a trained model's restore well
        # under 1% held-out loss while still compressing (docs/quality.md, bench_nohook),
        # so lossy commits are opt-in: a quality function, an explicit bound on the proxy
        # (epsilon= / --epsilon / quality.epsilon), a search space, or a fixed config.
        return Quantization("lossless", policy=policy)
    if quant is not None:  # measured by the gates, not searched (mvc.search.plan.gate_fixed)
        return Quantization("fixed", config=quant, policy=policy, optimizer=optimizer,
                                     quality=quality, epsilon=epsilon,
                                     tensor_cap=config.get("quality.tensor_cap"),
                                     fixed_rule=str(config.get("commit.fixed_gate")),
                                     moment_cap=config.get("quality.moment_cap"),
                                     mirror=bool(config.get("quality.mirror")),
                                     hessians=hessians)
    return Quantization("search", space=space, quality=quality, epsilon=epsilon,
                                 policy=policy, optimizer=optimizer,
                                 tensor_cap=config.get("quality.tensor_cap"),
                                 moment_cap=config.get("quality.moment_cap"),
                                 mirror=bool(config.get("quality.mirror")),
                                 hessians=hessians)


def warn_lossless_after_lossy(how: Quantization, lossless: bool | None, config: Config, odb: ObjectDB,
                              head: str | None) -> None:
    """Warn (`MvcWarning`) when this commit is lossless only because nothing judges a lossy
    one -- no quality hook, no epsilon, as in a fresh clone, whose config stays local -- while
    HEAD's commit is quantized: the history was lossy and this commit silently would not be.
    Once: the next commit's HEAD is this lossless one.  Not when lossless was asked for
    (`lossless=True`, `commit.mode = lossless`)."""
    if how.mode != "lossless" or lossless or head is None or config.get("commit.mode") != "search":
        return
    if odb.read_commit(head).quant is None:
        return
    warnings.warn(MvcWarning(
        f"HEAD ({head[:12]}) is quantized, but this commit is stored losslessly: this repository "
        "has no quality hook (config is not cloned or pushed). To keep committing lossy: "
        "`mvc config quality.hook MODULE:FUNCTION`, or `mvc config quality.epsilon E` to bound "
        "the proxy (Python: commit(quality=..., epsilon=...); docs/quality.md)"), stacklevel=3)
