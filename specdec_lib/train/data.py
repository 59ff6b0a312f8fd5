"""The training set: the prompts (``--prompts-from mix`` or ``stdlib``), the target's own
replies, decoded through the library, and the npz they are kept in."""
from __future__ import annotations

import os
import random

import numpy as np

DOCSTRING = "docstring"     # the family of models.prompts' stdlib docstring prompts
SAMPLED_TEMPERATURE = 0.7   # --sampled-fraction's replies


class PromptSet:
    """Prompts as chat-templated token ids with, per prompt, its family, its split (0 train,
    1 held-out report) and the temperature its reply is generated at (0: greedy)."""

    def __init__(self):
        self.prompts, self.families, self.split, self.temps = [], [], [], []

    def add(self, prompts, family, split, temps=None):
        self.prompts += prompts
        self.families += [family] * len(prompts)
        self.split += [split] * len(prompts)
        self.temps += list(temps) if temps is not None else [0.0] * len(prompts)


def stdlib_set(args, tok):
    """Today's data (``--prompts-from stdlib``): the docstring prompts of ``models.prompts``,
    ``--prompts`` / ``--variants`` for training, the first ``--heldout`` held-out ones."""
    from ..models.prompts import stdlib_prompts
    from ..models.smollm2 import chat_prompt
    s = PromptSet()
    s.add([chat_prompt(tok, p) for p in stdlib_prompts("train", args.prompts, args.variants)],
          DOCSTRING, 0)
    s.add([chat_prompt(tok, p) for p in stdlib_prompts("heldout", args.heldout)], DOCSTRING, 1)
    return s


def mix_families():
    """(training families, held-out families) of ``--prompts-from mix``: the prompt mix's
    families that are trained on plus the stdlib docstrings, and its held-out ones."""
    from .prompt_mix import FAMILIES, HELDOUT_FAMILIES
    return [f for f in FAMILIES if f not in HELDOUT_FAMILIES] + [DOCSTRING], list(HELDOUT_FAMILIES)


MIX_VERSION = {"mix": 1, "mix2": 2}      # --prompts-from -> prompt_mix version


def mix_items(n_train, per_family, seed, version=1):
    """The mix as message lists: ``(family, messages, split)``.

    Training (split 0): ``n_train`` prompts spread evenly over the training families (the
    prompt mix's (of ``version``), less HELDOUT_FAMILIES, and the stdlib docstrings under all six
    instructions), seeded.  Report (split 1): ``per_family`` prompts of every family,
    disjoint from training: for a training family the first ``per_family`` of its seeded
    draw, for the docstrings the held-out modules' first ones (the stdlib report's set), for
    the held-out families their own draw (never in training).  Training prompts that contain
    a held-out docstring (``rewrite`` / ``summarise`` on a held-out module) or repeat a report
    prompt are dropped."""
    from ..models.prompts import stdlib_prompts
    from .prompt_mix import family_size, prompt_mix, shares
    train_f, held_f = mix_families()
    doc_pool = stdlib_prompts("train", None, 6)
    doc_held = stdlib_prompts("heldout", per_family)
    sizes = {f: max(0, (len(doc_pool) if f == DOCSTRING else family_size(f, version) - per_family))
             for f in train_f}
    want = shares(n_train, sizes)
    # held-out docstrings (all of them, not only the report's) never reach training
    held_docs = [p.split("\n\n", 1)[1] for p in stdlib_prompts("heldout", None, 1)]
    report, train = [], []
    for f in train_f:
        if f == DOCSTRING:
            pick = random.Random(f"{seed}:{DOCSTRING}").sample(range(len(doc_pool)), want[f])
            train += [(f, [{"role": "user", "content": doc_pool[i]}]) for i in pick]
            report += [(f, [{"role": "user", "content": p}]) for p in doc_held]
            continue
        items = prompt_mix(per_family + want[f], seed=seed, families=[f], version=version)
        report += [(f, it["messages"]) for it in items[:per_family]]
        train += [(f, it["messages"]) for it in items[per_family:]]
    for f in held_f:
        report += [(f, it["messages"])
                   for it in prompt_mix(per_family, seed=seed, families=[f], version=version)]
    seen = {repr(m) for _, m in report}
    out = [(f, m, 1) for f, m in report]
    for f, m in train:
        text = "\n".join(x["content"] for x in m)
        if repr(m) in seen or (f in ("rewrite", "summarise") and any(d in text for d in held_docs)):
            continue
        out.append((f, m, 0))
    return out


def mix_set(args, tok):
    """``--prompts-from mix`` / ``mix2``: ``mix_items`` (of that version) chat-templated; ``--sampled-fraction`` of the
    training replies (a seeded choice) sampled at SAMPLED_TEMPERATURE, the rest (and every
    report reply: the report walks greedy decodes) greedy."""
    from ..models.smollm2 import chat_prompt
    n = args.prompts if args.prompts is not None else 12000
    items = mix_items(n, args.heldout, args.seed,
                      MIX_VERSION[getattr(args, "prompts_from", "mix")])
    train = [i for i, (_, _, sp) in enumerate(items) if sp == 0]
    k = round(args.sampled_fraction * len(train))
    hot = set(random.Random(f"{args.seed}:sampled").sample(train, k))
    s = PromptSet()
    for i, (f, msgs, sp) in enumerate(items):
        s.add([chat_prompt(tok, msgs)], f, sp, [SAMPLED_TEMPERATURE if i in hot else 0.0])
    return s


