#!/usr/bin/env python3
"""Tensor-parallel speculative decoding of the demo model over N GPUs (issue 7).

One process per GPU (started here with torch.multiprocessing spawn, or by torchrun).
Each rank holds its share of the attention and GDN heads
(specdec_lib/models/tiny_hybrid_tp.py); the layers' partial output projections are
summed by torch.distributed all-reduces over NCCL, on the stream the library's kernels
and cupy's dense math run on. Embedding, norms, lm_head and the MTP draft are
replicated, so every rank samples from its own copy of the same logits.

Checks, exit status 1 if any fails:
  * every round, (num_accepted, emitted, accept_len, finished) are all-gathered and
    must be equal on every rank (greedy run and sampled run);
  * the greedy TP output equals rank 0's 1-GPU speculative output and 1-GPU target-only
    output, token for token.
It also prints whether the sampled TP output equals the 1-GPU sampled output (the same
seeds; informational, since TP sums in another order and a sampled token may flip on a
last-bit logits difference) and the max |logits difference| TP vs 1-GPU (one verify
round and all forward passes).

NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are forced in the environment before anything starts.

  python3 examples/tp_demo.py --world-size 2           # 2 GPUs, NCCL
  python3 examples/tp_demo.py --backend reference      # CPU processes, gloo (checks the script)
  torchrun --nproc-per-node 2 examples/tp_demo.py      # the same, launched by torchrun

The collectives, the rank check and the start-up are ``specdec_lib.parallel``; this file is
the workload and its checks. Needs specdec_lib importable (``pip install -e .``).
"""
from specdec_lib.parallel import disable_nvlink_multicast

# before torch / NCCL are loaded anywhere (spawned children inherit the environment and
# re-import this file, so they set it again too)
disable_nvlink_multicast()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

from specdec_lib.demo import add_workload_args  # noqa: E402  (no torch/cupy import)
from specdec_lib.parallel import (Comm, RankDisagreement, init_process_group,  # noqa: E402
                                  launch, rank_checked)


