"""Shared plumbing of the end-to-end benchmark's checkpointing systems (benchmarks only).

`System` holds the live model, optimizer and quality function and defines the
save / restore contract; `_Tensorwise` stores each tensor on its own (weights via
`_prepare_weights`, optimizer state via `_enc_o_state`) and rebuilds the state
from those bytes alone.  `Exact` (torch.save, the reference) and `ZipNN`
(lossless) live here; the lossy re-implemented peers are in
benchmarks/e2e_baselines.py and mvc itself in benchmarks/e2e_systems.py.
"""
from __future__ import annotations

import copy
import io
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

__all__ = ["SMALL", "SaveStat", "System", "Exact", "ZipNN"]

SMALL = 1024  # tensors with fewer values are stored lossless by every system


@dataclass
class SaveStat:
    """Raw and stored bytes of one checkpoint (weights = model tensors only)."""

    raw_w: int
    stored_w: int
    raw_total: int
    stored_total: int
    seconds: float
    knob: str = ""
    #: [raw, stored] bytes by component ("weights", "exp_avg", "exp_avg_sq", "other"), where known
    parts: dict = field(default_factory=dict)


def _nbytes(sd: dict) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values() if torch.is_tensor(t))


def _opt_tensors(osd: dict) -> dict[str, torch.Tensor]:
    """Flatten Adam's state: 'idx/key' -> tensor."""
    return {f"{i}/{k}": v for i, st in osd["state"].items() for k, v in st.items()
            if torch.is_tensor(v)}


def _zip_bytes(t: torch.Tensor) -> bytes:
    import zipnn

    x = t.detach().to("cpu", torch.float32).contiguous()
    return bytes(zipnn.ZipNN(input_format="byte", bytearray_dtype="float32").compress(
        x.numpy().tobytes()))


def _unzip(b: bytes, like: torch.Tensor) -> torch.Tensor:
    import zipnn

    raw = zipnn.ZipNN(input_format="byte", bytearray_dtype="float32").decompress(b)
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(like.shape).clone()



class System:
    """Base: holds the model, optimizer and quality function; subclasses store bytes."""

    name = "base"
    lossy = False

    def __init__(self, epsilon: float = 0.01) -> None:
        self.epsilon = epsilon
        self.model: Optional[nn.Module] = None
        self.opt: Optional[torch.optim.Optimizer] = None
        self.quality: Optional[Callable[[nn.Module], float]] = None
        self._eval_model: Optional[nn.Module] = None

    def attach(self, model: nn.Module, opt: Optional[torch.optim.Optimizer],
               quality: Callable[[nn.Module], float]) -> None:
        """Bind the live model / optimizer and the quality function (a loss)."""
        self.model, self.opt, self.quality = model, opt, quality

    def after_backward(self) -> None:
        """Called after every backward pass (mvc's gradient EMA)."""

    def save(self, step: int) -> SaveStat:
        raise NotImplementedError

    def restore(self) -> int:
        """Load the latest checkpoint into model and optimizer; returns its step."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources."""

    # the quality of a candidate model state dict, evaluated on a private copy
    def _q(self, sd: dict) -> float:
        if self._eval_model is None:
            self._eval_model = copy.deepcopy(self.model)
        self._eval_model.load_state_dict(sd)
        return self.quality(self._eval_model)

    def _search(self, knobs: list, build: Callable[[Any], dict]) -> tuple[Any, dict]:
        """Most compressive knob (knobs ordered most -> least compressive) within epsilon."""
        base = self._q(self.model.state_dict())
        for k in knobs:
            cand = build(k)
            if (self._q(cand) - base) / max(abs(base), 1e-12) <= self.epsilon:
                return k, cand
        return None, {}


