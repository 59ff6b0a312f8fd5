#!/usr/bin/env python3
"""Check verify_attention_kv8's in-register dequantisation without a GPU (issue 32).

    python3 tools/perf/kv8_frag_check.py [layout] [decoders] [rounding]   (default: all three)

layout: emulates one warp's 16-key sub-tile lane by lane, as verify_attention_kv8.cu writes
  it: the 8-bit tile's shared-memory layout (kv8_off, and that every ldmatrix matrix is
  bank-conflict-free), what ldmatrix / ldmatrix.trans hand each lane of 8-bit rows, the
  byte pairings of common/kv8_frag.cuh, q's permuted columns, mma.m16n8k16's fragment
  semantics (common/mma.cuh), the int8 score fold and the epilogue's column order; exact
  arithmetic against q K^T and P V, D = 64 / 128 / 256, fp8 native / software and int8.
decoders: the byte tricks of kv8_frag.cuh bit for bit against reference/kvquant.py: int8
  codes -> f16 1152 + c (magic exponent), the software E4M3 pair decode with garbage in the
  ignored bytes (all 65536 code pairs).
rounding: the kernel's 16-bit roundings (P; int8: P' = p s 2^E in float16 against the exact
  codes, sum p (z + 128 s) in float32; the output) against
  tests/test_kv8.py::test_verify_attention_8bit_gpu's reference and tolerances, beside the
  previous kernel's (int8 V = fma(c, s, z + 128 s) in q's dtype, P in q's dtype).
A model of the kernel, not the kernel: the GPU tests are what proves it.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from specdec_lib.reference import kvquant as kq  # noqa: E402

E4M3 = kq.fp8_dequantize(np.arange(256, dtype=np.uint8), np.array([[1.0]])).reshape(-1)


# ---------------------------------------------------------------- layout
def kv8_off(D, row, c):
    if D >= 128:
        return row * D + ((c ^ (row & 7)) << 4)
    line = row >> 1
    return (line << 7) + (((((row & 1) << 2) | c) ^ (line & 7)) << 4)


def ldmatrix_x4(smem, addrs, trans):
    """bytes lane (g, t) receives from matrix m: non-trans, row g's bytes 4t..4t+3; .trans
    (b16 elements), element [2t][g] then [2t+1][g], i.e. rows 2t, 2t+1 x bytes 2g, 2g+1."""
    out = np.zeros((32, 4, 4), np.uint8)
    for m in range(4):
        rows = addrs[8 * m: 8 * m + 8]
        assert len({(a // 16) % 8 for a in rows}) == 8, "bank conflict"
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            if trans:
                r0, r1 = rows[2 * t], rows[2 * t + 1]
                out[lane, m] = [smem[r0 + 2 * g], smem[r0 + 2 * g + 1], smem[r1 + 2 * g], smem[r1 + 2 * g + 1]]
            else:
                out[lane, m] = smem[rows[g] + 4 * t: rows[g] + 4 * t + 4]
    return out


def mma(C, A, B):
    """C[lane] += A x B from per-lane fragments (pairs of values, low half first)."""
    Am, Bm = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a, b = A[lane], B[lane]
        Am[g, 2 * t:2 * t + 2], Am[g + 8, 2 * t:2 * t + 2] = a[0], a[1]
        Am[g, 2 * t + 8:2 * t + 10], Am[g + 8, 2 * t + 8:2 * t + 10] = a[2], a[3]
        Bm[2 * t:2 * t + 2, g], Bm[2 * t + 8:2 * t + 10, g] = b[0], b[1]
    Cm = Am @ Bm
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        C[lane] += [Cm[g, 2 * t], Cm[g, 2 * t + 1], Cm[g + 8, 2 * t], Cm[g + 8, 2 * t + 1]]


def layout_case(D, fmt, native, rng):
    keys = 64 if D <= 128 else 32
    sub = 1                                       # the second 16-key sub-tile of the tile
    codes = {kv: (rng.integers(0, 256, (keys, D)) & (0xF7 if fmt == "fp8" else 0xFF)).astype(np.uint8)
             for kv in "kv"}
    val = {kv: (E4M3[c] if fmt == "fp8" else c.view(np.int8).astype(np.float64)) for kv, c in codes.items()}
    ks, kz, vs, vz = (rng.uniform(a, b, keys) for a, b in ((0.01, 0.05), (-3, 0), (0.01, 0.05), (-3, 0)))
    smem = {kv: np.zeros(keys * D, np.uint8) for kv in "kv"}
    for kv in "kv":
        for r in range(keys):
            for c in range(D // 16):
                o = kv8_off(D, r, c)
                smem[kv][o:o + 16] = codes[kv][r, 16 * c:16 * c + 16]
    q = rng.standard_normal((16, D))
    strided = fmt == "fp8" and not native        # kQStrided: K pairs (0, 2) / (1, 3)

    def qpair(row, kk, t):
        c = kk * 16 + 4 * t
        x, y = (q[row, c], q[row, c + 1]), (q[row, c + 2], q[row, c + 3])
        return ((x[0], y[0]), (x[1], y[1])) if strided else (x, y)

    qa = [[(qpair(l >> 2, kk, l & 3)[0], qpair((l >> 2) + 8, kk, l & 3)[0],
            qpair(l >> 2, kk, l & 3)[1], qpair((l >> 2) + 8, kk, l & 3)[1]) for l in range(32)]
          for kk in range(D // 16)]
    lanes = np.arange(32)
    mrow = sub * 16 + (((lanes >> 3) & 1) << 3) + (lanes & 7)
    S = np.zeros((2, 32, 4))
    for kc in range(0, D // 16, 2):
        w = ldmatrix_x4(smem["k"], [kv8_off(D, mrow[l], kc + (l >> 4)) for l in range(32)], False)
        for h in range(2):
            for n in range(2):
                B = []
                for lane in range(32):
                    v = E4M3[w[lane, 2 * h + n]] if fmt == "fp8" else 1152 + w[lane, 2 * h + n].view(np.int8).astype(float)
                    B.append(((v[0], v[2]), (v[1], v[3])) if strided else ((v[0], v[1]), (v[2], v[3])))
                mma(S[n], qa[kc + h], B)
    got = np.zeros((16, 16))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for n in range(2):
            got[g, 8 * n + 2 * t: 8 * n + 2 * t + 2] = S[n, lane, :2]
            got[g + 8, 8 * n + 2 * t: 8 * n + 2 * t + 2] = S[n, lane, 2:]
    ksub = slice(sub * 16, sub * 16 + 16)
    bias = 1152 if fmt == "int8" else 0
    assert np.allclose(got, q @ (val["k"][ksub] + bias).T), ("q . codes", D, fmt, native)
    if fmt == "int8":   # s (q . (1152 + c)) + (z - 1024 s) sum(q) = q . ((c + 128) s + z)
        fold = got * ks[ksub] + (kz[ksub] - 1024 * ks[ksub]) * q.sum(1)[:, None]
        assert np.allclose(fold, q @ ((val["k"][ksub] + 128) * ks[ksub, None] + kz[ksub, None]).T)
    P = P0 = rng.random((16, 16))
    pa = [(tuple(P[l >> 2, 2 * (l & 3):2 * (l & 3) + 2]), tuple(P[(l >> 2) + 8, 2 * (l & 3):2 * (l & 3) + 2]),
           tuple(P[l >> 2, 8 + 2 * (l & 3):10 + 2 * (l & 3)]), tuple(P[(l >> 2) + 8, 8 + 2 * (l & 3):10 + 2 * (l & 3)]))
          for l in range(32)]
    if fmt == "int8":   # P' = p s (the kernel's 2^E cancels in exact arithmetic)
        P = P * vs[sub * 16:sub * 16 + 16][None, :]
        pa = [(tuple(P[l >> 2, 2 * (l & 3):2 * (l & 3) + 2]), tuple(P[(l >> 2) + 8, 2 * (l & 3):2 * (l & 3) + 2]),
               tuple(P[l >> 2, 8 + 2 * (l & 3):10 + 2 * (l & 3)]),
               tuple(P[(l >> 2) + 8, 8 + 2 * (l & 3):10 + 2 * (l & 3)])) for l in range(32)]
    acc = np.zeros((D // 8, 32, 4))
    acc_off = np.zeros((32, 4))
    mma(acc_off, pa, [((1152, 1152), (1152, 1152))] * 32)
    for vc in range(0, D // 16, 2):
        w = ldmatrix_x4(smem["v"], [kv8_off(D, mrow[l], vc + (l >> 4)) for l in range(32)], True)
        for h in range(2):
            Be, Bo = [], []
            for lane in range(32):
                regs = []
                for j in range(2):                 # w[2h]: keys 2t, 2t+1; w[2h+1]: keys 2t+8, 2t+9
                    b = w[lane, 2 * h + j]
                    v = E4M3[b] if fmt == "fp8" else 1152 + b.view(np.int8).astype(float)
                    regs.append(((v[0], v[2]), (v[1], v[3])))    # column d / column d+1
                Be.append((regs[0][0], regs[1][0]))
                Bo.append((regs[0][1], regs[1][1]))
            mma(acc[2 * (vc + h)], pa, Be)
            mma(acc[2 * (vc + h) + 1], pa, Bo)
    if fmt == "int8":   # (acc - P' . 1152) + sum p (z + 128 s)
        acc = acc - acc_off[None]
        zsum = P0 @ (vz[ksub] + 128 * vs[ksub])
        for lane in range(32):
            acc[:, lane, :2] += zsum[lane >> 2]
            acc[:, lane, 2:] += zsum[(lane >> 2) + 8]
        P = P0
    Vd = val["v"][ksub] if fmt == "fp8" else (val["v"][ksub] + 128) * vs[ksub, None] + vz[ksub, None]
    out = np.zeros((16, D))
    for cp in range(D // 64):                      # the epilogue's passes of 64 columns
        for c in range(4):
            e, o = acc[cp * 8 + 2 * c], acc[cp * 8 + 2 * c + 1]
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                col = cp * 64 + c * 16 + 4 * t
                out[g, col:col + 4] = [e[lane, 0], o[lane, 0], e[lane, 1], o[lane, 1]]
                out[g + 8, col:col + 4] = [e[lane, 2], o[lane, 2], e[lane, 3], o[lane, 3]]
    assert np.allclose(out, P @ Vd), ("P . V", D, fmt, native)


def check_layout():
    rng = np.random.default_rng(0)
    for D in (64, 128, 256):
        for fmt, native in (("fp8", True), ("fp8", False), ("int8", True)):
            layout_case(D, fmt, native, rng)
            print(f"layout ok: D={D} {fmt} {'native' if native else 'software'} "
                  "(q . K, int8 fold, P . V, epilogue columns, conflict-free ldmatrix)")


# ---------------------------------------------------------------- decoders
def prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(sel >> (4 * n)) & 7] << (8 * n) for n in range(4))


def f16(bits):
    return float(np.array([bits], np.uint16).view(np.float16)[0])


def halves(u):
    return u & 0xFFFF, u >> 16


def e4m3_sw(r):   # kv8_frag.cuh e4m3_b13_to_f16x2_sw
    h = ((r >> 1) & 0x3F803F80) | (r & 0x80008000)
    out = 0
    for part in range(2):
        v = np.float16(f16((h >> (16 * part)) & 0xFFFF)) * np.float16(256)
        out |= int(np.array([v], np.float16).view(np.uint16)[0]) << (16 * part)
    t = ((r & 0x7F007F00) + 0x01000100) & 0xFFFFFFFF
    nan = sum((0xFF if (t >> (8 * src + 7)) & 1 else 0) << (8 * n)   # prmt 0xBB99, sign mode
              for n, src in enumerate((1, 1, 3, 3)))
    return out | nan


def check_decoders():
    rng = np.random.default_rng(1)
    for _ in range(20000):
        w = int(rng.integers(0, 2 ** 32))
        c = [int(np.uint8((w >> (8 * i)) & 0xFF).view(np.int8)) for i in range(4)]
        for sel, (i, j) in ((0x4140, (0, 1)), (0x4342, (2, 3)), (0x4240, (0, 2)), (0x4341, (1, 3))):
            lo, hi = halves(prmt(w ^ 0x80808080, 0x64646464, sel))
            assert (f16(lo), f16(hi)) == (1152 + c[i], 1152 + c[j])
    print("decoders ok: int8 -> f16 1152 + c exact (20000 random words, the 4 pairings)")
    for b1 in range(256):
        for b3 in range(256):
            r = int(rng.integers(0, 256)) | (b1 << 8) | (int(rng.integers(0, 256)) << 16) | (b3 << 24)
            for bits, code in zip(halves(e4m3_sw(r)), (b1, b3)):
                v, e = f16(bits), E4M3[code]
                assert (np.isnan(v) and np.isnan(e)) or (v == e and np.signbit(v) == np.signbit(e)), code
    print("decoders ok: software E4M3 pair decode exact for all 65536 code pairs, NaN codes included")


# ---------------------------------------------------------------- rounding
def check_rounding():
    import test_kv8 as T
    from specdec_lib.dtypes import from_host_storage, to_host_storage

    def r16(x, dt):
        x = np.asarray(x, np.float64)
        if dt == "float16":
            return x.astype(np.float16).astype(np.float64)
        return from_host_storage(to_host_storage(x.astype(np.float32), dt), dt).astype(np.float64)

    def attend(q, K, V, pos, L, pround, vscale=1.0):
        s = (q @ K.T) / math.sqrt(q.shape[1])
        s[np.arange(K.shape[0])[None, :] > (L + pos)[:, None]] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        return (pround(p) @ V) / p.sum(1, keepdims=True) * vscale

    def model(c, dtype, new):
        fp8 = "k_scale" in c["kw"]
        qf = from_host_storage(to_host_storage(c["q"].astype(np.float32), dtype), dtype).astype(np.float64)
        Tn, Hq, D = qf.shape
        Hkv, ps = c["k_cache"].shape[2], c["k_cache"].shape[1]
        group = Hq // Hkv
        kd, vd = T._va_dequant(c)
        out, exp = np.zeros_like(qf), np.zeros_like(qf)
        pv = "float16" if new and fp8 else dtype
        for b in range(len(c["seq_lens"])):
            L, t0, t1 = int(c["seq_lens"][b]), int(c["cu_q"][b]), int(c["cu_q"][b + 1])
            if t1 == t0:
                continue
            keys = np.arange(L + t1 - t0)
            pages, slots = c["page_table"][b][keys // ps], keys % ps
            for h in range(Hkv):
                qr = qf[t0:t1, h * group:(h + 1) * group].reshape(-1, D)
                pos = np.repeat(np.arange(t1 - t0), group)
                K, V = kd[pages, slots, h], vd[pages, slots, h]
                e = attend(qr, K, V, pos, L, lambda p: p)
                if fp8:   # E4M3 values exact in both 16-bit types; scales in float32
                    ck = E4M3[c["k_cache"][pages, slots, h]] * c["kw"]["k_scale"][h]
                    cv = E4M3[c["v_cache"][pages, slots, h]]
                    o = attend(qr, ck, cv, pos, L, lambda p: r16(p, pv), c["kw"]["v_scale"][h])
                elif not new:
                    o = attend(qr, r16(K, dtype), r16(V, dtype), pos, L, lambda p: r16(p, dtype))
                else:     # K folded in float32; V as the kernel: P' = p s 2^E in float16 times c
                    # exactly, E dropping per 16-key step as one warp would; sum p (z + 128 s)
                    vp = c["kw"]["v_params"][pages, slots, h].astype(np.float64)
                    cv = c["v_cache"][pages, slots, h].view(np.int8).astype(np.float64)
                    sc = (qr @ K.T) / math.sqrt(D)
                    sc[np.arange(K.shape[0])[None, :] > (L + pos)[:, None]] = -np.inf
                    p = np.exp(sc - sc.max(1, keepdims=True))
                    o = (int8_pv(p, vp[:, 0], cv) + (p @ (vp[:, 1] + 128 * vp[:, 0]))[:, None]) / p.sum(1, keepdims=True)
                idx = (slice(t0, t1), slice(h * group, (h + 1) * group))
                out[idx] = r16(o, dtype).reshape(t1 - t0, group, D)
                exp[idx] = e.reshape(t1 - t0, group, D)
        return np.linalg.norm(out - exp) / np.linalg.norm(exp)

    def int8_pv(p, s_, cv):   # sum_k p s c as the kernel forms it (its running exponent E)
        E, acc = 126, np.zeros((p.shape[0], cv.shape[1]))
        for k0 in range(0, len(s_), 16):
            ss = s_[k0:k0 + 16]
            if ss.max() >= 2.0 ** (14 - E):
                e_new = min(max(8 - int(np.floor(np.log2(ss.max()))), -126), 126)
                acc *= 2.0 ** (e_new - E)
                E = e_new
            acc += r16(p[:, k0:k0 + 16] * ss * 2.0 ** E, "float16") @ cv[k0:k0 + 16]
        return acc * 2.0 ** -E

    print("rounding (test_verify_attention_8bit_gpu cases): rel_err previous kernel / this kernel (tolerance)")
    for fmt in T.FMTS:
        for dtype in ("float16", "bfloat16"):
            for D, group, Hkv, page in ((64, 4, 2, 16), (128, 4, 8, 16), (256, 1, 2, 64), (128, 16, 1, 1)):
                c = T._va_case(np.random.default_rng(7), fmt, D=D, Hq=group * Hkv, Hkv=Hkv, page=page,
                               qs=(4, 1, 16, 0, 7), Ls=(700, 0, 250, 3, 4095))
                old, new = model(c, dtype, False), model(c, dtype, True)
                tol = T._TOL[dtype]
                assert new <= tol / 4, (fmt, dtype, D, new)
                print(f"  {fmt:4s} {dtype:8s} D={D:3d} group={group:2d} Hkv={Hkv} page={page:2d}: "
                      f"{old:.2e} / {new:.2e} ({tol:.1e})")
    print("int8 token scales (test_verify_attention_int8_gpu_token_scales cases):")
    for order in ("random", "rising", "falling", "offset"):
        for dtype in ("float16", "bfloat16"):
            rng = np.random.default_rng(11)
            mags = {"random": lambda pos: 2.0 ** rng.uniform(-12, 12, pos.shape),
                    "rising": lambda pos: 2.0 ** np.linspace(-12, 12, pos.size),
                    "falling": lambda pos: 2.0 ** np.linspace(12, -12, pos.size),
                    "offset": lambda pos: 2.0 ** rng.uniform(-3, 3, pos.shape)}[order]
            c = T._va_case(rng, "int8", D=128, Hq=8, Hkv=2, page=16, qs=(4, 1, 3), Ls=(900, 0, 300),
                           mags=mags)
            if order == "offset":
                c["vf"] = (40.0 + c["vf"] / 64).astype(np.float32)
                c["v_cache"], c["kw"]["v_params"] = kq.int8_quantize(c["vf"])
            old, new = model(c, dtype, False), model(c, dtype, True)
            tol = T._TOL[dtype]
            assert new <= tol / 4, ("token scales", order, dtype, new)
            print(f"  {order:7s} {dtype:8s}: {old:.2e} / {new:.2e} ({tol:.1e})")


def main(argv):
    which = argv or ["layout", "decoders", "rounding"]
    for w in which:
        {"layout": check_layout, "decoders": check_decoders, "rounding": check_rounding}[w]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
