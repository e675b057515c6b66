"""Where a search's trials come from: the `TrialSource` protocol the search reads.

A trial quantizes every searched tensor by one config and measures the result: the
proxy, each tensor's relative L2 error (the tensor cap) and the bits per parameter.
The search (`mvc.search.driver`) decides everything else -- which trials, in which
order, which quantization a trial can reuse, the gate, the record -- so every caller
gets the same search from its own source:

* `mvc.search.prepared.Prepared`: this process's whole tensors (`find_config`, and every
  replica of a parallel search, `mvc.search.parallel`);
* `mvc.dcp.lossy.ShardedTrials`: a sharded save, where each rank quantizes its own shards
  and a trial's sums are added up over the ranks (a *collective* trial), so every rank
  measures the same numbers and the search walks the same trials on every rank.

A source quantizes one tensor at a time (`quantize`); what it returns for a tensor is
this process's part of that tensor's quantization (`Pieces`).  The search keeps the
pieces of the trials it may reuse, keyed by (tensor, bins, thresholds): a tensor's
quantization depends on nothing else within one search, so a later trial with the same
key reuses it.  `measure` then measures the whole trial; a collective source must make
it the one step every process takes together.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, cast

import torch

from mvc.quant import QuantConfig, QuantizedTensor
from mvc.quant.partition import Thresholds
from mvc.quant.uniform import DEFAULT_FAMILY

#: This process's part of one tensor's quantization, by the name the process knows it
#: under: a whole tensor's is {its name: its quantization}; a sharded tensor's, this
#: rank's shards (possibly none).
Pieces = Mapping[str, QuantizedTensor]
#: What a trial's quantization of one tensor depends on: (tensor name, bins, thresholds).
PieceKey = tuple[str, int, Thresholds]


@dataclass(frozen=True)
class Measure:
    """A trial's measurements, over every process's pieces.

    proxy:      the proxy's value (None when not asked for: a quality function judges).
    metric:     the proxy's metric name (None with `proxy`).
    distortion: each quantized tensor's relative L2 error.
    bits:       measured bits per quantized parameter (level entropy plus protected values).
    """

    proxy: float | None
    metric: str | None
    distortion: dict[str, float]
    bits: float


class TrialSource(Protocol):
    """What the search reads off the tensors it searches a config for."""

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        """This process's tensors: a trial's quantization map has their names (a quality
        function, where there is one, sees them)."""
        ...

    @property
    def names(self) -> list[str]:
        """The tensors a trial quantizes (whole-tensor names), in `groups` order."""
        ...

    @property
    def groups(self) -> Mapping[str, list[str]]:
        """Layer type -> its quantized tensors."""
        ...

    @property
    def embeddings(self) -> bool:
        """Some quantized tensor is an embedding (the cube has an embedding-bins axis)."""
        ...

    @property
    def embedding_share(self) -> float:
        """The embeddings' share of the quantized parameters (the cost model's weight)."""
        ...

    @property
    def has_sensitivity(self) -> bool:
        """Every quantized tensor has a sensitivity (gradient): sensitivity pruning is searched."""
        ...

    def thresholds(self, config: QuantConfig, ltype: str) -> Thresholds:
        """The prune / protect thresholds of layer type `ltype` under `config`."""
        ...

    def tensor_thresholds(self, name: str, thr: Thresholds) -> Thresholds:
        """The layer type's thresholds `thr` as tensor `name` applies them."""
        ...

    def quantize(self, name: str, bins: int, thr: Thresholds, *, seed: int, sigma: float,
                 init: torch.Tensor | None, weigh: bool) -> Pieces:
        """This process's part of tensor `name`'s quantization; `weigh`: a proxy search
        (its sums may be gradient-weighted)."""
        ...

    def measure(self, qmap: Mapping[str, QuantizedTensor | None],
                pieces: Mapping[PieceKey, Pieces], proxy: bool) -> Measure:
        """The trial's measurements: `qmap` is its quantization by `tensors`' names (None:
        exact), `pieces` the same by key; `proxy`: whether to compute the proxy."""
        ...


class FamilyTrialSource(TrialSource, Protocol):
    """A source that also quantizes with other families than k-means (`mvc.quant.uniform`);
    it lists them in `families`.  A source without that attribute is searched over k-means
    only (`source_families`)."""

    families: tuple[str, ...]

    def quantize(self, name: str, bins: int, thr: Thresholds, *, seed: int, sigma: float,
                 init: torch.Tensor | None, weigh: bool, family: str = DEFAULT_FAMILY,
                 feedback: bool = False) -> Pieces:
        """As `TrialSource.quantize`, in quantizer family `family`; `feedback` (asked only of
        a source with `hessians`): error feedback where it has the tensor's Hessian."""
        ...


