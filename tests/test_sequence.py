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
    toks = np.full(12, -9, np.int32)       # B*(K+1): the contract's worst case (T = 8 here)
    pos = np.full(12, -9, np.int32)
    dids = np.full(9, -9, np.int32)
    ref.seq_build_block(last, drafts, nd, L, cu, toks, pos, dids)
    assert cu.tolist() == [0, 4, 5, 8]
    assert toks[:8].tolist() == [10, 1, 2, 3, 20, 30, 7, 8]
    assert pos[:8].tolist() == [5, 6, 7, 8, 0, 7, 8, 9]
    assert dids[:5].tolist() == [1, 2, 3, 7, 8]      # spec_sample's draft_ids layout


def test_seq_stop_corrupt_lengths_are_flagged():
    # a negative out_lens never indexes the history: the row is flagged and keeps nothing
    emitted = np.array([[5, 6]], np.int32)
    out_tokens = np.full((1, 4), 3, np.int32)
    acc, fin = np.zeros(1, np.int32), np.zeros(1, np.uint8)
    ref.seq_stop(emitted, np.array([1], np.int32), out_tokens, np.array([-3], np.int32), None,
                 np.array([[[3, 5]]], np.int32), np.array([9], np.int32), acc, fin)
    assert (acc[0], fin[0]) == (0, FINISH_BAD_ROW)
    # out_lens past the buffer: only the C stored tokens are history
    acc, fin = np.zeros(1, np.int32), np.zeros(1, np.uint8)
    ref.seq_stop(emitted, np.array([1], np.int32), out_tokens, np.array([7], np.int32), None,
                 np.array([[[3, 5]]], np.int32), np.array([99], np.int32), acc, fin)
    assert (acc[0], fin[0]) == (1, FINISH_STOP_SEQ)


def test_seq_advance_clamps_and_flags():
    emitted = np.array([[5, 6], [7, 8], [1, 2]], np.int32)
    acc = np.array([9, 1, -4], np.int32)                 # > W: clamped to W; < 0: nothing
    L = np.zeros(3, np.int32)
    out = np.full((3, 3), -1, np.int32)
    out_lens = np.array([0, -2, 0], np.int32)
    last = np.full(3, -5, np.int32)
    fin = np.zeros(3, np.uint8)
    ref.seq_advance(emitted, acc, L, out, out_lens, last, fin)
    assert L.tolist() == [2, 1, 0] and last.tolist() == [6, 7, -5]
    assert out.tolist() == [[5, 6, -1], [-1] * 3, [-1] * 3] and out_lens.tolist() == [2, -2, 0]
    assert fin.tolist() == [0, FINISH_BAD_ROW, 0]


def test_sequence_ops_empty_batch():
    e = np.zeros((0, 3), np.int32)
    z = np.zeros(0, np.int32)
    acc, fin = ref.seq_stop(e, z, np.zeros((0, 4), np.int32), z, None, None, z, z.copy(),
                            np.zeros(0, np.uint8))
    assert acc.shape == (0,) and fin.shape == (0,)
    cu = np.full(1, 7, np.int32)
    ref.seq_build_block(z, np.zeros((0, 2), np.int32), z, z, cu, z.copy(), z.copy(), z.copy())
    assert cu.tolist() == [0]


# ------------------------------------------------------------------ validation without a GPU

class _Fake:
    """Stands in for a device array (address 0, never dereferenced): argument checks run
    without a GPU and must raise before anything reaches the driver."""

    def __init__(self, shape, typestr="<i4", strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (0, False), "strides": strides, "version": 3}


def _stop_args(B=3, W=4, C=8):
    return dict(emitted=_Fake((B, W)), num_accepted=_Fake((B,)), out_tokens=_Fake((B, C)),
                out_lens=_Fake((B,)), stop_ids=_Fake((B, 2)), stop_seqs=_Fake((B, 2, 3)),
                max_new_tokens=_Fake((B,)), accept_len=_Fake((B,)), finished=_Fake((B,), "|u1"))


