"""The Llama math in plain (differentiable) torch: what the torch backend's dense math
(``models.llama._TorchMath``: the prefill's attention) and the trainer
(``specdec_lib.train``: the teacher pass and the draft heads) share.

``TorchOps`` runs ``models.llama_layer.decoder_layer`` / ``draft_step`` in torch: new tensors
each call, so autograd sees the whole step. Imported only where torch is wanted (never by
``import specdec_lib``). Layout: rows leading, then heads, then the head dim
(``[B, N, H, D]``), as the library's ops take them.
"""
from __future__ import annotations

import torch

F = torch.nn.functional


def rms_norm(x, w, eps):
    """RMSNorm in float32, rounded to x's dtype, then scaled by w (the library's order)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    """Rotate-half rope: x [..., N, H, D], cos/sin [N, D/2] (rows of the table made by
    ``reference.layers.rope_cos_sin_cache``), in float32, rounded back to x's dtype."""
    h = x.shape[-1] // 2
    c, s = cos[..., None, :], sin[..., None, :]
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


def repeat_heads(x, Hq):
    """[..., Hkv, D] -> [..., Hq, D]: q head h reads kv head h // (Hq // Hkv) (an expand
    and one copy, which never syncs); x itself when Hkv == Hq."""
    *lead, Hkv, D = x.shape
    if Hkv == Hq:
        return x
    return x.unsqueeze(-2).expand(*lead, Hkv, Hq // Hkv, D).reshape(*lead, Hq, D)


def attention(q, k, v, *, causal=False, mask=None, scale=None):
    """SDPA over q [B, Nq, Hq, D] and k/v [B, Nk, Hkv, D] -> [B, Nq, Hq, D]: K/V heads
    repeated to q's (GQA) and the calls made 4-D with equal head counts, which is what
    sends torch's SDPA to the flash kernel (3-D inputs or ``enable_gqa`` take the float32
    math path: s13 profile, half of a 128-row prefill's 3 ms). ``mask``: boolean (True =
    attend) or additive, broadcastable to [B, Hq, Nq, Nk]."""
    Hq = q.shape[-2]
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), repeat_heads(k, Hq).transpose(1, 2),
        repeat_heads(v, Hq).transpose(1, 2), attn_mask=mask, is_causal=causal, scale=scale)
    return o.transpose(1, 2)


class TorchOps:
    """``llama_layer``'s ops in torch (autograd-friendly: nothing written in place)."""

    def __init__(self, eps):
        self.eps = float(eps)

    gemm = fc = staticmethod(F.linear)

    def add_norm(self, a, resid, w, out=None):
        x = resid + a
        return x, rms_norm(x, w, self.eps)

    def norm(self, x, w):
        return rms_norm(x, w, self.eps)

    @staticmethod
    def silu_mul(gu):
        g, u = gu.chunk(2, -1)
        return F.silu(g) * u

    def combine(self, embed, hid, tokens, w_e, w_h):
        """[rms(embed[tokens], w_e), rms(hid, w_h)] (draft_combine)."""
        return torch.cat([rms_norm(embed[tokens], w_e, self.eps), rms_norm(hid, w_h, self.eps)], -1)

    @staticmethod
    def new_rows(like):
        return None
