"""The 8-bit KV formats of specdec_lib.reference.kvquant against independent formulations
(CPU only): E4M3 decode over all 256 codes, encode over many float32 inputs against a
nearest-value search, the int8 row quantiser's documented corner cases."""
import numpy as np
import pytest

from specdec_lib.reference import kvquant as kq


def _value_table():
    """All 256 E4M3 codes by the textbook definition (sign, 4-bit exponent bias 7, 3-bit
    mantissa, subnormals at exponent 0, S.1111.111 = NaN), in float64."""
    vals = np.empty(256)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e = (c >> 3) & 0xF
        m = c & 7
        if e == 0xF and m == 7:
            vals[c] = np.nan
        elif e == 0:
            vals[c] = s * (m / 8.0) * 2.0 ** -6
        else:
            vals[c] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return vals


def test_e4m3_decode_all_codes():
    ref = _value_table()
    got = kq.e4m3_decode(np.arange(256, dtype=np.uint8)).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(got[ok], ref[ok])
    assert np.array_equal(np.signbit(got[ok]), np.signbit(ref[ok]))   # -0 is 0x80
    assert ref[0x7E] == 448.0 and ref[0x01] == 2.0 ** -9


def test_e4m3_roundtrip_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    back = kq.e4m3_encode(kq.e4m3_decode(codes))
    nan = (codes & 0x7F) == 0x7F
    assert np.array_equal(back[~nan], codes[~nan])
    assert np.all(back[nan] == 0x7F)


def _encode_by_search(x):
    """Nearest finite E4M3 value, ties to the even code (even mantissa), |x| > 464 and
    infinities saturate to +-448, NaN -> 0x7F: the spec without any bit tricks."""
    table = _value_table()
    pos = np.arange(0x7F)                       # 0x00..0x7E: the non-negative finite codes
    pv = table[pos]
    out = np.empty(x.shape, np.uint8)
    for i, v in enumerate(x.astype(np.float64)):
        if np.isnan(v):
            out[i] = 0x7F
            continue
        a = min(abs(v), 448.0) if abs(v) <= 464.0 else 448.0
        d = np.abs(pv - a)
        best = np.flatnonzero(d == d.min())
        c = best[0] if len(best) == 1 else [b for b in best if b % 2 == 0][0]
        out[i] = c | (0x80 if np.signbit(v) else 0)
    return out


def _interesting_floats(rng, n):
    table = _value_table()
    fin = table[~np.isnan(table)]
    fin = np.unique(np.abs(fin))
    mids = (fin[1:] + fin[:-1]) / 2            # exact ties in float32
    pts = np.concatenate([fin, mids, [464.0, 480.0, 2.0 ** -10, 3 * 2.0 ** -11, 1e-30, 1e30]])
    pts = pts.astype(np.float32)
    near = np.concatenate([np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    rnd = np.concatenate([
        rng.standard_normal(n).astype(np.float32) * 100,
        (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 12, n)).astype(np.float32),
        rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ])
    x = np.concatenate([pts, near, rnd, [np.inf, -np.inf, np.nan, 0.0, -0.0]]).astype(np.float32)
    return np.concatenate([x, -x])


def test_e4m3_encode_against_nearest_value_search():
    rng = np.random.default_rng(0)
    x = _interesting_floats(rng, 3000)
    got = kq.e4m3_encode(x)
    ref = _encode_by_search(x)
    bad = np.flatnonzero(got != ref)
    assert len(bad) == 0, [(float(x[i]), int(got[i]), int(ref[i])) for i in bad[:8]]


def test_e4m3_encode_monotone_dense():
    """Every float32 in [0, 512] by a stride: codes never decrease, saturate at 0x7E."""
    u = np.arange(0, 0x44000000, 997, dtype=np.uint32)
    x = u.view(np.float32)
    c = kq.e4m3_encode(x).astype(np.int64)
    assert np.all(np.diff(c) >= 0)
    assert c[-1] == 0x7E
    # and each code is a nearest value: |x - value(code)| <= half the local spacing
    v = kq.e4m3_decode(c.astype(np.uint8)).astype(np.float64)
    nxt = kq.e4m3_decode(np.minimum(c + 1, 0x7E).astype(np.uint8)).astype(np.float64)
    prv = kq.e4m3_decode(np.maximum(c - 1, 0).astype(np.uint8)).astype(np.float64)
    xs = x.astype(np.float64)
    inside = xs <= 448
    assert np.all(np.abs(xs - v)[inside] <= np.abs(xs - nxt)[inside])
    assert np.all(np.abs(xs - v)[inside] <= np.abs(xs - prv)[inside])


def test_fp8_quantize_scale():
    x = np.array([[1.0, -2.0, 900.0, np.nan]], np.float32)
    c = kq.fp8_quantize(x, np.float32(2.0))
    assert c.tolist() == [[int(kq.e4m3_encode(np.float32(0.5))), int(kq.e4m3_encode(np.float32(-1))),
                           0x7E, 0x7F]]
    back = kq.fp8_dequantize(c, 2.0)
    assert back[0, 0] == 1.0 and back[0, 1] == -2.0 and back[0, 2] == 896.0 and np.isnan(back[0, 3])


def test_int8_roundtrip_error_bound():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 8, 128)).astype(np.float32) * 3
    c, p = kq.int8_quantize(x)
    assert c.dtype == np.int8 and p.shape == (64, 8, 2) and p.dtype == np.float32
    y = kq.int8_dequantize(c, p)
    err = np.abs(y - x)
    assert np.all(err <= p[..., 0:1] * 0.5001 + 1e-6)
    # the row minimum reads back exactly, the maximum within half a step
    amin = np.argmin(x, axis=-1)
    assert np.array_equal(np.take_along_axis(y, amin[..., None], -1)[..., 0], x.min(-1))
    assert c.min() == -128 and c.max() == 127


