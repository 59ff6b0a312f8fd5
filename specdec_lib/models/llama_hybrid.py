"""The smollm2-hybrid (``models.smollm2_hybrid``: a Llama with most attention layers replaced
by gated delta-net layers) as a host model of ``SpeculativeDecoder``.

An attention layer is ``LlamaTarget``'s (rope_append_kv, verify_attention; prefill by the
host's causal kernel). A GDN layer, from its normed input h::

    y = h @ [Wq'; Wk'; Wv'; Wz; Wba]^T        # W' = SmolLM2's base + B A, merged at load,
    qkv, z, (b, a) = split(y)                  #   one matrix in the dense math's dtype
    o = gdn_verify(conv1d_verify(qkv) + SiLU, a, b, state)     # models.gdn_layer
    o = norm_w * rms_norm_per_head(o) * silu(z + z_bias)       # gated RMSNorm
    x, h = layer_rest(o @ Wo'^T)                               # SmolLM2's residual, MLP, norms

``commit`` runs gdn_commit / conv1d_commit over the accepted rows of the last pass (prefill
included: its GDN rows go through gdn_verify like a verify block's, any length); with
``fused_state`` (default) a verify block's commit only marks its rows pending and the next
forward's verifies apply them (``gdn_layer.FusedJournals``; ``flush()`` before reading a
state), prefill stays as above. The GDN
state pool is ``state_dtype`` (float32, bfloat16 or float16: the ops take all three); the conv
state is float32 (it holds the projection's rows, 16-bit on the GPU, exactly). Dense math is
``LlamaTarget``'s: float64 numpy on the reference backend (the ops' inputs rounded to float32),
bf16 (or ``dtype="float16"``) torch on the GPU; the gated norm runs in float64 on numpy, in
float32 on torch (torch ops, or the library's ``gated_rms_norm`` with ``gated_norm_op``).

``train.hybrid_model.HybridModel`` is the same network in differentiable torch; on the
reference backend this one matches its forward to float32 tolerance
(tests/test_hybrid_host.py).
"""
from __future__ import annotations

import numpy as np

from ..dtypes import one_of
from .gdn_layer import FUSED_BLOCK_ROWS, FusedJournals, gdn_block, gdn_commit_rows, gdn_dims
from .llama import LlamaTarget
from .llama_layer import layer_rest
from .smollm2_hybrid import base_projections, gdn_layers, layer_prefix

STATE_DTYPES = ("float32", "bfloat16", "float16")       # the GDN state pool
DENSE_DTYPES = ("bfloat16", "float16")                  # the torch backend's dense math


def state_dtype_name(state_dtype):
    """``state_dtype`` as one of ``STATE_DTYPES`` (aliases f32, bf16, f16, ...); ValueError
    naming the argument otherwise."""
    return one_of("state_dtype", state_dtype, STATE_DTYPES)


def dense_dtype_name(dtype):
    return one_of("dtype", dtype, DENSE_DTYPES)


def hybrid_unsupported(backend, state_dtype="float32", dtype="bfloat16", head_k_dim=64):
    """None when ``backend`` can run the hybrid with a ``state_dtype`` GDN state and ``dtype``
    dense math, else why not. Names are checked first (ValueError naming the argument);
    nothing is launched: the GPU is asked for its code family and the kernel images that
    would run are looked up."""
    sname, dname = state_dtype_name(state_dtype), dense_dtype_name(dtype)
    if backend.name not in ("reference", "torch"):
        return f"the hybrid host model runs on 'reference' or 'torch', not {backend.name!r}"
    if head_k_dim not in (64, 128):
        return f"GDN head dim {head_k_dim}: the gdn kernels take 64 or 128"
    if backend.name == "reference":
        return None
    try:
        from .. import runtime
        from ..ops.gdn import _STATE_NAME, _use_mma16
        dev = backend.device.index or 0
        family = runtime.arch_family(dev)
        if dname == "bfloat16" and family < 80:
            return (f"bfloat16 dense math and attention need sm_80 or newer; this device runs "
                    f"the compute_{family} code (use dtype float16)")
        for module in ("gdn", "conv", "attention"):
            runtime.choose_image(module, dev)
        mma = "_mma" if _use_mma16(sname, "kv") else ""
        for op in ("verify", "commit"):
            runtime.kernel("gdn", f"gdn_{op}{mma}_kv_d{head_k_dim}_{_STATE_NAME[sname]}", dev)
    except Exception as e:          # no driver, no image for this GPU, ...
        return f"{type(e).__name__}: {e}"
    return None


