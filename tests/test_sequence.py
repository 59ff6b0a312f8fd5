"""Sequence ops: seq_stop, seq_advance, seq_build_block (reference on CPU, kernels on GPU)."""
import numpy as np
import pytest

from conftest import needs_gpu, poison
from specdec_lib.reference import sequence as ref
from specdec_lib.reference.sequence import (FINISH_BAD_ROW, FINISH_CAPACITY, FINISH_MAX_LEN,
                                            FINISH_NONE, FINISH_STOP_ID, FINISH_STOP_SEQ)


def _stop_case(emitted, n, out=(), max_new=100, stop_ids=None, stop_seqs=None, finished=0):
    emitted = np.array([emitted], np.int32)
    out_tokens = np.full((1, 64), -1, np.int32)
    out_tokens[0, :len(out)] = out
    acc = np.full(1, -7, np.int32)
    fin = np.array([finished], np.uint8)
    sid = None if stop_ids is None else np.array([stop_ids], np.int32)
    sseq = None if stop_seqs is None else np.array([stop_seqs], np.int32)
    ref.seq_stop(emitted, np.array([n], np.int32), out_tokens, np.array([len(out)], np.int32),
                 sid, sseq, np.array([max_new], np.int32), acc, fin)
    return int(acc[0]), int(fin[0])


def test_seq_stop_no_stop_keeps_all():
    assert _stop_case([5, 6, 7, 8], 3) == (4, FINISH_NONE)
    assert _stop_case([5, 6, -1, -1], 1) == (2, FINISH_NONE)


def test_seq_stop_stop_id_mid_block():
    assert _stop_case([5, 6, 7, 8], 3, stop_ids=[7, -1]) == (3, FINISH_STOP_ID)
    assert _stop_case([5, 6, 7, 8], 3, stop_ids=[-1, 5]) == (1, FINISH_STOP_ID)
    # a stop id past the accepted tokens does not count
    assert _stop_case([5, 6, 7, 8], 1, stop_ids=[7]) == (2, FINISH_NONE)


def test_seq_stop_stop_sequence_crossing_the_round_boundary():
    # output so far ends with 3, 4; stop sequence 3 4 5 completes at the first new token
    assert _stop_case([5, 6, 7], 2, out=[1, 3, 4], stop_seqs=[[3, 4, 5], [-1, -1, -1]]) == \
        (1, FINISH_STOP_SEQ)
    # left-padded shorter sequence inside the block
    assert _stop_case([5, 6, 7], 2, out=[1], stop_seqs=[[-1, 6, 7]]) == (3, FINISH_STOP_SEQ)
    # no match: history differs
    assert _stop_case([5, 6, 7], 2, out=[1, 9, 4], stop_seqs=[[3, 4, 5]]) == (3, FINISH_NONE)
    # longer than everything generated so far: never matches
    assert _stop_case([5], 0, out=[], stop_seqs=[[4, 5]]) == (1, FINISH_NONE)


def test_seq_stop_max_length_mid_block():
    assert _stop_case([5, 6, 7, 8], 3, out=[1, 2], max_new=4) == (2, FINISH_MAX_LEN)
    assert _stop_case([5, 6, 7, 8], 3, out=[1, 2], max_new=6) == (4, FINISH_MAX_LEN)
    assert _stop_case([5, 6, 7, 8], 3, out=[1, 2], max_new=2) == (0, FINISH_MAX_LEN)
    # a stop id on the very token that reaches the limit reports the stop
    assert _stop_case([5, 6, 7, 8], 3, out=[1, 2], max_new=4, stop_ids=[6]) == (2, FINISH_STOP_ID)


def test_seq_stop_finished_on_entry_commits_nothing():
    assert _stop_case([5, 6, 7], 2, finished=FINISH_STOP_ID) == (0, FINISH_STOP_ID)


def test_seq_stop_bad_rows_are_flagged():
    assert _stop_case([5, 6, 7], 3) == (0, FINISH_BAD_ROW)          # n >= W
    assert _stop_case([5, 6, 7], -1) == (0, FINISH_BAD_ROW)
    assert _stop_case([-1, -1, -1], 0) == (0, FINISH_BAD_ROW)       # invalid sample block
    assert _stop_case([5, -1, 7], 2) == (1, FINISH_BAD_ROW)


