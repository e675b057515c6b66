"""Checkpointing systems compared by the end-to-end benchmark (benchmarks only).

Every system stores each checkpoint as real bytes (kept in memory, or in an mvc
repository on disk) and rebuilds model + optimizer from those bytes alone on
`restore()`.  The lossy baselines are simplified re-implementations from the
papers' descriptions (Inshrinkerator §8.2 / appendix A.2, ExCP §3):

* `Exact`     torch.save of the whole state (the reference).
* `ZipNN`     every tensor through the zipnn lossless float compressor.
* `Uniform`   QD-compressor-like: min-max uniform quantization of each big weight
              tensor, cyclic delta of the integer levels against the previous
              checkpoint (mod B), Huffman coded (mvc's native Huffman).  Bit width
              searched per checkpoint (one global width; QD's entropy-based per-layer
              width is simplified away).  Optimizer state lossless (zipnn).
* `Adaptive`  Check-N-Run-like: adaptive uniform quantization (greedy clipping-range
              search minimizing L2 error, per tensor), levels Huffman coded, no delta
              (as in Inshrinkerator's re-implementation).  Bit width searched.
              Optimizer state lossless (zipnn).
* `ExCP`      weight residual against the last reconstruction, joint weight-momentum
              pruning, 4-bit (15 centres + zero) k-means on residual and on both Adam
              moments, LZMA ("7zip").  Pruning strength alpha searched.
* `Mvc`       an mvc repository driven by `mvc.Tracker` (commit.mode=search with the
              held-out quality function; commit.optimizer compressed or exact).

All lossy searches use the same quality function (held-out loss) and epsilon,
and pick the most compressive knob whose relative degradation is <= epsilon.
Small tensors (< 1024 values: biases, norms, step counters) are lossless everywhere.
"""
from __future__ import annotations

import copy
import io
import lzma
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from benchmarks.baselines_quant import torch_lloyd

__all__ = ["SaveStat", "System", "Exact", "ZipNN", "Uniform", "Adaptive", "ExCP", "Mvc",
           "make_system", "SYSTEMS"]

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


def _huff(levels: np.ndarray) -> bytes:
    from mvc.native import huffman

    return bytes(huffman.encode(np.ascontiguousarray(levels)))


def _unhuff(b: bytes, n: int, dtype) -> np.ndarray:
    from mvc.native import huffman

    return np.asarray(huffman.decode(b, n, dtype)).reshape(-1)


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


# ---------------------------------------------------------------- uniform (QD-like)
def _uniform_levels(w: torch.Tensor, bins: int, lo: float, hi: float) -> tuple[torch.Tensor, float]:
    step = (hi - lo) / (bins - 1) if hi > lo else 1.0
    lv = torch.round((w.clamp(lo, hi) - lo) / step).clamp_(0, bins - 1).to(torch.int32)
    return lv, step