@pytest.mark.parametrize("override,exc,match", [
    (dict(emitted=np.zeros((3, 4), np.int32)), TypeError, "emitted"),
    (dict(emitted=_Fake((3, 4), "<i8")), TypeError, "emitted: dtype"),
    (dict(emitted=_Fake((3, 4), strides=(4, 12))), ValueError, "emitted: must be C-contiguous"),
    (dict(num_accepted=_Fake((4,))), ValueError, "num_accepted"),
    (dict(out_tokens=_Fake((2, 8))), ValueError, "out_tokens"),
    (dict(out_lens=_Fake((3,), "<i8")), TypeError, "out_lens"),
    (dict(stop_ids=_Fake((2, 2))), ValueError, "stop_ids"),
    (dict(stop_seqs=_Fake((3, 2))), ValueError, "stop_seqs"),
    (dict(max_new_tokens=_Fake((3, 1))), ValueError, "max_new_tokens"),
    (dict(accept_len=None), TypeError, "accept_len"),
    (dict(finished=_Fake((3,), "|b1")), TypeError, "finished: dtype"),
    (dict(finished=_Fake((3,))), TypeError, "finished"),
])
def test_seq_stop_op_validation(override, exc, match):
    from specdec_lib import ops
    with pytest.raises(exc, match=match):
        ops.seq_stop(**dict(_stop_args(), **override))


@pytest.mark.parametrize("override,exc,match", [
    (dict(accept_len=_Fake((2,))), ValueError, "accept_len"),
    (dict(seq_lens=_Fake((3,), "<i8")), TypeError, "seq_lens"),
    (dict(out_tokens=_Fake((3,))), ValueError, "out_tokens"),
    (dict(out_lens=_Fake((3,), strides=(8,))), ValueError, "out_lens"),
    (dict(last_token=np.zeros(3, np.int32)), TypeError, "last_token"),
    (dict(finished=_Fake((4,), "|u1")), ValueError, "finished"),
])
def test_seq_advance_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(emitted=_Fake((3, 4)), accept_len=_Fake((3,)), seq_lens=_Fake((3,)),
                out_tokens=_Fake((3, 8)), out_lens=_Fake((3,)), last_token=_Fake((3,)),
                finished=_Fake((3,), "|u1"))
    with pytest.raises(exc, match=match):
        ops.seq_advance(**dict(args, **override))


@pytest.mark.parametrize("override,exc,match", [
    (dict(draft_tokens=_Fake((2, 3))), ValueError, "draft_tokens"),
    (dict(num_draft=_Fake((3,), "<i8")), TypeError, "num_draft"),
    (dict(cu_q=_Fake((3,))), ValueError, "cu_q"),
    (dict(block_tokens=_Fake((11,))), ValueError, "block_tokens: needs at least 12"),
    (dict(positions=_Fake((12, 1))), ValueError, "positions"),
    (dict(draft_ids=_Fake((8,))), ValueError, "draft_ids: needs at least 9"),
])
def test_seq_build_block_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(last_token=_Fake((3,)), draft_tokens=_Fake((3, 3)), num_draft=_Fake((3,)),
                seq_lens=_Fake((3,)), cu_q=_Fake((4,)), block_tokens=_Fake((12,)),
                positions=_Fake((12,)), draft_ids=_Fake((9,)))
    with pytest.raises(exc, match=match):
        ops.seq_build_block(**dict(args, **override))


# ------------------------------------------------------------------------------ GPU

def _dev(*arrays):
    from specdec_lib import DeviceArray
    return [DeviceArray.from_numpy(a) for a in arrays]