def test_seq_stop_batch_matches_rows():
    rng = np.random.default_rng(0)
    B, W = 9, 5
    emitted = rng.integers(0, 6, (B, W)).astype(np.int32)
    n = rng.integers(0, W, B).astype(np.int32)
    out_tokens = rng.integers(0, 6, (B, 16)).astype(np.int32)
    out_lens = rng.integers(0, 10, B).astype(np.int32)
    stop_ids = rng.integers(-1, 6, (B, 2)).astype(np.int32)
    stop_seqs = rng.integers(0, 6, (B, 2, 3)).astype(np.int32)
    stop_seqs[:, :, 0] = -1
    max_new = (out_lens + rng.integers(0, 6, B)).astype(np.int32)
    fin = (rng.random(B) < 0.2).astype(np.uint8)
    acc = np.zeros(B, np.int32)
    fin0 = fin.copy()
    ref.seq_stop(emitted, n, out_tokens, out_lens, stop_ids, stop_seqs, max_new, acc, fin)
    for b in range(B):
        a1 = np.zeros(1, np.int32)
        f1 = fin0[b:b + 1].copy()
        ref.seq_stop(emitted[b:b + 1], n[b:b + 1], out_tokens[b:b + 1], out_lens[b:b + 1],
                     stop_ids[b:b + 1], stop_seqs[b:b + 1], max_new[b:b + 1], a1, f1)
        assert (a1[0], f1[0]) == (acc[b], fin[b])
        assert 0 <= acc[b] <= n[b] + 1


def test_seq_stop_validation_names_argument():
    e = np.zeros((2, 3), np.int32)
    z = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="num_accepted"):
        ref.seq_stop(e, np.zeros(3, np.int32), np.zeros((2, 4), np.int32), z, None, None, z,
                     z.copy(), np.zeros(2, np.uint8))
    with pytest.raises(TypeError, match="emitted"):
        ref.seq_stop(e.astype(np.float32), z, np.zeros((2, 4), np.int32), z, None, None, z,
                     z.copy(), np.zeros(2, np.uint8))


def test_seq_advance_appends_and_advances():
    emitted = np.array([[5, 6, 7], [8, 9, -1], [1, 2, 3]], np.int32)
    acc = np.array([3, 2, 0], np.int32)
    L = np.array([10, 20, 30], np.int32)
    out = np.full((3, 4), -1, np.int32)
    out[1, 0] = 4
    out_lens = np.array([0, 1, 0], np.int32)
    last = np.array([-5, -5, -5], np.int32)
    fin = np.zeros(3, np.uint8)
    ref.seq_advance(emitted, acc, L, out, out_lens, last, fin)
    assert L.tolist() == [13, 22, 30]
    assert out.tolist() == [[5, 6, 7, -1], [4, 8, 9, -1], [-1] * 4]
    assert out_lens.tolist() == [3, 3, 0]
    assert last.tolist() == [7, 9, -5]
    assert fin.tolist() == [0, 0, 0]


def test_seq_advance_capacity_overflow_flags():
    emitted = np.array([[5, 6, 7]], np.int32)
    out = np.full((1, 4), -1, np.int32)
    out_lens = np.array([2], np.int32)
    L = np.array([0], np.int32)
    last = np.zeros(1, np.int32)
    fin = np.zeros(1, np.uint8)
    ref.seq_advance(emitted, np.array([3], np.int32), L, out, out_lens, last, fin)
    assert out[0].tolist() == [-1, -1, 5, 6] and out_lens[0] == 4
    assert L[0] == 3 and last[0] == 7 and fin[0] == FINISH_CAPACITY


def test_seq_build_block_ragged():
    last = np.array([10, 20, 30], np.int32)
    drafts = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.int32)
    nd = np.array([3, 0, 2], np.int32)
    L = np.array([5, 0, 7], np.int32)
    cu = np.full(4, -9, np.int32)
    toks = np.full(9, -9, np.int32)
    pos = np.full(9, -9, np.int32)
    dids = np.full(6, -9, np.int32)
    ref.seq_build_block(last, drafts, nd, L, cu, toks, pos, dids)
    assert cu.tolist() == [0, 4, 5, 8]
    assert toks[:8].tolist() == [10, 1, 2, 3, 20, 30, 7, 8]
    assert pos[:8].tolist() == [5, 6, 7, 8, 0, 7, 8, 9]
    assert dids[:5].tolist() == [1, 2, 3, 7, 8]      # spec_sample's draft_ids layout


