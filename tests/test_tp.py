"""Tensor-parallel demo target (specdec_lib/models/tiny_hybrid_tp.py).

CPU: ranks simulated as threads of one process on the reference backend, with a fake
all-reduce (the sum of the ranks' partial outputs, in rank order, the same array handed
to every rank). The sharded forward equals the unsharded one (logits to float64
rounding), and whole speculative runs give every rank the same tokens as the
unsharded model. ``specdec_lib.parallel``'s rank check on a fake communicator; the example
examples/tp_demo.py on CPU processes (gloo) and, on two GPUs, over NCCL (skipped here).
"""
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from specdec_lib.models import (DEMO_CONFIG, TinyHybridTarget, TinyMTPDraft,
                                load_demo_checkpoint, make_demo_checkpoint)
from specdec_lib.models.tiny_hybrid_tp import (TinyHybridTargetTP, shard_weight, tp_config,
                                               tp_layout)
from specdec_lib.orchestrator import Request, SpeculativeDecoder, reference_backend
from specdec_lib.parallel import RankDisagreement, rank_checked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "tp_demo.py")


def _example(*args, timeout):
    """examples/tp_demo.py in a fresh interpreter that imports the specdec_lib this test
    imports (the source tree, or the installed wheel under .ci/run)."""
    import specdec_lib
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(specdec_lib.__file__))]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


class FakeGroup:
    """All-reduce among ``n`` threads: every rank gets the rank-ordered sum."""

    def __init__(self, n):
        self.n = n
        self.parts = [None] * n
        self.barrier = threading.Barrier(n, timeout=60)
        self.calls = 0

    def all_reduce_for(self, rank):
        def all_reduce(partial):
            self.parts[rank] = np.array(partial, copy=True)
            self.barrier.wait()
            total = self.parts[0].copy()
            for p in self.parts[1:]:
                total += p
            if rank == 0:
                self.calls += 1
            self.barrier.wait()          # nobody overwrites parts before all have summed
            return total
        return all_reduce


def run_ranks(n, fn):
    """fn(rank, all_reduce) in n threads; returns the results in rank order."""
    group = FakeGroup(n)
    out, errs = [None] * n, []

    def body(r):
        try:
            out[r] = fn(r, group.all_reduce_for(r))
        except BaseException as e:         # noqa: BLE001 (re-raised below)
            errs.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise errs[0]
    return out, group


