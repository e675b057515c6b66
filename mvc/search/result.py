"""`SearchResult`: what `mvc.search.find_config` returns (the chosen config, the winning
trial's quantization and the quality record)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mvc.search.record import QualityRecord

if TYPE_CHECKING:
    from mvc.quant import QuantConfig, QuantizedTensor


@dataclass
class SearchResult:
    """The outcome of `find_config`.

    config:      the chosen QuantConfig, or None (nothing feasible / nothing to
                 quantize: store losslessly).
    qmap:        the winning trial's quantization by tensor name (None = lossless);
                 all None when config is None.
    quality:     the quality record (metric, baseline, value, degradation, epsilon,
                 evaluations, mode, bits_per_param, trials; the gate that vouched
                 and its bound: gate, ucb / fidelity, tensor_cap, max_distortion,
                 worst_tensor — see `mvc.search.gate`); `.to_json()` is what a
                 commit stores.
    evaluations: quality-function calls made, the baseline included.
    """

    config: QuantConfig | None
    qmap: dict[str, QuantizedTensor | None]
    quality: QualityRecord
    evaluations: int