# ------------------------------------------------------------------------------ GPU

def _ops():
    from specdec_lib import ops
    return ops


@needs_gpu
@pytest.mark.parametrize("B,W", [(1, 1), (7, 4), (64, 8), (0, 3)])
def test_seq_stop_gpu(B, W, rng):
    from specdec_lib import DeviceArray
    ops = _ops()
    emitted = rng.integers(-1, 6, (B, W)).astype(np.int32)
    n = rng.integers(-1, W + 1, B).astype(np.int32)
    out_tokens = rng.integers(0, 6, (B, 16)).astype(np.int32)
    out_lens = rng.integers(0, 10, B).astype(np.int32)
    stop_ids = rng.integers(-1, 6, (B, 3)).astype(np.int32)
    stop_seqs = rng.integers(-1, 6, (B, 2, 3)).astype(np.int32)
    max_new = (out_lens + rng.integers(0, 6, B)).astype(np.int32)
    fin = (rng.random(B) < 0.2).astype(np.uint8)
    acc_ref, fin_ref = np.zeros(B, np.int32), fin.copy()
    ref.seq_stop(emitted, n, out_tokens, out_lens, stop_ids, stop_seqs, max_new, acc_ref, fin_ref)
    d = {k: DeviceArray.from_numpy(v) for k, v in dict(
        emitted=emitted, n=n, out_tokens=out_tokens, out_lens=out_lens, stop_ids=stop_ids,
        stop_seqs=stop_seqs, max_new=max_new, fin=fin).items()}
    acc = poison((B,), "int32")
    ops.seq_stop(d["emitted"], d["n"], d["out_tokens"], d["out_lens"], d["stop_ids"],
                 d["stop_seqs"], d["max_new"], acc, d["fin"])
    assert np.array_equal(acc.to_numpy(), acc_ref)
    assert np.array_equal(d["fin"].to_numpy(), fin_ref)


@needs_gpu
@pytest.mark.parametrize("B,W,C", [(1, 1, 1), (9, 5, 7), (64, 8, 256)])
def test_seq_advance_and_build_block_gpu(B, W, C, rng):
    from specdec_lib import DeviceArray
    ops = _ops()
    emitted = rng.integers(0, 100, (B, W)).astype(np.int32)
    acc = rng.integers(0, W + 1, B).astype(np.int32)
    L = rng.integers(0, 50, B).astype(np.int32)
    out = rng.integers(0, 100, (B, C)).astype(np.int32)
    out_lens = rng.integers(0, C + 1, B).astype(np.int32)
    last = rng.integers(0, 100, B).astype(np.int32)
    fin = np.zeros(B, np.uint8)
    host = [x.copy() for x in (L, out, out_lens, last, fin)]
    ref.seq_advance(emitted, acc, *host)
    dev = [DeviceArray.from_numpy(x) for x in (L, out, out_lens, last, fin)]
    ops.seq_advance(DeviceArray.from_numpy(emitted), DeviceArray.from_numpy(acc), *dev)
    for h, d in zip(host, dev):
        assert np.array_equal(d.to_numpy(), h)
    K = W - 1
    drafts = rng.integers(0, 100, (B, K)).astype(np.int32)
    nd = rng.integers(0, K + 1, B).astype(np.int32)
    cu, toks, pos, dids = (np.zeros(B + 1, np.int32), np.zeros(B * W, np.int32),
                           np.zeros(B * W, np.int32), np.zeros(max(B * K, 1), np.int32))
    ref.seq_build_block(last, drafts, nd, L, cu, toks, pos, dids)
    T = int(cu[-1])
    dcu, dtoks, dpos, ddids = (poison(cu.shape, "int32"), poison(toks.shape, "int32"),
                               poison(pos.shape, "int32"), poison(dids.shape, "int32"))
    ops.seq_build_block(DeviceArray.from_numpy(last), DeviceArray.from_numpy(drafts),
                        DeviceArray.from_numpy(nd), DeviceArray.from_numpy(L), dcu, dtoks, dpos,
                        ddids)
    assert np.array_equal(dcu.to_numpy(), cu)
    assert np.array_equal(dtoks.to_numpy()[:T], toks[:T])
    assert np.array_equal(dpos.to_numpy()[:T], pos[:T])
    assert np.array_equal(ddids.to_numpy()[:T - B], dids[:T - B])