def _stop_inputs(rng, B, W, C=16, with_ids=True, with_seqs=True):
    """Random rows over a 6-token alphabet (stop ids and sequences hit often), with
    corrupt values mixed in: n out of range, -1 tokens, out_lens < 0 or > C, rows
    finished on entry, max_new already reached."""
    emitted = np.where(rng.random((B, W)) < 0.95, rng.integers(0, 6, (B, W)), -1).astype(np.int32)
    n = rng.integers(0, W, B).astype(np.int32)
    n[rng.random(B) < 0.1] = rng.choice([-1, W, W + 3])
    out_tokens = rng.integers(0, 6, (B, C)).astype(np.int32)
    out_lens = rng.integers(0, C + 1, B).astype(np.int32)
    out_lens[rng.random(B) < 0.05] = -2
    out_lens[rng.random(B) < 0.05] = C + 5
    stop_ids = rng.integers(-1, 6, (B, 3)).astype(np.int32) if with_ids else None
    stop_seqs = None
    if with_seqs:
        stop_seqs = rng.integers(0, 6, (B, 2, 3)).astype(np.int32)
        pad = rng.integers(0, 4, (B, 2))     # left padding of each sequence: 0..3 (3 = unused)
        stop_seqs[np.arange(3)[None, None, :] < pad[..., None]] = -1
    max_new = (np.maximum(out_lens, 0) + rng.integers(-1, W + 2, B)).astype(np.int32)
    fin = np.where(rng.random(B) < 0.2, rng.integers(1, 6, B), 0).astype(np.uint8)
    return emitted, n, out_tokens, out_lens, stop_ids, stop_seqs, max_new, fin


@needs_gpu
@pytest.mark.parametrize("B,W", [(1, 1), (7, 4), (64, 8), (300, 16), (0, 3)])
@pytest.mark.parametrize("stops", ["both", "ids", "seqs", "none"])
def test_seq_stop_gpu(B, W, stops, rng):
    from specdec_lib import ops
    emitted, n, out_tokens, out_lens, stop_ids, stop_seqs, max_new, fin = _stop_inputs(
        rng, B, W, with_ids=stops in ("both", "ids"), with_seqs=stops in ("both", "seqs"))
    acc_ref, fin_ref = np.full(B, -9, np.int32), fin.copy()
    ref.seq_stop(emitted, n, out_tokens, out_lens, stop_ids, stop_seqs, max_new, acc_ref, fin_ref)
    d_em, d_n, d_out, d_ol, d_mn, d_fin = _dev(emitted, n, out_tokens, out_lens, max_new, fin)
    d_ids = _dev(stop_ids)[0] if stop_ids is not None else None
    d_seqs = _dev(stop_seqs)[0] if stop_seqs is not None else None
    acc = poison((B,), "int32")
    ops.seq_stop(d_em, d_n, d_out, d_ol, d_ids, d_seqs, d_mn, acc, d_fin)
    np.testing.assert_array_equal(acc.to_numpy(), acc_ref)
    np.testing.assert_array_equal(d_fin.to_numpy(), fin_ref)
    np.testing.assert_array_equal(d_em.to_numpy(), emitted)        # inputs untouched
    np.testing.assert_array_equal(d_out.to_numpy(), out_tokens)


@needs_gpu
@pytest.mark.parametrize("B,W,C", [(1, 1, 1), (9, 5, 7), (64, 8, 256), (0, 4, 4)])
def test_seq_advance_gpu(B, W, C, rng):
    from specdec_lib import ops
    emitted = rng.integers(0, 100, (B, W)).astype(np.int32)
    acc = rng.integers(-2, W + 3, B).astype(np.int32)
    L = rng.integers(0, 50, B).astype(np.int32)
    out = rng.integers(0, 100, (B, C)).astype(np.int32)
    out_lens = rng.integers(-2, C + 3, B).astype(np.int32)
    last = rng.integers(0, 100, B).astype(np.int32)
    fin = np.where(rng.random(B) < 0.2, 1, 0).astype(np.uint8)
    host = [x.copy() for x in (L, out, out_lens, last, fin)]
    ref.seq_advance(emitted, acc, *host)
    dev = _dev(L, out, out_lens, last, fin)
    ops.seq_advance(*_dev(emitted, acc), *dev)
    for name, h, d in zip(("seq_lens", "out_tokens", "out_lens", "last_token", "finished"),
                          host, dev):
        np.testing.assert_array_equal(d.to_numpy(), h, err_msg=name)


