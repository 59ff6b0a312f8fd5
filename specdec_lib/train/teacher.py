"""The teacher: the target as plain torch over padded batches (``llama_layer.decoder_layer``
with ``llama_torch.TorchOps``, causal SDPA; or the GDN hybrid, ``HybridTeacher``), keeping
the features each head reads and the target's argmax at every position."""
from __future__ import annotations

import numpy as np
import torch

from ..models.llama_layer import decoder_layer, fuse_layer, layer_tensor_names
from ..models.llama_torch import TorchOps, attention, rope
from ..reference.layers import rope_cos_sin_cache

F = torch.nn.functional


class Teacher:
    """The target's weights in torch (the fused layer form of ``LlamaTarget``) and its
    forward pass over padded batches."""

    def __init__(self, config, weights, device, dtype):
        self.c, self.dev, self.dt = config, device, dtype
        P = lambda n: torch.from_numpy(np.array(weights[n], np.float32)).to(device, dtype)  # noqa: E731
        self.embed = P("model.embed_tokens.weight")
        self.lm_head = self.embed if config.tied_embeddings else P("lm_head.weight")
        self.norm = P("model.norm.weight")
        self.layers = [fuse_layer({r: P(n) for r, n in layer_tensor_names(f"model.layers.{i}.").items()},
                                  torch.cat) for i in range(config.num_layers)]
        cs = rope_cos_sin_cache(config.context_length, config.head_dim, config.rope_theta)
        self.cos_sin = torch.from_numpy(cs).to(device)
        self.ops = TorchOps(config.rms_norm_eps)
        self.heads = (config.num_heads, config.num_kv_heads, config.head_dim)

    def forward(self, tokens, taps):
        """tokens [B, N] -> (final hidden [B, N, H], aux [B, N, taps*H], argmax [B, N])."""
        B, N = tokens.shape
        D = self.c.head_dim
        cs = self.cos_sin[:N]
        cos, sin = cs[:, :D // 2], cs[:, D // 2:]

        def attend(q, k, v):
            return attention(rope(q, cos, sin), rope(k, cos, sin), v, causal=True)
        x = self.embed[tokens]
        h = self.ops.norm(x, self.layers[0]["ln1"])
        aux = []
        for i, L in enumerate(self.layers):
            if i in taps:
                aux.append(x)
            nxt = self.layers[i + 1]["ln1"] if i + 1 < len(self.layers) else self.norm
            x, h = decoder_layer(self.ops, L, h, x, nxt, attend, self.heads)
        return h, torch.cat(aux, -1) if aux else None, argmax(h, self.lm_head)


def argmax(h, lm_head, rows=256):
    """The greedy token of every position of h [B, N, H], [B, N] (logits a slice at a time)."""
    B, N, _ = h.shape
    arg = torch.empty((B, N), dtype=torch.int64, device=h.device)
    for r in range(0, N, rows):
        arg[:, r:r + rows] = F.linear(h[:, r:r + rows], lm_head).argmax(-1)
    return arg


class HybridTeacher:
    """The GDN hybrid (``train.hybrid_model.HybridModel``, its forward as trained) as the
    teacher of an MTP head: its final hidden and its argmax; no EAGLE3 taps. Carries what
    ``DraftHead`` reads of a target (embed, lm_head, cos_sin, c)."""

    def __init__(self, model):
        self.model, self.c, self.dev, self.dt = model, model.c, model.dev, model.dt
        self.embed, self.lm_head, self.cos_sin = model.embed, model.lm_head, model.cos_sin

    def forward(self, tokens, taps):
        if taps:
            raise ValueError("the hybrid teacher gives no EAGLE3 taps (MTP heads only)")
        h = self.model.forward(tokens)
        return h, None, argmax(h, self.lm_head)


def hybrid_teacher(args, config, weights, device, dtype):
    """(HybridTeacher, hybrid config) of the hybrid in ``args.hybrid`` (checked:
    ``load_hybrid_weights``) on the base ``config`` / ``weights``, which must be the base it
    was distilled from (the GGUF sha256 its config records)."""
    from ..models.smollm2_hybrid import check_base, load_hybrid_weights
    from .data import base_identity
    from .hybrid_model import HybridModel
    cfg, tensors = load_hybrid_weights(args.hybrid, base=config)
    name, sha = base_identity(args, config)
    check_base(cfg, sha, name, f"--hybrid {args.hybrid}", hint="; pass its --gguf")
    chunk = cfg.get("specdec_training", {}).get("chunk_size", 64)
    return HybridTeacher(HybridModel(config, weights, cfg, device, dtype, chunk_size=chunk,
                                     init=tensors)), cfg


def teacher(model, seqs, taps, device, bsz_tokens, quiet, final=True):
    """Padded tensors of every sequence: tokens, lengths, features, target argmax; the final
    hidden states None unless ``final``."""
    from tqdm import tqdm
    n = len(seqs)
    N = max(len(s) for s in seqs)
    c = model.c
    tokens = torch.zeros((n, N), dtype=torch.int64)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.from_numpy(np.asarray(s, np.int64))
    tokens = tokens.to(device)
    lens = torch.tensor([len(s) for s in seqs], device=device)
    hid = torch.zeros((n, N, c.hidden_size), dtype=model.dt, device=device) if final else None
    aux = torch.zeros((n, N, len(taps) * c.hidden_size), dtype=model.dt, device=device)
    arg = torch.zeros((n, N), dtype=torch.int64, device=device)
    step = max(1, bsz_tokens // N)
    with torch.no_grad():
        for i in tqdm(range(0, n, step), desc="teacher", disable=quiet):
            h, a, g = model.forward(tokens[i:i + step], taps)
            arg[i:i + step] = g
            if final:
                hid[i:i + step] = h
            if a is not None:
                aux[i:i + step] = a
    return tokens, lens, hid, aux, arg
