"""The commit hook: choose, per commit, the most compressive quantization config whose
measured quality loss stays within epsilon (Inshrinkerator §5).

    from mvc.search import find_config
    res = find_config(flatten(state).tensors, evaluate=eval_loss, epsilon=0.01,
                      previous=last_config, grads=grad_ema)
    res.config, res.qmap, res.quality, res.evaluations

Modules: `space` (the config cube, its ordering and cost model), `guided`
(Algorithm 4), `neighbourhood` (the steady-state search), `quality` (relative
degradation and the proxy metric), `gate` (which gate judges a trial: scalar
metric, per-example confidence bound, fidelity, proxy; the per-tensor distortion
cap), `fidelity` (agreement with the exact checkpoint), `driver` (`find_config`),
`record` (`QualityRecord`: the quality record a commit stores), `plan` (`plan_quantization`:
how a commit quantizes, fixed config or search, optimizer moments included).
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mvc.search.driver import (DEFAULT_EXCLUDE, SearchResult, default_policy, find_config,
                                   search_trials, serve_trials)
    from mvc.search.fidelity import (DEFAULT_THRESHOLDS, Fidelity, FidelityError,
                                     FidelityOutputs, fidelity)
    from mvc.search.gate import (DEFAULT_CONFIDENCE, DEFAULT_MIRROR, DEFAULT_TENSOR_CAP,
                                 tensor_distortion)
    from mvc.search.guided import MonotoneOracle, diagonal, guided_search
    from mvc.search.neighbourhood import SWITCH_MARGIN, neighbourhood
    from mvc.search.parallel import ranks
    from mvc.search.plan import (FixedConfigRefusedError, Quantization, QuantizationPlan,
                                 plan_quantization)
    from mvc.search.quality import (DEFAULT_EPSILON, PROXY_EPSILON, QualityFunctionError,
                                    degradation, proxy_error)
    from mvc.search.record import QualityRecord
    from mvc.search.space import SearchError, SearchSpace, SearchSpaceError

#: Exported name -> the submodule defining it, imported on first use.
_EXPORTS: dict[str, str] = {name: "mvc.search." + module for module, names in {
    "driver": ["DEFAULT_EXCLUDE", "SearchResult", "default_policy", "find_config", "search_trials",
               "serve_trials"],
    "fidelity": ["DEFAULT_THRESHOLDS", "Fidelity", "FidelityError", "FidelityOutputs", "fidelity"],
    "gate": ["DEFAULT_CONFIDENCE", "DEFAULT_MIRROR", "DEFAULT_TENSOR_CAP", "tensor_distortion"],
    "guided": ["MonotoneOracle", "diagonal", "guided_search"],
    "neighbourhood": ["SWITCH_MARGIN", "neighbourhood"],
    "parallel": ["ranks"],
    "plan": ["FixedConfigRefusedError", "Quantization", "QuantizationPlan", "plan_quantization"],
    "quality": ["DEFAULT_EPSILON", "PROXY_EPSILON", "QualityFunctionError", "degradation",
                "proxy_error"],
    "record": ["QualityRecord"],
    "space": ["SearchError", "SearchSpace", "SearchSpaceError"],
}.items() for name in names}

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_EPSILON",
    "DEFAULT_EXCLUDE",
    "DEFAULT_MIRROR",
    "DEFAULT_TENSOR_CAP",
    "DEFAULT_THRESHOLDS",
    "Fidelity",
    "FidelityError",
    "FidelityOutputs",
    "FixedConfigRefusedError",
    "MonotoneOracle",
    "PROXY_EPSILON",
    "QualityFunctionError",
    "QualityRecord",
    "Quantization",
    "QuantizationPlan",
    "SWITCH_MARGIN",
    "SearchError",
    "SearchResult",
    "SearchSpace",
    "SearchSpaceError",
    "default_policy",
    "degradation",
    "diagonal",
    "fidelity",
    "find_config",
    "guided_search",
    "neighbourhood",
    "plan_quantization",
    "proxy_error",
    "ranks",
    "search_trials",
    "serve_trials",
    "tensor_distortion",
]


class _Package(types.ModuleType):
    """`mvc.search`, importing each submodule when one of its names is first asked for:
    reading a commit's quality record (`QualityRecord`, the CLI's `log` and `show`) must
    not import torch, which the search modules do."""

    def __getattr__(self, name: str) -> Any:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        types.ModuleType.__setattr__(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing a submodule binds it on the package.  `fidelity` and `neighbourhood`
        # name both a submodule and the function it exports; the package's attribute is
        # the function, as it was when this package imported everything eagerly.
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_EXPORTS))


sys.modules[__name__].__class__ = _Package