def _ckpt(tmp_path_factory, cfg):
    path = str(tmp_path_factory.mktemp("tp_ckpt"))
    make_demo_checkpoint(path, cfg)
    return load_demo_checkpoint(path)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """The demo model with head counts that split over 2 ranks (Hq 4/Hkv 2, Hk 2/Hv 4)."""
    return _ckpt(tmp_path_factory, tp_config(2))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo model as it is (Hkv = Hk = 1: KV and key heads replicated at TP 2)."""
    return _ckpt(tmp_path_factory, None)


def _block(rng, B, lens, V):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    toks = rng.integers(0, V, int(cu[-1])).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    return toks, pos, cu


def _two_blocks(target, rng_seed, B=3, V=256):
    """Prefill a ragged block, commit part of it, run a second block: (logits, hidden) x2."""
    rng = np.random.default_rng(rng_seed)
    target.reset(B, 64)
    seq_lens = np.zeros(B, np.int32)
    fin = np.zeros(B, np.uint8)
    toks, pos, cu = _block(rng, B, [5, 9, 2], V)
    l1, h1 = target.forward(toks, pos, cu, seq_lens, fin)
    acc = np.array([5, 7, 1], np.int32)
    target.commit(cu, acc)
    seq_lens = seq_lens + acc
    toks2 = rng.integers(0, V, 4 * B).astype(np.int32)
    cu2 = np.arange(0, 4 * B + 1, 4, dtype=np.int32)
    pos2 = np.concatenate([seq_lens[b] + np.arange(4) for b in range(B)]).astype(np.int32)
    l2, h2 = target.forward(toks2, pos2, cu2, seq_lens, fin)
    return (l1, h1), (l2, h2)


def test_tp_config_and_layout():
    c = tp_config(2)
    assert (c["num_attention_heads"], c["num_key_value_heads"]) == (4, 2)
    assert (c["linear_num_key_heads"], c["linear_num_value_heads"]) == (2, 4)
    assert tp_config(2, c) == c                      # already divisible: unchanged
    assert tp_layout(c, 1, 2) == {"q": (2, 2), "kv": (1, 1), "value": (2, 2), "key": (1, 1)}
    # the demo config: one KV head and one key head, replicated on both ranks
    d = dict(DEMO_CONFIG)
    assert tp_layout(d, 1, 2) == {"q": (1, 1), "kv": (0, 1), "value": (1, 1), "key": (0, 1)}
    with pytest.raises(ValueError, match="do not split"):
        tp_layout(dict(d, num_attention_heads=3, num_key_value_heads=1), 0, 2)
    with pytest.raises(ValueError, match="neither split"):
        tp_layout(dict(c, num_key_value_heads=2, num_attention_heads=6), 0, 3)


def test_shards_partition_the_weights(tp2):
    """Every row/column of a sharded tensor lands on exactly one rank (no KV replication in
    this config), and the conv channel order q | k | v is kept per rank."""
    cfg, tensors, _ = tp2
    for name in tensors:
        full = tensors[name].float32()
        if not (name.startswith("model.layers.") and ("_attn." in name)):   # replicated
            assert all(np.array_equal(shard_weight(name, full, cfg, r, 2), full) for r in range(2))
            continue
        parts = [shard_weight(name, full, cfg, r, 2) for r in range(2)]
        assert sum(p.size for p in parts) == full.size, name
        if name.endswith(("o_proj.weight", "out_proj.weight")):
            assert np.array_equal(np.concatenate(parts, axis=1), full), name
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "A_log",
                            "dt_bias")):
            assert np.array_equal(np.concatenate(parts, axis=0), full), name
        else:
            assert sorted(map(bytes, np.concatenate(parts).reshape(full.shape[0], -1))) == \
                sorted(map(bytes, full.reshape(full.shape[0], -1))), name


@pytest.mark.parametrize("world", [2])
@pytest.mark.parametrize("which", ["tp2", "demo"])
def test_sharded_forward_matches_unsharded(request, which, world):
    cfg, tensors, _ = request.getfixturevalue(which)
    want = _two_blocks(TinyHybridTarget(cfg, tensors, reference_backend()), 7)

    def rank(r, all_reduce):
        t = TinyHybridTargetTP(cfg, tensors, reference_backend(), r, world, all_reduce)
        return _two_blocks(t, 7)
    got, group = run_ranks(world, rank)
    n_layers = len(cfg["layer_types"])
    assert group.calls == 2 * n_layers               # one all-reduce per layer per block
    for r in range(world):
        for (lg, hg), (lw, hw) in zip(got[r], want):
            assert lg.shape == lw.shape and hg.shape == hw.shape
            np.testing.assert_allclose(lg, lw, rtol=0, atol=2e-5)
            np.testing.assert_allclose(hg, hw, rtol=0, atol=2e-5)
        for (lg, hg), (l0, h0) in zip(got[r], got[0]):
            assert np.array_equal(lg, l0) and np.array_equal(hg, h0)


def _requests(V, sampled, n=3, new=12):
    rng = np.random.default_rng(3)
    return [Request(prompt=rng.integers(0, V, 4 + 5 * b).tolist(), max_new_tokens=new,
                    temperature=0.8 if sampled else 0.0, top_p=0.9 if sampled else 1.0,
                    seed=100 + b) for b in range(n)]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_tp_decoding_matches_one_rank(tp2, sampled):
    """Whole speculative runs (k = 3): every rank emits the same tokens as the unsharded
    model, round by round (seq_stop's outputs recorded per rank)."""
    cfg, tensors, dw = tp2
    reqs = _requests(cfg["vocab_size"], sampled)
    be = reference_backend()
    one = SpeculativeDecoder(TinyHybridTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be),
                             num_speculative_tokens=3, backend=be).generate(reqs)

    def rank(r, all_reduce):
        be = reference_backend()
        rounds = []
        stop = be.seq_stop

        def seq_stop(emitted, num_accepted, *a):
            out = stop(emitted, num_accepted, *a)
            rounds.append((num_accepted.copy(), emitted.copy(), a[-2].copy()))
            return out
        be.seq_stop = seq_stop
        t = TinyHybridTargetTP(cfg, tensors, be, r, 2, all_reduce)
        dec = SpeculativeDecoder(t, TinyMTPDraft(cfg, dw, tensors, be), num_speculative_tokens=3,
                                 backend=be)
        return [x.tokens for x in dec.generate(reqs)], rounds, dec.metrics
    got, _ = run_ranks(2, rank)
    (t0, r0, m0), (t1, r1, _) = got
    assert t0 == t1 == [x.tokens for x in one]
    assert len(r0) == len(r1) == m0.rounds
    for a, b in zip(r0, r1):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    if not sampled:
        assert 0 < m0.acceptance_rate < 1


class _FakeComm:
    """all_gather_host of two ranks: rank 1 sees ``shift`` added to what rank 0 sees."""

    def __init__(self, shift):
        self.shift = shift

    def all_gather_host(self, a):
        a = np.asarray(a, np.int64)
        return np.stack([a, a + self.shift])


@pytest.mark.parametrize("shift", [0, 1])
def test_rank_checked_raises_when_ranks_differ(demo, shift):
    """The per-round check of specdec_lib.parallel: equal gathered outputs pass through,
    a difference raises RankDisagreement naming the ranks."""
    cfg, tensors, dw = demo
    log = {"rounds": 0, "mismatch": 0}
    be = rank_checked(reference_backend(), _FakeComm(shift), log)
    dec = SpeculativeDecoder(TinyHybridTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be),
                             num_speculative_tokens=2, backend=be)
    reqs = _requests(cfg["vocab_size"], False, n=2, new=4)
    if shift:
        with pytest.raises(RankDisagreement, match=r"ranks \[1\] differ"):
            dec.generate(reqs)
        assert log["mismatch"] == 1
    else:
        dec.generate(reqs)
        assert log["rounds"] >= 2 and log["mismatch"] == 0


def test_tp_demo_help():
    p = _example("--help", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "--world-size" in p.stdout and "NCCL" in p.stdout


def _has(mod):
    try:
        __import__(mod)
        return True
    except Exception:     # noqa: BLE001
        return False


@pytest.mark.skipif(not _has("torch"), reason="needs torch (torch.distributed, gloo) for the "
                                               "multi-process run on CPU")
def test_tp_demo_processes_on_cpu(tmp_path):
    """The example itself on the reference backend: 2 processes, gloo all-reduces."""
    p = _example("--world-size", "2", "--backend", "reference", "--batch", "2",
                 "--max-new-tokens", "8", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS" in p.stdout


def _gpus():
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:     # noqa: BLE001
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs, torch with NCCL and cupy "
                                        "(run examples/tp_demo.py --world-size 2 on a 2-GPU machine)")
def test_tp_demo_nccl_two_gpus():
    p = _example("--world-size", "2", "--max-new-tokens", "16", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
