"""The training set: the target's own greedy replies, decoded through the library, and the
npz they are kept in."""
from __future__ import annotations

import numpy as np


def generate(args, config, weights, tok, prompts, stop_ids):
    """The target's greedy replies to ``prompts`` (token id lists), through the library."""
    from ..models.llama import LlamaTarget
    from ..orchestrator import Request, SpeculativeDecoder, make_backend
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
