"""A draft head being trained: its parameters (float32, trainable), the unrolled multi-step
forward (``llama_layer.draft_step`` in torch: what ``LlamaDraftHead`` runs at decode time),
the labels of every step, and export / load in the registry layout (``head_tensor_names``)."""
from __future__ import annotations

import math
import os

import numpy as np
import torch

from ..models.llama_layer import draft_step, fuse_layer, head_tensor_names
from ..models.llama_torch import TorchOps, attention, rope

F = torch.nn.functional


class DraftHead:
    """The head's parameters by role (``head_tensor_names``) and its unrolled forward."""

    def __init__(self, method, cfg, target, device, seed):
        self.method, self.cfg, self.T = method, cfg, target
        self.layout = "eagle3" if method == "eagle3" else "deepseek_mtp"
        g = torch.Generator(device="cpu").manual_seed(seed)
        H, nq, nkv, D = cfg["hidden_size"], cfg["num_attention_heads"], \
            cfg["num_key_value_heads"], cfg["head_dim"]
        I = cfg["intermediate_size"]
        self.H, self.heads = H, (nq, nkv, D)
        self.ops = TorchOps(cfg["rms_norm_eps"])

        def rnd(*shape, std=0.02):
            return (torch.randn(*shape, generator=g) * std).to(device).requires_grad_()

        def ones(n):
            return torch.ones(n, device=device).requires_grad_()

        a_in = 2 * H if method == "eagle3" else H
        self.p = dict(norm_e=ones(H), norm_h=ones(H), ln2=ones(H), final=ones(H),
                      q=rnd(nq * D, a_in), k=rnd(nkv * D, a_in), v=rnd(nkv * D, a_in),
                      o=rnd(H, nq * D, std=0.02 / math.sqrt(2)),
                      gate=rnd(I, H), up=rnd(I, H), down=rnd(H, I, std=0.02 / math.sqrt(2)))
        if method == "mtp":
            self.p["fc"] = rnd(H, 2 * H)
            self.p["ln1"] = ones(H)
            self.lm_head = target.lm_head.float()
        else:
            taps = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
            self.p["fc"] = rnd(H, taps * H)
            self.lm_head = None                        # set by set_vocab
        self.embed = target.embed.float()

    def set_vocab(self, t2d_ids):
        """EAGLE3: the draft vocabulary (target ids, most frequent first); lm_head starts as
        those rows of the target's output embedding."""
        self.d_ids = t2d_ids
        self.p["lm_head"] = self.T.lm_head.float()[t2d_ids].clone().requires_grad_()
        self.to_draft = torch.full((self.T.c.vocab_size,), -1, dtype=torch.int64,
                                   device=t2d_ids.device)
        self.to_draft[t2d_ids] = torch.arange(len(t2d_ids), device=t2d_ids.device)

    def remap_vocab(self, t2d_ids):
        """EAGLE3: a new draft vocabulary for a loaded head (``--draft-vocab-from data``):
        tokens it already had keep their trained lm_head rows, new ones start as the
        target's (as ``set_vocab``). How many were kept."""
        old_rows, old_map = self.p["lm_head"].detach(), self.to_draft
        t2d_ids = t2d_ids.to(old_map.device)
        self.set_vocab(t2d_ids)
        prev = old_map[t2d_ids]
        kept = prev >= 0
        with torch.no_grad():
            self.p["lm_head"][kept] = old_rows[prev[kept]]
        return int(kept.sum().item())

    def params(self):
        return list(self.p.values())

    def unrolled(self, feat, tokens, steps):
        """feat [B, N, F] target features, tokens [B, N]: logits of every step, [B, N, V']."""
        p = self.p
        B, N = tokens.shape
        D = self.heads[2]
        cs = self.T.cos_sin
        P = dict(fuse_layer(p, torch.cat), fc=p["fc"], norm_e=p["norm_e"], norm_h=p["norm_h"],
                 final=p["final"])
        lm = p["lm_head"] if self.method == "eagle3" else self.lm_head
        hid = feat
        keys, vals, outs = [], [], []
        pos = torch.arange(N, device=tokens.device)
        causal = torch.ones((N, N), dtype=torch.bool, device=tokens.device).tril()
        diag = torch.eye(N, dtype=torch.bool, device=tokens.device)
        for j in range(steps):
            nxt = torch.zeros_like(tokens)
            nxt[:, :N - j - 1] = tokens[:, j + 1:]           # token p+j+1
            r = cs[(pos + j).clamp(max=cs.shape[0] - 1)]
            cos, sin = r[:, :D // 2], r[:, D // 2:]

            def attend(q, k, v, j=j, cos=cos, sin=sin):
                q, k = rope(q, cos, sin), rope(k, cos, sin)
                keys.append(k)
                vals.append(v)
                if j == 0:
                    return attention(q, k, v, causal=True)
                # step-0 keys of positions <= p, then this chain's own keys (the diagonal)
                mask = torch.cat([causal] + [diag] * j, 1)
                return attention(q, torch.cat(keys, 1), torch.cat(vals, 1), mask=mask)
            x, hn = draft_step(self.ops, self.layout, P, self.embed, hid, nxt, attend,
                               self.heads, self.H)
            outs.append(F.linear(hn, lm))
            hid = x
        return outs

    def labels(self, arg, lens, prompt_lens, steps):
        """Per step: the label (target argmax at p+j+1, draft ids for EAGLE3; -100 where
        the step does not count) [B, N]."""
        B, N = arg.shape
        pos = torch.arange(N, device=arg.device)[None]
        out = []
        for j in range(steps):
            lab = torch.full_like(arg, -100)
            lab[:, :N - j - 1] = arg[:, j + 1:]
            ok = (pos + j + 1) < lens[:, None]
            if j:                                       # fed tokens are the target's own
                ok &= (pos + j + 1) >= prompt_lens[:, None]
            lab = torch.where(ok, lab, torch.full_like(lab, -100))
            if self.method == "eagle3":
                mapped = self.to_draft[lab.clamp(min=0)]
                lab = torch.where((lab >= 0) & (mapped < 0), torch.full_like(lab, -100),
                                  torch.where(lab >= 0, mapped, lab))
            out.append(lab)
        return out

    def names(self, prefix_layer):
        """{parameter role: tensor name} in the registry layout."""
        pre = f"model.layers.{prefix_layer}." if self.method == "mtp" else "midlayer."
        names = head_tensor_names(self.layout, pre)
        return {k: names[k] for k in self.p}

    def load(self, path, prefix_layer):
        """Take the tensors of a saved head (the inverse of ``export``)."""
        from ..registry import open_safetensors
        dev = self.embed.device
        # a shipped head's model.safetensors.packed is read in its place
        found = dict(open_safetensors(os.path.join(path, "model.safetensors")).items())
        if self.method == "eagle3":
            d2t = np.asarray(found["d2t"].numpy(), np.int64)
            self.set_vocab(torch.from_numpy(np.arange(len(d2t)) + d2t).to(dev))
        with torch.no_grad():
            for key, name in self.names(prefix_layer).items():
                self.p[key].copy_(torch.from_numpy(np.array(found[name].float32())).to(dev))
        return self

    def export(self, cfg, prefix_layer):
        """Tensors in the registry layout (bfloat16; d2t/t2d for EAGLE3)."""
        bf = lambda x: x.detach().to(torch.bfloat16).cpu().contiguous()  # noqa: E731
        out = {name: bf(self.p[k]) for k, name in self.names(prefix_layer).items()}
        if self.method == "eagle3":
            ids = self.d_ids.cpu()
            out["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)
            t2d = torch.zeros(self.T.c.vocab_size, dtype=torch.bool)
            t2d[ids] = True
            out["t2d"] = t2d
        return out
