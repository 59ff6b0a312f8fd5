"""Draft ops: draft_carry, capture_hidden, draft_combine, draft_map_tokens, ngram_propose."""
import numpy as np
import pytest

from conftest import needs_gpu, poison, rel_err
from specdec_lib.reference import draft as ref


def test_draft_carry_gathers_last_committed_row():
    hidden = np.arange(12, dtype=np.float32).reshape(6, 2)
    cu_q = np.array([0, 3, 4, 6], np.int32)
    acc = np.array([2, 0, 2], np.int32)
    out = np.full((3, 2), np.nan, np.float32)
    ref.draft_carry(hidden, cu_q, acc, out)
    assert out.tolist() == [[2, 3], [0, 0], [10, 11]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8])
def test_draft_carry_shards_sum_to_full(dtype, rng):
    T, H, B = 11, 8, 4
    hidden = rng.integers(0, 50, (T, H)).astype(dtype)
    cu_q = np.array([0, 2, 5, 9, 11], np.int32)
    acc = np.array([2, 3, 1, 2], np.int32)
    full = np.zeros((B, H), dtype)
    ref.draft_carry(hidden, cu_q, acc, full)
    total = np.zeros((B, H), np.float64)
    for r0, r1 in ((0, 4), (4, 7), (7, 11)):          # sequence-parallel row shards
        for c0, c1 in ((0, 3), (3, 8)):               # and hidden-dim shards
            part = np.full((B, H), 99, dtype)
            ref.draft_carry(np.ascontiguousarray(hidden[r0:r1, c0:c1]), cu_q, acc, part,
                            row_begin=r0, col_begin=c0)
            total += part
    assert np.array_equal(total, full.astype(np.float64))


def test_capture_hidden_taps_and_residual(rng):
    T, H = 5, 4
    taps = [rng.standard_normal((T, H)).astype(np.float32) for _ in range(3)]
    res = rng.standard_normal((T, H)).astype(np.float32)
    out = np.full((T, 3 * H), np.nan, np.float32)
    for i, x in enumerate(taps):
        ref.capture_hidden(x, out, i, residual=res if i == 1 else None)
    want = np.concatenate([taps[0], taps[1] + res, taps[2]], axis=1)
    assert np.allclose(out, want)
    with pytest.raises(ValueError, match="tap"):
        ref.capture_hidden(taps[0], out, 3)


@pytest.mark.parametrize("unit_offset", [False, True])
def test_draft_combine_matches_formula(unit_offset, rng):
    rows, H, V = 6, 16, 30
    table = rng.standard_normal((V, H)).astype(np.float32)
    hidden = rng.standard_normal((rows, H)).astype(np.float32)
    we, wh = rng.standard_normal(H).astype(np.float32), rng.standard_normal(H).astype(np.float32)
    ids = np.array([0, 5, 29, 30, -1, 7], np.int32)
    out = np.full((rows, 2 * H), np.nan, np.float32)
    ref.draft_combine(table, hidden, we, wh, out, token_ids=ids, eps=1e-5, unit_offset=unit_offset)

    def norm(x, w):
        x = x.astype(np.float64)
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
        return y * ((1 + w) if unit_offset else w)
    e = np.zeros((rows, H))
    ok = (ids >= 0) & (ids < V)
    e[ok] = norm(table[ids[ok]], we)
    want = np.concatenate([e, norm(hidden, wh)], axis=1)
    assert rel_err(out, want) < 1e-6
    # given embeddings directly
    out2 = np.zeros_like(out)
    ref.draft_combine(table[[0, 5, 29, 1, 2, 7]], hidden, we, wh, out2, eps=1e-5,
                      unit_offset=unit_offset)
    assert np.allclose(out2[ok], out[ok], atol=1e-6)


def test_draft_combine_validation():
    with pytest.raises(ValueError, match="out"):
        ref.draft_combine(np.zeros((2, 4)), np.zeros((2, 4)), np.ones(4), np.ones(4), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="hidden_norm_weight"):
        ref.draft_combine(np.zeros((2, 4)), np.zeros((2, 4)), np.ones(4), np.ones(3), np.zeros((2, 8)))


def test_draft_map_tokens():
    d2t = np.array([0, 2, 5, 5], np.int64)             # offsets, HF EAGLE3 convention
    ids = np.array([0, 1, 2, 3, 4, -1], np.int32)
    out = np.zeros(6, np.int32)
    ref.draft_map_tokens(ids, d2t, out)
    assert out.tolist() == [0, 3, 7, 8, -1, -1]
    ref.draft_map_tokens(ids, np.array([3, 4, 9, 11]), out, offsets=False)
    assert out.tolist() == [3, 4, 9, 11, -1, -1]


def test_draft_reference_empty_batch():
    out = np.zeros((0, 4), np.float32)
    ref.draft_carry(np.zeros((0, 4), np.float32), np.zeros(1, np.int32), np.zeros(0, np.int32), out)
    ref.draft_combine(np.zeros((0, 4)), np.zeros((0, 4)), np.ones(4), np.ones(4), np.zeros((0, 8)))
    ref.draft_map_tokens(np.zeros(0, np.int32), np.zeros(3, np.int64), np.zeros(0, np.int32))


# ------------------------------------------------------------------ ngram_propose (reference)

def _ngram(ctx, K, *, split=None, min_n=1, max_n=3, pad=9):
    """Run the reference on one context given as a list, split into prompt / output at
    ``split`` (default: all prompt); slots past the lengths hold ``pad`` tokens, which
    must never be read. Returns (proposed tokens, num_draft)."""
    split = len(ctx) if split is None else split
    P, O = split + 2, len(ctx) - split + 3
    prompt = np.full((1, P), pad, np.int32)
    output = np.full((1, O), pad, np.int32)
    prompt[0, :split] = ctx[:split]
    output[0, :len(ctx) - split] = ctx[split:]
    dt = np.full((1, K), 12345, np.int32)
    nd = np.full(1, 12345, np.int32)
    ref.ngram_propose(prompt, np.array([split], np.int32), output,
                      np.array([len(ctx) - split], np.int32), dt, nd, min_n=min_n, max_n=max_n)
    m = int(nd[0])
    assert 0 <= m <= K and np.all(dt[0, m:] == -1)
    return dt[0, :m].tolist(), m


def test_ngram_propose_hand_cases():
    # repeats: n=3 [3,1,2] never occurred before; n=2 [1,2] did at 0 -> what followed it
    assert _ngram([1, 2, 3, 1, 2], 4) == ([3, 1, 2], 3)
    # overlapping matches: "a a a a" matches itself one step back, one token to propose
    assert _ngram([7, 7, 7, 7], 4) == ([7], 1)
    assert _ngram([7, 7, 7, 7, 7], 4, max_n=2) == ([7], 1)
    assert _ngram([1, 2, 1, 2, 1], 4) == ([2, 1], 2)          # n=3 [1,2,1] at 0 overlaps
    # a match at the very start of the context
    assert _ngram([5, 6, 9, 9, 8, 5, 6], 3) == ([9, 9, 8], 3)
    # the longest n wins over a later shorter match; each n alone takes its latest match
    ctx = [1, 2, 3, 9, 5, 2, 3, 8, 7, 3, 6, 1, 2, 3]
    assert _ngram(ctx, 3, max_n=3) == ([9, 5, 2], 3)
    assert _ngram(ctx, 3, min_n=2, max_n=4) == ([9, 5, 2], 3)
    assert _ngram(ctx, 3, max_n=2) == ([8, 7, 3], 3)
    assert _ngram(ctx, 3, max_n=1) == ([6, 1, 2], 3)
    # latest of several equal-length matches
    assert _ngram([4, 1, 5, 4, 1, 6, 4, 1], 2, max_n=2) == ([6, 4], 2)
    # no match, and min_n above the only match's length
    assert _ngram([1, 2, 3, 4], 4) == ([], 0)
    assert _ngram([4, 1, 2, 5, 1, 2], 4, min_n=3) == ([], 0)
    assert _ngram([4, 1, 2, 5, 1, 2], 4, min_n=2) == ([5, 1, 2], 3)
    # N = 0 and N = 1 propose nothing
    assert _ngram([], 4) == ([], 0)
    assert _ngram([3], 4) == ([], 0)
    assert _ngram([3], 4, split=0) == ([], 0)
    assert _ngram([3, 3], 4) == ([3], 1)                     # N = 2: n = 1 only
    # the proposal stops at the end of the context
    assert _ngram([3, 4, 3], 5) == ([4, 3], 2)
    # the op's docstring example
    assert _ngram([5, 1, 2, 7, 8, 1, 2], 3) == ([7, 8, 1], 3)
    # K larger than what is available; K = 1
    assert _ngram([1, 2, 9, 1, 2], 64) == ([9, 1, 2], 3)
    assert _ngram([1, 2, 9, 1, 2], 1) == ([9], 1)