@needs_gpu
@pytest.mark.parametrize("B,K", [(1, 0), (5, 1), (64, 7), (300, 3), (1000, 15), (0, 3)])
@pytest.mark.parametrize("with_draft_ids", [True, False])
def test_seq_build_block_gpu(B, K, with_draft_ids, rng):
    """B > 256 crosses the kernel's scan chunks; num_draft out of 0..K is clamped."""
    from specdec_lib import ops
    last = rng.integers(0, 1000, B).astype(np.int32)
    drafts = rng.integers(0, 1000, (B, K)).astype(np.int32)
    nd = rng.integers(-2, K + 3, B).astype(np.int32)
    L = rng.integers(0, 5000, B).astype(np.int32)
    n_rows = B * (K + 1)
    cu, toks, pos = (np.full(B + 1, -9, np.int32), np.full(n_rows, -9, np.int32),
                     np.full(n_rows, -9, np.int32))
    dids = np.full(B * K, -9, np.int32) if with_draft_ids else None
    ref.seq_build_block(last, drafts, nd, L, cu, toks, pos, dids)
    T = int(cu[-1])
    dcu, dtoks, dpos = poison((B + 1,), "int32"), poison((n_rows,), "int32"), poison((n_rows,), "int32")
    ddids = poison((B * K,), "int32") if with_draft_ids else None
    ops.seq_build_block(*_dev(last, drafts, nd, L), dcu, dtoks, dpos, ddids)
    np.testing.assert_array_equal(dcu.to_numpy(), cu)
    got_t, got_p = dtoks.to_numpy(), dpos.to_numpy()
    np.testing.assert_array_equal(got_t[:T], toks[:T])
    np.testing.assert_array_equal(got_p[:T], pos[:T])
    assert np.all(got_t[T:] == -1) and np.all(got_p[T:] == -1)     # nothing past T written
    if with_draft_ids:
        got_d = ddids.to_numpy()
        np.testing.assert_array_equal(got_d[:T - B], dids[:T - B])
        assert np.all(got_d[T - B:] == -1)


@needs_gpu
def test_sequence_rounds_gpu(rng):
    """Several rounds of seq_build_block -> seq_stop -> seq_advance on the device against the
    reference on the host: stop sequences crossing rounds, max length mid-block, rows
    finishing in different rounds, finished rows left alone."""
    from specdec_lib import ops
    B, K, C, R = 24, 3, 40, 8
    W = K + 1
    h = dict(last=rng.integers(0, 6, B).astype(np.int32), L=rng.integers(0, 9, B).astype(np.int32),
             out=np.full((B, C), -1, np.int32), out_lens=np.zeros(B, np.int32),
             fin=np.zeros(B, np.uint8), cu=np.zeros(B + 1, np.int32),
             toks=np.zeros(B * W, np.int32), pos=np.zeros(B * W, np.int32),
             dids=np.zeros(B * K, np.int32), acc=np.zeros(B, np.int32))
    stop_ids = np.full((B, 2), -1, np.int32)
    stop_ids[::5, 0] = 5
    stop_seqs = np.full((B, 2, 3), -1, np.int32)
    stop_seqs[1::3, 0] = [2, 3, 4]
    stop_seqs[2::3, 1, 1:] = [1, 1]
    max_new = rng.integers(3, 25, B).astype(np.int32)
    d = {k: _dev(v)[0] for k, v in h.items()}
    d_ids, d_seqs, d_max = _dev(stop_ids, stop_seqs, max_new)
    for _ in range(R):
        drafts = rng.integers(0, 6, (B, K)).astype(np.int32)
        nd = rng.integers(0, K + 1, B).astype(np.int32)
        n = rng.integers(0, K + 1, B).astype(np.int32)
        emitted = rng.integers(0, 6, (B, W)).astype(np.int32)
        ref.seq_build_block(h["last"], drafts, nd, h["L"], h["cu"], h["toks"], h["pos"], h["dids"])
        ref.seq_stop(emitted, n, h["out"], h["out_lens"], stop_ids, stop_seqs, max_new, h["acc"],
                     h["fin"])
        ref.seq_advance(emitted, h["acc"], h["L"], h["out"], h["out_lens"], h["last"], h["fin"])
        d_drafts, d_nd, d_n, d_em = _dev(drafts, nd, n, emitted)
        ops.seq_build_block(d["last"], d_drafts, d_nd, d["L"], d["cu"], d["toks"], d["pos"],
                            d["dids"])
        ops.seq_stop(d_em, d_n, d["out"], d["out_lens"], d_ids, d_seqs, d_max, d["acc"], d["fin"])
        ops.seq_advance(d_em, d["acc"], d["L"], d["out"], d["out_lens"], d["last"], d["fin"])
        T = int(h["cu"][-1])
        for k in ("cu", "acc", "L", "out", "out_lens", "last", "fin"):
            np.testing.assert_array_equal(d[k].to_numpy(), h[k], err_msg=k)
        np.testing.assert_array_equal(d["toks"].to_numpy()[:T], h["toks"][:T])
        np.testing.assert_array_equal(d["pos"].to_numpy()[:T], h["pos"][:T])
    assert h["fin"].any() and len(set(h["fin"].tolist())) > 1    # several reasons were hit


