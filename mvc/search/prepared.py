"""The search's per-call preparation: which tensors it quantizes, their value and
sensitivity sketches and the per-layer-type merges every trial reads its thresholds off,
the quantization of one tensor for a trial (`Prepared.quantize`) and a trial's
measurements (`Prepared.measure`): the `TrialSource` of a search over whole tensors."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from mvc.quant import (AssignStats, LogSketch, QuantConfig, QuantizedTensor, QuantPolicy,
                       quantize_prepared)
from mvc.quant.batched import GroupJob, batchable, start_group
from mvc.quant.batched_sketch import sketch_many
from mvc.quant.error import cached_error_sums, level_histogram, relative_error, seed_error_stats
from mvc.quant.errors import NonFiniteTensorError
from mvc.quant.feedback import feedback_levels, usable
from mvc.quant.importance import sensitivity
from mvc.layer_types import layer_type
from mvc.quant.partition import Thresholds, thresholds
from mvc.quant.uniform import DEFAULT_FAMILY, FAMILIES
from mvc.search.quality import proxy_error
from mvc.search.trials import Measure, PieceKey, Pieces, entropy_bits

#: Input Hessians by name, or a function that collects them (called on first use).
Hessians = Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor] | None]


class Prepared:
    """Per-search shared work: which tensors, their sketches, per-layer-type merges; and the
    quantization of one tensor for a trial, with what the search reads off it (a
    `mvc.search.trials.TrialSource` over this process's whole tensors)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                 policy: QuantPolicy, alpha: float,
                 hessians: Hessians | None = None) -> None:
        self.tensors = tensors
        self.grads = _beside(grads, tensors)
        grads = self.grads
        self.sketches: dict[str, LogSketch] = {}
        self.sens_sketches: dict[str, LogSketch] = {}
        self.groups: dict[str, list[str]] = {}
        chosen = {n: t for n, t in tensors.items() if policy.should_quantize(n, t)}
        sketched = _sketches(chosen, grads, alpha)
        for name, t in chosen.items():
            got = sketched.get(name)
            if got is None:
                continue  # NaN/Inf: kept lossless, as quantize_state(nonfinite="lossless")
            self.sketches[name] = got[0]
            if got[1] is not None:
                self.sens_sketches[name] = got[1]
            self.groups.setdefault(layer_type(name, t.shape), []).append(name)
        self.names = [n for names in self.groups.values() for n in names]
        self.layer_type_of = {n: lt for lt, names in self.groups.items() for n in names}
        self.mag = {lt: LogSketch(alpha).merge(*(self.sketches[n].abs() for n in names))
                    for lt, names in self.groups.items()}
        self.sens = {}
        for lt, names in self.groups.items():
            have = [n for n in names if n in self.sens_sketches]
            if have:
                self.sens[lt] = LogSketch(alpha).merge(*(self.sens_sketches[n] for n in have))
        self.has_sensitivity = bool(self.names) and all(n in self.sens_sketches for n in self.names)
        self.embeddings = "embedding" in self.groups
        total = sum(tensors[n].numel() for n in self.names)
        emb = sum(tensors[n].numel() for n in self.groups.get("embedding", []))
        self.embedding_share = emb / total if total else 0.0
        self._hessians_of = hessians
        self._hessians: dict[str, torch.Tensor] | None = None

    @property
    def hessians(self) -> Mapping[str, torch.Tensor]:
        """Input Hessians of the searched 2-D weights that error feedback serves, by name;
        given as a function, it is called here, on first use (a search that never tries
        error feedback never collects them)."""
        if self._hessians is None:
            h = self._hessians_of
            h = h() if callable(h) else h
            self._hessians = usable(h or {}, {n: self.tensors[n] for n in self.names})
        return self._hessians

    def thresholds(self, config: QuantConfig, ltype: str) -> Thresholds:
        lq = config.for_layer_type(ltype)
        needs_sens = lq.prune > 0 and lq.prune_metric == "sensitivity"
        sens = self.sens.get(ltype) if (lq.protect > 0 or needs_sens) else None
        return thresholds(self.mag[ltype], sens, prune=lq.prune, prune_metric=lq.prune_metric,
                          protect=lq.protect)

    def tensor_thresholds(self, name: str, thr: Thresholds) -> Thresholds:
        """`thr` for tensor `name`: without a sensitivity sketch of its own it protects by
        magnitude alone."""
        if name in self.sens_sketches or thr.protect_sensitivity is None:
            return thr
        return Thresholds(thr.prune, thr.prune_metric, thr.protect_magnitude, None)

    #: The quantizer families this source quantizes with (`FamilyTrialSource`).
    families = FAMILIES
    #: `measure` reads a quantization's cached error sums and level counts only, so a
    #: levels-free stand-in (`mvc.quant.error.measured_stand_in`) measures as it would.
    measures_stand_ins = True

    def quantize(self, name: str, bins: int, thr: Thresholds, *, seed: int, sigma: float,
                 init: torch.Tensor | None, weigh: bool, family: str = DEFAULT_FAMILY,
                 feedback: bool = False) -> Pieces:
        """{name: quantization of tensor `name`} in quantizer family `family`; with `feedback`
        and a Hessian for the tensor, its levels re-assigned by GPTQ error feedback.  The
        assignment pass also measures the error sums and level counts (`AssignStats`) and
        leaves them where the proxy, the guard rail and the bit count look them up:
        gradient-weighted when `weigh` (a proxy search) and the tensor has a gradient of its
        shape."""
        t = self.tensors[name]
        sens = sensitivity(t, self.grads[name], name=name) if (
            thr.needs_sensitivity and name in self.sens_sketches) else None
        g = self.grads.get(name) if weigh else None
        g = g if g is not None and g.shape == t.shape else None
        stats = AssignStats(w=g.detach().reshape(-1).to(torch.float32).contiguous()
                            if g is not None else None)
        x = t.detach().reshape(-1).to(torch.float32).contiguous()
        q = quantize_prepared(t, x, self.sketches[name], sens, thr, bins, seed=seed, sigma=sigma,
                              init=init, stats=stats, family=family)
        h = self.hessians.get(name) if feedback else None
        if h is None:
            seed_error_stats(q, t, g, stats.sums, stats.counts)
            return {name: q}
        # the assignment pass measured the plain levels: the re-assigned ones are measured
        # on first use (their sums and level counts)
        return {name: feedback_levels(q, t, h)}

    def quantize_group(self, keys: list[PieceKey], *, seed: int, sigma: float,
                       init: Mapping[str, torch.Tensor], weigh: bool,
                       family: str = DEFAULT_FAMILY, feedback: bool = False
                       ) -> dict[PieceKey, Pieces]:
        """The quantizations of those of `keys` whose tensors take the torch path (CUDA
        tensors), in one batched pass per layer type, bins count and device
        (`mvc.quant.batched`), all enqueued before the first is waited for, by key: what
        `quantize` gives each, with the same sums and counts left for the search. Host
        tensors (the native kernels), float64 ones and those error feedback re-assigns are
        left to `quantize` (`mvc.search.trials.GroupTrialSource`)."""
        # One pass per layer type (and bins count, device): a pass's levels are one buffer,
        # which any of its tensors' levels keeps alive, and the next trial reuses a layer type
        # whole or not at all; a pass over several would keep what it drops on the device.
        jobs: dict[tuple[int, torch.device, str], list[tuple[PieceKey, GroupJob]]] = {}
        for key in keys:
            name, bins, thr = key
            t = self.tensors[name]
            if not batchable(t) or (feedback and name in self.hessians):
                continue
            g = self.grads.get(name) if weigh else None
            g = g if g is not None and g.shape == t.shape else None
            grad = self.grads.get(name) if (
                thr.needs_sensitivity and name in self.sens_sketches) else None
            jobs.setdefault((bins, t.device, self.layer_type_of.get(name, "")), []).append(
                (key, GroupJob(t, self.sketches[name], thr, grad=grad, weight=g,
                               init=init.get(name))))
        # every pass enqueued before any is waited for: one wait for the device per call
        pending = [(group, start_group([job for _, job in group], bins, seed=seed, sigma=sigma,
                                       family=family))
                   for (bins, _, _), group in jobs.items()]
        for _, passed in pending:
            passed.wait()
        out: dict[PieceKey, Pieces] = {}
        for group, passed in pending:
            for (key, job), r in zip(group, passed.results(), strict=True):
                if r is not None:  # None: a degenerate tensor, left to `quantize`
                    seed_error_stats(r.q, job.tensor, job.weight, r.sums, r.counts)
                    out[key] = {key[0]: r.q}
        return out

    def measure(self, qmap: Mapping[str, QuantizedTensor | None],
                pieces: Mapping[PieceKey, Pieces], proxy: bool) -> Measure:
        """The proxy (when asked for), each tensor's relative L2 error and the bits, all
        from the sums and counts the quantizations' assignment passes left."""
        value, metric = proxy_error(self.tensors, qmap, self.grads) if proxy else (None, None)
        # Sums taken with a gradient serve this lookup without one: the same cached pass.
        distortion = {name: relative_error(cached_error_sums(got[name], self.tensors[name]))
                      for (name, _, _), got in pieces.items()}
        return Measure(value, metric, distortion, _bits(qmap))