def test_ngram_propose_prompt_output_boundary():
    # the pattern split across the boundary (prompt ..2 | output 3)
    assert _ngram([1, 2, 3, 4, 5, 6, 2, 3], 3, split=7) == ([4, 5, 6], 3)
    # the match split across it (prompt 8 1 | output 2 ...)
    assert _ngram([8, 1, 2, 9, 8, 1, 2], 3, split=2) == ([9, 8, 1], 3)
    # the proposal runs from the prompt into the output
    assert _ngram([1, 2, 3, 4, 1, 2], 3, split=3) == ([3, 4, 1], 3)
    # everything in the output (prompt empty), or everything in the prompt
    for split in (0, 6):
        assert _ngram([1, 2, 3, 4, 1, 2], 3, split=split) == ([3, 4, 1], 3)


def test_ngram_propose_batch_and_clamping():
    prompt = np.array([[1, 2, 1, 0], [5, 5, 5, 5], [1, 2, 3, 4]], np.int32)
    output = np.array([[2, 0], [0, 0], [1, 2]], np.int32)
    dt = np.zeros((3, 3), np.int32)
    nd = np.zeros(3, np.int32)
    ref.ngram_propose(prompt, np.array([3, 1, 4], np.int32), output,
                      np.array([1, 0, 2], np.int32), dt, nd)
    assert dt.tolist() == [[1, 2, -1], [-1, -1, -1], [3, 4, 1]] and nd.tolist() == [2, 0, 3]
    # out-of-range lengths: ValueError naming the array with check_indices, else clamped
    with pytest.raises(ValueError, match="prompt_lens: 5 at row 0"):
        ref.ngram_propose(prompt, np.array([5, 1, 4], np.int32), output,
                          np.array([1, 0, 2], np.int32), dt, nd)
    with pytest.raises(ValueError, match="output_lens: -1 at row 2"):
        ref.ngram_propose(prompt, np.array([3, 1, 4], np.int32), output,
                          np.array([1, 0, -1], np.int32), dt, nd)
    ref.ngram_propose(prompt, np.array([99, -3, 4], np.int32), output,
                      np.array([0, 7, -1], np.int32), dt, nd, check_indices=False)
    want0 = _ngram([1, 2, 1, 0], 3)
    assert nd.tolist() == [want0[1], 1, 0] and dt[1].tolist() == [0, -1, -1]


def _ngram_by_string_search(ctx, K, min_n, max_n):
    """The spec, written differently: the latest occurrence of the n-gram as a substring
    of the joined tokens before the last one (",a,b,c," text; rfind)."""
    N = len(ctx)
    text = "," + ",".join(map(str, ctx[:N - 1])) + ","
    for n in range(min(max_n, N - 1), min_n - 1, -1):
        pos = text.rfind("," + ",".join(map(str, ctx[N - n:])) + ",")
        if pos >= 0:
            i = text.count(",", 0, pos + 1) - 1     # tokens before the match
            return ctx[i + n:i + n + K]
    return []


def test_ngram_propose_matches_string_search(rng):
    for _ in range(400):
        B = int(rng.integers(1, 4))
        P, O, K = int(rng.integers(0, 30)), int(rng.integers(0, 30)), int(rng.integers(1, 9))
        vocab = int(rng.integers(1, 5))
        min_n = int(rng.integers(1, 4))
        max_n = int(rng.integers(min_n, 7))
        prompt = rng.integers(0, vocab, (B, P)).astype(np.int32)
        output = rng.integers(0, vocab, (B, O)).astype(np.int32)
        pl = rng.integers(0, P + 1, B).astype(np.int32)
        ol = rng.integers(0, O + 1, B).astype(np.int32)
        dt = np.full((B, K), 777, np.int32)
        nd = np.full(B, 777, np.int32)
        ref.ngram_propose(prompt, pl, output, ol, dt, nd, min_n=min_n, max_n=max_n)
        for b in range(B):
            ctx = prompt[b, :pl[b]].tolist() + output[b, :ol[b]].tolist()
            want = _ngram_by_string_search(ctx, K, min_n, max_n)
            assert dt[b].tolist() == want + [-1] * (K - len(want)) and nd[b] == len(want)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(min_n=0), ValueError, "min_n"),
    (dict(min_n=True), TypeError, "min_n"),
    (dict(max_n=33), ValueError, "max_n"),
    (dict(min_n=3, max_n=2), ValueError, "max_n"),
    (dict(max_n=2.0), TypeError, "max_n"),
    (dict(draft_tokens=np.zeros((2, 0), np.int32)), ValueError, "draft_tokens"),
    (dict(draft_tokens=np.zeros((2, 65), np.int32)), ValueError, "draft_tokens"),
    (dict(draft_tokens=np.zeros((3, 4), np.int32)), ValueError, "draft_tokens"),
    (dict(output=np.zeros((1, 4), np.int32)), ValueError, "output"),
    (dict(prompt_lens=np.zeros(3, np.int32)), ValueError, "prompt_lens"),
    (dict(num_draft=np.zeros((2, 1), np.int32)), ValueError, "num_draft"),
    (dict(prompt=np.zeros((2, 4), np.float32)), TypeError, "prompt"),
])
def test_ngram_propose_reference_validation(kw, exc, match):
    args = dict(prompt=np.zeros((2, 4), np.int32), prompt_lens=np.zeros(2, np.int32),
                output=np.zeros((2, 4), np.int32), output_lens=np.zeros(2, np.int32),
                draft_tokens=np.zeros((2, 4), np.int32), num_draft=np.zeros(2, np.int32))
    args.update(kw)
    with pytest.raises(exc, match=match):
        ref.ngram_propose(**args)


# ------------------------------------------------------------------ validation without a GPU

class _Fake:
    """Stands in for a device array (address 0, never dereferenced): argument checks run
    without a GPU and must raise before anything reaches the driver."""

    def __init__(self, shape, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (0, False), "strides": strides, "version": 3}


@pytest.mark.parametrize("override,exc,match", [
    (dict(hidden=np.zeros((6, 8), np.float32)), TypeError, "hidden"),
    (dict(hidden=_Fake((6, 8, 1))), ValueError, "hidden"),
    (dict(out=_Fake((3, 8), "<f2")), TypeError, "out: dtype"),
    (dict(out=_Fake((4, 8))), ValueError, "out"),
    (dict(cu_q=_Fake((3,), "<i4")), ValueError, "cu_q"),
    (dict(accept_len=_Fake((3,), "<i8")), TypeError, "accept_len"),
    (dict(col_begin=1), ValueError, "col_begin"),
    (dict(col_begin=-1), ValueError, "col_begin"),
    (dict(row_begin=-2), ValueError, "row_begin"),
    (dict(row_begin=1.5), TypeError, "row_begin"),
    (dict(hidden=_Fake((6, 8), strides=(4, 48))), ValueError, "hidden: the last dimension"),
])
def test_draft_carry_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(hidden=_Fake((6, 8)), cu_q=_Fake((4,), "<i4"), accept_len=_Fake((3,), "<i4"),
                out=_Fake((3, 8)))
    with pytest.raises(exc, match=match):
        ops.draft_carry(**dict(args, **override))


