"""The demo's embedded model: a tiny hybrid target and an MTP-style draft head.

Target (Qwen3-Next-shaped, far smaller): token embedding, ``layer_types`` of gated
delta-net layers (``linear_attention``: in_proj -> depthwise conv1d + SiLU -> GDN with
L2-normalised q/k and fused gating -> out_proj) and full-attention layers (RoPE, paged
KV cache, GQA), final RMSNorm, lm_head. No MLPs: every layer is residual. Draft: one
MTP layer in the ``qwen3_next_mtp`` weight layout (``mtp.fc``, ``mtp.pre_fc_norm_*``,
``mtp.layers.0.*``, ``mtp.norm``), sharing embedding and lm_head with the target. The
MTP layer's attention attends only to its own row (the draft keeps no KV cache), so
it reduces to ``o_proj(v_proj(x))``; that keeps the demo small and changes nothing
in the target, whose output alone decides correctness.

All dense math runs in float64 on the host array module ``xp`` (numpy, or cupy on a
GPU); everything speculative goes through ``backend`` ops: append_kv,
verify_attention, conv1d_verify/commit/flush, gdn_verify/commit/flush, draft_combine.

Weights are generated deterministically (``make_demo_checkpoint``) so that the target
mostly follows a fixed token permutation, perturbed by its context-dependent layers:
the draft, which sees only that permutation, is right often but not always, so the
demo exercises both acceptance and rejection.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .. import registry
from .gdn_layer import FUSED_BLOCK_ROWS, FusedJournals, gdn_block, gdn_commit_rows, gdn_dims

DEMO_CONFIG = {
    "model_type": "qwen3_next",
    "architectures": ["SpecdecTinyHybridForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 128,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 256,          # the MTP layer's dense MLP
    "mtp_num_hidden_layers": 1,
    "attn_output_gate": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "page_size": 16,
    # generation knobs of the synthetic weights
    "demo_layer_scale": 0.08,          # size of the layers' contribution vs the embedding
    "demo_seed": 1234,
}


def _rms(xp, x, w, eps):
    """Zero-centred RMSNorm (scale 1 + w), the Qwen3-Next convention; float64."""
    r = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * (1.0 + w)


def _linear(be):
    """x [M, K] @ w[N, K].T: the backend's own product where it has one (the cuda backend's
    is capturable in a CUDA graph, cupy's cuBLAS path is not), else the array's @."""
    return getattr(be, "linear", None) or (lambda x, w: x @ w.T)


def _silu(xp, x):
    return x / (1.0 + xp.exp(-x))


# ---------------------------------------------------------------------------- weights

def make_demo_weights(config: dict | None = None) -> dict[str, np.ndarray]:
    """name -> float32 array of the whole demo checkpoint (target + mtp.*)."""
    c = dict(DEMO_CONFIG, **(config or {}))
    rng = np.random.default_rng(int(c["demo_seed"]))
    V, H = c["vocab_size"], c["hidden_size"]
    nq, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, W = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    inter = c["intermediate_size"]
    s = float(c["demo_layer_scale"])
    w = {}

    def mat(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    def zeros(n):
        return np.zeros(n, np.float32)

    E = rng.standard_normal((V, H))
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    w["model.embed_tokens.weight"] = E.astype(np.float32)
    # lm_head row perm[v] points along E[v]: after a token v the model prefers perm[v]
    perm = rng.permutation(V)
    head = np.empty_like(E)
    head[perm] = E * 8.0 / np.sqrt(H)
    w["lm_head.weight"] = head.astype(np.float32)
    w["model.norm.weight"] = zeros(H)
    conv_dim = 2 * hk * dk + hv * dv
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = zeros(H)
        if kind == "linear_attention":
            a = p + "linear_attn."
            w[a + "in_proj_qkv.weight"] = mat(conv_dim, H)
            w[a + "in_proj_ba.weight"] = mat(2 * hv, H)
            w[a + "conv1d.weight"] = (rng.standard_normal((conv_dim, W)) * 0.5).astype(np.float32)
            w[a + "A_log"] = np.log(rng.uniform(1.0, 4.0, hv)).astype(np.float32)
            w[a + "dt_bias"] = rng.uniform(-1.0, 1.0, hv).astype(np.float32)
            w[a + "out_proj.weight"] = mat(H, hv * dv, s * 4.0)
        elif kind == "full_attention":
            a = p + "self_attn."
            w[a + "q_proj.weight"] = mat(nq * D, H, 2.0)
            w[a + "k_proj.weight"] = mat(nkv * D, H, 2.0)
            w[a + "v_proj.weight"] = mat(nkv * D, H)
            w[a + "o_proj.weight"] = mat(H, nq * D, s * 4.0)
        else:
            raise ValueError(f"config: unknown layer type {kind!r}")
    # MTP head: fc keeps the (normalised) embedding half, almost ignores the hidden half,
    # so the draft predicts perm[token]; its layer adds a small perturbation.
    fc = np.zeros((H, 2 * H))
    fc[:, :H] = np.eye(H) / np.sqrt(H)
    fc[:, H:] = rng.standard_normal((H, H)) * 0.02 / np.sqrt(H)
    m = "mtp."
    w[m + "fc.weight"] = fc.astype(np.float32)
    w[m + "pre_fc_norm_embedding.weight"] = zeros(H)
    w[m + "pre_fc_norm_hidden.weight"] = zeros(H)
    w[m + "norm.weight"] = zeros(H)
    L = m + "layers.0."
    w[L + "input_layernorm.weight"] = zeros(H)
    w[L + "post_attention_layernorm.weight"] = zeros(H)
    w[L + "self_attn.q_proj.weight"] = mat(nq * D, H)
    w[L + "self_attn.k_proj.weight"] = mat(nkv * D, H)
    w[L + "self_attn.v_proj.weight"] = mat(nkv * D, H)
    w[L + "self_attn.o_proj.weight"] = mat(H, nq * D, 0.05)
    w[L + "self_attn.q_norm.weight"] = zeros(D)
    w[L + "self_attn.k_norm.weight"] = zeros(D)
    w[L + "mlp.gate_proj.weight"] = mat(inter, H)
    w[L + "mlp.up_proj.weight"] = mat(inter, H)
    w[L + "mlp.down_proj.weight"] = mat(H, inter, 0.05)
    return w


def make_demo_checkpoint(path: str, config: dict | None = None) -> str:
    """Write ``model.safetensors`` and ``config.json`` of the demo model into ``path``."""
    from safetensors.numpy import save_file
    c = dict(DEMO_CONFIG, **(config or {}))
    os.makedirs(path, exist_ok=True)
    save_file(make_demo_weights(c), os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(c, fh, indent=1)
    return path


def load_demo_checkpoint(path: str) -> tuple[dict, dict[str, registry.LazyTensor],
                                             registry.DraftWeights]:
    """(config, target tensors, validated MTP draft weights) from a demo checkpoint."""
    with open(os.path.join(path, "config.json")) as fh:
        config = json.load(fh)
    tensors = registry.open_safetensors(path)
    draft = registry.load_draft_weights("qwen3_next_mtp", path, config)
    return config, tensors, draft


# ---------------------------------------------------------------------------- target

class TinyHybridTarget:
    """The target's host passes for a batch of ``batch`` sequences (slot b = sequence b).

    ``forward`` runs one verify block (tokens [T], positions [T], cu_q [B+1]) and
    returns (logits [T, V], hidden [T, H]) without writing GDN/conv state (KV rows are
    appended, which is harmless: rows past the committed length are dead);
    ``commit(cu_q, accept_len)`` advances the recurrent states over the accepted rows.

    ``fused_state`` (default): the GDN layers run fused mode (``gdn_layer.FusedJournals``): a
    forward's verifies first apply the rows the last commit accepted, and commit only marks
    its rows pending, so a state lags one round: ``flush()`` before reading one. Its pools
    hold 16 rows a slot (a verify block's most), so every forward is fused, the
    orchestrator's prefill blocks too. False: verify, then gdn_commit / conv1d_commit a layer.
    """

    def __init__(self, config, tensors, backend, *, fused_state=True):
        self.c, self.be, self.xp = config, backend, backend.xp
        self.fused_state = bool(fused_state)
        self._lin = _linear(backend)
        xp = self.xp
        get = lambda n: xp.asarray(tensors[n].float32(), dtype=xp.float64)  # noqa: E731
        c = config
        self.V, self.H = c["vocab_size"], c["hidden_size"]
        self.nq, self.nkv, self.D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.hk, self.hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        self.Wc = c["linear_conv_kernel_dim"]
        self._gdn = gdn_dims(c)
        self.eps = c["rms_norm_eps"]
        self.embed = get("model.embed_tokens.weight")
        self.lm_head = get("lm_head.weight")
        self.final_norm = get("model.norm.weight")
        self.layers = []
        for i, kind in enumerate(c["layer_types"]):
            p = f"model.layers.{i}."
            L = {"kind": kind, "ln": get(p + "input_layernorm.weight")}
            if kind == "linear_attention":
                a = p + "linear_attn."
                L.update(qkv=get(a + "in_proj_qkv.weight"), ba=get(a + "in_proj_ba.weight"),
                         conv=xp.asarray(tensors[a + "conv1d.weight"].float32()),
                         A_log=xp.asarray(tensors[a + "A_log"].float32()),
                         dt_bias=xp.asarray(tensors[a + "dt_bias"].float32()),
                         out=get(a + "out_proj.weight"))
            else:
                a = p + "self_attn."
                L.update(q=get(a + "q_proj.weight"), k=get(a + "k_proj.weight"),
                         v=get(a + "v_proj.weight"), o=get(a + "o_proj.weight"))
            self.layers.append(L)
        self.hidden_size = self.H
        self.page_size = int(c.get("page_size", 16))
        self.rope_theta = float(c.get("rope_theta", 10000.0))

    def reset(self, batch, max_len):
        """Fresh caches for ``batch`` empty sequences of up to ``max_len`` positions."""
        self.batch, self.max_len = batch, max_len
        xp, B = self.xp, batch
        ps = self.page_size
        self.max_pages = -(-self.max_len // ps)
        conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.slot_ids = xp.arange(B, dtype=xp.int32)
        self.page_table = xp.arange(B * self.max_pages, dtype=xp.int32).reshape(B, self.max_pages)
        kv_dtype = self.be.kv_dtype
        self._zero = xp.zeros((), dtype=xp.float32)      # what reset_slots writes
        self._zero_i32 = xp.zeros((), dtype=xp.int32)
        G = sum(L["kind"] == "linear_attention" for L in self.layers)
        self._journals = FusedJournals(
            xp.zeros, xp.float32, xp.int32, xp.float32,
            self.be.gdn_journal_width(self.hk, self.hv, self.dk, self.dv), conv_dim, G, B,
            B * FUSED_BLOCK_ROWS) if self.fused_state else None
        for L in self.layers:
            if L["kind"] == "linear_attention":
                L["state"] = xp.zeros((B, self.hv, self.dk, self.dv), dtype=xp.float32)
                L["conv_state"] = xp.zeros((B, conv_dim, self.Wc - 1), dtype=xp.float32)
            else:
                shape = (B * self.max_pages, ps, self.nkv, self.D)
                L["k_cache"] = xp.zeros(shape, dtype=kv_dtype)
                L["v_cache"] = xp.zeros(shape, dtype=kv_dtype)

    def reset_slots(self, slot_ids):
        """Fresh recurrent state for the given slots (a new request takes the slot). KV
        pages need nothing: rows past the committed length (0 after a reset) are dead. The
        zero written is a device array (a python 0 through a device index would be copied
        to the device, and waited for, on every write under torch)."""
        for L in self.layers:
            if L["kind"] == "linear_attention":
                L["state"][slot_ids] = self._zero
                L["conv_state"][slot_ids] = self._zero
        if self._journals is not None:                   # nothing pending for them
            self._journals.len[slot_ids] = self._zero_i32

    def flush(self):
        """Apply what fused mode left pending, so every GDN / conv state holds every
        committed row (before reading a state; nothing to do in plain mode)."""
        if self._journals is not None:
            states = [(L["state"], L["conv_state"]) for L in self._gdn_layers()]
            self._journals.flush(self.be, states, self.slot_ids)

    def _gdn_layers(self):
        return [L for L in self.layers if L["kind"] == "linear_attention"]

    def _rope(self, x, positions):
        xp = self.xp
        half = x.shape[-1] // 2
        inv = 1.0 / (self.rope_theta ** (xp.arange(half, dtype=xp.float64) / half))
        ang = positions.astype(xp.float64)[:, None] * inv[None, :]
        cos, sin = xp.cos(ang)[:, None, :], xp.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _reduce(self, partial):
        """A layer's output projection summed over tensor-parallel ranks: the identity here
        (one process holds every head); ``TinyHybridTargetTP`` all-reduces it."""
        return partial

    def forward(self, tokens, positions, cu_q, seq_lens, finished):
        """One block: tokens/positions [T] int32, cu_q [B+1], seq_lens [B] (committed L),
        finished [B] uint8 (their KV rows are not appended). Returns (logits, hidden)."""
        xp, be = self.xp, self.be
        T = tokens.shape[0]
        f32 = xp.float32
        x = self.embed[tokens]                                            # [T, H] f64
        fj = self._journals             # fused mode: every forward (pools of 16 rows a slot)
        fused = fj is not None
        self._records = []
        for L in self.layers:
            h = _rms(xp, x, L["ln"], self.eps)
            if L["kind"] == "linear_attention":
                qkv = self._lin(h, L["qkv"]).astype(f32)                         # [T, conv_dim]
                ba = self._lin(h, L["ba"]).astype(f32)
                o, record = gdn_block(be, xp.empty, f32, self._gdn, L, qkv, ba[:, :self.hv],
                                      ba[:, self.hv:], L["state"], L["conv_state"],
                                      self.slot_ids, cu_q,
                                      fj.layer(len(self._records), T) if fused else None)
                self._records.append(record)
                x = x + self._reduce(self._lin(o.reshape(T, -1).astype(xp.float64), L["out"]))
            else:
                q = self._rope(self._lin(h, L["q"]).reshape(T, self.nq, self.D), positions)
                k = self._rope(self._lin(h, L["k"]).reshape(T, self.nkv, self.D), positions)
                v = self._lin(h, L["v"]).reshape(T, self.nkv, self.D)
                kvd = self.be.kv_dtype
                be.append_kv(k.astype(kvd), v.astype(kvd), L["k_cache"], L["v_cache"],
                             self.page_table, seq_lens, cu_q, finished)
                o = xp.empty((T, self.nq, self.D), dtype=kvd)
                be.verify_attention(q.astype(kvd), L["k_cache"], L["v_cache"], self.page_table,
                                    seq_lens, cu_q, o)
                x = x + self._reduce(self._lin(o.reshape(T, -1).astype(xp.float64), L["o"]))
        if fused:
            fj.applied(T)
        hidden = _rms(xp, x, self.final_norm, self.eps)
        logits = self._lin(hidden, self.lm_head).astype(f32)
        return logits, hidden.astype(f32)

    def commit(self, cu_q, accept_len):
        """Advance GDN and conv states over the first accept_len[b] rows of the last block
        (fused mode: make them pending, for the next forward to apply)."""
        if self._journals is not None:
            self._journals.commit(cu_q, accept_len)
            return
        for L, record in zip(self._gdn_layers(), self._records):
            gdn_commit_rows(self.be, L["state"], L["conv_state"], self.slot_ids, cu_q,
                            accept_len, record)


# ---------------------------------------------------------------------------- draft

class TinyMTPDraft:
    """Greedy MTP draft head: k chained steps from (carry hidden [B, H], last token [B])."""

    def __init__(self, config, draft_weights, target_tensors, backend):
        xp = backend.xp
        self.be, self.xp = backend, xp
        self.spec = draft_weights.spec
        get = lambda n: xp.asarray(draft_weights[n], dtype=xp.float64)  # noqa: E731
        f32 = lambda n: xp.asarray(draft_weights[n], dtype=xp.float32)  # noqa: E731
        self.embed = xp.asarray(target_tensors["model.embed_tokens.weight"].float32())
        self.lm_head = xp.asarray(target_tensors["lm_head.weight"].float32(), dtype=xp.float64)
        self.eps = self.spec.rms_norm_eps
        self.norm_e = f32("mtp.pre_fc_norm_embedding.weight")
        self.norm_h = f32("mtp.pre_fc_norm_hidden.weight")
        self.fc = get("mtp.fc.weight")
        L = "mtp.layers.0."
        self.ln1 = get(L + "input_layernorm.weight")
        self.ln2 = get(L + "post_attention_layernorm.weight")
        self.wv = get(L + "self_attn.v_proj.weight")
        self.wo = get(L + "self_attn.o_proj.weight")
        self.gate = get(L + "mlp.gate_proj.weight")
        self.up = get(L + "mlp.up_proj.weight")
        self.down = get(L + "mlp.down_proj.weight")
        self.final = get("mtp.norm.weight")
        self.group = config["num_attention_heads"] // config["num_key_value_heads"]
        self.nkv, self.D = config["num_key_value_heads"], config["head_dim"]

    def propose(self, carry, last_token, k):
        """carry float32 [B, H], last_token int32 [B] -> draft tokens int32 [B, k]."""
        xp, be = self.xp, self.be
        lin = _linear(be)
        B, H = carry.shape
        out = xp.empty((B, k), dtype=xp.int32)
        h = carry
        tok = last_token
        comb = xp.empty((B, 2 * H), dtype=xp.float32)
        for j in range(k):
            be.draft_combine(self.embed, h, self.norm_e, self.norm_h, comb, token_ids=tok,
                             eps=self.eps, unit_offset=True)
            x = lin(comb.astype(xp.float64), self.fc)
            a = lin(_rms(xp, x, self.ln1, self.eps), self.wv)                 # [B, nkv*D]
            a = xp.repeat(a.reshape(B, self.nkv, 1, self.D), self.group, axis=2).reshape(B, -1)
            x = x + lin(a, self.wo)
            m = _rms(xp, x, self.ln2, self.eps)
            x = x + lin(_silu(xp, lin(m, self.gate)) * lin(m, self.up), self.down)
            logits = lin(_rms(xp, x, self.final, self.eps), self.lm_head)
            tok = xp.argmax(logits, axis=-1).astype(xp.int32)
            out[:, j] = tok
            h = x.astype(xp.float32)
        return out