@needs_gpu
def test_sequence_ops_reject_before_launch():
    from specdec_lib import DeviceArray, ops
    B, W = 3, 4
    acc = poison((B,), "int32")
    good = dict(emitted=DeviceArray.from_numpy(np.zeros((B, W), np.int32)),
                num_accepted=DeviceArray.from_numpy(np.zeros(B, np.int32)),
                out_tokens=DeviceArray.from_numpy(np.zeros((B, 8), np.int32)),
                out_lens=DeviceArray.from_numpy(np.zeros(B, np.int32)), stop_ids=None,
                stop_seqs=None, max_new_tokens=DeviceArray.from_numpy(np.full(B, 9, np.int32)),
                accept_len=acc, finished=DeviceArray.from_numpy(np.zeros(B, np.uint8)))
    for override, exc, match in [
        (dict(num_accepted=DeviceArray.from_numpy(np.zeros(B, np.int64))), TypeError, "num_accepted"),
        (dict(finished=DeviceArray.from_numpy(np.zeros(B, np.int32))), TypeError, "finished"),
        (dict(out_tokens=DeviceArray.from_numpy(np.zeros((B + 1, 8), np.int32))), ValueError,
         "out_tokens"),
        (dict(stop_ids=np.zeros((B, 2), np.int32)), TypeError, "stop_ids"),
    ]:
        with pytest.raises(exc, match=match):
            ops.seq_stop(**dict(good, **override))
        assert np.all(acc.to_numpy() == -1)
    ops.seq_stop(**good)
    assert acc.to_numpy().tolist() == [1, 1, 1]


# ---------------------------------------------------------------- the argument contract (CPU)
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from conftest import cast as _cast, vals as _vals, zeros_on as _new  # noqa: E402

_TORCH = ("torch",)








_STOP_ORDER = ("emitted", "num_accepted", "out_tokens", "out_lens", "stop_ids", "stop_seqs",
               "max_new_tokens", "accept_len", "finished")


def _seq_stop_call():
    return dict(emitted=np.array([[5, 6, 7], [8, 9, -1]], np.int32),
                num_accepted=np.array([2, 1], np.int32),
                out_tokens=np.array([[1, 2, -1, -1], [3, -1, -1, -1]], np.int32),
                out_lens=np.array([2, 1], np.int32), stop_ids=np.array([[6], [-1]], np.int32),
                stop_seqs=np.array([[[-1, -1, -1]], [[-1, 8, 9]]], np.int32),
                max_new_tokens=np.array([10, 10], np.int32),
                accept_len=np.full(2, -7, np.int32), finished=np.zeros(2, np.uint8))