def _sketches(tensors: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
              alpha: float) -> dict[str, tuple[LogSketch, LogSketch | None]]:
    """(value sketch, sensitivity sketch or None without a gradient) by name; a tensor whose
    values or gradient hold NaN / Inf is left out. Tensors on the torch path (CUDA) are
    sketched together, per device (`mvc.quant.batched_sketch`): a synchronisation per batch
    of tensors, not two per tensor."""
    out: dict[str, tuple[LogSketch, LogSketch | None]] = {}
    batched: dict[torch.device, list[str]] = {}
    for name, t in tensors.items():
        g = grads.get(name)
        if batchable(t) and (g is None or g.shape == t.shape):
            batched.setdefault(t.device, []).append(name)
            continue
        try:
            sk = LogSketch.from_tensor(t.detach().reshape(-1).to(torch.float32), alpha, name=name)
            out[name] = (sk, LogSketch.from_tensor(sensitivity(t, g, name=name), alpha, name=name)
                         if g is not None else None)
        except NonFiniteTensorError:
            continue
    for names in batched.values():
        ts = [tensors[n] for n in names]
        values = sketch_many(ts, alpha)
        ok = [i for i, sk in enumerate(values) if sk is not None]
        sens = sketch_many([ts[i] for i in ok], alpha, grads=[grads.get(names[i]) for i in ok])
        for i, ssk in zip(ok, sens, strict=True):
            vsk = values[i]
            assert vsk is not None
            if ssk is not None or grads.get(names[i]) is None:
                out[names[i]] = (vsk, ssk)
    return out


def _bits(qmap: Mapping[str, QuantizedTensor | None]) -> float:
    """Measured bits per quantized parameter: level entropy plus protected values."""
    total_bits, n = 0.0, 0
    for q in qmap.values():
        if q is None or q.levels.numel() == 0:
            continue
        # one native count per quantization, kept while it lives
        total_bits += entropy_bits(level_histogram(q), q.levels.numel())
        total_bits += q.protected.numel() * q.protected.element_size() * 8
        n += q.levels.numel()
    return total_bits / n if n else 0.0


def _beside(grads: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]
            ) -> Mapping[str, torch.Tensor]:
    """`grads` with each gradient that sits on an accelerator other than its tensor's moved to
    the tensor's device (a host state committed with a GPU run's gradients: the native kernels
    read host memory). A host gradient of a device tensor stays where it is: the batched passes
    upload it a chunk at a time, where a whole copy would be the weights' size again on the
    device."""
    moved = {n: g.to(tensors[n].device) for n, g in grads.items()
             if n in tensors and g.device != tensors[n].device and g.device.type != "cpu"}
    return {**grads, **moved} if moved else grads
