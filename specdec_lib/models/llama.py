"""A Llama-architecture target as a host model of ``SpeculativeDecoder`` (SmolLM2 and kin).

    x = embed[tokens]
    per layer:  h = rms_norm(x);  q, k, v = split(h @ Wqkv)
                rope_append_kv(q, k, v) -> paged cache;  o = verify_attention(q)   (prefill:
                x += o @ Wo;  h = rms_norm(x);  x += (silu(h @ Wg) * (h @ Wu)) @ Wd   causal attn)
    hidden = rms_norm(x);  logits = hidden @ embed.T   (tied lm_head)

Everything speculative and every elementwise step is a library op of the backend
(``rope_append_kv``: rope and the paged append in one launch, ``verify_attention``,
``rms_norm`` with the residual add fused, ``silu_mul``); only
the matrix products, the embedding gather and the prefill's causal attention are the host's,
through a small ``_Math`` of the array library: numpy in float64 on the ``reference`` backend
(the CPU oracle), torch in bf16 with cuBLAS and SDPA on the ``torch`` backend. One layer is
nine launches on the GPU (three GEMMs fused as qkv / gate-up), so the round graph stays short.

``forward`` runs a verify block (<= 16 rows per sequence); ``prefill`` runs whole prompts of
fresh sequences (any length) in one pass, attention by the host's causal kernel (torch: one
masked SDPA call per layer for all prompts), K/V still written through ``rope_append_kv``; the
model has no recurrent state, so ``commit`` does nothing.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..ops.layers import (LINEAR_FAST_MAX_K, LINEAR_FAST_MAX_ROWS, LINEAR_MMA_MAX_ROWS,
                          TUNING as LINEAR_TUNING)
from .llama_layer import decoder_layer, fuse_layer, layer_tensor_names, split_qkv

# The passes LlamaTarget(small_rows=True) runs on linear's CUDA-core few-row kernels: at most 5.
# linear takes up to LINEAR_FAST_MAX_ROWS = 8 that way (a CTA row per row since s42), but a
# chain of SmolLM2's 30 layers on them beat cuBLAS only up to 5 (H100: 558 / 603 / 728 us at
# 4 / 5 / 6 rows, cuBLAS ~620); SmolLM2's B=1 EAGLE3 rounds (GPU us, few-row against cuBLAS):
# k=3 934 against 1113, k=4 1008 against 1138.
SMALL_ROWS_MAX = 5
# ... and on linear's tensor-core form (tensor_cores=True, what the few-row decode asks unless
# ops.layers.TUNING["linear_mma"] is False): the SmolLM2 chain costs nearly the same at 1..8 rows
# (310 / 303 / 328 us at 1 / 4 / 8), 438 at 16 and 617 at 32 against cuBLAS's 625 / 635, 1127
# at 64 against 640 (H100 s47): at most 32. (B=4 k=3, 16 rows: 821 us GPU a round against
# cuBLAS's 1140; B=32 target-only 943 against 971.)
SMALL_ROWS_MAX_MMA = 32
assert SMALL_ROWS_MAX <= LINEAR_FAST_MAX_ROWS and SMALL_ROWS_MAX_MMA <= LINEAR_MMA_MAX_ROWS


def small_rows_max():
    """The most rows of a pass that LlamaTarget(small_rows=True) runs on linear:
    SMALL_ROWS_MAX_MMA on the tensor-core form, SMALL_ROWS_MAX where ops.layers.TUNING
    ["linear_mma"] forces the CUDA-core one (read at each pass's planning: a decoder's graphs
    keep what they recorded)."""
    return SMALL_ROWS_MAX if LINEAR_TUNING["linear_mma"] is False else SMALL_ROWS_MAX_MMA


class _RowInvariant:
    """The decode GEMMs through the library's ``linear`` op (``row_invariant=True``): a row's
    bits then depend on that row alone, never on how many rows share the call, so a verify
    block of k + 1 rows gives what k + 1 one-row steps give (speculative output token-identical
    to target-only at any k) and the decode rows of a request do not depend on its batch mates.
    Prefill keeps the host's GEMM (``bulk``): it runs once per prompt in either mode (prompts
    prefilled in one call share its cuBLAS shape)."""

    small_rows = False       # the torch math: few-row decode GEMMs through ``linear`` too

    def __init__(self, be=None, row_invariant=False):
        self.be, self.row_invariant = be, bool(row_invariant)

    def library_rows(self, rows, k, n):
        """Whether a [rows, k] @ [n, k].T GEMM goes through the library's ``linear``: always
        when row-invariant; with ``small_rows`` where linear's few-row kernels take it and
        pay (at most 32 rows on the tensor-core form, 5 on the CUDA-core one: small_rows_max();
        K <= 2048) and the weight is a layer's, not a vocabulary (N <= 8192: the
        lm_head's 49k columns stay on the host's GEMM)."""
        return self.row_invariant or (
            self.small_rows and rows <= small_rows_max() and k <= LINEAR_FAST_MAX_K
            and k % 8 == 0 and n <= 8192)

    def gemm(self, x, w):
        # (row-invariant: every GEMM; few rows: 2-D ones only, [B, N, F] rows stay on the host's)
        if not (self.row_invariant or
                (len(x.shape) == 2 and self.library_rows(x.shape[0], w.shape[1], w.shape[0]))):
            return self.linear(x, w)
        out = self.empty((x.shape[0], w.shape[0]), x.dtype)
        self.be.row_linear(x, w, out, tensor_cores=self.tensor_cores)
        return out

    @property
    def tensor_cores(self):
        """linear's tensor-core form for the few-row decode (its passes past small_rows_max()
        take the host's GEMM, so only those calls must agree); the CUDA-core kernels when
        row-invariant (every M must agree with every other)."""
        return not self.row_invariant

    @contextlib.contextmanager
    def bulk(self):
        """Host GEMMs inside (the prefill's many rows)."""
        keep = self.row_invariant, self.small_rows
        self.row_invariant = self.small_rows = False
        try:
            yield
        finally:
            self.row_invariant, self.small_rows = keep


class _NumpyMath(_RowInvariant):
    """float64 numpy: the reference backend's dense math (exact enough to be the oracle)."""
    name = "numpy"
    act = np.float64
    kv = np.float64
    int32 = np.int32
    f32 = np.float32
    cache8 = {"fp8_e4m3": np.uint8, "int8": np.int8}     # the 8-bit caches' storage

    def param(self, a):
        return np.ascontiguousarray(a, dtype=np.float64)

    def table(self, a):
        return np.asarray(a)

    def empty(self, shape, dtype=None):
        return np.empty(shape, dtype=self.act if dtype is None else dtype)

    def zeros(self, shape, dtype=None):
        return np.zeros(shape, dtype=self.act if dtype is None else dtype)

    def linear(self, x, w):
        return x @ w.T

    def cat_rows(self, ws):
        return np.ascontiguousarray(np.concatenate(ws, axis=0))

    def causal_attention(self, q, k, v, scale):
        """q [n, Hq, D], k/v [n, Hk, D] of one fresh sequence -> [n, Hq, D] (causal)."""
        n, Hq, D = q.shape
        g = Hq // k.shape[1]
        kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        s = np.einsum("ihd,jhd->hij", q, kk) * scale
        s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        return np.einsum("hij,jhd->ihd", s, vv)

    def prefill_plan(self, row_counts):
        """Row bounds of each prompt (the prefill's attention runs prompt by prompt here)."""
        return np.concatenate([[0], np.cumsum(row_counts)]).astype(int)

    def prefill_attention(self, plan, q, k, v, scale, out):
        """out[rows of prompt b] = causal attention within prompt b's rows, for every b."""
        for r0, r1 in zip(plan[:-1], plan[1:]):
            if r1 > r0:
                out[r0:r1] = self.causal_attention(q[r0:r1], k[r0:r1], v[r0:r1], scale)

    def host_rows(self, a):
        return np.asarray(a)

    def argmax_ids(self, a):
        return a.argmax(axis=1)

    # 8-bit caches (reference/kvquant.py is the spec)
    def cache_rows(self, page_table, seq_lens, cu_q, T, page_size):
        """Flat cache row (page * page_size + slot) of each of a block's T rows: where
        append_kv wrote row t of sequence b (position seq_lens[b] + t - cu_q[b])."""
        t = np.arange(T)
        b = np.searchsorted(np.asarray(cu_q), t, side="right") - 1
        pos = np.asarray(seq_lens)[b] + t - np.asarray(cu_q)[b]
        return np.asarray(page_table)[b, pos // page_size].astype(np.int64) * page_size + pos % page_size

    def read_fp8(self, cache, rows, scale):
        from ..reference import kvquant as kq
        c = cache.reshape(-1, *cache.shape[2:])[rows]
        return kq.fp8_dequantize(c, np.asarray(scale, np.float64).reshape(-1, 1))

    def read_int8(self, cache, rows, params):
        from ..reference import kvquant as kq
        p = params.reshape(-1, *params.shape[2:])[rows]
        return kq.int8_dequantize(cache.reshape(-1, *cache.shape[2:])[rows], p).astype(np.float64)

    def fp8_scales(self, k, v, k_scale, v_scale, headroom):
        """k_scale / v_scale [Hkv] (float32, in place) from a block's rows: see
        ``LlamaTarget.fp8_scales``."""
        k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
        h = k.shape[-1] // 2
        ka = np.sqrt(k[..., :h] ** 2 + k[..., h:] ** 2).max(axis=(0, 2))
        k_scale[...] = _fp8_scale(np, ka, headroom)
        v_scale[...] = _fp8_scale(np, np.abs(v).max(axis=(0, 2)), headroom)


class _TorchMath(_RowInvariant):
    """torch bf16 on the backend's GPU: cuBLAS GEMMs (fp32 accumulate), SDPA for prefill
    (``dtype="float16"``: all of it in float16, a float16 KV cache)."""
    name = "torch"

    def __init__(self, be, row_invariant=False, dtype="bfloat16", small_rows=True):
        import torch

        from . import llama_torch
        super().__init__(be, row_invariant)
        self.small_rows = bool(small_rows)
        self.torch, self.dev, self.lt = torch, be.device, llama_torch
        self.act = self.kv = getattr(torch, dtype)
        self.int32 = torch.int32
        self.f32 = torch.float32
        self.cache8 = {"fp8_e4m3": torch.uint8, "int8": torch.int8}
        self.F = torch.nn.functional

    def param(self, a):
        return self.torch.from_numpy(np.array(a, dtype=np.float32)).to(self.dev, self.act)

    def table(self, a):
        return self.torch.as_tensor(np.asarray(a)).to(self.dev)

    def empty(self, shape, dtype=None):
        return self.torch.empty(shape, dtype=self.act if dtype is None else dtype, device=self.dev)

    def zeros(self, shape, dtype=None):
        return self.torch.zeros(shape, dtype=self.act if dtype is None else dtype, device=self.dev)

    def linear(self, x, w):
        return self.F.linear(x, w)

    def cat_rows(self, ws):
        return self.torch.cat(ws, dim=0).contiguous()

    def causal_attention(self, q, k, v, scale):
        """One fresh sequence's causal attention, as one 4-D SDPA call ([1, H, n, D]) with
        K/V heads repeated to q's: 3-D inputs or ``enable_gqa`` send torch's SDPA down the
        float32 math path (s13 profile: its GEMMs, softmax and casts were half of a 128-row
        prefill's 3 ms); 4-D bf16 with equal head counts takes the flash kernel. bf16
        probabilities cost no fidelity that shows: against the float64 reference it flips
        as few argmaxes as the same call in float32, 2.5x slower (s14,
        tools/perf/prefill_fidelity.py)."""
        o = self.lt.attention(q[None], k[None], v[None], causal=True, scale=scale)
        return o[0]

    @staticmethod
    def repeat_heads(x, Hq):
        """``llama_torch.repeat_heads`` (kept here for the tools that time these paths)."""
        from .llama_torch import repeat_heads
        return repeat_heads(x, Hq)

    def prefill_plan(self, row_counts):
        """Gather/scatter indices and the mask of one batched prefill attention, built once
        per prefill call (every layer reuses them). A single prompt needs none: it is one
        plain causal SDPA call (``single`` = its row range), nor do P prompts of n rows each,
        back to back (``uniform``: one [P, n] causal call). Otherwise the P prompts with rows
        are padded to the longest, n rows each: ``rows`` [P, n] token row of each (prompt, i)
        slot (pads point at the prompt's first row, so every gathered value is finite);
        ``allowed`` [P, 1, n, n] key j <= query i and j a real row (a pad query row still
        sees its prompt's keys, so no softmax row is all-masked: no NaN); ``p``, ``i``,
        ``flat`` the (prompt, i) slot and token row of every real row (integer indices: the
        per-layer scatter needs no boolean-mask sync). Pad rows are dropped by the scatter."""
        torch = self.torch
        counts = np.asarray(row_counts, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[counts > 0]
        counts = counts[counts > 0]
        if counts.size == 0:
            return None
        if counts.size == 1:
            return dict(single=(int(starts[0]), int(starts[0] + counts[0])))
        n = int(counts.max())
        if (counts == n).all() and (np.diff(starts) == n).all():
            # prompts of equal rows, back to back (a grouped bucket pass): one batched causal
            # SDPA call on a view, the flash kernel, no gather, mask or scatter
            return dict(uniform=(int(starts[0]), counts.size, n))
        i = torch.arange(n, device=self.dev)
        valid = i[None, :] < torch.as_tensor(counts, device=self.dev)[:, None]       # [P, n]
        rows = torch.as_tensor(starts, device=self.dev)[:, None] + torch.where(valid, i[None, :], 0)
        allowed = (i[None, :] <= i[:, None])[None, None] & valid[:, None, None, :]
        slot = valid.reshape(-1).nonzero().squeeze(1)
        return dict(rows=rows, allowed=allowed, p=slot // n, i=slot % n,
                    flat=rows.reshape(-1)[slot])

    def _prefill_bias(self, plan, dtype):
        """The plan's mask as an additive bias in q's dtype (0 / -inf), its rows 16-element
        aligned (what the memory-efficient SDPA kernel takes as is), made once per dtype."""
        bias = plan.get(("bias", dtype))
        if bias is None:
            allowed = plan["allowed"]
            P, _, n, _ = allowed.shape
            full = self.torch.zeros((P, 1, n, -(-n // 16) * 16), dtype=dtype, device=self.dev)
            bias = full[..., :n].masked_fill_(~allowed, float("-inf"))
            plan["bias", dtype] = bias
        return bias

    def prefill_attention(self, plan, q, k, v, scale, out):
        """All prompts in one SDPA call: gather rows into [P, H, n, D], attend under the
        plan's mask, scatter the real rows back. K/V heads are repeated to q's (GQA, by an
        expand, which never syncs) so a masked kernel (memory-efficient or math) takes them
        on any torch version."""
        if plan is None:
            return
        if "single" in plan:
            r0, r1 = plan["single"]
            out[r0:r1] = self.causal_attention(q[r0:r1], k[r0:r1], v[r0:r1], scale)
            return
        if "uniform" in plan:
            r0, P, n = plan["uniform"]
            r1 = r0 + P * n
            o = self.lt.attention(*(a[r0:r1].reshape(P, n, *a.shape[1:]) for a in (q, k, v)),
                                  causal=True, scale=scale)
            out[r0:r1] = o.reshape(P * n, *o.shape[2:])
            return
        rows = plan["rows"]
        o = self.lt.attention(q[rows], k[rows], v[rows], scale=scale,      # [P, n, Hq, D]
                              mask=self._prefill_bias(plan, q.dtype))
        out[plan["flat"]] = o[plan["p"], plan["i"]]

    def host_rows(self, a):
        return a.float().cpu().numpy()      # numpy has no bfloat16

    def argmax_ids(self, a):
        return a.argmax(dim=1)

    # 8-bit caches: the numpy math's, on the device (no host sync: graph-capturable)
    def cache_rows(self, page_table, seq_lens, cu_q, T, page_size):
        torch = self.torch
        t = torch.arange(T, dtype=torch.int32, device=self.dev)
        b = torch.searchsorted(cu_q, t, right=True).long() - 1
        pos = (seq_lens.long()[b] + t.long() - cu_q.long()[b])
        return page_table.long()[b, pos // page_size] * page_size + pos % page_size

    def read_fp8(self, cache, rows, scale):
        c = cache.reshape(-1, *cache.shape[2:])[rows].view(self.torch.float8_e4m3fn)
        return (c.float() * scale[:, None]).to(self.act)

    def read_int8(self, cache, rows, params):
        p = params.reshape(-1, *params.shape[2:])[rows]
        u = cache.reshape(-1, *cache.shape[2:])[rows].float() + 128.0
        return (u * p[..., 0:1] + p[..., 1:2]).to(self.act)

    def fp8_scales(self, k, v, k_scale, v_scale, headroom):
        torch = self.torch
        k, v = k.float(), v.float()
        h = k.shape[-1] // 2
        ka = torch.sqrt(k[..., :h] ** 2 + k[..., h:] ** 2).amax(dim=(0, 2))
        k_scale.copy_(_fp8_scale(torch, ka, headroom))
        v_scale.copy_(_fp8_scale(torch, v.abs().amax(dim=(0, 2)), headroom))


class _LibraryOps:
    """``llama_layer``'s ops on the library (``rms_norm`` with the residual add fused,
    ``silu_mul``, ``draft_combine``) and a dense math's GEMMs: norms go into ``h``, the MLP's
    activation into ``act``, the residual stream into the ``out`` it is given."""

    def __init__(self, be, m, eps, h, act):
        self.be, self.m, self.eps, self.h, self.act = be, m, eps, h, act

    def gemm(self, x, w):
        return self.m.gemm(x, w)

    def fc(self, x, w):                 # a draft head's input projection: the host GEMM
        return self.m.linear(x, w)

    def add_norm(self, a, resid, w, out):
        self.be.rms_norm(a, w, self.h, eps=self.eps, residual=resid, residual_out=out)
        return out, self.h

    def norm(self, x, w):
        self.be.rms_norm(x, w, self.h, eps=self.eps)
        return self.h

    def silu_mul(self, gu):
        self.be.silu_mul(gu, self.act)
        return self.act

    def combine(self, embed, hid, tokens, w_e, w_h):
        comb = self.m.empty((tokens.shape[0], 2 * hid.shape[1]))
        self.be.draft_combine(embed, hid, w_e, w_h, comb, token_ids=tokens, eps=self.eps)
        return comb

    def new_rows(self, like):
        return self.m.empty(tuple(like.shape))


def dense_math(backend, row_invariant=False, dtype="bfloat16", small_rows=True):
    """The backend's dense math; ``dtype``: torch's activation dtype (bfloat16 or float16;
    numpy is float64 either way); ``small_rows`` (torch): decode GEMMs of <= 5 rows through
    the library's ``linear`` (its few-row kernels), not cuBLAS."""
    if backend.name == "reference":
        return _NumpyMath(backend, row_invariant)
    if backend.name == "torch":
        return _TorchMath(backend, row_invariant, dtype, small_rows)
    raise ValueError(f"backend: the Llama host model runs on 'reference' or 'torch', "
                     f"not {backend.name!r}")


KV_DTYPES = ("bfloat16", "float16", "fp8_e4m3", "int8")    # LlamaTarget(kv_dtype=...)
# fp8 scales: amax * FP8_SCALE_HEADROOM / 448, so that K/V up to twice the recording pass's
# largest magnitude are not clipped (E4M3 is floating point: the headroom costs no relative
# precision, only moves the subnormal threshold, 2^-6 * scale, up by the same factor)
FP8_SCALE_HEADROOM = 2.0


def _fp8_scale(xp, amax, headroom):
    """Per-head float32 scale of an fp8 cache from the largest magnitude ``amax`` [Hkv]:
    amax * headroom / 448, at least 2^-126 (the contract's smallest), 1 where amax is 0 or
    not finite."""
    from ..reference.kvquant import E4M3_MAX, MIN_SCALE
    s = amax * (headroom / E4M3_MAX)
    s = xp.where(s < float(MIN_SCALE), float(MIN_SCALE), s)
    return xp.where(xp.isfinite(s) & (amax > 0), s, 1.0)


def kv_dtype_name(kv_dtype):
    """``kv_dtype`` as one of ``KV_DTYPES`` (aliases: bf16, fp16, fp8, e4m3, ...); a
    ValueError naming the argument otherwise."""
    from ..dtypes import one_of
    return one_of("kv_dtype", kv_dtype, KV_DTYPES)


def kv_dtype_unsupported(backend, kv_dtype, head_dim):
    """None when ``backend`` can run a LlamaTarget with ``kv_dtype`` caches of ``head_dim``,
    else why not (nothing is launched: the GPU is only asked for its properties and the
    kernel images that would run)."""
    name = kv_dtype_name(kv_dtype)
    if backend.name not in ("reference", "torch"):
        return f"the Llama host model runs on 'reference' or 'torch', not {backend.name!r}"
    if name in ("bfloat16", "float16"):
        return None
    from ..contract.copy import KV8_MAX_HEAD_DIM
    if head_dim > KV8_MAX_HEAD_DIM:
        return f"head dim {head_dim} exceeds {KV8_MAX_HEAD_DIM} (8-bit caches)"
    if backend.name == "reference":
        return None
    try:
        import torch
        if name == "fp8_e4m3" and not hasattr(torch, "float8_e4m3fn"):
            return f"torch {torch.__version__} has no float8_e4m3fn"
        from .. import runtime
        from ..ops.attention import _STATIC_SMEM_KV8, verify_attention_kv8_smem_bytes
        dev = backend.device.index or 0
        family = runtime.arch_family(dev)
        for module in ("copy", "verify_attention_kv8"):
            runtime.choose_image(module, dev)
        need = verify_attention_kv8_smem_bytes(head_dim, family) + _STATIC_SMEM_KV8
        optin = runtime.device_props(dev)["smem_optin"]
        if need > optin:
            return (f"verify attention over an 8-bit cache of head dim {head_dim} needs {need} "
                    f"bytes of shared memory per block, device {dev} allows {optin}")
    except Exception as e:          # no driver, no image for this GPU, ...
        return f"{type(e).__name__}: {e}"
    return None


class LlamaTarget:
    """Host passes of a Llama target for ``SpeculativeDecoder`` (slot b = sequence b).

    ``small_rows`` (torch backend, default on): a decode pass of at most 32 rows
    (``small_rows_max()``: 32 on linear's tensor-core form, ``tensor_cores=True``; 5 where
    ``ops.layers.TUNING["linear_mma"]`` forces the CUDA-core one) whose layer GEMMs
    linear's few-row kernels take (K <= 2048) runs
    ``_run_fused`` on them: norms and silu_mul fused, no cuBLAS but the lm_head (SmolLM2 B=1
    target-only 1.55x, s40; a k = 3 / 4 verify round 0.84 / 0.89x of cuBLAS's GPU time, s42).
    Its rows are then row-invariant among passes of up to 32 rows (a verify block gives what
    one-row passes give, a small batch's rows what the request alone gives; a k = 3 round
    costs 1.22x target-only's GPU time at B=1, 667 / 547 us, H100 s46; row_invariant=True
    keeps linear's CUDA-core kernels, whose bits agree at every M)."""
    # prefill rows past a prompt (pads) only write dead cache rows: the decoder may pad a
    # prompt to a length bucket and replay one recorded prefill per bucket
    pads_prefill = True
    takes_max_q = True       # forward(..., max_q=): the round's longest block
    no_kv_layers = ()        # layers without a KV cache (a hybrid's GDN layers)

    def __init__(self, config, weights, backend, *, page_size=16, max_position=None,
                 row_invariant=False, kv_dtype="bfloat16", small_rows=True):
        from ..reference.layers import rope_cos_sin_cache
        self.c, self.be = config, backend
        self.kv_dtype = kv_dtype_name(kv_dtype)
        why = kv_dtype_unsupported(backend, self.kv_dtype, config.head_dim)
        if why is not None:
            raise ValueError(f"kv_dtype: {self.kv_dtype} caches on the {backend.name} "
                             f"backend: {why}")
        self.m = m = dense_math(backend, row_invariant,
                                "float16" if self.kv_dtype == "float16" else "bfloat16",
                                small_rows)
        self.row_invariant = m.row_invariant
        c = config
        self.V, self.H, self.D = c.vocab_size, c.hidden_size, c.head_dim
        self.nq, self.nkv, self.I = c.num_heads, c.num_kv_heads, c.intermediate_size
        self.eps, self.page_size = float(c.rms_norm_eps), int(page_size)
        self.hidden_size = self.H
        self.embed = m.param(weights["model.embed_tokens.weight"])
        self.lm_head = self.embed if c.tied_embeddings else m.param(weights["lm_head.weight"])
        self.final_norm = m.param(weights["model.norm.weight"])
        self.layers = []
        for i in range(c.num_layers):            # llama_layer's fused form: qkv, gate_up
            names = layer_tensor_names(f"model.layers.{i}.")
            self.layers.append(fuse_layer({r: m.param(weights[n]) for r, n in names.items()},
                                          m.cat_rows))
        self.max_position = int(max_position or c.context_length)
        self.cos_sin = m.table(rope_cos_sin_cache(self.max_position, self.D, c.rope_theta))
        self.hidden_dtype = m.act
        self.aux_taps = ()
        self.batch = 0
        self.cache_epoch = 0     # bumped by reset: a decoder's graphs hold these caches
        self.kv_quant = [{} for _ in self.layers]   # per layer: the 8-bit kwargs of its cache
        self._scales_pending = False
        if self.kv_dtype == "fp8_e4m3":      # per layer, per KV head; filled by the first pass
            self._fp8 = [(m.zeros((self.nkv,), m.f32), m.zeros((self.nkv,), m.f32))
                         for _ in self.layers]
            self.kv_quant = [dict(k_scale=ks, v_scale=vs) for ks, vs in self._fp8]
            self._scales_pending = True

    # ------------------------------------------------------------------ fp8 scales
    @property
    def kv_scales(self):
        """fp8 caches: (k_scale, v_scale) as float32 numpy [layers, Hkv], or None before
        they are recorded (and for other cache dtypes)."""
        if self.kv_dtype != "fp8_e4m3" or self._scales_pending:
            return None
        host = self.be.to_host
        return (np.stack([np.asarray(host(ks)) for ks, _ in self._fp8]),
                np.stack([np.asarray(host(vs)) for _, vs in self._fp8]))

    def set_kv_scales(self, k_scale, v_scale):
        """Give the fp8 scales instead of recording them: float32 [layers, Hkv] each (a
        [layers, 1] or [layers] array: one scale per layer). Call before a decoder captures
        graphs over these caches (the graphs read the scale arrays, not copies)."""
        if self.kv_dtype != "fp8_e4m3":
            raise ValueError(f"set_kv_scales: the caches are {self.kv_dtype}, not fp8_e4m3")
        from ..reference.kvquant import MIN_SCALE
        n = len(self.layers)
        for name, a in (("k_scale", k_scale), ("v_scale", v_scale)):
            a = np.asarray(a, np.float64)
            a = a.reshape(n, -1) if a.size in (n, n * self.nkv) else None
            if a is None:
                raise ValueError(f"{name}: expected [{n}, {self.nkv}], [{n}, 1] or [{n}] "
                                 "(layers, KV heads)")
            if not (np.isfinite(a).all() and (a >= MIN_SCALE).all()):
                raise ValueError(f"{name}: scales must be finite and >= 2^-126")
        for i, (ks, vs) in enumerate(self._fp8):
            for dst, src in ((ks, k_scale), (vs, v_scale)):
                row = np.broadcast_to(np.asarray(src, np.float32).reshape(n, -1)[i], (self.nkv,))
                dst[...] = self.m.table(np.ascontiguousarray(row, np.float32))
        self._scales_pending = False

    def capture_aux(self, before_layers):
        """Return EAGLE3's auxiliary hidden states instead of the final hidden: the residual
        stream entering each layer of ``before_layers`` (= the output of the layer before),
        side by side, [T, taps * H] (``ops.capture_hidden``). ``()`` switches back."""
        taps = tuple(int(i) for i in before_layers)
        if any(not 0 <= i < len(self.layers) for i in taps):
            raise ValueError(f"before_layers: {taps} outside 0..{len(self.layers) - 1}")
        self.aux_taps = taps
        self.hidden_size = self.H * max(1, len(taps))

    @property
    def weight_bytes(self):
        """Bytes of weights one forward pass reads (the decode roofline's numerator)."""
        n = self.embed.shape[0] * self.embed.shape[1]
        n += sum(L[k].shape[0] * L[k].shape[1] for L in self.layers for k in ("qkv", "o", "gate_up", "down"))
        return n * (8 if self.m.name == "numpy" else 2)

    # ------------------------------------------------------------------ caches
    def reset(self, batch, max_len):
        """Paged KV caches for ``batch`` empty sequences of up to ``max_len`` positions; the
        returned hidden is the final one again (``capture_aux(())``)."""
        if max_len > self.max_position:
            raise ValueError(f"max_len: {max_len} positions exceed the model's "
                             f"{self.max_position} (prompt + max_new_tokens + k + 1)")
        m, ps = self.m, self.page_size
        self.capture_aux(())        # a head that reads aux taps sets them in its own reset
        self.batch, self.max_len = batch, max_len
        self.max_pages = -(-max_len // ps)
        self.page_table = m.table(np.arange(batch * self.max_pages, dtype=np.int32)
                                  .reshape(batch, self.max_pages))
        shape = (batch * self.max_pages, ps, self.nkv, self.D)
        dt = m.cache8.get(self.kv_dtype, m.kv)
        self.kv = [(m.zeros(shape, dt), m.zeros(shape, dt)) if i not in self.no_kv_layers
                   else None for i in range(len(self.layers))]
        if self.kv_dtype == "int8":          # (scale, zero) of every cache row, beside it
            pshape = shape[:3] + (2,)
            self.kv_quant = [dict(k_params=m.zeros(pshape, m.f32), v_params=m.zeros(pshape, m.f32))
                             for _ in self.layers]
        self.cache_epoch += 1

    def reset_slots(self, slot_ids):
        """A new request takes these slots: nothing to clear (rows past L = 0 are dead)."""

    def commit(self, cu_q, accept_len):
        """No recurrent state: accepted KV rows are already in place, the rest are dead."""

    # ------------------------------------------------------------------ passes
    def forward(self, tokens, positions, cu_q, seq_lens, finished, max_q=None):
        """A verify block: tokens/positions [T], cu_q [B+1], seq_lens [B] committed, finished
        [B] (their K/V rows are not appended); ``max_q`` (host int, optional): no block has
        more rows. Returns (logits [T, V], hidden [T, H])."""
        return self._run(tokens, positions, cu_q, seq_lens, finished,
                         self.paged_attention(self.page_table, seq_lens, cu_q, max_q))

    def paged_attention(self, page_table, seq_lens, cu_q, max_q=None):
        """The attention of a verify block: over the paged cache (``verify_attention``).
        ``max_q`` bounds each block's rows (default min(T, 16)): the plan packs that many
        rows per sequence into its m-tiles, so a batch of 4-row blocks planned for 16 rows
        leaves three of each CTA's four warps without rows."""
        be = self.be

        kw = dict(row_invariant=True) if self.row_invariant else {}
        if max_q is not None:
            kw["max_q"] = int(max_q)

        def attend(q, k, v, k_cache, v_cache, out, q8, where):
            be.verify_attention(q, k_cache, v_cache, page_table, seq_lens, cu_q, out, **kw,
                                **q8)
        return attend

    def prefill(self, tokens, positions, cu_q, seq_lens, finished, *, row_counts, logits=False):
        """Whole prompts of fresh sequences (seq_lens[b] = 0 where row_counts[b] > 0), any
        length, in one pass. ``row_counts`` (host ints) split the rows per sequence for the
        causal attention. Returns (logits or None, hidden)."""
        with self.m.bulk():
            return self._run(tokens, positions, cu_q, seq_lens, finished,
                             self.prefill_attention(row_counts), want_logits=logits)

    def prefill_attention(self, row_counts):
        """The attention of a prefill: causal within each fresh prompt's own rows (the
        host's kernel; K/V still go to the cache through rope_append_kv). Over an 8-bit
        cache it reads what the decode reads: the block's K/V rows back from the cache,
        dequantised (``read_cache``), not the fresh 16-bit ones."""
        m = self.m
        scale = 1.0 / np.sqrt(self.D)
        plan = m.prefill_plan(row_counts)               # indices and mask: once, not per layer
        rows = []                                       # the cache rows of the block: once

        def attend(q, k, v, k_cache, v_cache, out, q8, where):  # within each prompt's rows
            if q8:
                if not rows:
                    rows.append(m.cache_rows(*where, q.shape[0], self.page_size))
                k, v = self.read_cache(k_cache, v_cache, rows[0], q8)
            m.prefill_attention(plan, q, k, v, scale, out)
        return attend

    def read_cache(self, k_cache, v_cache, rows, q8):
        """K and V [len(rows), Hkv, D] read back from 8-bit caches at flat rows
        ``rows`` (page * page_size + slot), dequantised as verify_attention reads them
        (reference/kvquant.py; float64 on numpy, rounded to the activation dtype on torch)."""
        m = self.m
        if "k_scale" in q8:
            return (m.read_fp8(k_cache, rows, q8["k_scale"]),
                    m.read_fp8(v_cache, rows, q8["v_scale"]))
        return (m.read_int8(k_cache, rows, q8["k_params"]),
                m.read_int8(v_cache, rows, q8["v_params"]))

    def _fused(self, T):
        """Whether a pass of T rows runs ``_run_fused`` (every layer GEMM through ``linear``,
        norms and silu_mul fused into it): row-invariant decoding, or a few-row decode
        where linear's few-row kernels take every layer GEMM (``small_rows``)."""
        m = self.m
        return type(self).layer is LlamaTarget.layer and (m.row_invariant or all(
            m.library_rows(T, k, n) for k, n in (
                (self.H, (self.nq + 2 * self.nkv) * self.D), (self.nq * self.D, self.H),
                (self.H, 2 * self.I), (self.I, self.H))))

    def _run(self, tokens, positions, cu_q, seq_lens, finished, attend, want_logits=True):
        if self._fused(tokens.shape[0]):
            return self._run_fused(tokens, positions, cu_q, seq_lens, finished, attend,
                                   want_logits)
        be, m = self.be, self.m
        T = tokens.shape[0]
        H, nq, D = self.H, self.nq, self.D
        record = self._scales_pending and T > 0     # fp8: the first pass with rows
        x = self.embed[tokens]                                   # residual stream [T, H]
        h = m.empty((T, H))
        be.rms_norm(x, self.layers[0]["ln1"], h, eps=self.eps)
        o = m.empty((T, nq, D), m.kv)
        act = m.empty((T, self.I))
        aux = m.empty((T, self.hidden_size)) if self.aux_taps else None
        for i, L in enumerate(self.layers):
            if i in self.aux_taps:                               # EAGLE3: layer i-1's output
                be.capture_hidden(x, aux, self.aux_taps.index(i))
            nxt = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.final_norm
            self.layer(L, h, x, x, nxt, h, self.kv[i], self.page_table, positions, seq_lens,
                       cu_q, finished, attend, o, act, self.eps, q8=self.kv_quant[i],
                       record=record)
        if record:
            self._scales_pending = False
        logits = m.gemm(h, self.lm_head) if want_logits else None
        return logits, (h if aux is None else aux)

    def _run_fused(self, tokens, positions, cu_q, seq_lens, finished, attend, want_logits):
        """``_run`` of a row-invariant (or few-row, ``_fused``) decode: each norm (with its
        residual add) runs in the prologue of the ``linear`` behind it and silu_mul in
        gate_up's epilogue, so a layer is six launches (qkv, rope_append_kv, attention, o,
        gate_up, down), not nine; the same
        layer math (``llama_layer.decoder_layer``), row-invariant as the unfused one (silu
        reads gate_up's float32 sums, not their 16-bit rounding). linear's residual_out must
        not be one of its inputs, so the residual stream alternates between two buffers."""
        be, m = self.be, self.m
        T = tokens.shape[0]
        H, nq, nkv, D, eps = self.H, self.nq, self.nkv, self.D, self.eps
        record = self._scales_pending and T > 0
        x = self.embed[tokens]                                   # the stream entering layer 0
        xs = (m.empty((T, H)), m.empty((T, H)))
        qkv = m.empty((T, (nq + 2 * nkv) * D))
        o = m.empty((T, nq, D), m.kv)
        mix, act = m.empty((T, H)), m.empty((T, self.I))
        aux = m.empty((T, self.hidden_size)) if self.aux_taps else None
        a, resid = x, None              # layer i's stream is a + resid (a alone at layer 0)
        tc = m.tensor_cores
        for i, L in enumerate(self.layers):
            xi = x if resid is None else xs[0]
            fuse = {} if resid is None else dict(residual=resid, residual_out=xi)
            be.row_linear(a, L["qkv"], qkv, norm_weight=L["ln1"], eps=eps, tensor_cores=tc, **fuse)
            if i in self.aux_taps:                               # EAGLE3: layer i-1's output
                be.capture_hidden(xi, aux, self.aux_taps.index(i))
            self.block_attention(attend, self.kv[i], self.page_table, positions, seq_lens, cu_q,
                                 finished, o, self.kv_quant[i], record)(
                                     *split_qkv(qkv, (nq, nkv, D)))
            be.row_linear(o.reshape(T, nq * D), L["o"], mix, tensor_cores=tc)
            be.row_linear(mix, L["gate_up"], act, norm_weight=L["ln2"], eps=eps, residual=xi,
                          residual_out=xs[1], epilogue="silu_mul", tensor_cores=tc)
            be.row_linear(act, L["down"], mix, tensor_cores=tc)
            a, resid = mix, xs[1]
        if record:
            self._scales_pending = False
        h = m.empty((T, H))
        be.rms_norm(a, self.final_norm, h, eps=eps, **({} if resid is None else
                                                        dict(residual=resid, residual_out=xs[0])))
        logits = m.gemm(h, self.lm_head) if want_logits else None
        return logits, (h if aux is None else aux)

    def layer(self, L, a_in, resid, x, next_norm, h, kv, page_table, positions, seq_lens, cu_q,
              finished, attend, o, act, eps, q8=None, record=False):
        """One decoder layer (``llama_layer.decoder_layer``) on the library's ops: q, k, v =
        split(a_in @ L.qkv); rope_append_kv into ``kv``; o = attend; x = round(resid + o @ L.o)
        (x may be resid: in place); x += mlp(rms_norm(x, L.ln2)); h = rms_norm(x, next_norm).
        a_in may be h. ``o`` [T, Hq, D] and ``act`` [T, I] are scratch. ``q8``: the 8-bit
        kwargs of ``kv`` (none: a 16-bit cache); ``record``: set its fp8 scales from this
        block's K/V first (``fp8_scales``)."""
        decoder_layer(self.ops(h, act, eps), L, a_in, resid, next_norm,
                      self.block_attention(attend, kv, page_table, positions, seq_lens, cu_q,
                                           finished, o, q8, record),
                      (self.nq, self.nkv, self.D), out=x)

    def ops(self, h, act, eps):
        """``llama_layer``'s ops on this backend, writing norms into ``h`` and the MLP's
        activation into ``act``."""
        return _LibraryOps(self.be, self.m, eps, h, act)

    def block_attention(self, attend, kv, page_table, positions, seq_lens, cu_q, finished, o,
                        q8=None, record=False):
        """``decoder_layer``'s attend over a block: rope and the paged append of its K/V in
        one launch (``rope_append_kv``, quantising on write into an 8-bit cache: ``q8`` its
        k_scale/v_scale or k_params/v_params), then ``attend`` (paged verify or prefill)
        into o. ``record``: first set the fp8 scales in ``q8`` from this block's K/V."""
        be, cos_sin = self.be, self.cos_sin
        kc, vc = kv
        q8 = q8 or {}
        where = (page_table, seq_lens, cu_q)

        def run(q, k, v):
            if record:
                self.m.fp8_scales(k, v, q8["k_scale"], q8["v_scale"], FP8_SCALE_HEADROOM)
            be.rope_append_kv(q, k, v, positions, cos_sin, kc, vc, page_table, seq_lens, cu_q,
                              finished, **q8)
            attend(q, k, v, kc, vc, o, q8, where)
            return o
        return run

    def score(self, tokens):
        """Logits [n, V] of one plain (non-speculative) forward pass over ``tokens`` (host
        ints): the rescoring check of lossless decoding. Uses slot 0's caches."""
        m = self.m
        n = len(tokens)
        B = self.batch
        if B == 0 or n > self.max_len:          # caches of the last decode too small: new ones
            self.reset(max(B, 1), n)
            B = self.batch
        counts = [n] + [0] * (B - 1)
        i32 = np.int32
        tok = m.table(np.asarray(tokens, i32))
        pos = m.table(np.arange(n, dtype=i32))
        cu = m.table(np.asarray([0] + [n] * B, i32))
        zeros = m.table(np.zeros(B, i32))
        fin = m.table(np.zeros(B, np.uint8))
        logits, _ = self.prefill(tok, pos, cu, zeros, fin, row_counts=counts, logits=True)
        return m.host_rows(logits)