_SEQ_STOP_BAD = [
    ("finished_bool", _TORCH, lambda a, p: a.update(finished=_cast(p, a["finished"], "bool")),
     TypeError, r"^finished: dtype"),
    ("num_accepted_int64", _TORCH, lambda a, p: a.update(num_accepted=_cast(p, a["num_accepted"], "int64")),
     TypeError, r"^num_accepted: dtype"),
    ("accept_len_float", REFUSAL_PATHS, lambda a, p: a.update(accept_len=_cast(p, a["accept_len"], "float32")),
     TypeError, r"^accept_len: dtype"),
    ("out_tokens_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(out_tokens=a["out_tokens"][:1]),
     ValueError, r"^out_tokens: expected shape \[2, \*\]"),
    ("stop_ids_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(stop_ids=a["stop_ids"][:1]),
     ValueError, r"^stop_ids: expected shape \[2, S\]"),
    ("stop_seqs_2d", REFUSAL_PATHS, lambda a, p: a.update(stop_seqs=a["stop_seqs"][:, 0]),
     ValueError, r"^stop_seqs: expected 3 dimensions"),
    ("emitted_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(emitted=strided_last(a["emitted"])),
     ValueError, r"^emitted: must be C-contiguous"),
    ("max_new_tokens_wrong_length", REFUSAL_PATHS,
     lambda a, p: a.update(max_new_tokens=_vals(p, [10, 10, 10])),
     ValueError, r"^max_new_tokens: expected shape \[2\]"),
    ("finished_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(finished=a["finished"][:1]),
     ValueError, r"^finished: expected shape \[2\]"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _SEQ_STOP_BAD, ids=[c[0] for c in _SEQ_STOP_BAD])
def test_seq_stop_refuses_bad_input(path, case):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _seq_stop_call())
    mutate(args, path)
    assert_refused(lambda: call_op(path, "seq_stop", [args[n] for n in _STOP_ORDER]), exc, match,
                   [args["accept_len"], args["finished"]])


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_seq_stop_good_input_passes_the_contract(path):
    args = on_path(path, _seq_stop_call())
    call_op(path, "seq_stop", [args[n] for n in _STOP_ORDER])
    assert np.asarray(args["accept_len"]).tolist() == [2, 2]
    assert np.asarray(args["finished"]).tolist() == [FINISH_STOP_ID, FINISH_STOP_SEQ]


_ADV_ORDER = ("emitted", "accept_len", "seq_lens", "out_tokens", "out_lens", "last_token", "finished")
_ADV_OUT = ("seq_lens", "out_tokens", "out_lens", "last_token", "finished")


def _seq_advance_call():
    return dict(emitted=np.array([[5, 6, 7], [8, 9, -1]], np.int32),
                accept_len=np.array([2, 1], np.int32), seq_lens=np.array([4, 9], np.int32),
                out_tokens=np.full((2, 4), -1, np.int32), out_lens=np.array([0, 1], np.int32),
                last_token=np.zeros(2, np.int32), finished=np.zeros(2, np.uint8))


_SEQ_ADVANCE_BAD = [
    ("seq_lens_int64", _TORCH, lambda a, p: a.update(seq_lens=_cast(p, a["seq_lens"], "int64")),
     TypeError, r"^seq_lens: dtype"),
    ("finished_int32", _TORCH, lambda a, p: a.update(finished=_cast(p, a["finished"], "int32")),
     TypeError, r"^finished: dtype"),
    ("out_lens_float", REFUSAL_PATHS, lambda a, p: a.update(out_lens=_cast(p, a["out_lens"], "float32")),
     TypeError, r"^out_lens: dtype"),
    ("emitted_1d", REFUSAL_PATHS, lambda a, p: a.update(emitted=a["emitted"][0]),
     ValueError, r"^emitted: expected 2 dimensions"),
    ("out_tokens_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(out_tokens=a["out_tokens"][:1]),
     ValueError, r"^out_tokens: expected shape"),
    ("last_token_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(last_token=_vals(p, [0, 0, 0])),
     ValueError, r"^last_token: expected shape \[2\]"),
    ("out_tokens_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(out_tokens=strided_last(a["out_tokens"])),
     ValueError, r"^out_tokens: must be C-contiguous"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _SEQ_ADVANCE_BAD, ids=[c[0] for c in _SEQ_ADVANCE_BAD])
def test_seq_advance_refuses_bad_input(path, case):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _seq_advance_call())
    mutate(args, path)
    assert_refused(lambda: call_op(path, "seq_advance", [args[n] for n in _ADV_ORDER]), exc, match,
                   [args[n] for n in _ADV_OUT])


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_seq_advance_good_input_passes_the_contract(path):
    args = on_path(path, _seq_advance_call())
    call_op(path, "seq_advance", [args[n] for n in _ADV_ORDER])
    assert np.asarray(args["seq_lens"]).tolist() == [6, 10]
    assert np.asarray(args["out_tokens"]).tolist() == [[5, 6, -1, -1], [-1, 8, -1, -1]]
    assert np.asarray(args["last_token"]).tolist() == [6, 8]