class GroupTrialSource(TrialSource, Protocol):
    """A source that can quantize a layer type's tensors together (`mvc.quant.batched`: one
    batched pass on their device, not one per tensor)."""

    def quantize_group(self, keys: list[PieceKey], *, seed: int, sigma: float,
                       init: Mapping[str, torch.Tensor], weigh: bool,
                       family: str = DEFAULT_FAMILY, feedback: bool = False
                       ) -> dict[PieceKey, Pieces]:
        """The quantizations of those of `keys` (a trial's, of every layer type) the source
        batches, by key, as `quantize` would give each; the keys it leaves out are asked of
        `quantize` one by one."""
        ...


def source_families(source: TrialSource) -> tuple[str, ...]:
    """The quantizer families `source` can quantize with: its `families`, else k-means."""
    got = getattr(source, "families", (DEFAULT_FAMILY,))
    return tuple(got)


def source_feedback(source: TrialSource) -> bool:
    """Whether `source` can quantize with error feedback: it knows some searched tensor's
    input Hessian (its `hessians`, `mvc.search.prepared.Prepared`)."""
    return bool(getattr(source, "hessians", None))


def quantize_config(source: TrialSource, config: QuantConfig, *, seed: int,
                    init: Mapping[str, torch.Tensor], weigh: bool,
                    reuse: dict[PieceKey, Pieces] | None = None
                    ) -> tuple[dict[str, QuantizedTensor | None], dict[PieceKey, Pieces]]:
    """(quantization by `source.tensors`' names, None for the exact ones; the same by
    key) of every searched tensor by `config`; a key found in `reuse` is not
    quantized again (`reuse` must hold quantizations of `config.family` and `config.feedback`
    only: the key names neither). `reuse` is consumed: what `config` does not use is
    taken out of it before anything is quantized.  `init`: warm-start centroids by tensor name.  A family other
    than k-means is asked of the source as `quantize(..., family=...)`, error feedback as
    `feedback=True` (`FamilyTrialSource`).  A source with `quantize_group` (`GroupTrialSource`)
    is first asked for every layer type's tensors together."""
    qmap: dict[str, QuantizedTensor | None] = {n: None for n in source.tensors}
    keys: dict[PieceKey, Pieces] = {}
    batch = cast(GroupTrialSource, source).quantize_group if hasattr(
        source, "quantize_group") else None
    groups = []
    for ltype, names in source.groups.items():
        thr = source.thresholds(config, ltype)
        bins = config.for_layer_type(ltype).bins
        groups.append([(name, bins, source.tensor_thresholds(name, thr)) for name in names])
    reuse = reuse if reuse is not None else {}
    # What this config does not reuse goes now, before its own quantizations are made: the
    # last trial's levels, on a GPU, are a quarter of the weights' bytes.
    wanted = {key for group in groups for key in group}
    for key in [k for k in reuse if k not in wanted]:
        del reuse[key]
    # every layer type's batched passes asked for at once: the source waits for its device
    # once per trial, not once per layer type
    todo = [key for group in groups for key in group if key not in reuse]
    batched = batch(todo, seed=seed, sigma=config.sigma, init=init, weigh=weigh,
                    family=config.family, feedback=config.feedback) if batch and todo else {}
    for group in groups:
        for key in group:
            name, bins, _ = key
            got = reuse.get(key)
            got = batched.get(key) if got is None else got
            if got is None and config.feedback:
                got = cast(FamilyTrialSource, source).quantize(
                    name, bins, key[2], seed=seed, sigma=config.sigma, init=init.get(name),
                    weigh=weigh, family=config.family, feedback=True)
            elif got is None and config.family != DEFAULT_FAMILY:
                got = cast(FamilyTrialSource, source).quantize(
                    name, bins, key[2], seed=seed, sigma=config.sigma, init=init.get(name),
                    weigh=weigh, family=config.family)
            elif got is None:
                got = source.quantize(name, bins, key[2], seed=seed, sigma=config.sigma,
                                      init=init.get(name), weigh=weigh)
            qmap.update(got)
            keys[key] = got
    return qmap, keys


def worst(distortion: Mapping[str, float]) -> tuple[float, str | None]:
    """(largest relative L2 error, its tensor); (0.0, None) for no tensor.  A tie goes to
    the later name, so the answer does not depend on the mapping's order."""
    return max(((d, n) for n, d in distortion.items()), default=(0.0, None),
               key=lambda dn: (dn[0], dn[1] or ""))


def entropy_bits(counts: torch.Tensor, numel: int) -> float:
    """Bits of `numel` level indices whose levels occur `counts` times, at their entropy."""
    p = counts[counts > 0].to(torch.float64) / numel
    return float(-(p * p.log2()).sum()) * numel
