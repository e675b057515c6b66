"""Quality gates for `Repo.commit(quality=...)`, the Tracker and `quality.hook`.

    from mvc.quality import fidelity
    fid = fidelity(outputs_fn, calib_inputs, metric="kl")       # or "cosine", "top1"
    repo.commit(state, "step 900", quality=fid)

What a quality argument can be, from weakest to strongest gate (the commit's
quality record names the one used, `gate`, with its bound; `mvc show` prints it):

* nothing: the proxy, a weighted reconstruction error within its own bound
  (``proxy``; not a loss bound);
* a function returning one loss: relative degradation <= epsilon, measured once
  (``metric``; noisy on a small calibration set);
* a function returning per-example losses (1-D tensor or sequence): the one-sided
  95% upper confidence bound of the paired relative degradation <= epsilon
  (``per-example-ucb``);
* `fidelity(...)`: agreement with the exact checkpoint's outputs: the 95% upper
  confidence bound of the mean per-example divergence within an absolute
  threshold (``fidelity``);
* `from_module(model, inputs)` (also ``fidelity.from_module``): the same gate on a
  module's outputs, which also gives error feedback (`QuantConfig.feedback`,
  `SearchSpace.feedback`) the input Hessians of the module's linear layers.

Whatever the gate, each quantized tensor's relative L2 error must stay within
`quality.tensor_cap`.  Details: `mvc.search.gate` and `mvc.search.fidelity`.
"""
from mvc.search.fidelity import (
                                 DEFAULT_THRESHOLDS,
                                 METRICS,
                                 Fidelity,
                                 FidelityError,
                                 FidelityOutputs,
                                 fidelity,
)
from mvc.search.gate import DEFAULT_CONFIDENCE, DEFAULT_TENSOR_CAP
from mvc.search.module_gate import ModuleFidelity, from_module

# ``mvc.quality.fidelity.from_module(model, inputs)``: the spelling of the same gate.
fidelity.from_module = from_module  # type: ignore[attr-defined]

__all__ = ["DEFAULT_CONFIDENCE", "DEFAULT_TENSOR_CAP", "DEFAULT_THRESHOLDS", "METRICS",
           "Fidelity", "FidelityError", "FidelityOutputs", "ModuleFidelity", "fidelity",
           "from_module"]
