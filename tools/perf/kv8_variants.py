"""Which 8-bit KV scheme could reach issue 32's agreement bar (>= 99% of greedy positions
equal to the 16-bit cache's)? A CPU experiment in torch over SmolLM2 (float32 math, every
layer's post-rope K and V passed through a simulated cache: rounded to bf16 for the base, or
quantised and dequantised), teacher-forced over natural text windows (``hybrid_eval``'s
sources), scored as the share of positions whose argmax equals the base's.

Schemes (each a K treatment x a V treatment; --schemes K:V,...), rounded by the library's
numpy reference of the kernels (``reference.kvquant``), fp8 scales recorded per layer and KV
head on the first half of the windows (``models.llama``'s rule: amax x 2 / 448), scored on
the second half:
  f32 / bf16  no rounding (the floor) / the 16-bit cache (the base)
  fp8         e4m3, the shipped scheme
  fp8-shift   fp8 of x minus its per-channel mean mu, added back; for K a kernel need not add
              it back (softmax is invariant to q . mu: append side only), for V the output
              gains mu (sum P = 1)
  fp8-rot     fp8 of x times an orthonormal Hadamard matrix H, rotated back: q . k =
              (q H) . (k H), so a kernel would rotate q and the appended k (V: the output, or
              W_o offline)
  int8        per-token asymmetric (TurboMind), the shipped int8 scheme

    python tools/perf/kv8_variants.py [--windows 16] [--window 256] [--json F]
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
import torch

from specdec_lib.models.llama import FP8_SCALE_HEADROOM, _fp8_scale
from specdec_lib.models.llama_layer import decoder_layer
from specdec_lib.models.llama_torch import attention, rope
from specdec_lib.models.smollm2 import load_smollm2
from specdec_lib.reference.kvquant import (fp8_dequantize, fp8_quantize, int8_dequantize,
                                           int8_quantize)
from specdec_lib.train.hybrid_eval import NATURAL_SOURCES, source_windows
from specdec_lib.train.teacher import Teacher


@functools.lru_cache(maxsize=None)
def hadamard(n):
    """The n x n Sylvester Hadamard matrix / sqrt(n) (n a power of two): orthonormal, so
    q . k = (q H) . (k H): a rotation spreads a few large channels over all of them."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


# fp8 schemes: (what is quantised, how to undo it) of x [B, N, H, D] and its channel mean mu
FP8_FORMS = {
    "fp8": (lambda x, mu: x, lambda y, mu: y),
    "fp8-shift": (lambda x, mu: x - mu, lambda y, mu: y + mu),
    "fp8-rot": (lambda x, mu: x @ hadamard(x.shape[-1]), lambda y, mu: y @ hadamard(y.shape[-1]).T),
}


def record(x):
    """A recording pass's statistics of x [B, N, H, D]: the channel mean and, per fp8 form,
    the per-head scale the target would record (``models.llama``'s rule and headroom)."""
    mu = x.mean(dim=(0, 1))
    st = {"mu": mu}
    for name, (fwd, _) in FP8_FORMS.items():
        amax = fwd(x, mu).abs().amax(dim=(0, 1, 3)).numpy()
        st[name] = _fp8_scale(np, amax, FP8_SCALE_HEADROOM).astype(np.float32)[:, None]
    return st


def treat(x, how, st):
    """One of K / V through scheme ``how``, rounded as the library's cache rounds it (the
    numpy reference of the kernels: ``reference.kvquant``); ``st``: ``record``'s statistics."""
    if how == "bf16":
        return x.to(torch.bfloat16).float()
    if how == "f32":             # no cache rounding at all: the floor of the comparison
        return x
    if how == "int8":
        return torch.from_numpy(int8_dequantize(*int8_quantize(x.numpy())))
    fwd, back = FP8_FORMS[how]
    y = fwd(x, st["mu"]).numpy()
    y = fp8_dequantize(fp8_quantize(y, st[how]), st[how])
    return back(torch.from_numpy(y.astype(np.float32)), st["mu"])


def argmax(m, tokens, k_how, v_how, stats):
    """[B, N] greedy tokens of Teacher ``m`` over ``tokens`` with every layer's post-rope K
    and V passed through the schemes; an empty ``stats`` is filled (a recording pass)."""
    N = tokens.shape[1]
    D = m.c.head_dim
    cos, sin = m.cos_sin[:N, :D // 2], m.cos_sin[:N, D // 2:]
    x = m.embed[tokens]
    h = m.ops.norm(x, m.layers[0]["ln1"])
    rec = not stats
    for i, L in enumerate(m.layers):
        def attend(q, k, v, i=i):
            k = rope(k, cos, sin)
            if rec:
                stats[("k", i)], stats[("v", i)] = record(k), record(v)
            k = treat(k, k_how, stats[("k", i)])
            v = treat(v, v_how, stats[("v", i)])
            return attention(rope(q, cos, sin), k, v, causal=True)
        nxt = m.layers[i + 1]["ln1"] if i + 1 < len(m.layers) else m.norm
        x, h = decoder_layer(m.ops, L, h, x, nxt, attend, m.heads)
    return torch.nn.functional.linear(h, m.lm_head).argmax(-1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sources", default="python-reference,idle-help,package-readmes,python-license")
    ap.add_argument("--schemes", help="K:V pairs, comma-separated (default: all below)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    config, weights, tok = load_smollm2(progress=False)
    m = Teacher(config, weights, "cpu", torch.float32)
    names = a.sources.split(",")
    wins = []
    for n in names:
        text, _ = NATURAL_SOURCES[n][1]()
        if len(text) > 200:
            wins += source_windows(text, tok, a.window * (a.windows // len(names)), a.window)
    wins = [w for w in wins if len(w) == a.window][:a.windows]
    tokens = torch.tensor(wins)
    print(f"{len(wins)} windows of {a.window} tokens")
    # the scales come from a recording pass over the first half, the scoring over the second:
    # a deployed target records once, then serves other text
    half = max(1, len(wins) // 2)
    stats = {}
    argmax(m, tokens[:half], "bf16", "bf16", stats)
    test = tokens[half:]
    t0 = time.perf_counter()
    base = argmax(m, test, "bf16", "bf16", stats)
    print(f"base {time.perf_counter() - t0:.1f} s")
    rows = []
    pairs = [("f32", "f32"), ("fp8", "fp8"), ("fp8-shift", "fp8"), ("fp8", "fp8-shift"),
             ("fp8-shift", "fp8-shift"), ("fp8", "bf16"), ("bf16", "fp8"),
             ("fp8-rot", "fp8"), ("fp8-rot", "fp8-rot"), ("fp8-rot", "bf16"), ("bf16", "fp8-rot"),
             ("int8", "int8"), ("int8", "bf16"), ("bf16", "int8")]
    if a.schemes:
        pairs = [tuple(p.split(":")) for p in a.schemes.split(",")]
    for k_how, v_how in pairs:
        got = argmax(m, test, k_how, v_how, stats)
        agree = float((got == base).double().mean())
        rows.append(dict(k=k_how, v=v_how, agreement=round(agree, 5)))
        print(f"K {k_how:10s} V {v_how:10s} agreement {agree:.4%}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(windows=len(wins), window=a.window, scored=int(test.numel()), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
