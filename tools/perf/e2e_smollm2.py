"""End-to-end benchmark of SmolLM2-135M-Instruct through the library (torch backend, GPU).

  python3 tools/perf/e2e_smollm2.py [--gguf PATH] [--new 256] [--json OUT.json] [--quick]
                               [--drafts ngram,mtp,eagle3] [--sets copy,open,heldout]

Runs, each with the round captured as one CUDA graph (warm-up and capture outside the timing):
  * B=1 greedy, up to --per-set prompts per set (the 8 copy-heavy, the 8 open-ended, and 32
    held-out standard-library docstring prompts that the trained heads never saw), one
    request at a time: target-only and each draft (prompt lookup, the trained MTP and EAGLE3
    heads; k=3, and the heads again at --head-k), tokens/s, acceptance per position, mean
    accepted length; generation runs through EOS (no stop ids) for a fixed token count
    unless --stop-at-eos;
  * B=32 mixed prompts (--b32 B; --batches B,B: more sizes): target-only and each draft (at
    each --mixed-k);
  * --serve N: N mixed requests served through the mixed case's B slots (the batched cases'
    modes timed in turns, ABBA, --batch-repeats each, after an untimed run: ``interleaved``);
  * --auto K_MAX: each draft also with num_speculative_tokens="auto" in every case above
    (its round costs measured and graphs recorded in the warm-up, outside the timing);
  * the rescoring check of every emitted token (one plain forward pass over each final
    sequence; a token within --tie-tolerance of the best logit is a tie, counted);
  * where a round's GPU time goes (torch.profiler over graph replays, kernels grouped).
Prints one summary table; --json writes every number.

--kv-dtype bfloat16|fp8_e4m3|int8: the target's KV cache (the heads' own stay bf16); every
case above then runs over that cache. --long-context N instead runs only the long-context
case (issue 32's bar): --long-batch requests of an N-token prompt (held-out prompts
concatenated), --new32 new tokens each, target-only and each draft at -k, with a bf16-cache
target and a --kv-dtype one in the same run, decode tokens/s (prefill left out) and the
8-bit / bf16 ratio. On the H200:

  python3 tools/perf/e2e_smollm2.py --long-context 8192 --kv-dtype fp8_e4m3 --drafts mtp \
      --long-batch 1 --new32 256 --json long_fp8.json     # and again with --kv-dtype int8,
                                                          # --long-batch 16 for a batch

--kv-agreement fp8_e4m3,int8 instead runs only the agreement case (issue 32's bar; see
kv_agreement below): greedy replies of a bf16-cache target and of each 8-bit one, --per-set
prompts of --sets (default general) in one batch, teacher-forced agreement with the bf16
tokens, free-running divergences, speculative == target-only per cache dtype:

  python3 tools/perf/e2e_smollm2.py --kv-agreement fp8_e4m3,int8 --per-set 32 --new 128 \
      --json kv_agreement.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from specdec_lib.demo import rescoring_check  # noqa: E402
from specdec_lib.models import load_smollm2_hybrid_target, load_smollm2_target  # noqa: E402
from specdec_lib.models.heads import hybrid_head, smollm2_head  # noqa: E402
from specdec_lib.models.kv_agreement import agreement, first_divergence, teacher_forced  # noqa: E402
from specdec_lib.models.llama_draft import LlamaDraftHead  # noqa: E402
from specdec_lib.models.ngram import NgramDraft  # noqa: E402
from specdec_lib.models.prompts import stdlib_prompts  # noqa: E402
from specdec_lib.models.smollm2 import (COPY_PROMPTS, OPEN_PROMPTS, STOP_TOKEN_IDS,  # noqa: E402
                                        chat_prompt)
from specdec_lib.orchestrator import (  # noqa: E402
    AutoK, PrefillPolicy, Request, SpeculativeDecoder, make_backend)
from specdec_lib.orchestrator.policy import _median  # noqa: E402

PREFILL = PrefillPolicy()       # --prefill: every decoder's (one for all modes of a run)


def add_decode_options(p):
    """The target's and heads' decode switches (here and in host_phases.py)."""
    p.add_argument("--small-rows-max", type=int, default=None, metavar="R", help="the target's "
                   "decode passes of <= R rows on linear (models.llama.SMALL_ROWS_MAX_MMA, "
                   "default 32, at most 256 on the tensor cores: a small batch's passes too, "
                   "then row-invariant; past R the host's GEMM; SMALL_ROWS_MAX, default 5, at "
                   "most 8, where linear's few-row calls are forced onto the CUDA cores)")
    p.add_argument("--unfused-head", action="store_true", help="the draft heads' steps "
                   "without the norms in linear's prologues and silu_mul in its epilogue "
                   "(LlamaDraftHead.fused_step = False; the default fuses them)")
    p.add_argument("--whole-blocks", action="store_true", help="every slot verifies a whole "
                   "block every round, idle ones included (orchestrator.serve.LIVE_ROWS = "
                   "False; by default rounds with at most half the slots busy verify one row "
                   "for each idle slot past the smallest live count, an eighth or a half of "
                   "the slots, that holds the busy ones)")
    p.add_argument("--pageable-upload", action="store_true", help="admissions' and "
                   "prefills' host->device copies from pageable memory, which wait for the "
                   "round run ahead (orchestrator.state.ASYNC_UPLOAD = False; the default "
                   "copies through a pinned staging ring)")


def apply_decode_options(p, args):
    """Set what ``add_decode_options``' flags ask (before any model is built)."""
    R = args.small_rows_max
    if R is not None:
        if not 1 <= R <= 256:
            p.error("--small-rows-max: 1 .. 256 (LINEAR_MMA_MAX_ROWS)")
        from specdec_lib.models import llama
        llama.SMALL_ROWS_MAX, llama.SMALL_ROWS_MAX_MMA = min(R, 8), R
    if args.unfused_head:
        LlamaDraftHead.fused_step = False
    if args.pageable_upload:
        from specdec_lib.orchestrator import state
        state.ASYNC_UPLOAD = False
    if args.whole_blocks:
        from specdec_lib.orchestrator import serve
        serve.LIVE_ROWS = False