class Exact(System):
    """torch.save of model + optimizer."""

    name = "exact torch.save"

    def save(self, step: int) -> SaveStat:
        t0 = time.perf_counter()
        msd = self.model.state_dict()
        osd = self.opt.state_dict() if self.opt else None
        bw, bo = io.BytesIO(), io.BytesIO()
        torch.save(msd, bw)
        torch.save(osd, bo)
        self._blob = (bw.getvalue(), bo.getvalue(), step)
        return SaveStat(_nbytes(msd), len(self._blob[0]),
                        _nbytes(msd) + (_nbytes(_opt_tensors(osd)) if osd else 0),
                        len(self._blob[0]) + len(self._blob[1]), time.perf_counter() - t0)

    def restore(self) -> int:
        bw, bo, step = self._blob
        self.model.load_state_dict(torch.load(io.BytesIO(bw), weights_only=True))
        if self.opt:
            self.opt.load_state_dict(torch.load(io.BytesIO(bo), weights_only=True))
        return step


class _Tensorwise(System):
    """Stores each tensor with `_enc_w` (weights) / `_enc_o` (optimizer); skeleton by torch.save."""

    def _enc_o(self, name: str, t: torch.Tensor) -> Any:
        return ("zip", _zip_bytes(t)) if t.numel() >= SMALL else ("raw", t.clone())

    def _dec_o(self, name: str, e: Any, like: torch.Tensor) -> torch.Tensor:
        return _unzip(e[1], like) if e[0] == "zip" else e[1].clone()

    @staticmethod
    def _size(e: Any) -> int:
        if e[0] == "raw":
            return e[1].numel() * e[1].element_size()
        return sum(len(p) for p in e[1:] if isinstance(p, (bytes, bytearray)))

    def _prepare_weights(self, msd: dict) -> tuple[dict, str]:
        """name -> encoded weight; the knob chosen (subclasses)."""
        return {n: self._enc_o(n, t) for n, t in msd.items()}, ""

    def _decode_weights(self, enc: dict, like: dict) -> dict:
        return {n: self._dec_o(n, e, like[n]) for n, e in enc.items()}

    def save(self, step: int) -> SaveStat:
        t0 = time.perf_counter()
        msd = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        wenc, knob = self._prepare_weights(msd)
        otens, oskel = {}, b""
        if self.opt:
            osd = self.opt.state_dict()
            ot = _opt_tensors(osd)
            otens = {n: self._enc_o_state(n, t, msd) for n, t in ot.items()}
            buf = io.BytesIO()
            torch.save({"param_groups": osd["param_groups"],
                        "keys": {i: list(st) for i, st in osd["state"].items()},
                        "shapes": {n: (tuple(t.shape), str(t.dtype)) for n, t in ot.items()}}, buf)
            oskel = buf.getvalue()
        self._commit(step, wenc, otens, oskel, msd)
        sw = sum(self._size(e) for e in wenc.values())
        so = sum(self._size(e) for e in otens.values()) + len(oskel)
        raw_o = _nbytes(_opt_tensors(self.opt.state_dict())) if self.opt else 0
        return SaveStat(_nbytes(msd), sw, _nbytes(msd) + raw_o, sw + so,
                        time.perf_counter() - t0, knob)

    def _enc_o_state(self, name: str, t: torch.Tensor, msd: dict) -> Any:
        return self._enc_o(name, t)

    def _commit(self, step, wenc, otens, oskel, msd) -> None:
        self._last = (step, wenc, otens, oskel, {n: t.shape for n, t in msd.items()})

    def restore(self) -> int:
        step, wenc, otens, oskel, shapes = self._last
        like = {n: torch.empty(s) for n, s in shapes.items()}
        self.model.load_state_dict(self._decode_weights(wenc, like))
        if self.opt and oskel:
            self.opt.load_state_dict(self._decode_opt(otens, oskel))
        return step

    def _decode_opt(self, otens: dict, oskel: bytes) -> dict:
        sk = torch.load(io.BytesIO(oskel), weights_only=True)
        state: dict = {}
        for i, keys in sk["keys"].items():
            state[i] = {}
            for k in keys:
                n = f"{i}/{k}"
                shape, dt = sk["shapes"][n]
                like = torch.empty(shape)
                t = self._dec_o(n, otens[n], like)
                state[i][k] = t.to(getattr(torch, dt.split(".")[-1]))
        return {"state": state, "param_groups": sk["param_groups"]}


class ZipNN(_Tensorwise):
    """zipnn lossless on every tensor."""

    name = "ZipNN lossless"