class Uniform(_Tensorwise):
    """QD-like uniform quantization + cyclic level delta + Huffman; bits searched."""

    name = "Uniform (QD-like)"
    lossy = True
    BITS = [2, 3, 4, 5, 6, 7, 8]

    def __init__(self, epsilon: float = 0.01) -> None:
        super().__init__(epsilon)
        self._chain: list = []   # encodings since the last base, oldest first
        self._prev_levels: dict = {}

    def _quant(self, msd: dict, bits: int) -> tuple[dict, dict]:
        levels, recon = {}, {}
        for n, t in msd.items():
            if t.numel() < SMALL or not t.is_floating_point():
                recon[n] = t
                continue
            lo, hi = float(t.min()), float(t.max())
            lv, step = _uniform_levels(t.float(), 1 << bits, lo, hi)
            levels[n] = (lv, lo, step, 1 << bits)
            recon[n] = (lv.float() * step + lo).to(t.dtype)
        return levels, recon

    def _prepare_weights(self, msd: dict) -> tuple[dict, str]:
        cache: dict = {}

        def build(bits):
            cache[bits] = self._quant(msd, bits)
            return cache[bits][1]

        bits, _ = self._search(self.BITS, build)
        if bits is None:
            self._prev_levels = {}   # the next quantized checkpoint starts a new base
            return {n: self._enc_o(n, t) for n, t in msd.items()}, "lossless"
        levels, _ = cache[bits]
        enc = {}
        for n, t in msd.items():
            if n not in levels:
                enc[n] = self._enc_o(n, t)
                continue
            lv, lo, step, b = levels[n]
            prev = self._prev_levels.get(n)
            if prev is not None:
                big = max(b, prev[1])
                d = torch.remainder(prev[0] - lv, big).numpy().astype(np.uint8 if big <= 256 else np.uint16)
                enc[n] = ("qdelta", _huff(d), lo, step, b, big)
            else:
                enc[n] = ("qbase", _huff(lv.numpy().astype(np.uint8 if b <= 256 else np.uint16)), lo, step, b)
            self._prev_levels[n] = (lv, b)
        return enc, f"{bits}b"

    def _commit(self, step, wenc, otens, oskel, msd) -> None:
        if any(e[0] == "qbase" for e in wenc.values()) or not self._chain:
            self._chain = []
        self._chain.append(wenc)
        super()._commit(step, wenc, otens, oskel, msd)

    def _decode_weights(self, enc: dict, like: dict) -> dict:
        levels: dict = {}
        out: dict = {}
        for wenc in self._chain:   # replay the delta chain from the base
            for n, e in wenc.items():
                n_el = like[n].numel()
                if e[0] == "qbase":
                    levels[n] = torch.from_numpy(_unhuff(e[1], n_el, np.uint8 if e[4] <= 256 else np.uint16).astype(np.int64))
                elif e[0] == "qdelta":
                    d = torch.from_numpy(_unhuff(e[1], n_el, np.uint8 if e[5] <= 256 else np.uint16).astype(np.int64))
                    levels[n] = torch.remainder(levels[n] - d, e[5])
                else:
                    levels.pop(n, None)
        for n, e in enc.items():
            if e[0] in ("qbase", "qdelta"):
                out[n] = (levels[n].float() * e[3] + e[2]).reshape(like[n].shape)
            else:
                out[n] = self._dec_o(n, e, like[n])
        return out


# ---------------------------------------------------------------- adaptive (Check-N-Run-like)
def _adaptive_range(x: torch.Tensor, bins: int, steps: int = 20) -> tuple[float, float]:
    """Greedy clipping-range search (shrink min or max, keep the lower L2 error)."""
    lo, hi = float(x.min()), float(x.max())
    best = (lo, hi)

    def err(a, b):
        lv, st = _uniform_levels(x, bins, a, b)
        return float(((lv.float() * st + a) - x).pow(2).sum())

    cur = err(lo, hi)
    step = (hi - lo) / (2 * steps)
    a, b = lo, hi
    for _ in range(steps):
        ea, eb = err(a + step, b), err(a, b - step)
        if min(ea, eb) > cur:
            break
        if ea <= eb:
            a, cur = a + step, ea
        else:
            b, cur = b - step, eb
        best = (a, b)
    return best


class Adaptive(_Tensorwise):
    """Check-N-Run-like adaptive uniform quantization, Huffman coded, no delta; bits searched."""

    name = "Adaptive (CNR-like)"
    lossy = True
    BITS = [2, 3, 4, 5, 6, 7, 8]

    def _quant(self, msd: dict, bits: int) -> tuple[dict, dict]:
        levels, recon = {}, {}
        for n, t in msd.items():
            if t.numel() < SMALL or not t.is_floating_point():
                recon[n] = t
                continue
            x = t.float().reshape(-1)
            lo, hi = _adaptive_range(x, 1 << bits)
            lv, step = _uniform_levels(x, 1 << bits, lo, hi)
            levels[n] = (lv, lo, step)
            recon[n] = (lv.float() * step + lo).reshape(t.shape)
        return levels, recon

    def _prepare_weights(self, msd: dict) -> tuple[dict, str]:
        cache: dict = {}

        def build(bits):
            cache[bits] = self._quant(msd, bits)
            return cache[bits][1]

        bits, _ = self._search(self.BITS, build)
        if bits is None:
            return {n: self._enc_o(n, t) for n, t in msd.items()}, "lossless"
        levels = cache[bits][0]
        enc = {n: (("q", _huff(levels[n][0].numpy().astype(np.uint8)), levels[n][1], levels[n][2])
                   if n in levels else self._enc_o(n, t)) for n, t in msd.items()}
        return enc, f"{bits}b"

    def _decode_weights(self, enc: dict, like: dict) -> dict:
        out = {}
        for n, e in enc.items():
            if e[0] == "q":
                lv = torch.from_numpy(_unhuff(e[1], like[n].numel(), np.uint8).astype(np.float32))
                out[n] = (lv * e[3] + e[2]).reshape(like[n].shape)
            else:
                out[n] = self._dec_o(n, e, like[n])
        return out