def add_prefill_options(p):
    """Every decoder's prefill policy (here and in served_timeline.py)."""
    p.add_argument("--prefill", default="auto", help="every decoder's prefill policy: auto "
                   "(default: bursts of 16+ admissions batched and eager, others bucket "
                   "replays), batched, bucketed, or auto:N (batched from bursts of N). "
                   "s21: target-only's served requests finish in lockstep and burst; the 16 "
                   "was tuned on SmolLM2, not the hybrid")
    p.add_argument("--prefill-group", type=int, default=None, metavar="G", help="prompts a "
                   "bucket pass may hold (PrefillPolicy.group; 1: a pass a prompt)")
    p.add_argument("--prefill-hold", type=int, default=None, metavar="H", help="rounds a "
                   "served stream's free slots may wait for a group (PrefillPolicy.hold_rounds)")


def prefill_policy(args):
    """The PrefillPolicy of ``add_prefill_options``' flags: --prefill ``auto``, ``batched``,
    ``bucketed`` or ``auto:N`` (batched from bursts of N), --prefill-group, --prefill-hold."""
    mode, _, n = args.prefill.partition(":")
    kw = dict(batched_from=int(n)) if n else {}
    if args.prefill_group is not None:
        kw["group"] = args.prefill_group
    if args.prefill_hold is not None:
        kw["hold_rounds"] = args.prefill_hold
    return PrefillPolicy(mode, **kw)


class PinnedK(AutoK):
    """``AutoK(k_max)`` that proposes ``k`` every round (fixed costs: no calibration, no
    probes): a fixed k run through auto's machinery and k_max-wide buffers, to tell which of
    the two makes auto's round at k slower than ``FixedK(k)``'s (s32: 1449 vs 1325 us)."""

    def __init__(self, k_max: int, k: int):
        super().__init__(k_max, costs={kk: 1.0 for kk in range(k_max + 1)})
        self.pin = int(k)

    def _best(self, busy, P_all=None) -> int:
        return self.pin


def spec_of(k):
    """(num_speculative_tokens, k_max) of a run's k: an int, ``"autoN"`` (``AutoK(N)``, its
    costs measured by ``SpeculativeDecoder.calibrate`` in the warm-up), ``"pinKofN"``
    (``PinnedK(N, K)``) or ``"kKLN"`` (fixed K, the decoder's length sized for k_max N)."""
    if isinstance(k, str) and k.startswith("pin"):
        kk, n = (int(x) for x in k[3:].split("of"))
        return PinnedK(n, kk), n
    if isinstance(k, str) and k.startswith("k") and "L" in k:
        kk, n = (int(x) for x in k[1:].split("L"))
        return kk, n
    if isinstance(k, str) and k.startswith("auto"):
        # "autoN" + "nodrain" (AutoK(N, drain=False): the rate objective only) and/or
        # "table" (probe_every=0: the calibrated table only, no live costs)
        body, kw = k[4:], {}
        for tag, arg in (("table", ("probe_every", 0)), ("nodrain", ("drain", False))):
            if body.endswith(tag):
                body, kw[arg[0]] = body.removesuffix(tag), arg[1]
        n = int(body or 4)
        return AutoK(n, **kw), n
    return k, k


def decoder(target, draft, k, be, reqs, slots=None, run_ahead=True):
    """A decoder warmed up on ``reqs``' prompts (4 new tokens each: the round graph and every
    prefill bucket recorded; with ``k="autoN"`` also every k's round cost measured and its
    graph recorded, on the timed requests themselves), its metrics reset. Its ``max_len``
    fits every request, so the timed calls reuse the warm-up's buffers and graphs."""
    graph = be.name == "torch"
    spec, k_max = spec_of(k)
    dec = SpeculativeDecoder(target, draft, num_speculative_tokens=spec, backend=be,
                             cuda_graph=graph, prefill=PREFILL, run_ahead=run_ahead,
                             max_len=SpeculativeDecoder.positions_needed(reqs, k_max))
    if graph:
        seen, warm = set(), []
        for r in reqs:
            if tuple(r.prompt) not in seen:
                seen.add(tuple(r.prompt))
                warm.append(Request(prompt=r.prompt, max_new_tokens=4,
                                    stop_token_ids=r.stop_token_ids))
        if slots is None:           # B=1: one call per request, as timed
            for w in warm:
                dec.generate([w])
        else:           # one admission per round: every prefill bucket recorded (a burst of
            # BATCHED_PREFILL_FROM or more goes batched, eager, and records none)
            dec.serve(warm, slots=slots, arrivals=list(range(len(warm))))
            dec.serve(warm[:slots], slots=slots)        # and a burst: the batched path
        if not dec.calibrate(reqs[:slots or 1], slots=slots or 1):
            print(f"warning: {k}: round costs not measured at every k in the warm-up")
        dec.capture_first = True
    dec.reset_metrics()
    return dec


def with_costs(dec):
    """The decoder's metrics, with an ``AutoK``'s round-cost table (us, per slot count and k,
    as it stood after the timed run) attached for the report."""
    m = dec.metrics
    if getattr(dec.spec, "measured", None):
        m.round_costs_us = {f"B{b}_k{kk}": round(s * 1e6, 1)
                            for (b, kk), s in sorted(dec.spec.measured.items())}
        # what the table was fitted from: each k's median GPU time and sample count, and the
        # median host share of a round's period, per slot count
        m.round_gpu_us = {f"B{b}_k{kk}": [round(_median(xs) * 1e6, 1), len(xs)]
                          for (b, kk), xs in sorted(dec.spec._samples.items())}
        m.round_host_us = {f"B{b}": round(_median(xs) * 1e6, 1)
                           for b, xs in sorted(dec.spec._host.items())}
        # live costs: each k's median period of decoding rounds, every slot busy, and count
        m.round_live_us = {f"B{b}_k{kk}": [round(_median(xs) * 1e6, 1), len(xs)]
                           for (b, kk), xs in sorted(dec.spec._live.items())}
        m.round_table_us = {f"B{b}_k{kk}": round(dec.spec.cost(b, kk) * 1e6, 1)
                            for (b, kk) in sorted(dec.spec.measured)}
    return m


BATCH_REPEATS = 1      # --batch-repeats: timed runs of a batched case, the median kept


