"""The smollm2-hybrid in differentiable torch, for its distillation: SmolLM2's layers
(frozen; ``llama_torch``'s norms, rope and attention) with the GDN layers of the config's
layer pattern (``models.smollm2_hybrid`` describes the design and the file), and the
teacher (SmolLM2 itself, every layer attention) over the same frozen weights.

A GDN layer, from the layer's normed input h (``[B, N, H]``)::

    qkv = h @ (Wqkv + B A)^T                  # Wqkv frozen (q_proj; k/v_proj per GQA group)
    q, k, v = split(silu(causal_depthwise_conv1d(qkv)))
    z = h @ (Bz Az)^T + z_bias;  b, a = split(h @ Wba^T)
    beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    o = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)        # chunked, float32
    o = norm_w * rms_norm_per_head(o) * silu(z)
    out = o @ (Wo + Bo Ao)^T                  # what the attention's o_proj output was

The decoder layer around it (residual, post-attention norm, MLP) is SmolLM2's.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..models.llama_layer import fuse_layer, layer_tensor_names, split_qkv
from ..models.llama_torch import TorchOps, attention, rope
from ..models.smollm2_hybrid import base_projections, gdn_layers, layer_prefix, tensor_spec
from ..reference.layers import rope_cos_sin_cache
from .gdn_torch import chunk_gated_delta_rule

F = torch.nn.functional


def init_gdn_tensors(cfg, seed=0):
    """float32 numpy initial values of every trainable tensor (``tensor_spec``): LoRA A
    random N(0, 1/fan_in), B zero (the layer starts as its base); z_bias = z_bias_init;
    conv the identity (tap W-1 = 1); ba zero (beta 1/2, a = 0); A = exp(A_log) ~ U(1, 16)
    and dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1] (Mamba's / Qwen3-Next's
    initialisation: per-token decays exp(-A dt) from 0.2 to 0.999); norm weight 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, _) in tensor_spec(cfg).items():
        leaf = name.rsplit(".", 1)[-1] if not name.endswith(".weight") else name.rsplit(".", 2)[-2]
        if name.endswith("lora_A"):
            a = rng.standard_normal(shape) / math.sqrt(shape[1])
        elif name.endswith("lora_B") or leaf == "in_proj_ba":
            a = np.zeros(shape)
        elif name.endswith("z_bias"):
            a = np.full(shape, float(cfg.get("z_bias_init", 1.0)))
        elif leaf == "conv1d":
            a = np.zeros(shape)
            a[:, -1] = 1.0
        elif name.endswith("A_log"):
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), shape))
            a = dt + np.log(-np.expm1(-dt))           # softplus^-1(dt)
        elif leaf == "norm":
            a = np.ones(shape)
        else:
            raise AssertionError(name)
        out[name] = a.astype(np.float32)
    return out


