"""``python -m specdec_lib demo``: speculative decoding on the embedded tiny hybrid model.

Generates the demo checkpoint (deterministic weights, written as safetensors and read
back through the draft-weight registry), decodes a batch of random prompts twice --
target-only greedy and speculative greedy with an MTP draft head -- and reports the
acceptance rate, mean accepted length, tokens/s and the speed-up. ``lossless: yes``
means every request's speculative output equals its target-only output token for
token; otherwise it prints ``lossless: no`` and exits with status 1.

On a machine with a CUDA GPU, cupy and the compiled ops the run uses the ``cuda``
backend (dense math in cupy, every speculative op a library kernel); elsewhere the
numpy ``reference`` backend (the CPU run takes a few seconds at the defaults).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

from .models import TinyHybridTarget, TinyMTPDraft, load_demo_checkpoint, make_demo_checkpoint
from .orchestrator import Request, SpeculativeDecoder, make_backend


def add_workload_args(p):
    """The workload flags shared by the demo and tools/tp_demo.py."""
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3, metavar="K",
                   help="draft tokens proposed per round, 1..15 (default 3)")
    p.add_argument("--batch", type=int, default=4, metavar="B",
                   help="number of requests decoded together (default 4)")
    p.add_argument("--prompt-len", type=int, default=8, metavar="N",
                   help="tokens per random prompt; request b gets N + 3*b to make the batch "
                        "ragged (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="tokens generated per request (default 32; raise it on a GPU)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random prompts (the weights are fixed; default 0)")


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m specdec_lib demo",
        description="Speculative decoding (MTP draft head, chain drafts) on an embedded tiny "
                    "hybrid model (GDN + full-attention layers, paged KV), checked lossless "
                    "against target-only greedy decoding. Exit status 0 iff lossless.")
    p.add_argument("--backend", choices=("auto", "reference", "cuda"), default="auto",
                   help="'cuda': library kernels on the GPU with cupy for the dense math; "
                        "'reference': numpy reference ops on the CPU; 'auto' (default): cuda "
                        "when a GPU, cupy and the compiled extension are present, else reference")
    add_workload_args(p)
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="write the demo checkpoint (model.safetensors + config.json) into DIR "
                        "instead of a temporary folder, and keep it")
    p.add_argument("--layers", type=int, default=3, metavar="N",
                   help="target layers, the pattern gdn/attn/gdn repeated (default 3). The draft "
                        "is one MTP layer whatever N is, so a deeper target is where speculation "
                        "pays off on the GPU: this model's ops are so small that a round costs "
                        "about its number of kernel launches, draft and target alike")
    p.add_argument("--layer-scale", type=float, default=None, metavar="S",
                   help="strength of the target's context-dependent layers relative to its "
                        "fixed token map; higher means the draft is right less often "
                        "(default 0.08 * sqrt(3 / layers): roughly 3 of 4 drafts accepted)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="cuda backend: launch every op of every round from Python instead of "
                        "capturing the round once as a CUDA graph and replaying it (the "
                        "default: a round is then one graph launch)")
    p.add_argument("--no-progress", action="store_true",
                   help="do not draw the progress indicator (drawn on stderr when it is a terminal "
                        "and a run takes over a second)")
    return p


def _pick_backend(name):
    if name != "auto":
        return make_backend(name), None
    try:
        from . import runtime
        reason = runtime.gpu_unavailable_reason()
        if reason is None:
            return make_backend("cuda"), None
    except Exception as e:          # no cupy, ops not built, no driver ...
        reason = f"{type(e).__name__}: {e}"
    return make_backend("reference"), reason


class _Progress:
    """A one-line progress bar on stderr, drawn only once a run has taken over 1 s."""

    def __init__(self, label, enabled):
        self.label, self.enabled, self.t0, self.drawn = label, enabled, time.perf_counter(), False

    def __call__(self, done, total):
        if not self.enabled or time.perf_counter() - self.t0 < 1.0:
            return
        frac = done / total if total else 1.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r  {self.label:<12} [{bar:<30}] {done}/{total} tokens")
        sys.stderr.flush()
        self.drawn = True

    def close(self):
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    k = args.num_speculative_tokens
    if not 1 <= k <= 15:
        print(f"error: --num-speculative-tokens must be in 1..15, got {k}", file=sys.stderr)
        return 2
    if args.batch < 1 or args.prompt_len < 1 or args.max_new_tokens < 1:
        print("error: --batch, --prompt-len and --max-new-tokens must be >= 1", file=sys.stderr)
        return 2
    be, why = _pick_backend(args.backend)
    where = "GPU (library kernels, cupy dense math)" if be.name == "cuda" else \
        "CPU (numpy reference ops)"
    print(f"backend: {be.name} -- {where}" + (f"; no GPU path: {why.split(' (')[0]}" if why else ""))

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
    overrides = {"demo_layer_scale": scale,
                 "layer_types": (pattern * args.layers)[:args.layers]}
    make_demo_checkpoint(path, overrides)
    config, tensors, draft_weights = load_demo_checkpoint(path)
    print(f"model: vocab {config['vocab_size']}, hidden {config['hidden_size']}, layers "
          f"{'/'.join('gdn' if t == 'linear_attention' else 'attn' for t in config['layer_types'])}"
          f", draft {draft_weights.spec.layout} ({len(draft_weights.names())} tensors, "
          f"read lazily from {path}/model.safetensors)")

    target = TinyHybridTarget(config, tensors, be)
    draft = TinyMTPDraft(config, draft_weights, tensors, be)
    rng = np.random.default_rng(args.seed)
    V = config["vocab_size"]
    reqs = [Request(prompt=rng.integers(0, V, size=args.prompt_len + 3 * b).tolist(),
                    max_new_tokens=args.max_new_tokens) for b in range(args.batch)]
    show = not args.no_progress and sys.stderr.isatty()

    # warm-up (kernel loading / JIT, cupy plans) so the timed runs compare like with like
    graph = be.name == "cuda" and not args.no_cuda_graph
    warm = [Request(prompt=r.prompt[:2], max_new_tokens=4) for r in reqs[:1]]
    SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be,
                       cuda_graph=graph).generate(warm)
    SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be,
                       cuda_graph=graph).generate(warm)

    base_dec = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=be,
                                  cuda_graph=graph)
    bar = _Progress("target-only", show)
    base = base_dec.generate(reqs, progress=bar)
    bar.close()
    spec_dec = SpeculativeDecoder(target, draft, num_speculative_tokens=k, backend=be,
                                  cuda_graph=graph)
    bar = _Progress("speculative", show)
    spec = spec_dec.generate(reqs, progress=bar)
    bar.close()

    mb, ms = base_dec.metrics, spec_dec.metrics
    print(f"requests: {len(reqs)}, prompt lengths {[len(r.prompt) for r in reqs]}, "
          f"{args.max_new_tokens} new tokens each, k = {k}")
    how = "CUDA graph per round" if graph else "ops launched from Python"
    for name, mm in (("target-only", mb), ("speculative", ms)):
        print(f"{name:12s}: {mm.emitted} tokens in {mm.wall_s:.3f} s = {mm.tokens_per_s:,.1f} "
              f"tokens/s ({mm.rounds} target passes; host {mm.host_us_per_round:,.0f} us to "
              f"enqueue a round, {how})")
    print(f"acceptance rate: {ms.acceptance_rate:.3f}  (per position: "
          + ", ".join(f"{x:.2f}" for x in ms.per_position_acceptance) + ")")
    print(f"mean accepted length: {ms.mean_accepted_length:.2f} tokens per target pass")
    print(f"speed-up over target-only: {ms.tokens_per_s / mb.tokens_per_s:.2f}x"
          + ("  (CPU reference ops are per-token loops: a verify block costs about as "
             "much as its rows decoded one by one)" if be.name == "reference" else ""))
    bad = [b for b, (x, y) in enumerate(zip(spec, base)) if x.tokens != y.tokens]
    if tmp is not None:
        tmp.cleanup()
    if bad:
        b = bad[0]
        x, y = spec[b].tokens, base[b].tokens
        i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        print(f"request {b}: first difference at output token {i}: speculative "
              f"{x[i:i + 4]} vs target-only {y[i:i + 4]}")
        print(f"lossless: no ({len(bad)} of {len(reqs)} requests differ)")
        return 1
    print("lossless: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
