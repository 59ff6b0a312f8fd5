"""The gated delta rule in plain, differentiable torch: a per-token recurrent version (the
naive oracle) and a chunked one (what training runs), both in the conventions of the
library's float64 reference (``specdec_lib.reference.gdn``)::

    S = exp(g_t) * S                          # S [Dk, Dv] per value head, layout "kv"
    S = S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = S^T (q_t * scale)                   # scale defaults to 1/sqrt(Dk)

g is the log decay (<= 0), q and k optionally L2-normalised first (``x / sqrt(sum x^2 +
1e-6)``), value head h reads key head ``h // (Hv // Hk)`` (GVA). Shapes: q, k [B, T, Hk, Dk],
v [B, T, Hv, Dv], g, beta [B, T, Hv], state [B, Hv, Dk, Dv]; returns (o [B, T, Hv, Dv],
final state). Math in the inputs' dtype (float32 in training; float64 in the tests).

The chunked form (chunk size C; the WY form the fla kernels and HF's
``torch_chunk_gated_delta_rule`` use, derived here from the recurrence): inside a chunk
with start state S0 and cumulative log decay G_t = g_1 + ... + g_t, the rank-one updates
u_t = beta_t (v_t - (exp(g_t) S_{t-1})^T k_t) satisfy the unit lower-triangular system

    u_t + sum_{s<t} beta_t exp(G_t - G_s) (k_t . k_s) u_s = beta_t v_t - beta_t exp(G_t) S0^T k_t

so U = Tinv (beta V) - Tinv (beta exp(G) K) S0 with one triangular solve per chunk (no
loop over tokens), and

    o_t  = exp(G_t) S0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s
    S_C  = exp(G_C) S0 + sum_s exp(G_C - G_s) k_s u_s^T.

Every exponent taken is <= 0 (the upper triangle is masked before ``exp``), so nothing
overflows and no NaN reaches the gradient. A tail shorter than C is padded with k = v =
beta = g = 0 rows, which leave the state unchanged.

Imported only by the trainer (torch is optional for the package).
"""
from __future__ import annotations

import torch

L2NORM_EPS = 1e-6


def l2norm(x, eps=L2NORM_EPS):
    """x / sqrt(sum(x^2) + eps) over the last axis (the reference's normalisation)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, scale, qk_l2norm):
    """q, k expanded to the value heads (GVA), normalised and scaled."""
    B, T, Hk, Dk = q.shape
    Hv = v.shape[2]
    if Hv % Hk:
        raise ValueError(f"value heads {Hv} not a multiple of key heads {Hk}")
    if k.shape != q.shape or g.shape != (B, T, Hv) or beta.shape != (B, T, Hv):
        raise ValueError(f"shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    scale = Dk ** -0.5 if scale is None else float(scale)
    if Hv != Hk:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    return q * scale, k


def _state0(state, B, Hv, Dk, Dv, like):
    if state is None:
        return like.new_zeros((B, Hv, Dk, Dv))
    if tuple(state.shape) != (B, Hv, Dk, Dv):
        raise ValueError(f"state: expected shape {(B, Hv, Dk, Dv)}, got {tuple(state.shape)}")
    return state.to(like.dtype)


def recurrent_gated_delta_rule(q, k, v, g, beta, *, state=None, scale=None, qk_l2norm=False):
    """One token at a time (the oracle of the chunked form). Returns (o, final state)."""
    q, k = _prepare(q, k, v, g, beta, scale, qk_l2norm)
    B, T, Hv, Dv = v.shape
    Dk = q.shape[-1]
    S = _state0(state, B, Hv, Dk, Dv, v)
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]                                              # [B, Hv, Dk]
        err = v[:, t] - torch.einsum("bhij,bhi->bhj", S, kt)
        S = S + kt[..., :, None] * (beta[:, t, :, None] * err)[..., None, :]
        outs.append(torch.einsum("bhij,bhi->bhj", S, q[:, t]))
    return torch.stack(outs, 1), S


def chunk_gated_delta_rule(q, k, v, g, beta, *, state=None, scale=None, qk_l2norm=False,
                           chunk_size=64):
    """The chunked gated delta rule (module docstring). Returns (o, final state)."""
    q, k = _prepare(q, k, v, g, beta, scale, qk_l2norm)
    B, T, Hv, Dv = v.shape
    Dk = q.shape[-1]
    C = int(chunk_size)
    if C < 1:
        raise ValueError(f"chunk_size must be >= 1, not {chunk_size}")
    S = _state0(state, B, Hv, Dk, Dv, v)
    pad = (-T) % C
    # [B, T, H, D] -> [B, H, n, C, D]; g/beta [B, T, H] -> [B, H, n, C]
    def chunks(x):
        x = x.transpose(1, 2)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
        n = x.shape[2] // C
        return x.reshape(*x.shape[:2], n, C, *x.shape[3:])
    qc, kc, vc, gc, bc = (chunks(x) for x in (q, k, v, g.to(v.dtype), beta.to(v.dtype)))
    n = qc.shape[2]
    G = gc.cumsum(-1)                                             # [B, H, n, C]
    diff = G[..., :, None] - G[..., None, :]                      # G_t - G_s, [.., C(t), C(s)]
    incl = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
    decay = diff.masked_fill(~incl, float("-inf")).exp()          # exp(G_t - G_s), s <= t
    eye = torch.eye(C, dtype=v.dtype, device=v.device)
    kk = kc @ kc.transpose(-1, -2)
    A = (bc[..., :, None] * kk * decay).tril(-1)                  # strictly lower
    Tm = A + eye
    bv = bc[..., None] * vc                                       # [B, H, n, C, Dv]
    bk = (bc * G.exp())[..., None] * kc                           # [B, H, n, C, Dk]
    rhs = torch.linalg.solve_triangular(Tm, torch.cat([bv, bk], -1), upper=False,
                                        unitriangular=True)
    Ub, W = rhs[..., :Dv], rhs[..., Dv:]                          # U = Ub - W S0
    qk = (qc @ kc.transpose(-1, -2)) * decay                      # s <= t, decayed
    qg = qc * G.exp()[..., None]
    kend = kc * (G[..., -1:] - G).exp()[..., None]                # exp(G_C - G_s) k_s
    gend = G[..., -1].exp()                                       # [B, H, n]
    outs = []
    for i in range(n):
        U = Ub[:, :, i] - W[:, :, i] @ S
        outs.append(qg[:, :, i] @ S + qk[:, :, i] @ U)
        S = gend[:, :, i, None, None] * S + kend[:, :, i].transpose(-1, -2) @ U
    o = torch.stack(outs, 2).reshape(B, Hv, n * C, Dv)[:, :, :T]
    return o.transpose(1, 2), S
