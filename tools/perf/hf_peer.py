"""The HF transformers peer for tools/perf/e2e_smollm2.py, and the cross-checks against it.

  python3 tools/perf/hf_peer.py --dir /tmp/m --gguf smol.gguf [--json OUT.json] [--skip-compiled]

1. Tokenizer: the chat-templated prompt's ids from transformers' GGUF tokenizer vs ours.
2. Host model: logits of one prompt from transformers (bf16 and fp32) vs our torch-backend
   LlamaTarget.score (bf16) -- max |diff|, argmax agreement per position.
3. Speed, greedy, generating through EOS: ``generate`` as shipped (B=1, dynamic cache, with and
   without prompt_lookup_num_tokens=3) and with a static cache + transformers' own compile
   (mode reduce-overhead: CUDA graphs) at B=1 (8 copy prompts x --new) and B=32 (mixed x --new32).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def timed_generate(model, tok, texts, new, **kw):
    """Greedy generate of each text alone (B=1); (tokens, seconds, outputs)."""
    import torch
    outs, n, secs = [], 0, 0.0
    for t in texts:
        ids = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        ids = {k: v.cuda() for k, v in ids.items()}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(**ids, max_new_tokens=new, do_sample=False, **kw)
        torch.cuda.synchronize()
        secs += time.perf_counter() - t0
        gen = out[0, ids["input_ids"].shape[1]:].tolist()
        n += len(gen)
        outs.append(gen)
    return n, secs, outs


def batched_generate(model, tok, texts, new, **kw):
    import torch
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                       tokenize=False) for t in texts]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(**enc, max_new_tokens=new, do_sample=False, **kw)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0], secs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/tmp/m")
    p.add_argument("--gguf", default="smol.gguf")
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--new32", type=int, default=128)
    p.add_argument("--json", default=None)
    p.add_argument("--skip-compiled", action="store_true")
    args = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from specdec_lib.models import load_smollm2_target
    from specdec_lib.models.smollm2 import COPY_PROMPTS, OPEN_PROMPTS, chat_prompt
    from specdec_lib.orchestrator import make_backend
    rep = {}
    tok = AutoTokenizer.from_pretrained(args.dir, gguf_file=args.gguf)
    model = AutoModelForCausalLM.from_pretrained(args.dir, gguf_file=args.gguf,
                                                 dtype=torch.bfloat16).cuda().eval()
    model.generation_config.eos_token_id = None          # through EOS, as ours in the bench
    model.generation_config.pad_token_id = tok.eos_token_id
    be = make_backend("torch")
    ours, our_tok = load_smollm2_target(be, path=os.path.join(args.dir, args.gguf), progress=False)

    # 1. tokenizer
    agree = []
    for t in COPY_PROMPTS[:4] + OPEN_PROMPTS[:4] + ["3.14159 + 27 = ? Ünïcödé, emoji 🙂, tabs\tand  spaces"]:
        hf_ids = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                         return_dict=True)["input_ids"]
        agree.append(list(hf_ids) == chat_prompt(our_tok, t))
    rep["tokenizer_agrees"] = f"{sum(agree)}/{len(agree)}"
    rep["golden_ids_hi"] = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                                   add_generation_prompt=True, return_dict=True)["input_ids"]
    print("tokenizer: ours == transformers on", rep["tokenizer_agrees"], "prompts")

    # 2. logits of one prompt
    ids = chat_prompt(our_tok, COPY_PROMPTS[0])
    ours.reset(1, len(ids) + 8)
    mine = np.asarray(ours.score(ids), dtype=np.float64)
    with torch.no_grad():
        hf16 = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
        m32 = AutoModelForCausalLM.from_pretrained(args.dir, gguf_file=args.gguf,
                                                   dtype=torch.float32).cuda().eval()
        hf32 = m32(torch.tensor([ids], device="cuda")).logits[0].double().cpu().numpy()
        del m32
    for lab, ref in (("hf_bf16", hf16), ("hf_fp32", hf32)):
        rep[f"logits_vs_{lab}"] = dict(
            max_abs=float(np.abs(mine - ref).max()),
            rel_norm=float(np.linalg.norm(mine - ref) / np.linalg.norm(ref)),
            argmax_agree=f"{int((mine.argmax(1) == ref.argmax(1)).sum())}/{len(ids)}")
    rep["hf_bf16_vs_fp32_rel_norm"] = float(np.linalg.norm(hf16 - hf32) / np.linalg.norm(hf32))
    print("logits:", json.dumps({k: v for k, v in rep.items() if k.startswith(("logits", "hf_"))}))

    # 3. speed
    n, s, plain_out = timed_generate(model, tok, COPY_PROMPTS[:2], args.new)
    rep["hf_plain_b1"] = dict(tokens=n, seconds=round(s, 3), tokens_per_s=round(n / s, 1))
    n, s, pl_out = timed_generate(model, tok, COPY_PROMPTS[:2], args.new, prompt_lookup_num_tokens=3)
    rep["hf_prompt_lookup_b1"] = dict(tokens=n, seconds=round(s, 3), tokens_per_s=round(n / s, 1),
                                      identical_to_plain=sum(a == b for a, b in zip(plain_out, pl_out)))
    print("hf plain / prompt lookup B=1:", rep["hf_plain_b1"], rep["hf_prompt_lookup_b1"])
    if not args.skip_compiled:
        from transformers import CompileConfig
        model.generation_config.cache_implementation = "static"
        model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
        # the first pass compiles (and records a graph per static-cache size): time the second
        t0 = time.perf_counter()
        timed_generate(model, tok, COPY_PROMPTS, args.new)
        rep["hf_compile_s_b1"] = round(time.perf_counter() - t0, 1)
        n, s, _ = timed_generate(model, tok, COPY_PROMPTS, args.new)
        rep["hf_compiled_b1"] = dict(tokens=n, seconds=round(s, 3), tokens_per_s=round(n / s, 1))
        print("hf compiled B=1:", rep["hf_compiled_b1"], "first pass (compiling)", rep["hf_compile_s_b1"], "s")
        texts = ((COPY_PROMPTS + OPEN_PROMPTS) * 2)[:32]
        t0 = time.perf_counter()
        batched_generate(model, tok, texts, args.new32)
        rep["hf_compile_s_b32"] = round(time.perf_counter() - t0, 1)
        n, s = batched_generate(model, tok, texts, args.new32)
        rep["hf_compiled_b32"] = dict(tokens=n, seconds=round(s, 3), tokens_per_s=round(n / s, 1))
        print("hf compiled B=32:", rep["hf_compiled_b32"], "first pass (compiling)", rep["hf_compile_s_b32"], "s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