def _parser():
    p = argparse.ArgumentParser(
        prog="examples/tp_demo.py",
        description="Tensor-parallel speculative decoding of the demo model (GDN + attention "
                    "heads sharded over the ranks, torch.distributed + NCCL all-reduces, "
                    "sampling on every rank). Checks that all ranks accept the same tokens "
                    "every round and that the output equals the 1-GPU output; exit status 0 "
                    "iff every check passes. NVLink multicast is kept off "
                    "(NCCL_NVLS_ENABLE=0).")
    p.add_argument("--world-size", type=int, default=2, metavar="N",
                   help="number of ranks = GPUs, GPU i for rank i (default 2). Ignored under "
                        "torchrun (its WORLD_SIZE counts)")
    p.add_argument("--backend", choices=("cuda", "reference"), default="cuda",
                   help="'cuda' (default): library kernels + cupy on GPU <rank>, NCCL "
                        "all-reduces; 'reference': numpy reference ops in CPU processes, gloo "
                        "all-reduces (checks this script without GPUs)")
    add_workload_args(p)   # -k, --batch, --prompt-len, --max-new-tokens, --seed
    p.add_argument("--sample-seed", type=int, default=1000,
                   help="sampled run: request b has sampling seed SAMPLE_SEED + b, the same on "
                        "every rank (default 1000)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="temperature of the sampled run (default 0.8; the greedy run is "
                        "always done too)")
    p.add_argument("--top-p", type=float, default=0.9, help="top-p of the sampled run (default 0.9)")
    p.add_argument("--top-k", type=int, default=0, help="top-k of the sampled run (default 0: off)")
    p.add_argument("--layer-scale", type=float, default=None, metavar="S",
                   help="strength of the target's context-dependent layers (demo default 0.08)")
    p.add_argument("--sync-allreduce", action="store_true",
                   help="debug: synchronise the device before and after every all-reduce "
                        "(by default they are ordered on the compute stream without host waits)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="collective timeout in seconds (default 300)")
    p.add_argument("--port", type=int, default=0,
                   help="rendezvous port on 127.0.0.1 for the spawned ranks (default: a free one)")
    return p


SAMPLED_INFO = "sampled == 1-GPU sampled (informational, not a failure)"


# ----------------------------------------------------------------------------- wrappers

class Recorder:
    """A target wrapper that keeps a device copy of every forward's tokens and logits."""

    def __init__(self, target):
        self.t = target
        self.calls = []

    @property
    def hidden_size(self):
        return self.t.hidden_size

    def reset(self, batch, max_len):
        self.calls = []
        return self.t.reset(batch, max_len)

    def forward(self, tokens, positions, cu_q, seq_lens, finished):
        logits, hidden = self.t.forward(tokens, positions, cu_q, seq_lens, finished)
        self.calls.append((tokens.copy(), logits.copy()))
        return logits, hidden

    def commit(self, cu_q, accept_len):
        return self.t.commit(cu_q, accept_len)

    def reset_slots(self, slot_ids):
        return self.t.reset_slots(slot_ids)

    def host_calls(self, to_host):
        return [(to_host(t), to_host(lg)) for t, lg in self.calls]


# ----------------------------------------------------------------------------- worker

def _requests(args, V):
    rng = np.random.default_rng(args.seed)
    from specdec_lib.orchestrator import Request
    prompts = [rng.integers(0, V, size=args.prompt_len + 3 * b).tolist() for b in range(args.batch)]
    greedy = [Request(prompt=p, max_new_tokens=args.max_new_tokens) for p in prompts]
    sampled = [Request(prompt=p, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_p=args.top_p, top_k=args.top_k, seed=args.sample_seed + b)
               for b, p in enumerate(prompts)]
    return greedy, sampled


def _logit_diffs(a_calls, b_calls, first_round):
    """(diff at forward call ``first_round``, max diff over calls with equal tokens,
    number compared)."""
    diffs = []
    for (ta, la), (tb, lb) in zip(a_calls, b_calls):
        if ta.shape == tb.shape and np.array_equal(ta, tb):
            diffs.append(float(np.max(np.abs(la.astype(np.float64) - lb.astype(np.float64)))))
        else:
            diffs.append(None)
    first = diffs[first_round] if first_round < len(diffs) else None
    ok = [d for d in diffs if d is not None]
    return first, (max(ok) if ok else None), len(ok)


def worker(rank, world, args, init_method, local_rank=None):
    dev = rank if local_rank is None else local_rank
    import torch
    from specdec_lib.models import TinyHybridTarget, TinyMTPDraft, load_demo_checkpoint, \
        make_demo_checkpoint
    from specdec_lib.models.tiny_hybrid_tp import TinyHybridTargetTP, tp_config, tp_layout
    from specdec_lib.orchestrator import SpeculativeDecoder, cuda_backend, reference_backend

    stream = None
    if args.backend == "cuda":
        import cupy
        torch.cuda.set_device(dev)
        cupy.cuda.Device(dev).use()
        be = cuda_backend(dev)
        # the backend's own non-blocking stream: the decoder makes it cupy's current stream
        # while it runs; make it current for this whole process too, so the work outside
        # the decoder (self-test, copies) is ordered with the all-reduces as well
        stream = be.stream
        stream.use()
    else:
        be = reference_backend()
    dist = init_process_group(rank, world, be.name, init_method, timeout_s=args.timeout,
                              device=dev)
    comm = Comm(torch, dist, be.name, rank, world, dev, stream, args.sync_allreduce)
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    failures = []
    report = {"rank": rank}
    try:
        comm.self_test(be.xp)
        say(f"ranks: {world} ({be.name}; {'NCCL' if be.name == 'cuda' else 'gloo'} "
            f"all-reduce self-test ok; NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')})")

        overrides = {} if args.layer_scale is None else {"demo_layer_scale": args.layer_scale}
        tmp = tempfile.TemporaryDirectory(prefix=f"specdec_tp{rank}_")   # kept to the end
        make_demo_checkpoint(tmp.name, tp_config(world, overrides))
        config, tensors, dw = load_demo_checkpoint(tmp.name)
        say(f"model: vocab {config['vocab_size']}, hidden {config['hidden_size']}, layers "
            + "/".join("gdn" if t == "linear_attention" else "attn" for t in config["layer_types"])
            + f"; attention heads q {config['num_attention_heads']} kv "
              f"{config['num_key_value_heads']}, GDN heads k {config['linear_num_key_heads']} "
              f"v {config['linear_num_value_heads']}; per rank "
            + ", ".join(f"{k} {v[1]}" for k, v in tp_layout(config, 0, world).items()))
        greedy, sampled = _requests(args, config["vocab_size"])
        K = args.num_speculative_tokens
        n_prefill = max(-(-(len(r.prompt) - 1) // 16) for r in greedy)

        def tp_run(reqs, k=K, record=False):
            log = {"rounds": 0, "mismatch": 0}
            cbe = rank_checked(be, comm, log)
            t = TinyHybridTargetTP(config, tensors, be, rank, world, comm.all_reduce)
            rec = Recorder(t) if record else t
            # eager rounds: the all-reduces and the per-round rank check (a host read) are
            # not graph-capturable here
            dec = SpeculativeDecoder(rec, TinyMTPDraft(config, dw, tensors, be) if k else None,
                                     num_speculative_tokens=k, backend=cbe, cuda_graph=False)
            be.synchronize()
            t0 = time.perf_counter()
            err = None
            try:
                res = [r.tokens for r in dec.generate(reqs)]
            except RankDisagreement as e:
                res, err = None, str(e)
            be.synchronize()
            dt = time.perf_counter() - t0
            calls = rec.host_calls(be.to_host) if record else None
            return res, dt, log, dec.metrics, err, calls

        def one_run(reqs, k=K, record=False):
            t = TinyHybridTarget(config, tensors, be)
            rec = Recorder(t) if record else t
            dec = SpeculativeDecoder(rec, TinyMTPDraft(config, dw, tensors, be) if k else None,
                                     num_speculative_tokens=k, backend=be, cuda_graph=False)
            be.synchronize()
            t0 = time.perf_counter()
            res = [r.tokens for r in dec.generate(reqs)]
            be.synchronize()
            dt = time.perf_counter() - t0
            return res, dt, dec.metrics, (rec.host_calls(be.to_host) if record else None)

        # warm-up: kernel loading, cupy kernel compilation, NCCL channels
        from specdec_lib.orchestrator import Request
        warm = [Request(prompt=greedy[0].prompt[:3], max_new_tokens=3)]
        tp_run(warm)
        tp_run([Request(prompt=greedy[0].prompt[:3], max_new_tokens=3, temperature=0.7, seed=1)])

        g_tok, g_dt, g_log, g_m, g_err, g_calls = tp_run(greedy, record=rank == 0)
        s_tok, s_dt, s_log, s_m, s_err, _ = tp_run(sampled)
        for name, err in (("greedy", g_err), ("sampled", s_err)):
            if err:
                failures.append(f"{name}: ranks disagree: {err}")
        report.update(greedy=g_tok, sampled=s_tok, g_rounds=g_log["rounds"],
                      s_rounds=s_log["rounds"])

        # the 1-GPU reference on rank 0 (the other ranks wait in the broadcast)
        base = None
        if rank == 0:
            one_run(warm)
            b_tok, b_dt, b_m, b_calls = one_run(greedy, record=True)
            o_tok, o_dt, _, _ = one_run(greedy, k=0)
            bs_tok, bs_dt, _, _ = one_run(sampled)
            first, mx, ncmp = _logit_diffs(g_calls, b_calls, n_prefill) if g_calls else \
                (None, None, 0)
            base = dict(greedy=b_tok, target_only=o_tok, sampled=bs_tok, dt=b_dt, s_dt=bs_dt,
                        o_dt=o_dt, rounds=b_m.rounds, first=first, max=mx, ncmp=ncmp,
                        acc=b_m.acceptance_rate)
        base = comm.broadcast_object(base, src=0)
        mine = {
            "greedy == 1-GPU speculative": g_tok is not None and g_tok == base["greedy"],
            "greedy == 1-GPU target-only": g_tok is not None and g_tok == base["target_only"],
        }
        for k_, ok in mine.items():
            if not ok:
                failures.append(f"rank {rank}: {k_}: no")
        # informational: sampling may legitimately flip on a last-bit logits difference
        mine[SAMPLED_INFO] = s_tok is not None and s_tok == base["sampled"]
        report.update(mine=mine)
    except Exception:                         # noqa: BLE001
        # one rank's own failure: the others would wait in a collective, so leave now
        # (spawn / torchrun then stop the other ranks)
        print(f"FAIL rank {rank}: " + traceback.format_exc(), flush=True)
        return 1
    report["failures"] = failures
    allrep = comm.gather_objects(report)
    all_fail = list(dict.fromkeys(f for r in allrep for f in r.get("failures", [])))

    if rank == 0:
        if base is not None and "greedy" in report:
            T = sum(len(t) for t in (report["greedy"] or []))
            agree = all(r.get("greedy") == allrep[0].get("greedy") and
                        r.get("sampled") == allrep[0].get("sampled") for r in allrep)
            print(f"requests: {args.batch}, prompt lengths "
                  f"{[len(r.prompt) for r in greedy]}, {args.max_new_tokens} new tokens each, "
                  f"k = {K}; sampled run: temperature {args.temperature}, top-p {args.top_p}, "
                  f"top-k {args.top_k}, seeds {args.sample_seed}..{args.sample_seed + args.batch - 1}")
            print(f"TP greedy : {T} tokens, {report['g_rounds']} rounds checked on every rank, "
                  f"{g_dt:.3f} s ({g_m.acceptance_rate:.3f} acceptance, "
                  f"{comm.n_all_reduce} all-reduces so far on rank 0)")
            print(f"TP sampled: {sum(len(t) for t in (report['sampled'] or []))} tokens, "
                  f"{report['s_rounds']} rounds checked on every rank, {s_dt:.3f} s")
            print(f"{'1-GPU' if be.name == 'cuda' else '1-rank':<10}: greedy {base['dt']:.3f} s ({base['rounds']} rounds, "
                  f"{base['acc']:.3f} acceptance), target-only {base['o_dt']:.3f} s, "
                  f"sampled {base['s_dt']:.3f} s")
            fmt = lambda v: "n/a" if v is None else f"{v:.3g}"  # noqa: E731
            print(f"max |logits TP - 1-GPU|: first verify round {fmt(base['first'])}, over "
                  f"{base['ncmp']} forward passes with the same tokens {fmt(base['max'])}")
            print(f"rank agreement every round: {'yes' if agree and not any('disagree' in f for f in all_fail) else 'no'}")
            for k_ in report["mine"]:
                print(f"{k_}: " + ("yes" if all(r.get("mine", {}).get(k_) for r in allrep)
                                   else "no"))
        for f in all_fail:
            print("FAIL " + f.rstrip())
        print("PASS" if not all_fail else f"FAILED ({len(all_fail)} problems)", flush=True)
    try:
        dist.destroy_process_group()
    except Exception:                         # noqa: BLE001
        pass
    return 1 if all_fail else 0


def main(argv=None):
    args = _parser().parse_args(argv)
    if not 1 <= args.num_speculative_tokens <= 15:
        print("error: --num-speculative-tokens must be in 1..15", file=sys.stderr)
        return 2
    if min(args.batch, args.prompt_len, args.max_new_tokens) < 1:
        print("error: --batch, --prompt-len and --max-new-tokens must be >= 1", file=sys.stderr)
        return 2
    world = args.world_size
    if world < 1:
        print("error: --world-size must be >= 1", file=sys.stderr)
        return 2
    torchrun = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if args.backend == "cuda" and not torchrun:
        import torch
        n = torch.cuda.device_count()
        if n < world:
            print(f"error: --world-size {world} needs {world} GPUs, torch sees {n}",
                  file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    try:
        rc = launch(worker, world, args, port=args.port)
    except Exception as e:                    # noqa: BLE001 (a rank failed: its output says why)
        print(f"FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
              f" ({time.perf_counter() - t0:.1f} s)", flush=True)
        return 1
    if not torchrun:
        print(f"total wall time {time.perf_counter() - t0:.1f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