@pytest.mark.parametrize("override,exc,match", [
    (dict(hidden=_Fake((5, 4), "<i4")), TypeError, "hidden: dtype"),
    (dict(out=_Fake((5, 12), "<f2")), TypeError, "out: dtype"),
    (dict(out=_Fake((5, 10))), ValueError, "out: 10 columns"),
    (dict(out=_Fake((4, 12))), ValueError, "out: 4 rows"),
    (dict(tap=3), ValueError, "tap"),
    (dict(tap=-1), ValueError, "tap"),
    (dict(residual=_Fake((5, 3))), ValueError, "residual"),
    (dict(residual=_Fake((5, 4), "<f2")), TypeError, "residual"),
])
def test_capture_hidden_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(hidden=_Fake((5, 4)), out=_Fake((5, 12)), tap=1)
    with pytest.raises(exc, match=match):
        ops.capture_hidden(**dict(args, **override))


@pytest.mark.parametrize("override,exc,match", [
    (dict(hidden=_Fake((3, 8), "<f8")), TypeError, "hidden: dtype"),
    (dict(embed=_Fake((3, 7))), ValueError, "embed: width"),
    (dict(embed=_Fake((5, 8))), ValueError, "embed: 5 rows"),
    (dict(embed=_Fake((3, 8), "<f2")), TypeError, "embed"),
    (dict(out=_Fake((3, 8))), ValueError, "out"),
    (dict(embed_norm_weight=_Fake((7,))), ValueError, "embed_norm_weight"),
    (dict(embed_norm_weight=_Fake((8,), "<f2")), TypeError, "embed_norm_weight"),
    (dict(hidden_norm_weight=_Fake((8,), "<i4")), TypeError, "hidden_norm_weight"),
    (dict(token_ids=_Fake((4,), "<i4")), ValueError, "token_ids"),
    (dict(token_ids=_Fake((3,), "<f4")), TypeError, "token_ids"),
    (dict(eps=-1.0), ValueError, "eps"),
    (dict(eps=float("nan")), ValueError, "eps"),
])
def test_draft_combine_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(embed=_Fake((3, 8)), hidden=_Fake((3, 8)), embed_norm_weight=_Fake((8,)),
                hidden_norm_weight=_Fake((8,)), out=_Fake((3, 16)))
    with pytest.raises(exc, match=match):
        ops.draft_combine(**dict(args, **override))


@pytest.mark.parametrize("override,exc,match", [
    (dict(draft_ids=_Fake((6,), "<f4")), TypeError, "draft_ids"),
    (dict(d2t=_Fake((9, 1), "<i8")), ValueError, "d2t"),
    (dict(out=_Fake((6,), "<i8")), TypeError, "out"),
    (dict(out=_Fake((5,), "<i4")), ValueError, "out"),
])
def test_draft_map_tokens_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(draft_ids=_Fake((6,), "<i4"), d2t=_Fake((9,), "<i8"), out=_Fake((6,), "<i4"))
    with pytest.raises(exc, match=match):
        ops.draft_map_tokens(**dict(args, **override))


@pytest.mark.parametrize("override,exc,match", [
    (dict(prompt=_Fake((3, 8), "<i8")), TypeError, "prompt: dtype"),
    (dict(prompt=_Fake((3,), "<i4")), ValueError, "prompt"),
    (dict(prompt_lens=_Fake((4,), "<i4")), ValueError, "prompt_lens"),
    (dict(prompt_lens=_Fake((3,), "<u4")), TypeError, "prompt_lens"),
    (dict(output=_Fake((2, 5), "<i4")), ValueError, "output: expected shape"),
    (dict(output=_Fake((3, 5), "<i4", strides=(40, 8))), ValueError, "output: the last"),
    (dict(output_lens=_Fake((3,), "<i8")), TypeError, "output_lens"),
    (dict(output_lens=_Fake((3,), "<i4", strides=(8,))), ValueError, "output_lens"),
    (dict(draft_tokens=_Fake((3, 0), "<i4")), ValueError, "draft_tokens: K = 0"),
    (dict(draft_tokens=_Fake((3, 65), "<i4")), ValueError, "draft_tokens: K = 65"),
    (dict(draft_tokens=_Fake((4, 6), "<i4")), ValueError, "draft_tokens: expected shape"),
    (dict(draft_tokens=_Fake((3, 6), "<f4")), TypeError, "draft_tokens"),
    (dict(num_draft=_Fake((2,), "<i4")), ValueError, "num_draft"),
    (dict(min_n=0), ValueError, "min_n"),
    (dict(min_n=1.0), TypeError, "min_n"),
    (dict(max_n=33), ValueError, "max_n"),
    (dict(min_n=4, max_n=3), ValueError, "max_n"),
    (dict(prompt=_Fake((3, 2**30), "<i4"), output=_Fake((3, 2**30), "<i4")), ValueError,
     "prompt/output"),
    (dict(stream=-1), ValueError, "stream"),
])
def test_ngram_propose_op_validation(override, exc, match):
    from specdec_lib import ops
    args = dict(prompt=_Fake((3, 8), "<i4"), prompt_lens=_Fake((3,), "<i4"),
                output=_Fake((3, 5), "<i4"), output_lens=_Fake((3,), "<i4"),
                draft_tokens=_Fake((3, 6), "<i4"), num_draft=_Fake((3,), "<i4"))
    with pytest.raises(exc, match=match):
        ops.ngram_propose(**dict(args, **override))


# ------------------------------------------------------------------------------ GPU

class _View:
    """A strided / offset view into a DeviceArray, through __cuda_array_interface__
    (strides and offset in elements): exercises the kernels' narrow-vector paths."""

    def __init__(self, base, shape, strides, offset=0):
        isz = base.itemsize
        self.base = base
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": base.__cuda_array_interface__["typestr"],
            "data": (base.ptr + offset * isz, False), "strides": tuple(s * isz for s in strides),
            "version": 3}
        self.np_view = lambda host: np.lib.stride_tricks.as_strided(
            host.reshape(-1)[offset:], shape, tuple(s * host.itemsize for s in strides))


def _as_f32(a, dtype):
    from specdec_lib.dtypes import bf16_bits_to_f32
    return bf16_bits_to_f32(a) if dtype == "bfloat16" else a.astype(np.float32)