def generate(args, config, weights, tok, prompts, stop_ids, temps=None):
    """The target's replies to ``prompts`` (token id lists), through the library: greedy, or
    sampled at ``temps[i]`` (> 0) with a fixed per-prompt seed (``--seed`` and the index)."""
    from ..models.llama import LlamaTarget
    from ..orchestrator import Request, SpeculativeDecoder, make_backend
    from tqdm import tqdm
    be = make_backend(args.backend)
    target = LlamaTarget(config, weights, be)
    temps = [0.0] * len(prompts) if temps is None else temps
    out = []
    # one decoder for every chunk: with max_len fixed its buffers, caches and graphs serve
    # each chunk of the same size (a decoder per chunk re-captured its graphs every time)
    max_len = max((len(p) for p in prompts), default=1) + args.gen_tokens + 2
    dec = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be,
                             cuda_graph=args.backend == "torch", max_len=max_len)
    bar = tqdm(total=len(prompts), desc="generating", unit="reply", disable=args.quiet)
    for i in range(0, len(prompts), args.gen_batch):
        chunk = prompts[i:i + args.gen_batch]
        res = dec.generate([Request(prompt=p, max_new_tokens=args.gen_tokens,
                                    stop_token_ids=list(stop_ids), temperature=t,
                                    seed=(args.seed * 1_000_003 + i + j) if t > 0 else 0)
                            for j, (p, t) in enumerate(zip(chunk, temps[i:i + len(chunk)]))])
        out += [r.tokens for r in res]
        bar.update(len(chunk))
    bar.close()
    return out


def save_data(path, seqs, prompt_lens, split, families=None, temps=None):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lens = np.asarray([len(s) for s in seqs], np.int64)
    extra = {}
    if families is not None:
        extra["families"] = np.asarray(families, dtype=str)
        extra["temperatures"] = np.asarray(temps if temps is not None else [0.0] * len(seqs),
                                           np.float32)
    np.savez_compressed(path, tokens=np.concatenate(seqs).astype(np.int32),
                        offsets=np.concatenate([[0], np.cumsum(lens)]),
                        prompt_lens=np.asarray(prompt_lens, np.int32),
                        split=np.asarray(split, np.int8), **extra)


def load_data(path):
    """(sequences, prompt lengths, split, families, temperatures); an npz written before
    families were recorded is all docstrings, greedy."""
    d = np.load(path)
    off = d["offsets"]
    tokens = d["tokens"]        # an NpzFile decompresses the array again on every d[...]
    seqs = [tokens[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    n = len(seqs)
    fams = d["families"].tolist() if "families" in d.files else [DOCSTRING] * n
    temps = d["temperatures"].tolist() if "temperatures" in d.files else [0.0] * n
    return seqs, d["prompt_lens"].tolist(), d["split"].tolist(), fams, temps


def load_base(args):
    """(config, weights, tokenizer, stop ids) of the model the trainers learn from: the
    ``--gguf`` Llama (its own tokenizer, template and end token) or SmolLM2 (checked)."""
    if args.gguf:
        from ..models.gguf_llama import read_gguf_llama
        config, weights, tok = read_gguf_llama(args.gguf, progress=not args.quiet)
        return config, weights, tok, [i for i in (config.eos_token_id,) if i is not None]
    from ..models.smollm2 import STOP_TOKEN_IDS, load_smollm2
    config, weights, tok = load_smollm2(progress=not args.quiet)
    return config, weights, tok, list(STOP_TOKEN_IDS)


def base_identity(args, config):
    """(name, GGUF sha256) of the base model ``load_base`` read: what a hybrid records as
    the model it was distilled from."""
    if args.gguf:
        from ..models.gguf_llama import sha256_of
        return config.name or os.path.basename(args.gguf), sha256_of(args.gguf)
    from ..models.smollm2 import GGUF_SHA256
    return "SmolLM2-135M-Instruct", GGUF_SHA256


def training_data(args, config, weights, tok, stop_ids, log, timing):
    """(sequences, prompt lengths, split, families, temperatures): read from ``--data`` when
    it exists, else the prompts (``--prompts-from``) and the target's replies to them,
    written to ``--data`` when given. train-draft and train-hybrid share it."""
    import time
    if args.data and os.path.exists(args.data):
        out = load_data(args.data)
        log(f"data: {len(out[0])} sequences from {args.data}")
        return out
    t0 = time.perf_counter()
    ps = (mix_set if args.prompts_from in MIX_VERSION else stdlib_set)(args, tok)
    outs = generate(args, config, weights, tok, ps.prompts, stop_ids, ps.temps)
    seqs = [list(p) + list(o) for p, o in zip(ps.prompts, outs)]
    plens = [len(p) for p in ps.prompts]
    timing["generate_s"] = round(time.perf_counter() - t0, 1)
    log(f"generated {sum(len(o) for o in outs)} tokens for {len(seqs)} prompts "
        f"({sum(t > 0 for t in ps.temps)} sampled) in {timing['generate_s']} s")
    if args.data:
        save_data(args.data, seqs, plens, ps.split, ps.families, ps.temps)
    return seqs, plens, ps.split, ps.families, ps.temps