class LlamaHybridTarget(LlamaTarget):
    """``LlamaTarget`` with the GDN layers of a hybrid config (slot b = sequence b).

    config, weights: the base Llama (``gguf_llama.LlamaConfig`` and its float32 tensors);
    hybrid_cfg, hybrid_tensors: ``smollm2_hybrid.load_hybrid_weights``'s (config dict,
    float32 tensors). ``state_dtype``: the GDN state; ``dtype``: the torch backend's dense
    math and KV cache (bfloat16, or float16 where there is no bf16). ``small_rows``: as
    ``LlamaTarget``'s (off by default here: not yet run on a GPU with the hybrid).
    ``fused_state`` (default): a verify block's GDN / conv commit is folded into the next
    forward's verifies (``gdn_layer.FusedJournals``; pools of ``reset``'s ``block_rows`` a slot,
    which the decoder sets to its k_max + 1; a longer forward flushes and runs plain); False:
    gdn_commit / conv1d_commit a layer after every pass."""
    pads_prefill = True      # pad rows of a prefill are never committed (GDN) or dead (KV)
    takes_block_rows = True  # reset(..., block_rows=): the rows a slot's verify block may have

    def __init__(self, config, weights, hybrid_cfg, hybrid_tensors, backend, *, page_size=16,
                 max_position=None, row_invariant=False, state_dtype="float32",
                 dtype="bfloat16", small_rows=False, fused_state=True):
        self.state_dtype = state_dtype_name(state_dtype)
        self.fused_state = bool(fused_state)
        dname = dense_dtype_name(dtype)
        cfg = hybrid_cfg
        if cfg["num_hidden_layers"] != config.num_layers or cfg["hidden_size"] != config.hidden_size:
            raise ValueError(f"hybrid_cfg: {cfg['num_hidden_layers']} layers of "
                             f"{cfg['hidden_size']}, the base model has {config.num_layers} of "
                             f"{config.hidden_size}")
        self.d = d = gdn_dims(cfg)
        why = hybrid_unsupported(backend, self.state_dtype, dname, d.dk)
        if why is not None:
            raise ValueError(f"state_dtype: a {self.state_dtype} GDN state with {dname} dense "
                             f"math on the {backend.name} backend: {why}")
        self.hybrid_cfg = cfg
        self.gdn_ids = self.no_kv_layers = tuple(gdn_layers(cfg))
        # small_rows (LlamaTarget's few-row linear GEMMs) stays off by default here until the
        # hybrid's GPU tests and end to end have run with it (s40 measured the dense target)
        super().__init__(config, weights, backend, page_size=page_size,
                         max_position=max_position, row_invariant=row_invariant, kv_dtype=dname,
                         small_rows=small_rows)
        m = self.m
        vec = (lambda a: m.table(np.asarray(a, np.float64))) if m.name == "numpy" else \
            (lambda a: m.table(np.asarray(a, np.float32)))        # host math's vectors
        f32 = lambda a: m.table(np.ascontiguousarray(a, np.float32))  # noqa: E731  (op inputs)
        for i in self.gdn_ids:
            p, t = layer_prefix(i), hybrid_tensors
            base = base_projections(cfg, weights, i)

            def merged(n, base_w=None):
                dw = np.asarray(t[p + f"{n}_proj.lora_B"], np.float64) @ \
                    np.asarray(t[p + f"{n}_proj.lora_A"], np.float64)
                return dw if base_w is None else np.asarray(base_w, np.float64) + dw
            w_in = np.concatenate([merged("q", base["q"]), merged("k", base["k"]),
                                   merged("v", base["v"]), merged("z"),
                                   np.asarray(t[p + "in_proj_ba.weight"], np.float64)])
            old = self.layers[i]
            self.layers[i] = dict(
                kind="gdn", ln1=old["ln1"], ln2=old["ln2"], gate_up=old["gate_up"],
                down=old["down"], w_in=m.param(w_in), o=m.param(merged("o", base["o"])),
                conv=f32(t[p + "conv1d.weight"]), A_log=f32(t[p + "A_log"]),
                dt_bias=f32(t[p + "dt_bias"]), norm=vec(t[p + "norm.weight"]),
                z_bias=vec(t[p + "z_bias"]))
        self.gated_eps = float(cfg.get("rms_norm_eps", config.rms_norm_eps))
        self._records = []
        self._journals, self._fused_pass = None, False

    @property
    def weight_bytes(self):
        n = self.embed.shape[0] * self.embed.shape[1]
        for L in self.layers:
            n += sum(L[k].shape[0] * L[k].shape[1]
                     for k in ("qkv", "w_in", "o", "gate_up", "down") if k in L)
        return n * (8 if self.m.name == "numpy" else 2)

    # ------------------------------------------------------------------ caches
    def reset(self, batch, max_len, block_rows=FUSED_BLOCK_ROWS):
        """Paged KV caches of the attention layers and fresh GDN / conv states for ``batch``
        empty sequences of up to ``max_len`` positions; with ``fused_state`` the fused mode's
        pools for verify passes of up to ``block_rows`` rows a slot (journals and conv rows of
        [G, batch * block_rows, ...], twice: smollm2-hybrid's at block_rows 4 about 1 MB a
        slot, beside 2.2 MB of float32 GDN states; prefill passes need none)."""
        super().reset(batch, max_len)
        m, d = self.m, self.d
        if m.name == "numpy":               # bfloat16 held as its bits (specdec_lib.dtypes)
            sdt = {"float32": np.float32, "float16": np.float16,
                   "bfloat16": np.uint16}[self.state_dtype]
        else:
            sdt = getattr(m.torch, self.state_dtype)
        self.slot_ids = m.table(np.arange(batch, dtype=np.int32))
        # every GDN layer's state (and conv state) is one slice of a single pool, so that
        # reset_slots clears a slot in all of them with one write
        G = len(self.gdn_ids)
        self._state_pool = m.zeros((G, batch, d.hv, d.dk, d.dv), sdt)
        self._conv_pool = m.zeros((G, batch, d.conv_dim, d.W - 1), m.f32)
        for j, i in enumerate(self.gdn_ids):
            L = self.layers[i]
            L["state"], L["conv_state"] = self._state_pool[j], self._conv_pool[j]
        self._records = []
        # the conv rows in qkv's dtype (float32 on numpy, the dense math's on torch)
        self._journals = FusedJournals(
            m.zeros, m.f32, m.int32, m.f32 if m.name == "numpy" else m.act,
            self.be.gdn_journal_width(d.hk, d.hv, d.dk, d.dv), d.conv_dim, G, batch,
            batch * int(block_rows)) if self.fused_state else None
        self._fused_pass = False

    def reset_slots(self, slot_ids):
        """A new request takes these slots: its GDN and conv states start from zero (KV rows
        past L = 0 are dead already) and nothing pending (fused mode). One write a pool for
        every layer (the pools of ``reset``); on torch ``index_fill_`` with the value as a
        kernel argument, nothing copied or waited on (an int64 device index is used as it
        is)."""
        pending = self._journals.len if self._journals is not None else None
        if self.m.name == "numpy":
            idx = np.asarray(slot_ids)
            self._state_pool[:, idx] = 0
            self._conv_pool[:, idx] = 0
            if pending is not None:                     # nothing pending for them
                pending[idx] = 0
            return
        torch = self.m.torch
        idx = slot_ids if isinstance(slot_ids, torch.Tensor) else self.m.table(np.asarray(slot_ids))
        idx = idx.to(self.m.dev, torch.int64)        # (itself when already an int64 there)
        self._state_pool.index_fill_(1, idx, 0)
        self._conv_pool.index_fill_(1, idx, 0)
        if pending is not None:
            pending.index_fill_(0, idx, 0)

    def flush(self):
        """Apply what fused mode left pending, so every GDN / conv state holds every
        committed row (before reading a state; nothing to do in plain mode)."""
        if self._journals is not None:
            self._journals.flush(self.be, [(self.layers[i]["state"], self.layers[i]["conv_state"])
                                           for i in self.gdn_ids], self.slot_ids)

    def commit(self, cu_q, accept_len):
        """Advance every GDN layer's state and conv state over the first accept_len[b] rows
        of the last pass (forward or prefill); after a fused forward, make them pending."""
        if self._fused_pass:
            self._journals.commit(cu_q, accept_len)
            return
        for i, record in zip(self.gdn_ids, self._records):
            L = self.layers[i]
            gdn_commit_rows(self.be, L["state"], L["conv_state"], self.slot_ids, cu_q,
                            accept_len, record)

    # ------------------------------------------------------------------ passes
    def forward(self, tokens, positions, cu_q, seq_lens, finished, max_q=None):
        """``LlamaTarget.forward``; with ``fused_state`` the GDN verifies in fused mode (a pass
        of more rows than the pools hold flushes first and runs plain)."""
        fj = self._journals
        self._fused_pass = fj is not None and tokens.shape[0] <= fj.rows
        if fj is not None and not self._fused_pass:
            self.flush()
        return super().forward(tokens, positions, cu_q, seq_lens, finished, max_q)

    def prefill(self, tokens, positions, cu_q, seq_lens, finished, *, row_counts, logits=False):
        """``LlamaTarget.prefill``, plain in either mode (its rows would not fit the pools):
        its fresh sequences have nothing pending (``reset_slots``) and the other slots no rows
        in it, so what is pending for them stays pending, for the next forward."""
        self._fused_pass = False
        return super().prefill(tokens, positions, cu_q, seq_lens, finished,
                               row_counts=row_counts, logits=logits)

    def _run(self, tokens, positions, cu_q, seq_lens, finished, attend, want_logits=True):
        self._records = []
        out = super()._run(tokens, positions, cu_q, seq_lens, finished, attend, want_logits)
        if self._fused_pass:
            self._journals.applied(tokens.shape[0])
        return out

    def layer(self, L, a_in, resid, x, next_norm, h, kv, page_table, positions, seq_lens, cu_q,
              finished, attend, o, act, eps, q8=None, record=False):
        """An attention layer as ``LlamaTarget.layer``; a GDN layer by ``gdn_layer``."""
        if L.get("kind") != "gdn":
            return super().layer(L, a_in, resid, x, next_norm, h, kv, page_table, positions,
                                 seq_lens, cu_q, finished, attend, o, act, eps, q8=q8,
                                 record=record)
        return self.gdn_layer(L, a_in, resid, x, next_norm, h, cu_q, act, eps)

    def gdn_layer(self, L, a_in, resid, x, next_norm, h, cu_q, act, eps):
        """One GDN layer (module docstring) from its normed input ``a_in`` [T, H]; the
        residual stream goes into ``x``, the next norm into ``h`` (as ``decoder_layer``)."""
        m, d = self.m, self.d
        y = m.gemm(a_in, L["w_in"])                       # [T, conv_dim + Hv Dv + 2 Hv]
        cd, hvdv = d.conv_dim, d.hv * d.dv
        qkv, z, ba = y[:, :cd], y[:, cd:cd + hvdv], y[:, cd + hvdv:]
        if m.name == "numpy":                             # the ops take float32 on the CPU
            qkv, ba = qkv.astype(np.float32), ba.astype(np.float32)
        fused = self._journals.layer(len(self._records), qkv.shape[0]) if self._fused_pass \
            else None
        o, rec = gdn_block(self.be, m.empty, m.f32, d, L, qkv, ba[:, :d.hv], ba[:, d.hv:],
                           L["state"], L["conv_state"], self.slot_ids, cu_q, fused)
        self._records.append(rec)
        g = self._gated_norm(o, z, L["norm"], L["z_bias"])
        return layer_rest(self.ops(h, act, eps), L, m.gemm(g, L["o"]), resid, next_norm, out=x)

    # The torch path's gated norm as one library launch (gated_rms_norm) instead of ~10 torch
    # kernels a GDN layer; off until its GPU tests and an e2e ran (s45: CPU-tested only).
    gated_norm_op = False

    def _gated_norm(self, o, z, w, z_bias):
        """norm_w * rms_norm(o per head) * silu(z + z_bias) -> [T, Hv Dv] in the dense math's
        dtype: float64 host math on numpy; on torch float32 math rounded once to the dense
        math's dtype, as torch ops or, with ``gated_norm_op``, one ``gated_rms_norm`` launch
        (o float32 [T, Hv, Dv] and z a bf16 column slice of the projection read as they are)."""
        T = o.shape[0]
        eps = self.gated_eps
        if self.m.name == "numpy":
            o = o.astype(np.float64)
            r = o / np.sqrt((o * o).mean(axis=-1, keepdims=True) + eps)
            zz = z + z_bias
            return r.reshape(T, -1) * w * (zz * 0.5 * (1.0 + np.tanh(0.5 * zz)))
        if self.gated_norm_op:
            g = self.m.empty(z.shape)
            self.be.gated_rms_norm(o.reshape(T, -1), z, w, g, group_size=o.shape[-1],
                                   z_bias=z_bias, eps=eps)
            return g
        F = self.m.F
        r = o * self.m.torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
        return (r.reshape(T, -1) * w * F.silu(z.float() + z_bias)).to(self.m.act)

    def score(self, tokens):
        """Logits [n, V] of one plain forward pass over ``tokens`` (host ints), from a fresh
        state in slot 0 (its KV rows and GDN state are the decoder's no more)."""
        n = len(tokens)
        if self.batch == 0 or n > self.max_len:
            self.reset(max(self.batch, 1), n)
        self.reset_slots(self.m.table(np.zeros(1, np.int32)))
        return super().score(tokens)