# ---------------------------------------------------------------- ExCP-like
def _kmeans_codes(x: torch.Tensor, mask: torch.Tensor, k: int = 15) -> tuple[bytes, torch.Tensor]:
    """Codes 0 (pruned) / 1..k (centre index + 1) LZMA-packed, and the reconstruction."""
    vals = x[mask]
    codes = torch.zeros(x.numel(), dtype=torch.uint8)
    recon = torch.zeros_like(x)
    cents = np.zeros(0, dtype=np.float32)
    if vals.numel() > 0:
        kk = min(k, int(vals.numel()))
        # centres fitted on a fixed sample (<= 64k values) to keep the per-candidate search cheap
        fit = vals
        if vals.numel() > 65536:
            g = torch.Generator().manual_seed(0)
            fit = vals[torch.randint(vals.numel(), (65536,), generator=g)]
        cents = np.asarray(torch_lloyd(fit, kk, max_iter=25), dtype=np.float32)
        c = torch.from_numpy(cents)
        mids = (c[:-1] + c[1:]) / 2
        idx = torch.bucketize(vals, mids)
        codes[mask] = (idx + 1).to(torch.uint8)
        recon[mask] = c[idx]
    blob = lzma.compress(cents.tobytes() + codes.numpy().tobytes(), preset=6)
    return blob, recon


class ExCP(_Tensorwise):
    """Residual + joint weight-momentum pruning + 4-bit k-means + LZMA; alpha searched."""

    name = "ExCP-like"
    lossy = True
    # eq. 5's alpha has no scale-free default; a geometric grid, most pruning first
    ALPHAS = [1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 0.0]
    BETA = 1.0

    def __init__(self, epsilon: float = 0.01) -> None:
        super().__init__(epsilon)
        self._recon: dict = {}       # last reconstructed weights (W_hat_{t-1})
        self._chain: list = []       # every weight encoding so far (residuals replayed on restore)

    def _param_state(self) -> dict:
        """weight name -> (exp_avg, exp_avg_sq) of the live optimizer."""
        if self.opt is None:
            return {}
        names = [n for n, _ in self.model.named_parameters()]
        params = [p for g in self.opt.param_groups for p in g["params"]]
        pid = {id(p): n for n, p in zip(names, self.model.parameters())}
        return {pid[id(p)]: (self.opt.state[p]["exp_avg"].cpu(), self.opt.state[p]["exp_avg_sq"].cpu())
                for p in params if p in self.opt.state and id(p) in pid}

    def _quant(self, msd: dict, alpha: float) -> tuple[dict, dict, dict]:
        ps = self._param_state()
        enc, recon, masks = {}, {}, {}
        for n, t in msd.items():
            if t.numel() < SMALL or not t.is_floating_point():
                recon[n] = t
                continue
            x = t.float().reshape(-1)
            prev = self._recon.get(n)
            resid = x - prev if prev is not None else x
            if n in ps and alpha > 0:
                v = ps[n][1].reshape(-1)
                # ExCP eq. 5: threshold alpha / sqrt(v) * median(|W|), per element
                thr = alpha / (v.sqrt() + 1e-12) * float(x.abs().median())
                mask = resid.abs() > thr
            else:
                mask = torch.ones_like(x, dtype=torch.bool)
            blob, rq = _kmeans_codes(resid, mask)
            r = (prev + rq) if prev is not None else rq
            enc[n] = ("excp", blob)
            recon[n] = r.reshape(t.shape)
            masks[n] = mask
        return enc, recon, masks

    def _prepare_weights(self, msd: dict) -> tuple[dict, str]:
        cache: dict = {}

        def build(alpha):
            cache[alpha] = self._quant(msd, alpha)
            return cache[alpha][1]

        alpha, _ = self._search(self.ALPHAS, build)
        if alpha is None:
            alpha = 0.0
            build(alpha)
        enc, recon, masks = cache[alpha]
        self._pending = ({n: recon[n].reshape(-1).float() for n in enc}, masks)
        out = {n: enc[n] if n in enc else self._enc_o(n, t) for n, t in msd.items()}
        return out, f"a={alpha:g}"

    def _enc_o_state(self, name: str, t: torch.Tensor, msd: dict) -> Any:
        if t.numel() < SMALL or not t.is_floating_point():
            return self._enc_o(name, t)
        # joint pruning (eq. 6): keep a moment where |m1| > beta * mean|m1| and the weight residual survived
        idx, key = name.split("/")
        pname = self._pidx_name().get(int(idx))
        wmask = self._pending[1].get(pname) if pname else None
        x = t.float().reshape(-1).cpu()
        m1 = self._m1(int(idx)).reshape(-1)
        mask = m1.abs() > self.BETA * float(m1.abs().mean())
        if wmask is not None:
            mask &= wmask
        blob, _ = _kmeans_codes(x, mask)
        return ("excp", blob)

    def _pidx_name(self) -> dict:
        names = [n for n, _ in self.model.named_parameters()]
        return dict(enumerate(names))

    def _m1(self, idx: int) -> torch.Tensor:
        p = [p for g in self.opt.param_groups for p in g["params"]][idx]
        return self.opt.state[p]["exp_avg"].cpu()

    def _commit(self, step, wenc, otens, oskel, msd) -> None:
        self._recon.update(self._pending[0])
        self._chain.append(wenc)
        super()._commit(step, wenc, otens, oskel, msd)

    def _decode_weights(self, enc: dict, like: dict) -> dict:
        # after a crash only the bytes survive: replay the residual chain (Alg. 2/3) in the
        # order the compressor summed it, which reproduces W_hat bit for bit
        acc: dict = {}
        for wenc in self._chain:
            for n, e in wenc.items():
                if e[0] == "excp":
                    r = self._dec_o(n, e, like[n]).reshape(-1)
                    acc[n] = acc[n] + r if n in acc else r
        return {n: (acc[n].reshape(like[n].shape) if e[0] == "excp" else self._dec_o(n, e, like[n]))
                for n, e in enc.items()}

    def _dec_o(self, name: str, e: Any, like: torch.Tensor) -> torch.Tensor:
        if e[0] != "excp":
            return super()._dec_o(name, e, like)
        raw = lzma.decompress(e[1])
        n = like.numel()
        k = (len(raw) - n) // 4
        cents = torch.from_numpy(np.frombuffer(raw[: 4 * k], dtype=np.float32).copy())
        codes = torch.from_numpy(np.frombuffer(raw[4 * k:], dtype=np.uint8).astype(np.int64))
        table = torch.cat([torch.zeros(1), cents])
        return table[codes].reshape(like.shape)