def _carry_case(rng, B, H, dtype):
    from specdec_lib.dtypes import host_dtype
    q = rng.integers(1, 5, B)
    cu = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    T = int(cu[-1])
    acc = np.array([rng.integers(0, x + 1) for x in q], np.int32)
    hidden = rng.integers(0, 200, (T, H)).astype(host_dtype(dtype))
    return cu, acc, hidden


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8"])
@pytest.mark.parametrize("B,H", [(1, 1), (5, 129), (64, 4096), (0, 8)])
def test_draft_carry_gpu(dtype, B, H, rng):
    from specdec_lib import DeviceArray, ops
    cu, acc, hidden = _carry_case(rng, B, H, dtype)
    T = hidden.shape[0]
    for r0, c0 in ((0, 0), (T // 2, H // 3)):
        want = np.zeros((B, H + c0), hidden.dtype)
        ref.draft_carry(np.ascontiguousarray(hidden[r0:]), cu, acc, want, row_begin=r0, col_begin=c0)
        out = poison((B, H + c0), dtype)
        ops.draft_carry(DeviceArray.from_numpy(np.ascontiguousarray(hidden[r0:]), dtype),
                        DeviceArray.from_numpy(cu), DeviceArray.from_numpy(acc), out,
                        row_begin=r0, col_begin=c0)
        np.testing.assert_array_equal(out.to_numpy(), want)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8"])
def test_draft_carry_gpu_shards_sum_to_full(dtype, rng):
    """Row (sequence-parallel) and column (hidden-dim) shards of hidden, each gathered on
    the GPU, sum to the unsharded carry; every byte of every output is written."""
    from specdec_lib import DeviceArray, ops
    B, H = 9, 96
    cu, acc, hidden = _carry_case(rng, B, H, dtype)
    T = hidden.shape[0]
    full = np.zeros((B, H), hidden.dtype)
    ref.draft_carry(hidden, cu, acc, full)
    total = np.zeros((B, H), np.float64)
    d_cu, d_acc = DeviceArray.from_numpy(cu), DeviceArray.from_numpy(acc)
    for r0, r1 in ((0, T // 3), (T // 3, T - 2), (T - 2, T)):
        for c0, c1 in ((0, 40), (40, 96)):
            out = poison((B, H), dtype)
            ops.draft_carry(DeviceArray.from_numpy(np.ascontiguousarray(hidden[r0:r1, c0:c1]), dtype),
                            d_cu, d_acc, out, row_begin=r0, col_begin=c0)
            total += _as_f32(out.to_numpy(), dtype) if dtype == "bfloat16" else out.to_numpy()
    want = _as_f32(full, dtype) if dtype == "bfloat16" else full
    np.testing.assert_array_equal(total, want.astype(np.float64))


@needs_gpu
def test_draft_carry_gpu_bad_indices_and_views(rng):
    """cu_q / accept_len values pointing outside hidden give zero rows (never a fault);
    strided, offset views take the narrow-unit kernels."""
    from specdec_lib import DeviceArray, ops
    B, H, T = 6, 37, 10
    hidden = rng.standard_normal((T, H)).astype(np.float32)
    cu = np.array([0, 2, 4, 2**30, -50, 9, 10], np.int32)
    acc = np.array([2, 2**31 - 1, 1, 1, 3, -7], np.int32)
    want = np.zeros((B, H), np.float32)
    with pytest.raises(ValueError, match="cu_q"):   # the host paths refuse such offsets
        ref.draft_carry(hidden, cu, acc, want)
    ref.draft_carry.unchecked(hidden, cu, acc, want)  # what the kernel must do with them
    out = poison((B, H), "float32")
    ops.draft_carry(DeviceArray.from_numpy(hidden), DeviceArray.from_numpy(cu),
                    DeviceArray.from_numpy(acc), out)
    np.testing.assert_array_equal(out.to_numpy(), want)
    # hidden: every other row of a wider buffer, starting one element in; out: a view too
    base = DeviceArray.from_numpy(rng.standard_normal(2 * T * (H + 3) + 1).astype(np.float32))
    hv = _View(base, (T, H), (2 * (H + 3), 1), offset=1)
    obase = poison((B * (H + 5) + 3,), "float32")
    ov = _View(obase, (B, H + 2), (H + 5, 1), offset=3)
    cu = np.array([0, 1, 3, 5, 6, 8, 10], np.int32)
    acc = np.array([1, 2, 0, 1, 2, 1], np.int32)
    h_host = hv.np_view(base.to_numpy())
    want = np.zeros((B, H + 2), np.float32)
    ref.draft_carry(np.ascontiguousarray(h_host), cu, acc, want, col_begin=1)
    ops.draft_carry(hv, DeviceArray.from_numpy(cu), DeviceArray.from_numpy(acc), ov, col_begin=1)
    np.testing.assert_array_equal(ov.np_view(obase.to_numpy()), want)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("T,H", [(1, 64), (7, 129), (300, 4096), (0, 32)])
def test_capture_hidden_gpu(dtype, T, H, rng):
    from specdec_lib import DeviceArray, ops
    from specdec_lib.dtypes import round_to
    x = rng.standard_normal((T, H)).astype(np.float32)
    r = rng.standard_normal((T, H)).astype(np.float32)
    xr, rr = round_to(x, dtype), round_to(r, dtype)       # the values the GPU sees
    out = poison((T, 3 * H), dtype)
    for tap in range(3):
        ops.capture_hidden(DeviceArray.from_numpy(x, dtype), out, tap,
                           residual=DeviceArray.from_numpy(r, dtype) if tap == 2 else None)
    want = np.zeros((T, 3 * H))
    for tap in range(3):
        ref.capture_hidden(xr, want, tap, residual=rr if tap == 2 else None)
    got = _as_f32(out.to_numpy(), dtype)
    np.testing.assert_array_equal(got[:, :2 * H], want[:, :2 * H])      # copies are exact
    tol = 1e-7 if dtype == "float32" else 5e-3
    assert rel_err(got, want) < tol


@needs_gpu
def test_capture_hidden_gpu_strided_rows(rng):
    from specdec_lib import DeviceArray, ops
    T, H = 5, 24
    base = DeviceArray.from_numpy(rng.standard_normal(T * 40).astype(np.float32), "bfloat16")
    hv = _View(base, (T, H), (40, 1), offset=8)          # 16-byte aligned rows: vector path
    hv2 = _View(base, (T, H), (40, 1), offset=3)         # unaligned: scalar path
    out = poison((T, 2 * H), "bfloat16")
    ops.capture_hidden(hv, out, 0)
    ops.capture_hidden(hv2, out, 1, residual=hv)
    host = base.to_numpy()
    a = _as_f32(np.ascontiguousarray(hv.np_view(host)), "bfloat16")
    b = _as_f32(np.ascontiguousarray(hv2.np_view(host)), "bfloat16")
    got = _as_f32(out.to_numpy(), "bfloat16")
    np.testing.assert_array_equal(got[:, :H], a)
    assert rel_err(got[:, H:], a + b) < 5e-3


def _round_inputs(rng, dtype, *shape):
    from specdec_lib.dtypes import round_to
    return round_to(rng.standard_normal(shape).astype(np.float32), dtype).astype(np.float32)


@needs_gpu
@pytest.mark.parametrize("dtype,wdtype", [("float32", "float32"), ("float16", "float16"),
                                          ("bfloat16", "bfloat16"), ("bfloat16", "float32"),
                                          ("float16", "float32")])
@pytest.mark.parametrize("rows,H", [(1, 64), (5, 130), (64, 4096), (0, 128), (3, 129)])
@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("gather", [False, True])
def test_draft_combine_gpu(dtype, wdtype, rows, H, unit_offset, gather, rng):
    from specdec_lib import DeviceArray, ops
    V = 50
    table, hidden = _round_inputs(rng, dtype, V, H), _round_inputs(rng, dtype, rows, H)
    we, wh = _round_inputs(rng, wdtype, H), _round_inputs(rng, wdtype, H)
    ids = rng.integers(-2, V + 2, rows).astype(np.int32)
    embed = table if gather else table[np.clip(ids, 0, V - 1)]
    want = np.zeros((rows, 2 * H))
    ref.draft_combine(embed, hidden, we, wh, want, token_ids=ids if gather else None,
                      unit_offset=unit_offset)
    out = poison((rows, 2 * H), dtype)
    dev = lambda a, dt=dtype: DeviceArray.from_numpy(a, dt)  # noqa: E731
    ops.draft_combine(dev(embed), dev(hidden), dev(we, wdtype), dev(wh, wdtype), out,
                      token_ids=DeviceArray.from_numpy(ids) if gather else None,
                      unit_offset=unit_offset)
    got = _as_f32(out.to_numpy(), dtype)
    assert rel_err(got, want) < (1e-5 if dtype == "float32" else 5e-3)
    if gather:   # unknown ids give exactly zero embedding halves
        bad = (ids < 0) | (ids >= V)
        assert np.all(got[bad, :H] == 0)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_draft_combine_gpu_wide_rows_int64_ids_nan(dtype, rng):
    """Rows wider than the kernel's register cache (second pass re-reads), int64 ids, a
    NaN in one hidden row (that row's hidden half only is NaN), eps as given."""
    from specdec_lib import DeviceArray, ops
    rows, H, V = 4, 20000, 7
    table, hidden = _round_inputs(rng, dtype, V, H), _round_inputs(rng, dtype, rows, H)
    hidden[2, 17] = np.nan
    we, wh = _round_inputs(rng, dtype, H), _round_inputs(rng, dtype, H)
    ids = np.array([3, 6, 0, 9], np.int64)
    want = np.zeros((rows, 2 * H))
    ref.draft_combine(table, hidden, we, wh, want, token_ids=ids, eps=1e-3)
    out = poison((rows, 2 * H), dtype)
    dev = lambda a: DeviceArray.from_numpy(a, dtype)  # noqa: E731
    ops.draft_combine(dev(table), dev(hidden), dev(we), dev(wh), out,
                      token_ids=DeviceArray.from_numpy(ids), eps=1e-3)
    got = _as_f32(out.to_numpy(), dtype)
    assert np.all(np.isnan(got[2, H:])) and np.all(np.isfinite(got[2, :H]))
    ok = np.isfinite(want)
    assert rel_err(got[ok], want[ok]) < (1e-5 if dtype == "float32" else 5e-3)


@needs_gpu
@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("d2t_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("offsets", [True, False])
@pytest.mark.parametrize("N", [0, 1, 777, 100003])
def test_draft_map_tokens_gpu(ids_dtype, d2t_dtype, offsets, N, rng):
    from specdec_lib import DeviceArray, ops
    Vd = 1000
    d2t = rng.integers(0, 5000, Vd).astype(d2t_dtype)
    ids = rng.integers(-5, Vd + 5, N).astype(ids_dtype)
    if N:
        ids[0] = np.iinfo(ids_dtype).min
    want = np.zeros(N, np.int32)
    ref.draft_map_tokens(ids, d2t, want, offsets=offsets)
    out = poison((N,), "int32")
    ops.draft_map_tokens(DeviceArray.from_numpy(ids), DeviceArray.from_numpy(d2t), out,
                         offsets=offsets)
    np.testing.assert_array_equal(out.to_numpy(), want)


@needs_gpu
def test_draft_ops_reject_before_launch(rng):
    from specdec_lib import DeviceArray, ops
    H = 16
    hidden = DeviceArray.from_numpy(rng.standard_normal((4, H)).astype(np.float32))
    w = DeviceArray.from_numpy(np.ones(H, np.float32))
    out = poison((4, 2 * H), "float32")
    for kw, exc, match in [
        (dict(embed_norm_weight=DeviceArray.from_numpy(np.ones(H, np.float16))), TypeError,
         "embed_norm_weight"),
        (dict(token_ids=DeviceArray.from_numpy(np.zeros(3, np.int32))), ValueError, "token_ids"),
        (dict(embed=DeviceArray.from_numpy(np.zeros((4, H), np.float16))), TypeError, "embed"),
        (dict(eps=-1e-6), ValueError, "eps"),
    ]:
        args = dict(embed=hidden, hidden=hidden, embed_norm_weight=w, hidden_norm_weight=w,
                    out=out)
        args.update(kw)
        with pytest.raises(exc, match=match):
            ops.draft_combine(**args)
        assert np.all(out.to_numpy().view(np.uint32) == 0xFFFFFFFF)
    carry = poison((2, H), "float32")
    with pytest.raises(ValueError, match="col_begin"):
        ops.draft_carry(hidden, DeviceArray.from_numpy(np.array([0, 2, 4], np.int32)),
                        DeviceArray.from_numpy(np.ones(2, np.int32)), carry, col_begin=1)
    assert np.all(carry.to_numpy().view(np.uint32) == 0xFFFFFFFF)


# ------------------------------------------------------------------ ngram_propose (GPU)

_NG_SENTINEL = 0x5A   # outputs are filled with 0x5A5A5A5A, not poison()'s -1: -1 is the pad value


def _ng_poisoned(shape):
    from specdec_lib import DeviceArray
    return DeviceArray.empty(shape, "int32").fill_bytes(_NG_SENTINEL)


def _ng_case(rng, B, P, O, vocab=4):
    """Random ragged contexts of four kinds (row b % 4): small-vocab noise (matches near
    the end), a last token seen nowhere else (no match: the kernel scans every round),
    distinct tokens whose only match is the context's first tokens (found in the last
    round scanned), a short repeated phrase (a full-length match in the first round).
    Slots past the lengths hold small-vocab noise, so a kernel reading them would match."""
    prompt = rng.integers(0, vocab, (B, P)).astype(np.int32)
    output = rng.integers(0, vocab, (B, O)).astype(np.int32)
    pl = rng.integers(0, P + 1, B).astype(np.int32)
    ol = rng.integers(0, O + 1, B).astype(np.int32)
    if B > 1:
        pl[0], ol[0] = P, O                       # one row uses both buffers in full
    for b in range(B):
        N = int(pl[b] + ol[b])
        kind = b % 4
        if kind == 0 or N < 2:
            continue
        if kind == 1:
            ctx = rng.integers(0, vocab, N)
            ctx[-1] = vocab + 1
        elif kind == 2:
            ctx = 100 + rng.permutation(N)
            h = min(5, N // 2)
            ctx[:h] = ctx[N - h:]
        else:
            ctx = np.resize(rng.integers(0, 1000, int(rng.integers(1, 8))), N)
        prompt[b, :pl[b]] = ctx[:pl[b]]
        output[b, :ol[b]] = ctx[pl[b]:]
    return prompt, pl, output, ol


def _ng_run(prompt, pl, output, ol, K, min_n, max_n, **kw):
    from specdec_lib import DeviceArray, ops
    B = prompt.shape[0]
    dt, nd = _ng_poisoned((B, K)), _ng_poisoned((B,))
    res = ops.ngram_propose(DeviceArray.from_numpy(prompt), DeviceArray.from_numpy(pl),
                            DeviceArray.from_numpy(output), DeviceArray.from_numpy(ol), dt, nd,
                            min_n=min_n, max_n=max_n, **kw)
    assert res[0] is dt and res[1] is nd
    return dt.to_numpy(), nd.to_numpy()


def _ng_want(prompt, pl, output, ol, K, min_n, max_n, check_indices=True):
    B = prompt.shape[0]
    wd, wn = np.zeros((B, K), np.int32), np.zeros(B, np.int32)
    ref.ngram_propose(prompt, pl, output, ol, wd, wn, min_n=min_n, max_n=max_n,
                      check_indices=check_indices)
    return wd, wn


# (P, O, [(min_n, max_n, K), ...]): long contexts only with short n ranges (the reference
# is a plain loop; its no-match rows cost N per n)
_NG_SIZES = [(1, 1, [(1, 3, 4), (1, 1, 1)]),
             (6, 3, [(1, 3, 4), (2, 5, 64), (1, 32, 3)]),
             (300, 77, [(1, 3, 4), (2, 5, 64), (1, 32, 7), (3, 3, 1)]),
             (4099, 1, [(1, 3, 5), (2, 4, 64)]),           # a round boundary, output nearly empty
             (30000, 10000, [(1, 3, 4), (2, 5, 64)])]
_NG_CASES = [pytest.param(B, P, O, mn, mx, K, id=f"B{B}-P{P}-O{O}-n{mn}..{mx}-K{K}")
             for B in (1, 3, 64) for P, O, cfgs in _NG_SIZES for mn, mx, K in cfgs]


@needs_gpu
@pytest.mark.parametrize("B,P,O,min_n,max_n,K", _NG_CASES)
def test_ngram_propose_gpu(B, P, O, min_n, max_n, K, rng):
    case = _ng_case(rng, B, P, O)
    got_d, got_n = _ng_run(*case, K, min_n, max_n)
    want_d, want_n = _ng_want(*case, K, min_n, max_n)
    np.testing.assert_array_equal(got_n, want_n)
    np.testing.assert_array_equal(got_d, want_d)


@needs_gpu
def test_ngram_propose_gpu_deterministic_and_repeated(rng):
    """Same inputs -> same bits on every run; consecutive calls on reused outputs."""
    case = _ng_case(rng, 64, 2000, 500, vocab=3)
    first = _ng_run(*case, 8, 1, 4)
    for _ in range(3):
        again = _ng_run(*case, 8, 1, 4)
        np.testing.assert_array_equal(again[0], first[0])
        np.testing.assert_array_equal(again[1], first[1])
    np.testing.assert_array_equal(first[0], _ng_want(*case, 8, 1, 4)[0])


@needs_gpu
def test_ngram_propose_gpu_views(rng):
    """Strided rows: prompt rows 16-byte aligned (int4 loads), output rows one element off
    (scalar loads), draft_tokens rows padded; nothing outside the views is written."""
    from specdec_lib import DeviceArray, ops
    B, P, O, K = 5, 45, 23, 6
    prompt, pl, output, ol = _ng_case(rng, B, P, O, vocab=3)
    S = 48                                                 # P < S, S % 4 == 0
    pbase = DeviceArray.from_numpy(rng.integers(0, 3, B * S + 4).astype(np.int32))
    pv = _View(pbase, (B, P), (S, 1), offset=4)
    obase = DeviceArray.from_numpy(rng.integers(0, 3, B * (O + 2) + 1).astype(np.int32))
    ov = _View(obase, (B, O), (O + 2, 1), offset=1)
    # write the case into the views' rows
    ph, oh = pbase.to_numpy(), obase.to_numpy()
    pv.np_view(ph)[...] = prompt
    ov.np_view(oh)[...] = output
    pbase.copy_from_numpy(ph)
    obase.copy_from_numpy(oh)
    dbase = _ng_poisoned((B * (K + 3),))
    dv = _View(dbase, (B, K), (K + 3, 1))
    nd = _ng_poisoned((B,))
    ops.ngram_propose(pv, DeviceArray.from_numpy(pl), ov, DeviceArray.from_numpy(ol), dv, nd,
                      max_n=4)
    want_d, want_n = _ng_want(prompt, pl, output, ol, K, 1, 4)
    dh = dbase.to_numpy()
    np.testing.assert_array_equal(dv.np_view(dh), want_d)
    np.testing.assert_array_equal(nd.to_numpy(), want_n)
    gaps = dh.reshape(B, K + 3)[:, K:]
    assert np.all(gaps.view(np.uint32) == 0x5A5A5A5A)


@needs_gpu
def test_ngram_propose_gpu_bad_lengths(rng):
    """Lengths outside 0..P / 0..O: check_indices raises before the launch (outputs keep
    their bytes); without it the kernel clamps, as the reference does, and never faults."""
    from specdec_lib import DeviceArray, ops
    B, P, O, K = 6, 20, 9, 4
    prompt, _, output, _ = _ng_case(rng, B, P, O, vocab=2)
    pl = np.array([21, -1, 2**31 - 1, -2**31, 0, 20], np.int32)
    ol = np.array([3, 9, 10, -5, 2**31 - 1, -1], np.int32)
    dt, nd = _ng_poisoned((B, K)), _ng_poisoned((B,))
    args = (DeviceArray.from_numpy(prompt), DeviceArray.from_numpy(pl),
            DeviceArray.from_numpy(output), DeviceArray.from_numpy(ol), dt, nd)
    with pytest.raises(ValueError, match="prompt_lens"):
        ops.ngram_propose(*args)
    ok_pl = np.clip(pl, 0, P).astype(np.int32)
    with pytest.raises(ValueError, match="output_lens"):
        ops.ngram_propose(args[0], DeviceArray.from_numpy(ok_pl), *args[2:])
    assert np.all(dt.to_numpy().view(np.uint32) == 0x5A5A5A5A)
    assert np.all(nd.to_numpy().view(np.uint32) == 0x5A5A5A5A)
    ops.ngram_propose(*args, check_indices=False)
    want_d, want_n = _ng_want(prompt, pl, output, ol, K, 1, 3, check_indices=False)
    np.testing.assert_array_equal(dt.to_numpy(), want_d)
    np.testing.assert_array_equal(nd.to_numpy(), want_n)


@needs_gpu
def test_ngram_propose_gpu_graph_capture(rng):
    """Captured once into a CUDA graph (the host-side length check skips itself while the
    stream captures), replayed on new contexts written into the same buffers."""
    cp = pytest.importorskip("cupy")
    from specdec_lib import ops
    B, P, O, K = 7, 300, 60, 5
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        bufs = [cp.asarray(a) for a in _ng_case(rng, B, P, O)]
        dt = cp.full((B, K), 77, cp.int32)
        nd = cp.full((B,), 77, cp.int32)
    ops.ngram_propose(*bufs, dt, nd, max_n=4, stream=stream.ptr)      # eager: loads the module
    stream.synchronize()
    with stream:
        dt.fill(77)
        nd.fill(77)
        stream.begin_capture()
        try:
            ops.ngram_propose(*bufs, dt, nd, max_n=4, stream=stream.ptr)
        finally:
            graph = stream.end_capture()
    assert np.all(cp.asnumpy(dt, stream=stream) == 77)             # capture ran nothing
    for _ in range(3):
        case = _ng_case(rng, B, P, O)
        for buf, host in zip(bufs, case):
            buf.set(host, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        want_d, want_n = _ng_want(*case, K, 1, 4)
        np.testing.assert_array_equal(cp.asnumpy(dt, stream=stream), want_d)
        np.testing.assert_array_equal(cp.asnumpy(nd, stream=stream), want_n)


# ---------------------------------------------------------------- the argument contract (CPU)
# Each op's bad inputs on the reference path (numpy arrays) and the eager torch path (CPU
# tensors through torch.ops.specdec): the named error, and the outputs untouched. A case is
# (id, paths it applies to, mutate(args, path), exception, message start); dtype-exactness
# cases apply to the torch path only (numpy dtypes are checked by kind).
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from conftest import cast as _cast, vals as _vals, zeros_on as _new  # noqa: E402

TORCH = ("torch",)











def _new_like(a, shape):
    """A zero array of ``shape`` with ``a``'s dtype and array type."""
    if isinstance(a, np.ndarray):
        return np.zeros(shape, a.dtype)
    import torch
    return torch.zeros(shape, dtype=a.dtype)


def _dense(a):
    """A C-contiguous copy (of a slice: a narrower array that is still contiguous)."""
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a.contiguous()


def _rows_overlap(a):
    """A [R, W] view of ``a``'s memory whose rows overlap (a row stride of one element)."""
    if isinstance(a, np.ndarray):
        return np.lib.stride_tricks.as_strided(a, a.shape, (a.itemsize, a.itemsize))
    return a.as_strided(tuple(a.shape), (1, 1))


def _host(a):
    """The path's array as float64 numpy (torch bf16 through float32)."""
    if isinstance(a, np.ndarray):
        return a.astype(np.float64)
    return a.float().numpy().astype(np.float64) if a.is_floating_point() else a.numpy()


def run_refusal(op, path, case, call, order, outputs, torch_dtypes=None):
    """Build ``call`` (name -> numpy value) on ``path``, break it with ``case`` and check
    that op ``op`` refuses it without writing ``outputs`` (names). Arguments named in
    ``order`` go positionally, the others by keyword."""
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, call, torch_dtypes)
    mutate(args, path)
    pos = [args[n] for n in order]
    kw = {n: v for n, v in args.items() if n not in order}
    assert_refused(lambda: call_op(path, op, pos, kw), exc, match,
                   [args[n] for n in outputs if args.get(n) is not None])


def run_good(op, path, call, order, torch_dtypes=None):
    """The good call on ``path``: it passes the contract and computes. Returns the args."""
    args = on_path(path, call, torch_dtypes)
    call_op(path, op, [args[n] for n in order], {n: v for n, v in args.items() if n not in order})
    return args


# ------------------------------------------------------------ draft_carry
_CARRY_ORDER = ("hidden", "cu_q", "accept_len", "out")
_CARRY_BF16 = {"hidden": "bfloat16", "out": "bfloat16"}


def _carry_call():
    return {"hidden": np.arange(24, dtype=np.float32).reshape(6, 4),
            "cu_q": np.array([0, 2, 3, 6], np.int32), "accept_len": np.array([2, 0, 3], np.int32),
            "out": np.full((3, 4), 7.0, np.float32)}


_CARRY_BAD = [
    ("out_fp16_for_bf16_hidden", TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "float16")),
     TypeError, r"^out: dtype"),
    ("out_float64", REFUSAL_PATHS, lambda a, p: a.update(out=_cast(p, a["out"], "float64")),
     TypeError, r"^out: dtype"),
    ("cu_q_int64", TORCH, lambda a, p: a.update(cu_q=_cast(p, a["cu_q"], "int64")),
     TypeError, r"^cu_q: dtype"),
    ("accept_len_float32", REFUSAL_PATHS,
     lambda a, p: a.update(accept_len=_cast(p, a["accept_len"], "float32")),
     TypeError, r"^accept_len: dtype"),
    ("cu_q_short", REFUSAL_PATHS, lambda a, p: a.update(cu_q=a["cu_q"][:3]),
     ValueError, r"^cu_q: expected shape"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a.update(cu_q=_vals(p, [0, 3, 2, 6])),
     ValueError, r"^cu_q: must start at 0 and never decrease"),
    ("cu_q_not_from_0", REFUSAL_PATHS, lambda a, p: a.update(cu_q=_vals(p, [1, 2, 3, 6])),
     ValueError, r"^cu_q: must start at 0"),
    ("out_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:2]),
     ValueError, r"^out: expected shape \[3, \*\]"),
    ("col_begin_past_out", REFUSAL_PATHS, lambda a, p: a.update(col_begin=1),
     ValueError, r"^col_begin: columns 1..5"),
    ("row_begin_negative", REFUSAL_PATHS, lambda a, p: a.update(row_begin=-1),
     ValueError, r"^row_begin: must be >= 0"),
    ("hidden_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(hidden=strided_last(a["hidden"])),
     ValueError, r"^hidden: the last dimension must be contiguous"),
    ("out_3d", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:, :, None]),
     ValueError, r"^out: expected 2 dimensions"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _CARRY_BAD, ids=[c[0] for c in _CARRY_BAD])
def test_draft_carry_refuses_bad_input(path, case):
    run_refusal("draft_carry", path, case, _carry_call(), _CARRY_ORDER, ("out",), _CARRY_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_draft_carry_good_input_passes_the_contract(path):
    args = run_good("draft_carry", path, _carry_call(), _CARRY_ORDER, _CARRY_BF16)
    h = _carry_call()["hidden"]
    np.testing.assert_array_equal(_host(args["out"]), np.stack([h[1], np.zeros(4), h[5]]))


# ------------------------------------------------------------ capture_hidden
_CAPTURE_ORDER = ("hidden", "out", "tap")
_CAPTURE_BF16 = {"hidden": "bfloat16", "out": "bfloat16", "residual": "bfloat16"}


def _capture_call():
    return {"hidden": np.arange(20, dtype=np.float32).reshape(5, 4),
            "out": np.full((5, 12), 7.0, np.float32), "tap": 1,
            "residual": np.ones((5, 4), np.float32)}


_CAPTURE_BAD = [
    ("out_fp16_for_bf16_hidden", TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "float16")),
     TypeError, r"^out: dtype"),
    ("residual_float32_for_bf16", TORCH,
     lambda a, p: a.update(residual=_cast(p, a["residual"], "float32")), TypeError, r"^residual: dtype"),
    ("hidden_int32", REFUSAL_PATHS, lambda a, p: a.update(hidden=_cast(p, a["hidden"], "int32")),
     TypeError, r"^hidden: dtype"),
    ("tap_past_taps", REFUSAL_PATHS, lambda a, p: a.update(tap=3), ValueError, r"^tap: must be <= 2"),
    ("tap_negative", REFUSAL_PATHS, lambda a, p: a.update(tap=-1), ValueError, r"^tap: must be >= 0"),
    ("out_not_a_multiple", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:, :10]),
     ValueError, r"^out: 10 columns is not a multiple"),
    ("out_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:4]),
     ValueError, r"^out: 4 rows"),
    ("residual_wrong_shape", REFUSAL_PATHS, lambda a, p: a.update(residual=a["residual"][:, :3]),
     ValueError, r"^residual: expected shape"),
    ("hidden_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(hidden=strided_last(a["hidden"])),
     ValueError, r"^hidden: the last dimension must be contiguous"),
    ("out_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(out=strided_last(a["out"])),
     ValueError, r"^out: the last dimension must be contiguous"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _CAPTURE_BAD, ids=[c[0] for c in _CAPTURE_BAD])
def test_capture_hidden_refuses_bad_input(path, case):
    run_refusal("capture_hidden", path, case, _capture_call(), _CAPTURE_ORDER, ("out",),
                _CAPTURE_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_capture_hidden_good_input_passes_the_contract(path):
    args = run_good("capture_hidden", path, _capture_call(), _CAPTURE_ORDER, _CAPTURE_BF16)
    got = _host(args["out"])
    np.testing.assert_array_equal(got[:, 4:8], _capture_call()["hidden"] + 1)
    assert np.all(got[:, :4] == 7) and np.all(got[:, 8:] == 7)


# ------------------------------------------------------------ draft_combine
_COMBINE_ORDER = ("embed", "hidden", "embed_norm_weight", "hidden_norm_weight", "out")
_COMBINE_BF16 = {"embed": "bfloat16", "hidden": "bfloat16", "out": "bfloat16"}


def _combine_call():
    r = np.random.default_rng(3)
    return {"embed": r.standard_normal((3, 8)).astype(np.float32),
            "hidden": r.standard_normal((3, 8)).astype(np.float32),
            "embed_norm_weight": np.ones(8, np.float32), "hidden_norm_weight": np.ones(8, np.float32),
            "out": np.full((3, 16), 7.0, np.float32), "eps": 1e-5}


_COMBINE_BAD = [
    ("hidden_float64", TORCH, lambda a, p: a.update(hidden=_cast(p, a["hidden"], "float64")),
     TypeError, r"^hidden: dtype"),
    ("embed_fp16_for_bf16", TORCH, lambda a, p: a.update(embed=_cast(p, a["embed"], "float16")),
     TypeError, r"^embed: dtype"),
    ("hidden_norm_weight_other_dtype", TORCH,
     lambda a, p: a.update(hidden_norm_weight=_cast(p, a["hidden_norm_weight"], "bfloat16")),
     TypeError, r"^hidden_norm_weight: dtype"),
    ("hidden_int32", REFUSAL_PATHS, lambda a, p: a.update(hidden=_cast(p, a["hidden"], "int32")),
     TypeError, r"^hidden: dtype"),
    ("out_wrong_width", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:, :8]),
     ValueError, r"^out: expected shape \[3, 16\]"),
    ("embed_norm_weight_short", REFUSAL_PATHS,
     lambda a, p: a.update(embed_norm_weight=a["embed_norm_weight"][:7]),
     ValueError, r"^embed_norm_weight: expected shape"),
    ("embed_width", REFUSAL_PATHS, lambda a, p: a.update(embed=_dense(a["embed"][:, :7])),
     ValueError, r"^embed: width 7"),
    ("embed_rows_without_ids", REFUSAL_PATHS, lambda a, p: a.update(embed=_new_like(a["embed"], (5, 8))),
     ValueError, r"^embed: 5 rows"),
    ("token_ids_float", REFUSAL_PATHS, lambda a, p: a.update(token_ids=_vals(p, [0, 1, 2], "float32")),
     TypeError, r"^token_ids: dtype"),
    ("token_ids_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(token_ids=_vals(p, [0, 1])),
     ValueError, r"^token_ids: expected shape"),
    ("eps_negative", REFUSAL_PATHS, lambda a, p: a.update(eps=-1e-6), ValueError, r"^eps"),
    ("eps_nan", REFUSAL_PATHS, lambda a, p: a.update(eps=float("nan")), ValueError, r"^eps"),
    ("hidden_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(hidden=strided_last(a["hidden"])),
     ValueError, r"^hidden: the last dimension must be contiguous"),
    ("weight_strided", REFUSAL_PATHS,
     lambda a, p: a.update(embed_norm_weight=strided_last(a["embed_norm_weight"])),
     ValueError, r"^embed_norm_weight: must be C-contiguous"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _COMBINE_BAD, ids=[c[0] for c in _COMBINE_BAD])
def test_draft_combine_refuses_bad_input(path, case):
    run_refusal("draft_combine", path, case, _combine_call(), _COMBINE_ORDER, ("out",), _COMBINE_BF16)


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_draft_combine_good_input_passes_the_contract(path):
    call = dict(_combine_call(), token_ids=np.array([1, -1, 99], np.int32))   # ids: device data
    args = run_good("draft_combine", path, call, _COMBINE_ORDER, _COMBINE_BF16)
    got = _host(args["out"])
    assert np.all(got[1:, :8] == 0) and np.all(np.abs(got[0, :8]) > 0)   # bad ids: zero half
    assert np.all(np.abs(got[:, 8:]) > 0)


# ------------------------------------------------------------ draft_map_tokens
_MAP_ORDER = ("draft_ids", "d2t", "out")


def _map_call():
    return {"draft_ids": np.array([0, 3, -1, 9, 2, 8], np.int32),
            "d2t": np.arange(9, dtype=np.int64) * 10, "out": np.full(6, 77, np.int32)}


_MAP_BAD = [
    ("out_int64", TORCH, lambda a, p: a.update(out=_cast(p, a["out"], "int64")), TypeError, r"^out: dtype"),
    ("draft_ids_float", REFUSAL_PATHS, lambda a, p: a.update(draft_ids=_cast(p, a["draft_ids"], "float32")),
     TypeError, r"^draft_ids: dtype"),
    ("d2t_float", REFUSAL_PATHS, lambda a, p: a.update(d2t=_cast(p, a["d2t"], "float32")),
     TypeError, r"^d2t: dtype"),
    ("d2t_2d", REFUSAL_PATHS, lambda a, p: a.update(d2t=a["d2t"].reshape(3, 3)),
     ValueError, r"^d2t: expected 1 dimensions"),
    ("out_short", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:5]), ValueError, r"^out: expected shape"),
    ("draft_ids_strided", REFUSAL_PATHS, lambda a, p: a.update(draft_ids=strided_last(a["draft_ids"])),
     ValueError, r"^draft_ids: must be C-contiguous"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _MAP_BAD, ids=[c[0] for c in _MAP_BAD])
