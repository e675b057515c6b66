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
`record` (`QualityRecord`: the quality record a commit stores).
"""
from mvc.search.driver import (
    DEFAULT_EXCLUDE,
    SearchResult,
    default_policy,
    find_config,
    search_trials,
    serve_trials,
)
from mvc.search.fidelity import (
                                 DEFAULT_THRESHOLDS,
                                 Fidelity,
                                 FidelityError,
                                 FidelityOutputs,
                                 fidelity,
)
from mvc.search.gate import DEFAULT_CONFIDENCE, DEFAULT_TENSOR_CAP, tensor_distortion
from mvc.search.guided import MonotoneOracle, diagonal, guided_search
from mvc.search.neighbourhood import SWITCH_MARGIN, neighbourhood
from mvc.search.parallel import ranks
from mvc.search.quality import (
                                 DEFAULT_EPSILON,
                                 PROXY_EPSILON,
                                 QualityFunctionError,
                                 degradation,
                                 proxy_error,
)
from mvc.search.record import QualityRecord
from mvc.search.space import SearchError, SearchSpace, SearchSpaceError

__all__ = [
                                 "DEFAULT_CONFIDENCE",
                                 "DEFAULT_EPSILON",
                                 "DEFAULT_EXCLUDE",
                                 "DEFAULT_TENSOR_CAP",
                                 "DEFAULT_THRESHOLDS",
                                 "PROXY_EPSILON",
                                 "SWITCH_MARGIN",
                                 "Fidelity",
                                 "FidelityError",
                                 "FidelityOutputs",
                                 "MonotoneOracle",
                                 "QualityFunctionError",
                                 "QualityRecord",
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
                                 "proxy_error",
                                 "ranks",
                                 "search_trials",
                                 "serve_trials",
                                 "tensor_distortion",
]