# ---------------------------------------------------------------- mvc
class Mvc(System):
    """An mvc repository in a temp dir, driven by mvc.Tracker."""

    lossy = True

    def __init__(self, epsilon: float = 0.01, optimizer: str = "compressed") -> None:
        super().__init__(epsilon)
        self.optimizer_policy = optimizer
        self.name = "mvc (default)" if optimizer == "compressed" else "mvc (exact optimizer)"
        self._dir = tempfile.mkdtemp(prefix="mvc-e2e-")
        self.tracker = None

    def attach(self, model, opt, quality) -> None:
        import mvc

        super().attach(model, opt, quality)
        self.repo = mvc.Repo.init(self._dir)
        self.repo.config.set("commit.mode", "search")
        self.repo.config.set("commit.optimizer", self.optimizer_policy)
        self.tracker = mvc.Tracker(self.repo, model, opt, quality=quality, epsilon=self.epsilon)

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
        st += self.repo.store.size(cid) + self.repo.store.size(c.snapshot)
        knob = self.tracker.history[-1].get("config") or "lossless"
        if isinstance(knob, dict):
            knob = f"{knob.get('bins')}b/p{knob.get('prune')}"
        return SaveStat(raw_w, sw, raw_t, st, dt, str(knob))

    def restore(self) -> int:
        self.tracker.restore("HEAD")
        return int(self.repo.read_commit(self.repo.resolve("HEAD")).step)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        shutil.rmtree(self._dir, ignore_errors=True)


SYSTEMS = ["exact", "zipnn", "uniform", "adaptive", "excp", "mvc", "mvc-exact-opt"]


def make_system(key: str, epsilon: float = 0.01) -> System:
    """A fresh system by key (see SYSTEMS)."""
    return {"exact": lambda: Exact(epsilon), "zipnn": lambda: ZipNN(epsilon),
            "uniform": lambda: Uniform(epsilon), "adaptive": lambda: Adaptive(epsilon),
            "excp": lambda: ExCP(epsilon), "mvc": lambda: Mvc(epsilon, "compressed"),
            "mvc-exact-opt": lambda: Mvc(epsilon, "exact")}[key]()
