"""Trained draft heads of a Llama target (``LlamaTarget``) as ``SpeculativeDecoder`` drafts:
an MTP head in the ``deepseek_mtp`` layout and an EAGLE3 head, both one decoder layer with a
paged KV cache of its own, both run through the library's ops.

One draft step on rows r (one row per position p, fed the token that follows p):

    MTP:     c = draft_combine(embed[tok], hid, enorm, hnorm)   x = eh_proj(c)
             x = x + o(attn(rms(x, ln1)));  x = x + mlp(rms(x, ln2))
             logits = lm_head(rms(x, shared_head.norm))          (the target's tied lm_head)
    EAGLE3:  c = draft_combine(embed[tok], hid, input_ln, hidden_norm)
             x = hid + o(attn(c))            (q/k/v take the 2H combined row)
             x = x + mlp(rms(x, post_ln));   logits = lm_head(rms(x, norm))  (draft vocab,
             mapped back to target ids through d2t)

``hid`` of the first step is the target's feature of position p: its final hidden (MTP) or
fc(aux taps) (EAGLE3: the outputs of three target layers, ``LlamaTarget.capture_aux``); of
every later step, the previous step's output x of the same sequence. The output of the row
of position p predicts the token at p + 2.

A round (``propose_block``): the first step runs over the whole verify block (the target's
hidden rows, each fed the token emitted after it; rows past ``accept_len`` are garbage and
their cache rows dead, as in the target), its K/V appended at the block's positions; the
last accepted row's output (``draft_carry``) gives draft token 1; k - 1 more steps of one
row per sequence follow, each appending at the next position. A prefill runs the first step
over the prompt rows with the host's causal attention. ``specdec_lib.train`` trains heads on
exactly this computation (``llama_layer.draft_step``, in torch; its multi-step objective
unrolls the same chain).
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..registry import load_draft_weights
from .llama_layer import draft_step, fuse_layer, head_tensor_names, split_qkv


class LlamaDraftHead:
    """An MTP (deepseek_mtp layout) or EAGLE3 head for ``target`` (a ``LlamaTarget``).

    ``fused_step`` (default on since s48's H100 A/B: +0.9-1.0% B=1 tok/s at k = 3 / 4, lossless
    on 32 prompts; False gives the unfused step): a step whose GEMMs linear's few-row forms
    take (the target's ``library_rows``) runs each norm in the prologue of the linear behind
    it and silu_mul in gate_up's epilogue (``_step_fused``, as ``LlamaTarget._run_fused``):
    two launches a step fewer, the lm_head and fc on linear too; the same math, silu read
    from gate_up's float32 sums (the unfused step rounds them to 16 bits first)."""
    uses_target_block = True
    fused_step = True

    def __init__(self, target, weights, *, page_size=16):
        spec = weights.spec
        if spec.layout not in ("deepseek_mtp", "eagle3"):
            raise ValueError(f"weights: layout {spec.layout!r}; LlamaDraftHead runs "
                             "deepseek_mtp and eagle3 heads")
        if spec.hidden_size != target.H or spec.vocab_size != target.V:
            raise ValueError(f"weights: hidden {spec.hidden_size} / vocab {spec.vocab_size} "
                             f"do not match the target's {target.H} / {target.V}")
        self.t, self.be, self.m = target, target.be, target.m
        self.spec, self.layout = spec, spec.layout
        self.eps, self.page_size = spec.rms_norm_eps, int(page_size)
        m = self.m
        pre = spec.layer_prefixes[0]
        names = head_tensor_names(self.layout, pre)
        own = {r: m.param(weights[n]) for r, n in names.items()}
        # the head's tensors by role, the layer in llama_layer's fused form
        self.L = dict(fuse_layer(own, m.cat_rows), fc=own["fc"], norm_e=own["norm_e"],
                      norm_h=own["norm_h"], final=own["final"])
        if self.layout == "eagle3":
            self.lm_head = own["lm_head"]
            Vd = self.lm_head.shape[0]
            d2t = weights["d2t"] if "d2t" in weights else np.zeros(Vd, np.int64)
            self.d2t = m.table(np.asarray(d2t, np.int64))
            taps = spec.aux_capture_before_layers
            if taps is None:
                n = len(target.layers)
                taps = (2, n // 2, n - 3)
            self.taps = tuple(taps)
        else:
            head = pre + "shared_head.head.weight"
            self.lm_head = m.param(weights[head]) if head in weights else target.lm_head
            self.d2t = None
            self.taps = ()
        self.I = self.L["down"].shape[1]
        self.batch = 0
        self.cache_epoch = 0     # bumped by reset (as the target's)

    @classmethod
    def load(cls, target: Any, path: str, method: str | None = None,
             **kw: Any) -> LlamaDraftHead:
        """Read and validate a head through the registry (``method`` defaults to the kind the
        config implies, ``heads.head_method``)."""
        from .heads import head_method
        cfg_path = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "config.json")
        with open(cfg_path) as fh:
            cfg = json.load(fh)
        return cls(target, load_draft_weights(method or head_method(cfg), path, cfg), **kw)

    # ------------------------------------------------------------------ cache
    def reset(self, batch, max_len):
        """A one-layer paged KV cache for ``batch`` sequences of ``max_len`` positions; the
        target (reset just before, by the decoder) is set to return the features this head
        reads (EAGLE3: its aux taps)."""
        t, m, ps = self.t, self.m, self.page_size
        t.capture_aux(self.taps)
        self.batch, self.max_pages = batch, -(-max_len // ps)
        self.page_table = m.table(np.arange(batch * self.max_pages, dtype=np.int32)
                                  .reshape(batch, self.max_pages))
        shape = (batch * self.max_pages, ps, t.nkv, t.D)
        self.kv = (m.zeros(shape, m.kv), m.zeros(shape, m.kv))
        self.ar = m.table(np.arange(max(batch + 1, 16), dtype=np.int32))   # cu_q / steps
        self.cache_epoch += 1

    # ------------------------------------------------------------------ passes
    def _step(self, hid, tokens, positions, cu_q, lens, finished, attend):
        """One draft step over rows: hid [R, H] (or aux [R, taps*H] for EAGLE3's first
        step), tokens [R] target ids (out-of-range -> zero embedding). Returns the step's
        output x [R, H] and its final norm [R, H] (the lm_head input); K/V appended to the
        cache."""
        m, t = self.m, self.t
        R = tokens.shape[0]
        attend = t.block_attention(attend, self.kv, self.page_table, positions, lens, cu_q,
                                   finished, m.empty((R, t.nq, t.D), m.kv))
        if self._fused(R):
            return self._step_fused(hid, tokens, attend)
        ops = t.ops(m.empty((R, t.H)), m.empty((R, self.I)), self.eps)
        return draft_step(ops, self.layout, self.L, t.embed, hid, tokens, attend,
                          (t.nq, t.nkv, t.D), t.H)

    def _fused(self, R):
        """Whether a step over R rows runs ``_step_fused``: ``fused_step`` and every layer
        GEMM taken by the target math's ``linear`` (row-invariant, or few rows)."""
        L = self.L
        return self.fused_step and all(
            self.m.library_rows(R, w.shape[1], w.shape[0])
            for w in (L["qkv"], L["o"], L["gate_up"], L["down"]))

    def _step_fused(self, hid, tokens, attend):
        """``draft_step`` with the norms in linear's prologues and silu_mul in gate_up's
        epilogue: EAGLE3 fc?, draft_combine, qkv, rope_append_kv, attention, o, gate_up (+ ln2
        norm, residual, silu_mul), down, the final norm (+ residual); MTP the same with eh_proj
        after draft_combine and ln1 in qkv's prologue. Returns (x, h) as ``_step``."""
        be, m, t, L = self.be, self.m, self.t, self.L
        R, H, eps = tokens.shape[0], t.H, self.eps
        nq, nkv, D = t.nq, t.nkv, t.D
        tc = m.tensor_cores

        def lin(x, w, out, **kw):
            be.row_linear(x, w, out, tensor_cores=tc, **kw)
        eagle3 = self.layout == "eagle3"
        if eagle3 and hid.shape[-1] != H:
            hid = m.gemm(hid, L["fc"])                          # fc of the aux taps
        comb = m.empty((R, 2 * H))
        be.draft_combine(t.embed, hid, L["norm_e"], L["norm_h"], comb, token_ids=tokens, eps=eps)
        qkv = m.empty((R, (nq + 2 * nkv) * D))
        if eagle3:              # q/k/v read the combined row (no norm); the stream is hid
            resid = hid
            lin(comb, L["qkv"], qkv)
        else:                   # eh_proj gives the stream; ln1 in qkv's prologue
            resid = m.gemm(comb, L["fc"])
            lin(resid, L["qkv"], qkv, norm_weight=L["ln1"], eps=eps)
        o = attend(*split_qkv(qkv, (nq, nkv, D)))
        mix, x, act = m.empty((R, H)), m.empty((R, H)), m.empty((R, self.I))
        lin(o.reshape(R, nq * D), L["o"], mix)
        # x = round(resid + mix) (residual_out: never one of linear's inputs), act = mlp's
        lin(mix, L["gate_up"], act, norm_weight=L["ln2"], eps=eps, residual=resid,
            residual_out=x, epilogue="silu_mul")
        lin(act, L["down"], mix)
        h = m.empty((R, H))
        be.rms_norm(mix, L["final"], h, eps=eps, residual=x, residual_out=x)
        return x, h

    def _token(self, hn, out):
        """Greedy draft tokens from normed step outputs hn [B, H], as target ids into ``out``
        (int32 [B], contiguous): the argmax cast on its way in, or mapped through d2t."""
        be, m = self.be, self.m
        logits = (m.gemm(hn, self.lm_head) if self._fused(hn.shape[0])
                  else m.linear(hn, self.lm_head))
        ids = m.argmax_ids(logits)
        if self.d2t is None:
            out[...] = ids
        else:
            be.draft_map_tokens(ids, self.d2t, out)

    def propose_block(self, block, k):
        """k draft tokens [B, k] int32 for every sequence from the target's last pass.

        block: hidden [R, Hf] (the target's rows), tokens [R] (the token after each row),
        positions [R], cu_q [B+1], valid [B] (rows that were committed: the first step's
        last valid row predicts draft 1), seq_lens [B] (committed positions after the
        pass: seq_lens - valid is where the block starts), finished [B], row_counts (host
        ints, prefill only: the rows are whole fresh prompts, host causal attention).
        The drafts are made step-major (row j = draft j of every sequence, each step's
        token ids a contiguous row) and returned transposed: a view, [B, k]."""
        m, t, be = self.m, self.t, self.be
        B = block.valid.shape[0]
        base = block.seq_lens - block.valid
        if block.row_counts is not None:
            attend = t.prefill_attention(block.row_counts)
        else:
            attend = t.paged_attention(self.page_table, base, block.cu_q,
                                       getattr(block, "max_q", None))
        x, xn = self._step(block.hidden, block.tokens, block.positions, block.cu_q, base,
                           block.finished, attend)
        g, gn = m.empty((B, t.H)), m.empty((B, t.H))
        be.draft_carry(x, block.cu_q, block.valid, g)       # the last committed row's
        be.draft_carry(xn, block.cu_q, block.valid, gn)
        out = m.empty((k, B), m.int32)
        self._token(gn, out[0])
        cu1 = self.ar[:B + 1]
        if k > 1:       # step j appends at seq_lens + j - 1: every step's lengths at once
            lens_all = block.seq_lens[None, :] + self.ar[:k - 1, None]
        for j in range(1, k):
            lens = lens_all[j - 1]
            attend = t.paged_attention(self.page_table, lens, cu1, 1)
            g, gn = self._step(g, out[j - 1], lens, cu1, lens, block.finished, attend)
            self._token(gn, out[j])
        return out.T
