"""The training data's command-line arguments, shared by ``train-draft`` and ``train-hybrid``
(both read or write the same npz of generated sequences: no torch here, so ``--help`` works
without it)."""
from __future__ import annotations


def add_data_arguments(p):
    p.add_argument("--data", default=None, help="npz of generated sequences: read if it "
                   "exists, else written after generation")
    p.add_argument("--prompts-from", choices=("mix", "mix2", "stdlib"), default="mix",
                   help="mix: the prompt mix (specdec_lib.train.prompt_mix: 9 task families "
                   "trained on + stdlib docstrings; translation and multi-turn chat held out); "
                   "mix2: its version 2 (advice and code grown, s27); "
                   "stdlib: standard-library docstrings only (the data of the heads before the mix)")
    p.add_argument("--prompts", type=int, default=None, help="training prompts (mix: spread "
                   "evenly over the training families, default 12000; stdlib: default all)")
    p.add_argument("--variants", type=int, default=2, help="stdlib: instructions per docstring")
    p.add_argument("--heldout", type=int, default=64, help="report prompts (mix: per family, "
                   "none of them trained on; stdlib: in all)")
    p.add_argument("--sampled-fraction", type=float, default=0.0, help="this fraction of the "
                   "training replies sampled at temperature 0.7 (fixed seeds), the rest greedy")
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=256)
    p.add_argument("--backend", choices=("torch", "reference"), default="torch",
                   help="generation backend (reference: numpy on the CPU, for tests)")


def parse_args(p, argv):
    """``p.parse_args(argv)`` with the data arguments' range checks."""
    args = p.parse_args(argv)
    if not 0.0 <= args.sampled_fraction <= 1.0:
        p.error(f"--sampled-fraction: 0..1, not {args.sampled_fraction}")
    for name in ("prompts", "heldout"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            p.error(f"--{name}: must be >= 0")
    return args