def decode(target, draft, k, be, reqs, slots=None):
    """Warm-up of the same shapes and one untimed run of the timed call, then
    ``BATCH_REPEATS`` timed runs on the warm decoder; returns (results, metrics) of the run
    with the median tokens/s (a B=32 run lasts ~0.2 s: one host stall moves it 10%; s28: the
    first timed run after the warm-up was the slowest of three in 9 of 21 cases, by up to 20%)."""
    dec = decoder(target, draft, k, be, reqs, slots or len(reqs))
    dec.serve(reqs, slots=slots or len(reqs))        # untimed: the call itself, warm
    runs = []
    for _ in range(max(1, BATCH_REPEATS)):
        dec.reset_metrics()
        out = dec.serve(reqs, slots=slots or len(reqs))
        runs.append((with_costs(dec), out))
    return median_run(runs)


def median_run(runs):
    """(results, metrics) of the run with the median tokens/s of ``runs`` [(metrics,
    results)]; the metrics carry every run's tokens/s (``repeat_tokens_per_s``) if several."""
    runs = sorted(runs, key=lambda r: r[0].tokens_per_s)
    m, out = runs[len(runs) // 2]
    if len(runs) > 1:
        m.repeat_tokens_per_s = [round(r[0].tokens_per_s, 1) for r in runs]
    return out, m


def interleaved(target, be, reqs, slots, modes):
    """The modes ``[(key, draft, k)]`` of one batched case, each on a warm decoder of its
    own, timed in turns: repeat r runs them in order (r even) or reversed (r odd), so a
    slowdown over the case (s29: the mode run last was the slowest at the same k, its rounds
    +4-10%) falls on each; each timed run right after an untimed run of the same call (a
    decoder that runs after another finds the target's caches reset and records its graphs
    again, in that untimed run). ``BATCH_REPEATS`` timed runs a mode; returns {key:
    (results, metrics)} of each mode's median run (``repeat_tokens_per_s``: all of them)."""
    decs = {key: decoder(target, draft, k, be, reqs, slots) for key, draft, k in modes}
    runs: dict = {key: [] for key in decs}
    order = list(decs)
    for r in range(max(1, BATCH_REPEATS)):
        for key in (order if r % 2 == 0 else order[::-1]):
            dec = decs[key]
            dec.serve(reqs, slots=slots)                 # untimed: warm again
            dec.reset_metrics()
            gc.collect()        # no collection debt of the runs before (s30: B=16 bimodal)
            out = dec.serve(reqs, slots=slots)
            runs[key].append((with_costs(dec), out))
            # detached: the next untimed run must not count into this run's metrics (s30:
            # every stored run but the last also held its next warm run's rounds)
            dec.reset_metrics()
    return {key: median_run(rs) for key, rs in runs.items()}


def one_at_a_time(target, draft, k, be, reqs):
    """B=1: each request alone, one decoder (graphs kept between calls); metrics summed."""
    dec = decoder(target, draft, k, be, reqs)
    out = []
    for r in reqs:
        out += dec.generate([r])
    return out, with_costs(dec)


def summary(m):
    return dict(tokens=m.emitted, seconds=round(m.wall_s - m.capture_s, 4),
                tokens_per_s=round(m.tokens_per_s, 1), rounds=m.rounds,
                decode_tokens_per_s=round(m.decode_tokens_per_s, 1),
                mean_accepted_length=round(m.mean_accepted_length, 3),
                per_position_acceptance=[round(x, 3) for x in m.per_position_acceptance],
                host_us_per_round=round(m.host_us_per_round, 1),
                prefill_s=round(m.prefill_s, 4),
                # of prefill_s: admit's host time (buffers, reset_slots), over how many
                # admissions of how many requests
                admit_s=round(m.admit_s, 4), admissions=m.admissions, admitted=m.admitted,
                capture_s=round(m.capture_s, 4),      # graphs recorded in the run (not timed)
                **({"k_rounds": dict(sorted(m.k_rounds.items()))} if m.policy == "auto" else {}),
                **({k: getattr(m, k) for k in ("round_costs_us", "round_gpu_us", "round_host_us",
                                                    "round_live_us", "round_table_us")
                    if hasattr(m, k)}),
                **({"repeat_tokens_per_s": m.repeat_tokens_per_s}
                   if hasattr(m, "repeat_tokens_per_s") else {}))


def prefill_profile(target, draft, k, be, reqs, replays=10):
    """GPU time of one bucketed prefill replay per bucket (CUDA events; the slot's length is
    zeroed before each, so every replay prefills afresh), and the largest bucket's replay by
    kernel group (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    dec = decoder(target, draft, k, be, reqs)
    st = dec._state
    out = {}
    for (nb, m), pb in sorted(st.prefills.items()):
        ms = []
        for _ in range(replays):
            st.buf.seq_lens.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            pb.replay()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        out[f"bucket_{nb}x{m}_ms"] = round(sorted(ms)[len(ms) // 2], 3)
    (nb, m), pb = max(st.prefills.items(), key=lambda kv: kv[0][0] * kv[0][1])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            st.buf.seq_lens.zero_()
            pb.replay()
        torch.cuda.synchronize()
    groups = {}
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
        if t > 0:
            groups[ev.key[:60]] = groups.get(ev.key[:60], 0.0) + t / 5
    out[f"bucket_{nb}x{m}_top_kernels_us"] = {g: round(t, 1) for g, t in
                                          sorted(groups.items(), key=lambda x: -x[1])[:12]}
    return out


TRAINED_PROMPTS = 30000     # --prompts of the heads' training command (their config.json)


def unseen_prompts(n, seed=1):
    """``n`` prompts of the prompt mix's held-out families (half each; message lists), drawn
    with a seed of their own: not train-draft's report draw, and never trained on."""
    from specdec_lib.train.prompt_mix import HELDOUT_FAMILIES, prompt_mix
    per = -(-n // len(HELDOUT_FAMILIES))
    out = [it["messages"] for f in HELDOUT_FAMILIES
           for it in prompt_mix(per, seed=seed, families=[f])]
    return out[:n]


GENERAL_MIX = 2     # --general-mix: the mix version the general set is drawn from (2 since
                    # s28: the shipped EAGLE3 head trained on version 2's prompts)


def general_prompts(n, seed=1, trained=TRAINED_PROMPTS, version=None):
    """``n`` new prompts of every family of the mix (``version``, default GENERAL_MIX),
    round-robin (message lists): a draw of its own, less every prompt of the training set and
    report of a ``trained``-prompt run (``mix_items`` of the heads' command) of this version
    and every one before it, so none was trained on by heads of any of them; a family with
    none left (version 1's advice and code, used up by training) is skipped. The held-out
    families are in it; the docstrings are the ``heldout`` set's."""
    from specdec_lib.train.data import mix_items
    from specdec_lib.train.prompt_mix import FAMILIES, prompt_mix
    version = GENERAL_MIX if version is None else version
    seen = {repr(m) for v in range(1, version + 1) for _, m, _ in mix_items(trained, 64, 0, v)}
    per = {f: [it["messages"] for it in prompt_mix(n + 64, seed=seed, families=[f],
                                                   version=version)
               if repr(it["messages"]) not in seen][:n] for f in FAMILIES}
    out = []
    for j in range(n):
        out += [per[f][j] for f in FAMILIES if j < len(per[f])]
    return out[:n]


def round_profile(target, draft, k, be, prompts, rounds=20):
    """GPU time per round by kernel group, from torch.profiler over graph replays (one
    request per prompt, all in one batch, through EOS)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    reqs = [Request(prompt=p, max_new_tokens=rounds * (k + 1) + 8) for p in prompts]
    dec = decoder(target, draft, k, be, reqs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        dec.generate(reqs)
        torch.cuda.synchronize()
    groups = {}
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" and getattr(ev, "self_device_time_total", 0) == 0:
            continue
        t = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
        if t <= 0:
            continue
        n = ev.key.lower()
        g = ("attention (verify)" if "verify_attention" in n else
             "sampling" if "spec_sample" in n else
             "prefill attention" if ("flash" in n or "fmha" in n or "attention" in n) else
             "GEMM" if ("gemm" in n or "xmma" in n or "cutlass" in n or "sm90" in n or "ampere" in n) else
             "norm / rope / silu" if any(s in n for s in ("rms_norm", "rope", "silu_mul")) else
             "KV append" if "append_kv" in n else
             "sequence / draft ops" if any(s in n for s in ("seq_", "ngram", "draft_")) else
             "other (copies, torch elementwise)")
        groups[g] = groups.get(g, 0.0) + t
    m = dec.metrics
    per_round = {g: round(t / max(m.rounds, 1), 1) for g, t in sorted(groups.items(), key=lambda x: -x[1])}
    return dict(rounds=m.rounds, gpu_us_per_round=per_round,
                wall_us_per_round=round(1e6 * (m.wall_s - m.capture_s - m.prefill_s) / max(m.rounds, 1), 1),
                host_enqueue_us_per_round=round(m.host_us_per_round, 1))


def main():
    global PREFILL, BATCH_REPEATS, GENERAL_MIX     # set from the options below
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=None)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--new32", type=int, default=128)
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--tie-tolerance", type=float, default=0.25)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="2 prompts per set, B=8")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="requests stop at <|im_end|> / <|endoftext|> (natural replies; tokens/s "
                        "over the tokens emitted) instead of generating through EOS")
    p.add_argument("--drafts", default="ngram,mtp,eagle3")
    p.add_argument("--serve-k", default=None, help="k of the heads in the served stream, "
                   "comma-separated (default -k); prompt lookup always runs at -k")
    p.add_argument("--serve", type=int, default=0, metavar="N", help="also serve N mixed "
                   "requests through the mixed case's B slots (continuous batching)")
    p.add_argument("--general-mix", type=int, choices=(1, 2), default=GENERAL_MIX, help="the "
                   "prompt-mix version the general set is drawn from (2, the default since s28: "
                   "with advice and code, none trained on by heads of version 1 or 2; 1: "
                   "s26-s27's set, which version 2's training may have read)")
    p.add_argument("--batches", default=None, metavar="B,B", help="more batch sizes of the "
                   "mixed case after --b32's (e.g. 4,16,64: auto against the fixed k at every "
                   "batch), each its own b<B>_mixed entry")
    p.add_argument("--batch-repeats", type=int, default=1, metavar="R", help="timed runs of "
                   "each mixed batch case per mode on its warm decoder, the median kept (each "
                   "lasts ~0.2 s at 128 new tokens)")
    p.add_argument("--serve-repeats", type=int, default=1, metavar="R", help="serve the "
                   "stream R times in all (the same warm decoders, each mode's runs back to "
                   "back; runs after the first are not rescored): R ratios, as the served "
                   "ratio moves from run to run")
    add_prefill_options(p)
    p.add_argument("--row-invariant", action="store_true", help="decode GEMMs through the "
                   "library's linear (LlamaTarget row_invariant=True)")
    p.add_argument("--sets", default=None, help="B=1 prompt sets (default copy,open,heldout; "
                   "general with --kv-agreement): copy, open, "
                   "heldout (stdlib docstrings), general (new prompts of every family of the "
                   "prompt mix, none trained on), unseen (the mix's held-out families only: "
                   "translation and multi-turn chat with a system prompt)")
    p.add_argument("--hybrid", default=None, metavar="DIR", help="decode smollm2-hybrid (the "
                   "weights DIR of train-hybrid) with its MTP head (DIR/smollm2_hybrid_mtp) "
                   "instead of SmolLM2")
    p.add_argument("--state-dtype", default="float32", help="--hybrid: the GDN state dtype")
    p.add_argument("--plain-state", action="store_true", help="--hybrid: gdn_commit / "
                   "conv1d_commit every round (fused_state=False), not the fused mode")
    p.add_argument("--gated-norm-op", action="store_true", help="--hybrid: the GDN layers' "
                   "gated norm as one gated_rms_norm launch (LlamaHybridTarget.gated_norm_op)")
    p.add_argument("--no-profile", action="store_true", help="skip the round / prefill "
                   "profiles at the end")
    p.add_argument("--heads-dir", default=None, help="heads from DIR/smollm2_<method>/ "
                   "(train-draft --out DIR) instead of the shipped ones")
    p.add_argument("--per-set", type=int, default=32, help="prompts per B=1 set (the held-out "
                   "pool has ~130; copy / open have 8): over 8 replies one near-tie flipped "
                   "by the numerics moved the mean accepted length 2.5 -> 2.05 (s14)")
    p.add_argument("--head-k", type=int, default=0, help="also run the heads at this k (B=1)")
    p.add_argument("--auto", type=int, default=0, metavar="K_MAX", help="also run every draft "
                   "with num_speculative_tokens='auto' (AutoK(K_MAX)) in every case (B=1 sets, "
                   "the mixed batch, the served stream)")
    p.add_argument("--auto-nodrain", action="store_true", help="with --auto: also AutoK(K_MAX, "
                   "drain=False) (its batch-wide rate objective even when no request waits)")
    p.add_argument("--auto-table", action="store_true", help="with --auto: also AutoK(K_MAX, "
                   "probe_every=0) (the calibrated table alone, no live costs: s29-s30's auto)")
    p.add_argument("--mixed-k", default=None, help="k of the drafts in the mixed batch and "
                   "the served stream, comma-separated (default -k): the fixed k's that auto "
                   "is compared with")
    p.add_argument("--backend", default="torch", help="torch (GPU); reference: the CPU (float64: "
                   "exact, so the B=1 sets run as one batch there; acceptance only, not speed)")
    p.add_argument("--b32", type=int, default=None, help="batch of the mixed case (default 32, "
                   "8 with --quick; 0 skips it)")
    p.add_argument("--kv-dtype", default="bfloat16", help="the target's KV cache: bfloat16 "
                   "(default), fp8_e4m3 or int8")
    p.add_argument("--long-context", type=int, default=0, metavar="N", help="only the "
                   "long-context case: N-token prompts, bf16 vs --kv-dtype caches in one run")
    p.add_argument("--long-batch", type=int, default=1, metavar="B",
                   help="--long-context: requests decoded together (default 1)")
    p.add_argument("--kv-agreement", default=None, metavar="DTYPES", help="only the 8-bit "
                   "cache agreement case: greedy replies of a bf16-cache target and of each "
                   "of these caches (comma-separated: fp8_e4m3,int8), --per-set prompts of "
                   "each of --sets in one batch, --new tokens each")
    add_decode_options(p)
    p.add_argument("--block-rows", type=int, default=1, help="--kv-agreement: rows per "
                   "sequence of the teacher-forced pass's verify blocks: 1 (default) is the "
                   "target-only decode's own block shape (B rows a call: the bf16 target "
                   "over its own replies should agree everywhere; ~128 eager calls per cache "
                   "dtype), up to 16 (fewer calls, GEMM bits of another shape)")
    args = p.parse_args()
    apply_decode_options(p, args)
    PREFILL = prefill_policy(args)
    BATCH_REPEATS = args.batch_repeats
    GENERAL_MIX = args.general_mix
    be = make_backend(args.backend)
    if args.long_context:
        return long_context(args, be)
    if args.kv_agreement:
        return kv_agreement(args, be)
    args.sets = args.sets or "copy,open,heldout"
    t0 = time.perf_counter()
    if args.hybrid:             # smollm2-hybrid and its MTP head (train-draft --hybrid)
        target, tok = load_smollm2_hybrid_target(be, weights=args.hybrid, path=args.gguf,
                                                 progress=False, row_invariant=args.row_invariant,
                                                 state_dtype=args.state_dtype,
                                                 fused_state=not args.plain_state)
        target.gated_norm_op = args.gated_norm_op
    else:
        target, tok = load_smollm2_target(be, path=args.gguf, progress=False,
                                          row_invariant=args.row_invariant, kv_dtype=args.kv_dtype)
    print(f"loaded in {time.perf_counter() - t0:.1f} s; weights {target.weight_bytes / 1e6:.0f} MB "
          f"bf16; kv cache {target.kv_dtype}")
    drafts = {}
    for name in args.drafts.split(","):
        if name == "ngram":
            drafts[name] = NgramDraft(be)
        elif args.hybrid:
            if name != "mtp":
                p.error(f"--drafts {name}: the hybrid drafts with ngram or its mtp head")
            drafts[name] = LlamaDraftHead.load(target, hybrid_head(args.hybrid), name)
        else:
            drafts[name] = LlamaDraftHead.load(
                target, os.path.join(args.heads_dir, f"smollm2_{name}") if args.heads_dir
                else smollm2_head(name), name)
    k = args.k
    n_sets = 2 if args.quick else args.per_set
    pool = pool_of(args.per_set)
    sets = {name: pool[name][:n_sets] for name in args.sets.split(",")}
    gpu = args.backend == "torch"
    if gpu:
        import torch
    report = {"device": torch.cuda.get_device_name() if gpu else "cpu", "k": k,
              "prefill": args.prefill, "drafts": list(drafts),
              "row_invariant": target.row_invariant, "kv_dtype": target.kv_dtype,
              "hybrid": args.hybrid and dict(weights=args.hybrid, state_dtype=args.state_dtype,
                                             fused_state=not args.plain_state,
                                             gated_norm_op=args.gated_norm_op)}
    rows = []
    stops = dict(stop_token_ids=STOP_TOKEN_IDS) if args.stop_at_eos else {}
    report["stop_at_eos"] = bool(args.stop_at_eos)

    def rescore(reqs, res):
        n, ties, bad = rescoring_check(target, reqs, res, args.tie_tolerance,
                                       steps=2 if gpu else 0)
        return dict(tokens=n, ties=ties, mismatches=len(bad), first=bad[:3])

    def case(label, key, reqs, run, runs):
        """Target-only once, then each (draft, k) of ``runs``, all rescored."""
        base, mb = run(target, None, 0, be, reqs)
        entry = report[key] = dict(target_only=summary(mb), of=len(reqs),
                                   rescoring_target_only=rescore(reqs, base))
        # (target-only's own replies rescored too: a spec mismatch in a reply identical to
        # target-only's is the batch's numerics, not speculation; s51 had to infer it)
        tchk = entry["rescoring_target_only"]
        print(f"{label}: target-only rescored: {tchk['mismatches']} mismatches "
              f"({tchk['ties']} ties)", flush=True)
        for name, kk in runs:
            spec, ms = run(target, drafts[name], kk, be, reqs)
            same = sum(x.tokens == y.tokens for x, y in zip(base, spec))
            chk = rescore(reqs, spec)
            entry[f"{name}_k{kk}"] = dict(summary(ms), identical_requests=same, rescoring=chk,
                                          sample_reply=tok.decode(spec[0].tokens[:80]))
            rows.append((label, f"{name} k={kk}", mb, ms, same, len(reqs), chk))
            print(f"{label}: {name} k={kk} {ms.tokens_per_s:,.1f} tok/s, target-only "
                  f"{mb.tokens_per_s:,.1f} ({ms.tokens_per_s / max(mb.tokens_per_s, 1e-9):.2f}x)",
                  flush=True)
            _dump(args, report)     # what a timeout leaves behind

    heads = [n for n in drafts if n != "ngram"]
    auto = ([f"auto{args.auto}"] + ([f"auto{args.auto}nodrain"] if args.auto_nodrain else [])
            + ([f"auto{args.auto}table"] if args.auto_table else []) if args.auto else [])
    b1_runs = [(n, k) for n in drafts] + ([(n, args.head_k) for n in heads] if args.head_k else []) \
        + [(n, a) for a in auto for n in drafts]
    mixed_k = [int(x) for x in args.mixed_k.split(",")] if args.mixed_k else [k]
    for name, texts in sets.items():
        reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new, **stops) for t in texts]
        case(f"B=1 {name}", f"b1_{name}", reqs, one_at_a_time if gpu else decode, b1_runs)
    B = args.b32 if args.b32 is not None else (8 if args.quick else 32)
    best = max(heads or list(drafts), key=lambda n: report[f"b1_{list(sets)[-1]}"][f"{n}_k{k}"]["tokens_per_s"])
    if B == 0:
        _print(rows, report)
        return _dump(args, report)
    def mixed_texts(B):
        """B prompts: half held-out docstrings, then copy-heavy and open-ended ones, cycled."""
        return ((pool["heldout"][8:8 + B // 2] + COPY_PROMPTS + OPEN_PROMPTS) * (B // 16 + 1))[:B]
    texts = mixed_texts(B)
    mixed_runs = [(n, kk) for kk in mixed_k for n in drafts] + [(n, a) for a in auto for n in drafts]
    def in_turns(reqs, slots, runs):
        """``case``'s ``run`` for a batched case: every mode timed by ``interleaved`` first
        (on the GPU), then looked up by (draft, k)."""
        if not gpu:
            return decode
        done = interleaved(target, be, reqs, slots, [((None, 0), None, 0)] + [
            ((id(drafts[n]), kk), drafts[n], kk) for n, kk in runs])
        return lambda target, draft, kk, be, reqs: done[(None if draft is None else id(draft), kk)]
    for BB in [B] + [int(x) for x in (args.batches or "").split(",") if x and int(x) != B]:
        reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new32, **stops)
                for t in mixed_texts(BB)]
        case(f"B={BB} mixed", f"b{BB}_mixed", reqs, in_turns(reqs, BB, mixed_runs), mixed_runs)
    if args.serve:      # continuous batching: a stream of requests through B slots
        sreqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new32, **stops)
                 for t in (texts * (args.serve // len(texts) + 1))[:args.serve]]

        decs = {}       # one warm decoder a mode, kept for --serve-repeats

        def served(target, draft, kk, be, reqs):
            key = (None if draft is None else id(draft), kk)
            if key not in decs:
                decs[key] = decoder(target, draft, kk, be, reqs, B)
                decs[key].serve(reqs, slots=B)       # untimed, as decode's
            dec = decs[key]
            dec.reset_metrics()
            return dec.serve(reqs, slots=B), with_costs(dec)
        serve_k = [int(x) for x in args.serve_k.split(",")] if args.serve_k else mixed_k
        skey = f"serve{args.serve}_slots{B}"
        sruns = ([(n, k) for n in drafts if n == "ngram"] + [(n, kk) for kk in serve_k for n in heads]
                 + [(n, a) for a in auto for n in drafts])
        case(f"serve {args.serve}/{B}", skey, sreqs,
             in_turns(sreqs, B, sruns) if args.serve_repeats <= 1 else served, sruns)
        # the served ratio moves from run to run (target-only +-15%, s14): more runs, each
        # mode's back to back (AA..BB..): decoders of one target share its caches, so one that
        # runs after another finds them reset and records its graphs again (s21's interleaved
        # repeats were such cold runs), hence an untimed run first in each mode's group. Not
        # rescored again: each run is counted token-identical to target-only's (greedy)
        def run_row(m):
            return dict(tokens_per_s=round(m.tokens_per_s, 1), prefill_s=round(m.prefill_s, 4),
                        admit_s=round(m.admit_s, 4), capture_s=round(m.capture_s, 4))
        if args.serve_repeats > 1:
            reps = [dict() for _ in range(args.serve_repeats - 1)]
            base_runs = []
            served(target, None, 0, be, sreqs)      # untimed: its graphs recorded again
            for row in reps:
                base, mb = served(target, None, 0, be, sreqs)
                base_runs.append(base)
                row["target_only"] = run_row(mb)
            for name, kk in sruns:
                served(target, drafts[name], kk, be, sreqs)      # untimed, as above
                for rep, (row, base) in enumerate(zip(reps, base_runs), 1):
                    spec, ms = served(target, drafts[name], kk, be, sreqs)
                    to = row["target_only"]["tokens_per_s"]
                    r = row[f"{name}_k{kk}"] = dict(
                        run_row(ms), speedup=round(ms.tokens_per_s / max(to, 1e-9), 3),
                        identical_to_target_only=sum(x.tokens == y.tokens for x, y in zip(base, spec)))
                    print(f"serve {args.serve}/{B} repeat {rep}: {name} k={kk} "
                          f"{ms.tokens_per_s:,.1f} tok/s, target-only {to:,.1f} "
                          f"({r['speedup']:.2f}x)", flush=True)
            report[skey]["repeats"] = reps
            _dump(args, report)
    # the profiles (rounds, then prefills) last: a profiler session leaves the process slower
    # (s13: B=32 host enqueue per round 6 -> ~110 us after one), so nothing is timed after it
    if args.no_profile:
        _print(rows, report)
        return _dump(args, report)
    try:
        for lab, prompts in (("b1", [reqs[0].prompt]), (f"b{B}", [r.prompt for r in reqs])):
            report[f"round_profile_spec_{lab}"] = round_profile(target, drafts[best], k, be, prompts)
            report[f"round_profile_spec_{lab}"]["draft"] = best
            report[f"round_profile_base_{lab}"] = round_profile(target, None, 0, be, prompts)
    except Exception as e:      # the profiler is a report, not the benchmark
        report["round_profile_error"] = f"{type(e).__name__}: {e}"
    try:
        pre = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new, **stops)
               for t in sets[list(sets)[0]]]
        report["prefill_profile_base"] = prefill_profile(target, None, 0, be, pre)
        report["prefill_profile_spec"] = prefill_profile(target, drafts[best], k, be, pre)
        report["prefill_profile_spec"]["draft"] = best
    except Exception as e:      # a report, not the benchmark
        report["prefill_profile_error"] = f"{type(e).__name__}: {e}"
    _print(rows, report)
    _dump(args, report)


def long_context(args, be):
    """--long-context N: decode tokens/s at an N-token context, a bf16-cache target against
    a --kv-dtype one (same weights, same requests, same run); each run warmed up first
    (graphs recorded), prefill left out of the rate. Rescoring is skipped (an N-token plain
    pass per request); speculative == target-only is counted per cache dtype."""
    n = args.long_context
    kvs = ["bfloat16"] + ([args.kv_dtype] if args.kv_dtype != "bfloat16" else [])
    report = {"long_context": n, "batch": args.long_batch, "new": args.new32, "k": args.k,
              "kv_dtypes": kvs}
    tok = None
    for kv in kvs:
        t0 = time.perf_counter()
        target, tok = load_smollm2_target(be, path=args.gguf, progress=False,
                                          row_invariant=args.row_invariant, kv_dtype=kv,
                                          max_position=n + args.new32 + 2 * args.k + 32)
        print(f"{kv}: loaded in {time.perf_counter() - t0:.1f} s")
        if not args.long_batch or not n:
            break
        ids = []
        for t in stdlib_prompts("heldout") * 64:        # held-out text to N tokens
            ids += chat_prompt(tok, t)
            if len(ids) >= n:
                break
        reqs = [Request(prompt=ids[b:b + n], max_new_tokens=args.new32)
                for b in range(args.long_batch)]
        base, mb = decode(target, None, 0, be, reqs)
        entry = report[kv] = dict(target_only=summary(mb))
        print(f"  {kv:9s} target-only: {mb.decode_tokens_per_s:,.1f} decode tok/s "
              f"(prefill {mb.prefill_s:.3f} s)")
        for name in args.drafts.split(","):
            draft = NgramDraft(be) if name == "ngram" else \
                LlamaDraftHead.load(target, smollm2_head(name), name)
            spec, ms = decode(target, draft, args.k, be, reqs)
            target.capture_aux(())
            same = sum(x.tokens == y.tokens for x, y in zip(base, spec))
            entry[f"{name}_k{args.k}"] = dict(summary(ms), identical_requests=same)
            print(f"  {kv:9s} {name} k={args.k}: {ms.decode_tokens_per_s:,.1f} decode tok/s, "
                  f"accepted length {ms.mean_accepted_length:.2f}, {same}/{len(reqs)} "
                  "requests == target-only")
        del target
    if len(kvs) == 2 and kvs[1] in report:
        lo, hi = report["bfloat16"], report[kvs[1]]
        report["ratio_8bit_over_bf16"] = {
            key: round(hi[key]["decode_tokens_per_s"] / lo[key]["decode_tokens_per_s"], 3)
            for key in lo if key in hi}
        print(f"decode tok/s {kvs[1]} / bfloat16 at {n} tokens of context:",
              json.dumps(report["ratio_8bit_over_bf16"]))
    _dump(args, report)


def pool_of(n):
    """The prompt sets by name (text or message lists; ``main``'s --sets)."""
    return {"copy": COPY_PROMPTS, "open": OPEN_PROMPTS, "heldout": stdlib_prompts("heldout"),
            "general": general_prompts(n), "unseen": unseen_prompts(n)}


def kv_agreement(args, be):
    """--kv-agreement DTYPES: issue 32's agreement bar. A bf16-cache target and one target
    per 8-bit cache dtype (the same weights, read once), the same requests (--per-set
    prompts of each of --sets, default general; --new tokens, through EOS unless
    --stop-at-eos), all in one batch of that many slots (graphs on the torch backend):

      * greedy target-only replies, and each --drafts at -k: requests == target-only with
        that cache dtype (the bf16 target too: the control);
      * teacher-forced (``models.kv_agreement``): each 8-bit target run over the bf16 run's
        sequences through verify blocks over its own 8-bit cache (--block-rows rows per call),
        the share of reply positions where the bf16 token is its argmax; the bf16 target over
        its own replies gives the floor of the procedure (block vs one-row GEMM bits);
      * free-running: per prompt the first position where the 8-bit reply departs from the
        bf16 one, and the bf16 model's top-2 logit gap there (--tie-tolerance: a near-tie).
    """
    from specdec_lib.models.llama import LlamaTarget, kv_dtype_name, kv_dtype_unsupported
    from specdec_lib.models.smollm2 import EXPECTED, load_smollm2
    kvs = ["bfloat16"] + [kv for kv in dict.fromkeys(kv_dtype_name(x.strip())
                                                     for x in args.kv_agreement.split(","))
                          if kv != "bfloat16"]
    names = (args.sets or "general").split(",")
    stops = dict(stop_token_ids=STOP_TOKEN_IDS) if args.stop_at_eos else {}
    gpu = args.backend == "torch"
    report = {"case": "kv_agreement", "kv_dtypes": kvs, "sets": names, "per_set": args.per_set,
              "new": args.new, "k": args.k, "drafts": args.drafts.split(","),
              "block_rows": args.block_rows, "tie_tolerance": args.tie_tolerance,
              "stop_at_eos": bool(args.stop_at_eos), "row_invariant": args.row_invariant}
    for kv in kvs:                  # refused before the weights are read
        why = kv_dtype_unsupported(be, kv, EXPECTED["head_dim"])
        if why is not None:
            raise SystemExit(f"--kv-agreement {kv}: {why}")
    base = base_sc = reqs = None
    t_all = time.perf_counter()
    config, weights, tok = load_smollm2(args.gguf, progress=False)     # read once
    report["load_s"] = round(time.perf_counter() - t_all, 2)
    for kv in kvs:
        t0 = time.perf_counter()
        target = LlamaTarget(config, weights, be, row_invariant=args.row_invariant,
                             kv_dtype=kv)
        if reqs is None:
            if gpu:
                import torch
                report["device"] = torch.cuda.get_device_name()
            pool = pool_of(args.per_set)
            texts = [t for n in names for t in pool[n][:args.per_set]]
            reqs = [Request(prompt=chat_prompt(tok, t), max_new_tokens=args.new, **stops)
                    for t in texts]
            prompts = [r.prompt for r in reqs]
            report["requests"] = len(reqs)
        res, mb = decode(target, None, 0, be, reqs)
        replies = [list(r.tokens) for r in res]
        entry = report[kv] = dict(target_only=summary(mb))
        for name in args.drafts.split(","):
            if not name:
                continue
            draft = NgramDraft(be) if name == "ngram" else \
                LlamaDraftHead.load(target, smollm2_head(name), name)
            spec, ms = decode(target, draft, args.k, be, reqs)
            target.capture_aux(())
            firsts = [first_divergence(x, list(y.tokens)) for x, y in zip(replies, spec)]
            entry[f"{name}_k{args.k}"] = dict(
                summary(ms), identical_requests=sum(j is None for j in firsts),
                first_divergence=firsts)
        t1 = time.perf_counter()
        width = SpeculativeDecoder.positions_needed(reqs, 0)    # the target-only decoder's
        if kv == "bfloat16":
            base, base_sc = replies, teacher_forced(target, prompts, replies, args.block_rows,
                                                    max_len=width)
            entry["self"] = agreement(base, base_sc, base, base_sc, tie=args.tie_tolerance)
        else:
            sc = teacher_forced(target, prompts, base, args.block_rows, max_len=width)
            entry["agreement"] = agreement(base, base_sc, replies, sc, tie=args.tie_tolerance)
            if target.kv_scales is not None:
                ks, vs = target.kv_scales
                entry["fp8_scales"] = dict(k=ks.round(6).tolist(), v=vs.round(6).tolist())
        entry["teacher_forced_s"] = round(time.perf_counter() - t1, 3)
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"{kv}: {entry['seconds']:.1f} s (teacher-forced pass "
              f"{entry['teacher_forced_s']:.2f} s)", flush=True)
        _dump(args, report)
        del target
    del weights
    report["seconds"] = round(time.perf_counter() - t_all, 2)
    _print_agreement(report)
    _dump(args, report)


def _print_agreement(report):
    """The --kv-agreement table: per cache dtype, teacher-forced agreement with the bf16
    run, free-running identical requests and divergences, speculative == target-only."""
    n = report["requests"]
    drafts = [k for k in report["bfloat16"] if k.endswith(f"_k{report['k']}")]
    print(f"\n{n} requests x {report['new']} new tokens, one batch; teacher-forced over the "
          f"bf16 run's sequences in {report['block_rows']}-row verify blocks")
    print(f"{'kv cache':16s} {'teacher-forced':>22s} {'exact ties':>10s} {'free: identical':>15s} "
          f"{'near-ties (gap<%g)' % report['tie_tolerance']:>18s} {'median gap':>10s} "
          + " ".join(f"{'spec==' + d:>16s}" for d in drafts))
    for kv in report["kv_dtypes"]:
        e = report[kv]
        a = e.get("agreement") or e["self"]
        tf, fr = a["teacher_forced"], a["free_running"]
        med = "-" if fr["median_base_gap"] is None else f"{fr['median_base_gap']:.3f}"
        label = kv + (" (self)" if kv == "bfloat16" else "")
        print(f"{label:16s} {tf['agreeing']:>7d}/{tf['positions']:<6d} {100 * tf['fraction']:7.2f}% "
              f"{tf['exact_ties']:>10d} {fr['identical']:>9d}/{n:<5d} {fr['near_ties']:>18d} "
              f"{med:>10s} " + " ".join(f"{e[d]['identical_requests']:>12d}/{n:<3d}"
                                        for d in drafts))
    for kv in report["kv_dtypes"][1:]:
        fr = report[kv]["agreement"]["free_running"]
        if fr["divergences"]:
            print(f"{kv} diverges from bf16 at (request, position, bf16 gap): " + ", ".join(
                f"({d['request']}, {d['position']}, {d.get('base_gap', '-')})"
                for d in fr["divergences"]))


def _print(rows, report):
    print(f"\n{'case':14s} {'draft':12s} {'target-only tok/s':>18s} {'spec tok/s':>11s} "
          f"{'speed-up':>9s} {'decode only':>12s} {'acc len':>8s} {'per position':>24s} "
          f"{'same':>6s} {'mismatch (ties)':>16s}")
    for lab, dname, mb, ms, same, n, chk in rows:
        print(f"{lab:14s} {dname:12s} {mb.tokens_per_s:18,.1f} {ms.tokens_per_s:11,.1f} "
              f"{ms.tokens_per_s / mb.tokens_per_s:8.2f}x "
              f"{ms.decode_tokens_per_s / mb.decode_tokens_per_s:11.2f}x "
              f"{ms.mean_accepted_length:8.2f} "
              f"{' '.join(f'{x:.2f}' for x in ms.per_position_acceptance):>24s} {same:>3d}/{n:<2d} "
              f"{chk['mismatches']:>8d} ({chk['ties']})")
    for key, val in report.items():
        if key.startswith(("round_profile", "prefill_profile")):
            print(key, json.dumps(val))


def _dump(args, report):
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
