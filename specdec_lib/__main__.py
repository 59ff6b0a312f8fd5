"""``python -m specdec_lib {demo,inspect,bench,info,train-draft,train-hybrid,eval-hybrid,
pack-weights}`` (also the ``specdec`` console script); ``--version`` prints the package
version."""
import json
import sys

USAGE = """usage: python -m specdec_lib [--version] COMMAND [args]

commands:
  demo      decode SmolLM2-135M-Instruct speculatively with its trained MTP head (GPU if
            present, else the CPU reference backend) and check it is lossless; --model
            tiny-hybrid runs the embedded hybrid (GDN + attention) model (demo --help)
  inspect   list every shipped cubin's kernels, registers, shared/local memory, params
            (--check: fail on missing cubins, local memory, param-size mismatches)
  bench     benchmark ops against the copy bandwidth measured in the same run
  info      which kernel image runs on this machine's GPU, as JSON
  train-draft
            train MTP / EAGLE3 draft heads for a Llama target, or an MTP head for a
            smollm2-hybrid (--hybrid DIR) (needs torch and the model extra; --help lists
            the options)
  train-hybrid
            distil SmolLM2 into its gated-delta-net hybrid (smollm2-hybrid; needs torch
            and the model extra; --help lists the options)
  eval-hybrid
            a smollm2-hybrid's quality against its base: perplexity on held-out natural
            text, greedy replies to 16 held-out prompts, as JSON / markdown (needs torch
            and the model extra; --help lists the options)
  pack-weights
            pack weights directories' model.safetensors losslessly (model.safetensors.packed,
            how the trained weights ship; --unpack restores them)
"""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "--version":
        from . import __version__
        print(f"specdec_lib {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo import main as run
    elif cmd == "inspect":
        from .cubins import main as run
    elif cmd == "bench":
        from .bench import main as run
    elif cmd == "train-draft":
        from .train.cli import main as run
    elif cmd == "train-hybrid":
        from .train.hybrid import main as run
    elif cmd == "eval-hybrid":
        from .train.hybrid_eval import main as run
    elif cmd == "pack-weights":
        from .models.packed import main as run
    elif cmd == "info":
        from . import runtime
        print(json.dumps(runtime.info(load="--load" in rest), indent=1, default=str))
        return 0
    else:
        print(f"unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
