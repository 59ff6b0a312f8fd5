"""Draft ops: draft_carry, capture_hidden, draft_combine, draft_map_tokens."""
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


# ------------------------------------------------------------------------------ GPU

@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8"])
@pytest.mark.parametrize("B,H", [(1, 1), (5, 129), (64, 4096), (0, 8)])
def test_draft_carry_gpu(dtype, B, H, rng):
    from specdec_lib import DeviceArray, ops
    from specdec_lib.dtypes import host_dtype
    q = rng.integers(1, 5, B)
    cu = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    T = int(cu[-1])
    acc = np.array([rng.integers(0, x + 1) for x in q], np.int32)
    hidden = rng.integers(0, 200, (T, H)).astype(host_dtype(dtype))
    for r0, c0 in ((0, 0), (T // 2, H // 3)):
        want = np.zeros((B, H + c0), hidden.dtype)
        ref.draft_carry(np.ascontiguousarray(hidden[r0:]), cu, acc, want, row_begin=r0, col_begin=c0)
        out = poison((B, H + c0), dtype)
        ops.draft_carry(DeviceArray.from_numpy(np.ascontiguousarray(hidden[r0:]), dtype),
                        DeviceArray.from_numpy(cu), DeviceArray.from_numpy(acc), out,
                        row_begin=r0, col_begin=c0)
        assert np.array_equal(out.to_numpy(), want)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("T,H", [(1, 64), (7, 129), (300, 4096)])
def test_capture_hidden_gpu(dtype, T, H, rng):
    from specdec_lib import DeviceArray, ops
    from specdec_lib.dtypes import bf16_bits_to_f32
    x = rng.standard_normal((T, H)).astype(np.float32)
    r = rng.standard_normal((T, H)).astype(np.float32)
    out = poison((T, 3 * H), dtype)
    for tap in range(3):
        ops.capture_hidden(DeviceArray.from_numpy(x, dtype), out, tap,
                           residual=DeviceArray.from_numpy(r, dtype) if tap == 2 else None)
    got = out.to_numpy()
    got = bf16_bits_to_f32(got) if dtype == "bfloat16" else got.astype(np.float32)
    want = np.concatenate([x, x, x + r], axis=1)
    assert rel_err(got, want) < (1e-2 if dtype != "float32" else 1e-6)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows,H", [(1, 64), (5, 130), (64, 4096), (0, 128)])
@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("gather", [False, True])
def test_draft_combine_gpu(dtype, rows, H, unit_offset, gather, rng):
    from specdec_lib import DeviceArray, ops
    from specdec_lib.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
    V = 50
    def rnd(*s):
        x = rng.standard_normal(s).astype(np.float32)
        return bf16_bits_to_f32(f32_to_bf16_bits(x)) if dtype == "bfloat16" else x.astype(dtype).astype(np.float32)
    table, hidden = rnd(V, H), rnd(rows, H)
    we, wh = rnd(H), rnd(H)
    ids = rng.integers(-2, V + 2, rows).astype(np.int32)
    embed = table if gather else table[np.clip(ids, 0, V - 1)]
    want = np.zeros((rows, 2 * H))
    ref.draft_combine(embed, hidden, we, wh, want, token_ids=ids if gather else None,
                      unit_offset=unit_offset)
    out = poison((rows, 2 * H), dtype)
    dev = lambda a: DeviceArray.from_numpy(a, dtype)  # noqa: E731
    ops.draft_combine(dev(embed), dev(hidden), dev(we), dev(wh), out,
                      token_ids=DeviceArray.from_numpy(ids) if gather else None,
                      unit_offset=unit_offset)
    got = out.to_numpy()
    got = bf16_bits_to_f32(got) if dtype == "bfloat16" else got.astype(np.float32)
    assert rel_err(got, want) < (1e-5 if dtype == "float32" else 1e-2)


@needs_gpu
def test_draft_map_tokens_gpu(rng):
    from specdec_lib import DeviceArray, ops
    Vd = 1000
    d2t = rng.integers(0, 5000, Vd).astype(np.int64)
    ids = rng.integers(-5, Vd + 5, 777).astype(np.int32)
    want = np.zeros(777, np.int32)
    ref.draft_map_tokens(ids, d2t, want)
    out = poison((777,), "int32")
    ops.draft_map_tokens(DeviceArray.from_numpy(ids), DeviceArray.from_numpy(d2t), out)
    assert np.array_equal(out.to_numpy(), want)
