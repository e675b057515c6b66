"""Re-implemented lossy peers of the end-to-end benchmark (benchmarks only).

Simplified from the papers' descriptions (Inshrinkerator §8.2 / appendix A.2, ExCP §3):

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

`ExactMomentPruned` is a control, not a compressor: exact checkpoints with ExCP's
momentum mask applied to both Adam moments on restore.
"""
from __future__ import annotations

import lzma
from typing import Any

import numpy as np
import torch

from benchmarks.baselines_quant import torch_lloyd
from benchmarks.e2e_base import SMALL, Exact, _Tensorwise

__all__ = ["Uniform", "Adaptive", "ExCP", "ExactMomentPruned"]


def _huff(levels: np.ndarray) -> bytes:
    from mvc.native import huffman

    return bytes(huffman.encode(np.ascontiguousarray(levels)))


def _unhuff(b: bytes, n: int, dtype) -> np.ndarray:
    from mvc.native import huffman

    return np.asarray(huffman.decode(b, n, dtype)).reshape(-1)


# ---------------------------------------------------------------- uniform (QD-like)
def _uniform_levels(w: torch.Tensor, bins: int, lo: float, hi: float) -> tuple[torch.Tensor, float]:
    step = (hi - lo) / (bins - 1) if hi > lo else 1.0
    lv = torch.round((w.clamp(lo, hi) - lo) / step).clamp_(0, bins - 1).to(torch.int32)
    return lv, step


class _UniformBits(_Tensorwise):
    """Uniform levels per tensor over a range `_range` picks; one bit width searched per checkpoint."""

    lossy = True
    BITS = [2, 3, 4, 5, 6, 7, 8]

    def _range(self, x: torch.Tensor, bins: int) -> tuple[float, float]:
        return float(x.min()), float(x.max())

    def _quant(self, msd: dict, bits: int) -> tuple[dict, dict]:
        levels, recon = {}, {}
        for n, t in msd.items():
            if t.numel() < SMALL or not t.is_floating_point():
                recon[n] = t
                continue
            x = t.float().reshape(-1)
            lo, hi = self._range(x, 1 << bits)
            lv, step = _uniform_levels(x, 1 << bits, lo, hi)
            levels[n] = (lv, lo, step, 1 << bits)
            recon[n] = (lv.float() * step + lo).reshape(t.shape).to(t.dtype)
        return levels, recon

    def _search_levels(self, msd: dict) -> tuple[int | None, dict | None]:
        """(bits, levels by name) of the most compressive feasible width, or (None, None)."""
        cache: dict = {}

        def build(bits):
            cache[bits] = self._quant(msd, bits)
            return cache[bits][1]

        bits, _ = self._search(self.BITS, build)
        return bits, (cache[bits][0] if bits is not None else None)


class Uniform(_UniformBits):
    """QD-like uniform quantization + cyclic level delta + Huffman; bits searched."""

    name = "Uniform (QD-like)"

    def __init__(self, epsilon: float = 0.01) -> None:
        super().__init__(epsilon)
        self._chain: list = []   # encodings since the last base, oldest first
        self._prev_levels: dict = {}

    def _prepare_weights(self, msd: dict) -> tuple[dict, str]:
        bits, levels = self._search_levels(msd)
        if bits is None:
            self._prev_levels = {}   # the next quantized checkpoint starts a new base
            return {n: self._enc_o(n, t) for n, t in msd.items()}, "lossless"
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


class Adaptive(_UniformBits):
    """Check-N-Run-like adaptive uniform quantization, Huffman coded, no delta; bits searched."""

    name = "Adaptive (CNR-like)"

    def _range(self, x: torch.Tensor, bins: int) -> tuple[float, float]:
        return _adaptive_range(x, bins)

    def _prepare_weights(self, msd: dict) -> tuple[dict, str]:
        bits, levels = self._search_levels(msd)
        if bits is None:
            return {n: self._enc_o(n, t) for n, t in msd.items()}, "lossless"
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




# ---------------------------------------------------------------- control
class ExactMomentPruned(Exact):
    """Control, not a compressor: exact checkpoints, but on restore both Adam moments are
    zeroed where |m| <= mean|m| (ExCP eq. 6's momentum mask, beta = 1, without the weight
    part). Shows how much of ExCP-like's quality comes from that pruning acting as a larger
    step after each restore rather than from the state it keeps."""

    name = "exact + ExCP moment pruning on restore (control)"

    def restore(self) -> int:
        step = super().restore()
        if self.opt is not None:
            for st in self.opt.state.values():
                m, v = st.get("exp_avg"), st.get("exp_avg_sq")
                if torch.is_tensor(m) and torch.is_tensor(v) and m.numel() >= SMALL:
                    mask = m.abs() <= m.abs().mean()
                    m[mask] = 0
                    v[mask] = 0
        return step
