"""Training a head (AdamW, cosine schedule over a time budget, multi-step loss; from random
weights or a saved head) and the held-out report."""
from __future__ import annotations

import math
import time

import torch

from .head import DraftHead


def autocast(device):
    """bf16 autocast on a GPU; full precision (float32) on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def train_head(method, args, cfg, model, data, device, log, init=None):
    """Train one head on the training rows ``tr``; (head, ``family_report`` over ``groups``).
    ``init``: a saved head's directory to start from (its tensors and, for EAGLE3, its draft
    vocabulary) instead of random weights (and the vocabulary of the most frequent targets).

    The schedule is the same either way: a warm-up of 20 updates, then a cosine from
    ``args.lr`` to a tenth of it over the time budget. A continued head warms up again
    because its optimizer starts afresh (no Adam moments are saved with a head): the first
    updates of a zero second moment are about lr in size for every parameter, a kick a
    trained head would feel most; 20 updates are a sliver of a run. Whether to start lower
    than ``--lr`` is the user's choice."""
    tokens, lens, plens, hid, aux, arg, tr, groups = data
    head = DraftHead(method, cfg, model, device, args.seed)
    if init is not None:
        head.load(init, model.c.num_layers)
    if method == "eagle3":
        rows = tr.to(arg.device)
        valid = torch.arange(arg.shape[1], device=arg.device)[None] < lens[rows][:, None]
        counts = torch.bincount(arg[rows][valid], minlength=model.c.vocab_size)
        how_from = args.draft_vocab_from
        if init is None and how_from == "init":     # a fresh head has no init's to keep
            how_from = "data"
        if how_from != "init":
            ids = choose_vocab(counts, cfg["draft_vocab_size"], how_from)
        if init is None:
            head.set_vocab(ids)
            how = "" if how_from == "data" else f" ({how_from})"
        elif how_from != "init":
            how = (f" (re-chosen: {how_from}; {head.remap_vocab(ids)} kept from --init "
                   f"{init})")
        else:
            how = f" (--init {init}'s)"
        ids = head.d_ids.to(counts.device)
        cover = counts[ids].sum().item() / max(1, counts.sum().item())
        log(f"eagle3: draft vocabulary {len(ids)} tokens{how} covers {cover:.3f} of the targets")
    feat = hid if method == "mtp" else aux
    opt = torch.optim.AdamW(head.params(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    N = tokens.shape[1]
    bsz = max(1, args.batch_tokens // N)
    # the rows are drawn on the device: a pageable host-to-device copy of the picks would
    # wait for the stream every update, so the host could never queue ahead of the GPU
    gen = torch.Generator(device=device).manual_seed(args.seed)
    tr_dev = tr.to(device)
    weights_j = [0.8 ** j for j in range(args.steps)]
    amp = autocast(device)
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
        pick = tr_dev[torch.randint(len(tr_dev), (bsz,), generator=gen, device=device)]
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
    log(f"{method}: {it} updates of {bsz} sequences in {time.perf_counter() - t0:.0f} s"
        + (f", last loss {loss.item():.3f}" if it else ""))
    return head, family_report(head, feat, tokens, lens, plens, arg, groups, args, amp)


def choose_vocab(counts, size, how="data"):
    """An EAGLE3 draft vocabulary of ``size`` target ids (sorted) from ``counts`` (the
    training targets' counts per id): "data", the most frequent; "data+rank", the ids seen
    at least twice, most frequent first, then the lowest ids not chosen -- the tokenizer's
    own order, its most frequent pieces first for a BPE vocabulary -- so that text the data
    lacks (held-out families, other languages) is still covered (s47, SmolLM2 greedy
    replies to new prompts: 2,816 tokens from the data covered 87.5% of a general set and
    71% of the held-out families; grown by rank to 8,192, 90% / 86%)."""
    import torch
    order = counts.argsort(descending=True, stable=True)
    if how == "data":
        return order[:size].sort().values
    if how != "data+rank":
        raise ValueError(f"how: {how!r}; 'data' or 'data+rank'")
    seen = order[counts[order] >= 2][:size]
    taken = torch.zeros(len(counts), dtype=torch.bool, device=counts.device)
    taken[seen] = True
    rest = torch.nonzero(~taken).flatten()[:size - len(seen)]
    return torch.cat([seen, rest]).sort().values


def family_report(head, feat, tokens, lens, plens, arg, groups, args, amp):
    """``evaluate`` over all report rows (the top-level keys) and per family (``families``;
    ``groups`` is {family: row indices}); ``heldout_families`` names those never trained on."""
    from .prompt_mix import HELDOUT_FAMILIES
    rows = torch.cat(list(groups.values())) if groups else torch.zeros(0, dtype=torch.int64)
    out = evaluate(head, feat, tokens, lens, plens, arg, rows, args, amp)
    out["families"] = {f: dict(evaluate(head, feat, tokens, lens, plens, arg, r, args, amp),
                               sequences=len(r)) for f, r in groups.items()}
    out["heldout_families"] = [f for f in groups if f in HELDOUT_FAMILIES]
    return out


def report_table(name, report):
    """The per-family report as text: a row per family (``*``: never trained on), acceptance
    per draft position (P(steps 0..j all right)) and the mean accepted length a greedy decode
    gets at each k."""
    fams = report.get("families", {})
    S = len(report["chain_acceptance"])
    head = (f"{name}: acceptance per family and draft position (* = family held out of "
            f"training)\n  {'family':<13}{'seqs':>5}{'anchors':>8}  "
            + " ".join(f"pos{j + 1:<3}" for j in range(S)) + "   "
            + " ".join(f"k={k:<4}" for k in range(1, S + 1)))
    lines = [head]
    rows = list(fams.items()) + [("all", dict(report, sequences=sum(
        r.get("sequences", 0) for r in fams.values())))]
    for f, r in rows:
        mark = "*" if f in report.get("heldout_families", ()) else " "
        dec = r["decode_mean_accepted_length_at_k"]
        lines.append(f" {mark}{f:<13}{r.get('sequences', 0):>5}{r['anchors']:>8}  "
                     + " ".join(f"{a:<6.3f}" for a in r["chain_acceptance"]) + "   "
                     + " ".join(f"{dec[k]:<6.3f}" for k in range(1, S + 1)))
    return "\n".join(lines)


def evaluate(head, feat, tokens, lens, plens, arg, rows, args, amp):
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
