"""Input Hessians of torch's self-attention: the packed input projection of an
`nn.MultiheadAttention` gets one when query, key and value are one tensor, none when they
are not (cross-attention)."""
from __future__ import annotations

import torch

from mvc.quant.feedback import collect_hessians


def test_self_attention_in_proj_hessian():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(3, 5, 16)
    h = collect_hessians(layer.eval(), [x])
    assert set(h) == {"self_attn.in_proj_weight", "linear1.weight", "linear2.weight"}
    flat = x.reshape(-1, 16).to(torch.float64)
    assert torch.allclose(h["self_attn.in_proj_weight"], flat.T @ flat)


def test_cross_attention_has_no_hessian():
    attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    q, kv = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    assert collect_hessians(attn, [q], forward=lambda m, x: m(x, kv, kv)) == {}
    assert set(collect_hessians(attn, [q], forward=lambda m, x: m(x, x, x))) == {"in_proj_weight"}