def test_int8_formula_by_hand():
    x = np.array([0.0, 1.0, 2.55, -1.0], np.float32)
    c, p = kq.int8_quantize(x)
    scale = np.float32(np.float32(3.55) / np.float32(255))
    assert p[0] == scale and p[1] == np.float32(-1.0)
    inv = np.float32(1) / scale
    want = [int(np.clip(np.rint(np.float32(np.float32(v) - np.float32(-1)) * inv), 0, 255)) - 128
            for v in x]
    assert c.tolist() == want


def test_int8_corner_rows():
    eq = np.full((1, 16), 0.3, np.float32)
    c, p = kq.int8_quantize(eq)
    assert p[0, 0] == 1.0 and p[0, 1] == np.float32(0.3) and np.all(c == -128)
    assert np.all(kq.int8_dequantize(c, p) == np.float32(0.3))
    nanrow = np.full((1, 4), np.nan, np.float32)
    c, p = kq.int8_quantize(nanrow)
    assert p[0, 0] == 1.0 and np.isnan(p[0, 1]) and np.all(np.isnan(kq.int8_dequantize(c, p)))
    part = np.array([[1.0, np.nan, 3.0]], np.float32)
    c, p = kq.int8_quantize(part)
    assert c[0, 1] == -128 and kq.int8_dequantize(c, p)[0, 1] == 1.0   # NaN reads as the min
    tiny = np.array([[0.0, 1e-40]], np.float32)                        # subnormal range
    c, p = kq.int8_quantize(tiny)
    assert p[0, 0] == 1.0 and np.all(c == -128)
    inf = np.array([[-np.inf, 0.0, 1.0]], np.float32)
    c, p = kq.int8_quantize(inf)
    assert p[0, 0] == 1.0 and c.tolist() == [[-128, 127, 127]]
    # a zero minimum is stored as +0 whichever zero a min keeps (order-dependent)
    zeros = np.array([[-0.0, 0.0, 2.0], [0.0, -0.0, 2.0], [-0.0, -0.0, -0.0], [-0.0, 1.0, 3.0]],
                     np.float32)
    c, p = kq.int8_quantize(zeros)
    assert np.all(p[:, 1] == 0) and not np.signbit(p[:, 1]).any()
    assert c[:, 0].tolist() == [-128] * 4


@pytest.mark.parametrize("shape", [(3, 5), (2, 7, 64)])
def test_int8_codes_use_full_range(shape):
    rng = np.random.default_rng(2)
    x = rng.uniform(-5, 5, shape).astype(np.float32)
    c, p = kq.int8_quantize(x)
    assert np.all(c.min(-1) == -128) and np.all(c.max(-1) == 127)