class HybridModel:
    """Frozen SmolLM2 weights (``dtype``, on ``device``) + the trainable GDN tensors
    (float32 leaves). ``forward`` runs the hybrid, ``teacher`` SmolLM2 itself."""

    def __init__(self, config, weights, cfg, device, dtype=torch.float32, *, seed=0,
                 chunk_size=64, init=None):
        self.c, self.cfg, self.dev, self.dt = config, cfg, torch.device(device), dtype
        self.chunk = int(chunk_size)
        P = lambda a: torch.from_numpy(np.array(a, np.float32)).to(self.dev, dtype)  # noqa: E731
        self.embed = P(weights["model.embed_tokens.weight"])
        self.lm_head = self.embed if config.tied_embeddings else P(weights["lm_head.weight"])
        self.norm = P(weights["model.norm.weight"])
        self.layers = [fuse_layer({r: P(weights[n]) for r, n in
                                   layer_tensor_names(f"model.layers.{i}.").items()}, torch.cat)
                       for i in range(config.num_layers)]
        self.gdn = gdn_layers(cfg)
        self.base = {}
        for i in self.gdn:
            b = base_projections(cfg, weights, i)
            self.base[i] = dict(qkv=P(np.concatenate([b["q"], b["k"], b["v"]])), o=P(b["o"]))
        cs = rope_cos_sin_cache(config.context_length, config.head_dim, config.rope_theta)
        self.cos_sin = torch.from_numpy(cs).to(self.dev)
        self.ops = TorchOps(config.rms_norm_eps)
        self.heads = (config.num_heads, config.num_kv_heads, config.head_dim)
        init = init_gdn_tensors(cfg, seed) if init is None else init
        self.p = {n: torch.from_numpy(np.array(a, np.float32)).to(self.dev).requires_grad_()
                  for n, a in init.items()}

    # ---------------------------------------------------------------- parameters
    def params(self, layers=None):
        keep = None if layers is None else tuple(layer_prefix(i) for i in layers)
        return [t for n, t in self.p.items() if keep is None or n.startswith(keep)]

    def export(self):
        """name -> float32 numpy array of every trainable tensor (``save_hybrid_weights``)."""
        return {n: t.detach().float().cpu().numpy() for n, t in self.p.items()}

    def _lp(self, i):
        pre = layer_prefix(i)
        return {n[len(pre):]: t for n, t in self.p.items() if n.startswith(pre)}

    # ---------------------------------------------------------------- mixers
    def attention_mixer(self, L, h, N, want_heads=False):
        """SmolLM2's attention of one layer over h [B, N, H]: (o_proj output, head outputs)."""
        nq, _, D = self.heads
        qkv = F.linear(h, L["qkv"])
        lead = qkv.shape[:-1]
        q, k, v = split_qkv(qkv, self.heads)
        cs = self.cos_sin[:N]
        cos, sin = cs[:, :D // 2], cs[:, D // 2:]
        o = attention(rope(q, cos, sin), rope(k, cos, sin), v, causal=True).reshape(*lead, nq * D)
        return F.linear(o, L["o"]), (o if want_heads else None)

    def gdn_mixer(self, i, h, want_heads=False):
        """GDN layer ``i`` over its normed input h [B, N, H] -> (output [B, N, H], the gated
        normed head outputs before the o projection when ``want_heads``)."""
        c = self.cfg
        p, base = self._lp(i), self.base[i]
        Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        Dk, Dv, W = c["linear_key_head_dim"], c["linear_value_head_dim"], \
            c["linear_conv_kernel_dim"]
        B, N, _ = h.shape
        hf = h.float()
        A = torch.cat([p["q_proj.lora_A"], p["k_proj.lora_A"], p["v_proj.lora_A"]])
        t = F.linear(hf, A).chunk(3, -1)
        delta = torch.cat([F.linear(t[0], p["q_proj.lora_B"]), F.linear(t[1], p["k_proj.lora_B"]),
                           F.linear(t[2], p["v_proj.lora_B"])], -1)
        qkv = F.linear(h, base["qkv"]).float() + delta            # [B, N, 2HkDk + HvDv]
        x = F.pad(qkv.transpose(1, 2), (W - 1, 0))
        qkv = F.silu(F.conv1d(x, p["conv1d.weight"][:, None, :], groups=qkv.shape[-1])
                     ).transpose(1, 2)
        q = qkv[..., :Hk * Dk].reshape(B, N, Hk, Dk)
        k = qkv[..., Hk * Dk:2 * Hk * Dk].reshape(B, N, Hk, Dk)
        v = qkv[..., 2 * Hk * Dk:].reshape(B, N, Hv, Dv)
        z = F.linear(F.linear(hf, p["z_proj.lora_A"]), p["z_proj.lora_B"]) + p["z_bias"]
        b, a = F.linear(hf, p["in_proj_ba.weight"]).chunk(2, -1)
        beta = torch.sigmoid(b)
        g = -p["A_log"].exp() * F.softplus(a + p["dt_bias"])
        with torch.autocast(h.device.type, enabled=False):      # the recurrence in float32
            o, _ = chunk_gated_delta_rule(q.float(), k.float(), v.float(), g.float(),
                                          beta.float(), qk_l2norm=True, chunk_size=self.chunk)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.c.rms_norm_eps)
        o = o.reshape(B, N, Hv * Dv) * p["norm.weight"] * F.silu(z)
        out = F.linear(o.to(h.dtype), base["o"]).float() + \
            F.linear(F.linear(o, p["o_proj.lora_A"]), p["o_proj.lora_B"])
        return out.to(h.dtype), (o if want_heads else None)

    # ---------------------------------------------------------------- stacks
    def _layer_rest(self, L, x, mix, nxt):
        x, h = self.ops.add_norm(mix, x, L["ln2"])
        mlp = F.linear(self.ops.silu_mul(F.linear(h, L["gate_up"])), L["down"])
        return self.ops.add_norm(mlp, x, nxt)

    def _run(self, tokens, hybrid, collect=False):
        B, N = tokens.shape
        x = self.embed[tokens]
        h = self.ops.norm(x, self.layers[0]["ln1"])
        taps = {}
        for i, L in enumerate(self.layers):
            nxt = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.norm
            if hybrid and i in self.base:
                mix, _ = self.gdn_mixer(i, h)
            else:
                mix, heads = self.attention_mixer(L, h, N, want_heads=collect)
                if collect and i in self.base:
                    taps[i] = (h, mix, heads)
            x, h = self._layer_rest(L, x, mix, nxt)
        return h, taps

    def forward(self, tokens):
        """The hybrid over tokens [B, N] -> final normed hidden [B, N, H]."""
        return self._run(tokens, True)[0]

    def teacher(self, tokens):
        """SmolLM2 over tokens [B, N] -> (final normed hidden, {GDN layer i: (its normed
        input, the attention's o_proj output, the attention's head outputs)})."""
        with torch.no_grad():
            return self._run(tokens, False, collect=True)

    def logits(self, h):
        return F.linear(h, self.lm_head).float()

    # ---------------------------------------------------------------- calibration
    def calibrate_norms(self, taps, mask):
        """Data-dependent start for the gated norm: norm.weight = s (one number per layer),
        the least-squares scale of the layer's output (weight 1) onto the attention output it
        replaces over the valid rows ``mask`` [B, N] (the output is linear in the weight
        while o_proj's delta is zero, so this never raises the stage-1 loss; s >= 0.01)."""
        m = mask[..., None].float()
        with torch.no_grad():
            for i, (h, y, _) in taps.items():
                w = self.p[layer_prefix(i) + "norm.weight"]
                w.fill_(1.0)
                out, _ = self.gdn_mixer(i, h)
                out, y = out.float(), y.float()
                s = (out * y * m).sum() / (out * out * m).sum().clamp_min(1e-12)
                w.fill_(max(float(s), 0.01))