def test_draft_map_tokens_refuses_bad_input(path, case):
    run_refusal("draft_map_tokens", path, case, _map_call(), _MAP_ORDER, ("out",))


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_draft_map_tokens_good_input_passes_the_contract(path):
    args = run_good("draft_map_tokens", path, _map_call(), _MAP_ORDER)
    # ids outside the draft vocabulary are device data: mapped to -1, not refused
    assert _host(args["out"]).tolist() == [0, 33, -1, -1, 22, 88]


# ------------------------------------------------------------ ngram_propose
_NGRAM_ORDER = ("prompt", "prompt_lens", "output", "output_lens", "draft_tokens", "num_draft")


def _ngram_call():
    return {"prompt": np.array([[1, 2, 3, 1, 2, 0], [5, 5, 5, 0, 0, 0]], np.int32),
            "prompt_lens": np.array([5, 3], np.int32), "output": np.zeros((2, 4), np.int32),
            "output_lens": np.array([0, 0], np.int32),
            "draft_tokens": np.full((2, 3), 77, np.int32), "num_draft": np.full(2, 77, np.int32)}


_NGRAM_BAD = [
    ("prompt_lens_int64", TORCH, lambda a, p: a.update(prompt_lens=_cast(p, a["prompt_lens"], "int64")),
     TypeError, r"^prompt_lens: dtype"),
    ("draft_tokens_int64", TORCH, lambda a, p: a.update(draft_tokens=_cast(p, a["draft_tokens"], "int64")),
     TypeError, r"^draft_tokens: dtype"),
    ("prompt_float", REFUSAL_PATHS, lambda a, p: a.update(prompt=_cast(p, a["prompt"], "float32")),
     TypeError, r"^prompt: dtype"),
    ("no_draft_slots", REFUSAL_PATHS, lambda a, p: a.update(draft_tokens=_new(p, (2, 0), "int32")),
     ValueError, r"^draft_tokens: K = 0"),
    ("too_many_draft_slots", REFUSAL_PATHS, lambda a, p: a.update(draft_tokens=_new(p, (2, 65), "int32")),
     ValueError, r"^draft_tokens: K = 65"),
    ("output_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(output=a["output"][:1]),
     ValueError, r"^output: expected shape \[2, O\]"),
    ("prompt_lens_wrong_batch", REFUSAL_PATHS, lambda a, p: a.update(prompt_lens=_vals(p, [1, 1, 1])),
     ValueError, r"^prompt_lens: expected shape"),
    ("num_draft_strided", REFUSAL_PATHS, lambda a, p: a.update(num_draft=strided_last(a["num_draft"])),
     ValueError, r"^num_draft: must be C-contiguous"),
    ("output_last_dim_strided", REFUSAL_PATHS, lambda a, p: a.update(output=strided_last(a["output"])),
     ValueError, r"^output: the last dimension must be contiguous"),
    ("min_n_zero", REFUSAL_PATHS, lambda a, p: a.update(min_n=0), ValueError, r"^min_n: must be >= 1"),
    ("max_n_past_32", REFUSAL_PATHS, lambda a, p: a.update(max_n=33), ValueError, r"^max_n: must be <= 32"),
    ("max_n_below_min_n", REFUSAL_PATHS, lambda a, p: a.update(min_n=3, max_n=2),
     ValueError, r"^max_n: must be >= min_n"),
    ("prompt_len_past_P", REFUSAL_PATHS, lambda a, p: a["prompt_lens"].__setitem__(1, 7),
     ValueError, r"^prompt_lens: 7 at row 1 is outside 0..6"),
    ("output_len_negative", REFUSAL_PATHS, lambda a, p: a["output_lens"].__setitem__(0, -1),
     ValueError, r"^output_lens: -1 at row 0 is outside 0..4"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _NGRAM_BAD, ids=[c[0] for c in _NGRAM_BAD])
def test_ngram_propose_refuses_bad_input(path, case):
    run_refusal("ngram_propose", path, case, _ngram_call(), _NGRAM_ORDER, ("draft_tokens", "num_draft"))


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_ngram_propose_good_input_passes_the_contract(path):
    args = run_good("ngram_propose", path, _ngram_call(), _NGRAM_ORDER)
    assert _host(args["draft_tokens"]).tolist() == [[3, 1, 2], [5, -1, -1]]
    assert _host(args["num_draft"]).tolist() == [3, 1]
    # with check_indices=False lengths out of range are clamped (the kernel's reading)
    call = _ngram_call()
    call["prompt_lens"][1] = 9
    args = run_good("ngram_propose", path, dict(call, check_indices=False), _NGRAM_ORDER)
    assert _host(args["num_draft"]).tolist() == [3, 1]