_BB_ORDER = ("last_token", "draft_tokens", "num_draft", "seq_lens", "cu_q", "block_tokens",
             "positions", "draft_ids")
_BB_OUT = ("cu_q", "block_tokens", "positions", "draft_ids")


def _seq_build_block_call():
    B, K = 2, 3
    return dict(last_token=np.array([10, 20], np.int32),
                draft_tokens=np.array([[1, 2, 3], [4, 5, 6]], np.int32),
                num_draft=np.array([3, 1], np.int32), seq_lens=np.array([5, 0], np.int32),
                cu_q=np.full(B + 1, -9, np.int32), block_tokens=np.full(B * (K + 1), -9, np.int32),
                positions=np.full(B * (K + 1), -9, np.int32), draft_ids=np.full(B * K, -9, np.int32))


_SEQ_BUILD_BLOCK_BAD = [
    ("num_draft_int64", _TORCH, lambda a, p: a.update(num_draft=_cast(p, a["num_draft"], "int64")),
     TypeError, r"^num_draft: dtype"),
    ("seq_lens_float", REFUSAL_PATHS, lambda a, p: a.update(seq_lens=_cast(p, a["seq_lens"], "float32")),
     TypeError, r"^seq_lens: dtype"),
    ("block_tokens_short", REFUSAL_PATHS, lambda a, p: a.update(block_tokens=a["block_tokens"][:7]),
     ValueError, r"^block_tokens: needs at least 8 elements"),
    ("positions_2d", REFUSAL_PATHS, lambda a, p: a.update(positions=a["positions"].reshape(2, 4)),
     ValueError, r"^positions: expected 1 dimensions"),
    ("draft_ids_short", REFUSAL_PATHS, lambda a, p: a.update(draft_ids=a["draft_ids"][:5]),
     ValueError, r"^draft_ids: needs at least 6 elements"),
    ("cu_q_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(cu_q=a["cu_q"][:2]),
     ValueError, r"^cu_q: expected shape \[3\]"),
    ("draft_tokens_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(draft_tokens=a["draft_tokens"][:1]),
     ValueError, r"^draft_tokens: expected shape \[2, K\]"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _SEQ_BUILD_BLOCK_BAD, ids=[c[0] for c in _SEQ_BUILD_BLOCK_BAD])
def test_seq_build_block_refuses_bad_input(path, case):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _seq_build_block_call())
    mutate(args, path)
    assert_refused(lambda: call_op(path, "seq_build_block", [args[n] for n in _BB_ORDER]), exc,
                   match, [args[n] for n in _BB_OUT])


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_seq_build_block_good_input_passes_the_contract(path):
    args = on_path(path, _seq_build_block_call())
    call_op(path, "seq_build_block", [args[n] for n in _BB_ORDER])
    assert np.asarray(args["cu_q"]).tolist() == [0, 4, 6]
    assert np.asarray(args["block_tokens"])[:6].tolist() == [10, 1, 2, 3, 20, 4]
    assert np.asarray(args["positions"])[:6].tolist() == [5, 6, 7, 8, 0, 1]
