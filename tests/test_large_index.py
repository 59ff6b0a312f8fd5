"""Large indices (issue 7): ops whose operands hold more than 2^31 elements compute correct
addresses. Each test allocates one multi-GiB operand (up to ~9 GiB per test, freed before
the next), fills it on the device (memset), writes random data only where the op must
read, places the rows / pages / slots it works on beyond element 2^31 (and one exactly at
it), and compares those with the numpy reference: an address computed in 32 bits would
read the background value or fault, or write somewhere the checks see.

GPU only; each test skips (with the reason) when the device has less free memory than it
needs. About 20 s on an H200; deselected under tools/gpu/sanitize.sh (SPECDEC_SANITIZE)."""
import numpy as np
import pytest

from conftest import needs_gpu, poison, rel_err
from specdec_lib import reference as ref
from specdec_lib.dtypes import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = needs_gpu
GiB = 2**30
I31 = 2**31


# ------------------------------------------------------------------ helpers

def _free_bytes():
    from specdec_lib import runtime
    runtime.driver().ensure_context(0)
    try:
        from cuda.bindings import driver as cu
        err, free, _total = cu.cuMemGetInfo()
        if int(err) == 0:
            return int(free)
    except Exception:   # noqa: BLE001 - any failure: try the next way
        pass
    try:
        import torch
        return int(torch.cuda.mem_get_info()[0])
    except Exception:   # noqa: BLE001
        return None


def need(gib):
    free = _free_bytes()
    want = int((gib + 1) * GiB)          # + 1 GiB of slack for the small operands
    if free is not None and free < want:
        pytest.skip(f"needs {gib + 1:.1f} GiB of free device memory, {free / GiB:.1f} GiB free")


def big(shape, dtype, byte=0):
    """A device array filled with one byte value on the device (no host copy)."""
    from specdec_lib import DeviceArray
    return DeviceArray.empty(shape, dtype).fill_bytes(byte)


def put(arr, elem_offset, host):
    """Write host data (any numpy array, bf16 as uint16 bits) at element offset of arr."""
    from specdec_lib import runtime
    h = np.ascontiguousarray(host)
    assert elem_offset >= 0 and elem_offset + h.size <= arr.size
    drv = runtime.driver()
    drv.ensure_context(arr.device)
    drv.ctx_synchronize()
    drv.memcpy_htod(arr.ptr + elem_offset * arr.itemsize, h.reshape(-1).view(np.uint8))


def get(arr, elem_offset, shape, host_dtype):
    from specdec_lib import runtime
    out = np.empty(shape, host_dtype)
    assert out.itemsize == arr.itemsize and elem_offset + out.size <= arr.size
    drv = runtime.driver()
    drv.ensure_context(arr.device)
    drv.ctx_synchronize()
    drv.memcpy_dtoh(out.reshape(-1).view(np.uint8), arr.ptr + elem_offset * arr.itemsize)
    return out


def dev(a, dtype=None):
    from specdec_lib import DeviceArray
    return DeviceArray.from_numpy(np.asarray(a), dtype=dtype)


def bf16(x):
    return f32_to_bf16_bits(np.asarray(x, np.float32))


def f32(bits):
    return bf16_bits_to_f32(bits).astype(np.float64)


class View:
    """A strided view (strides in elements) of a DeviceArray through the CUDA array
    interface."""

    def __init__(self, base, shape, strides, typestr):
        self.base = base
        isz = base.itemsize
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "strides": tuple(s * isz for s in strides),
                                         "data": (base.ptr, False), "version": 3}


# ------------------------------------------------------------------ copy

def test_copy_contiguous_beyond_2_31_elements(rng):
    from specdec_lib import ops
    n = I31 + 2**21 + 5                          # int16: 4 GiB per operand
    need(2 * n * 2 / GiB)
    src = big((n,), "int16", 0x11)
    dst = poison((n,), "int16")
    spots = {}
    for s in (0, I31 - 3, I31 + 4093, n - 4096):  # one slice straddles element 2^31
        h = rng.integers(-2**15, 2**15, 4096, dtype=np.int16)
        put(src, s, h)
        spots[s] = h
    ops.copy(dst, src)
    for s, h in spots.items():
        np.testing.assert_array_equal(get(dst, s, h.shape, np.int16), h, err_msg=f"slice at {s}")
    back = get(dst, n - 2**20, (2**20 - 4096,), np.int16)          # background near the end
    assert (back == 0x1111).all(), "background not copied near the end"


def test_copy_strided_rows_beyond_2_31_elements(rng):
    """A row-padded source (not mergeable into one dim): row * stride past 2^31."""
    from specdec_lib import ops
    R, C, pad = 65600, 32768, 16                  # R * C = 2^31 + 2^21 int8 elements
    need((R * (C + pad) + R * C) / GiB)
    base = big((R * (C + pad),), "int8", 0x22)
    src = View(base, (R, C), (C + pad, 1), "|i1")
    dst = poison((R, C), "int8")
    rows = {}
    for r in (0, 65535, 65536, R - 2, R - 1):    # 65536 * C = 2^31 exactly
        h = rng.integers(-128, 128, C, dtype=np.int8)
        put(base, r * (C + pad), h)
        rows[r] = h
    ops.copy(dst, src)
    for r, h in rows.items():
        np.testing.assert_array_equal(get(dst, r * C, (C,), np.int8), h, err_msg=f"row {r}")
    assert (get(dst, (R - 3) * C, (C,), np.int8) == 0x22).all()


# ------------------------------------------------------------------ append_kv + verify_attention

@pytest.mark.parametrize("split", [False, True])
def test_append_kv_and_verify_attention_pages_beyond_2_31(rng, split):
    """KV caches of 4.3 GiB each (fp16, 16384 elements per page): sequence 1's pages lie
    beyond element 2^31 (page 131072 starts exactly there), sequence 0's at the start.
    The history and the block are written with append_kv, read back page by page, and the
    block's attention is compared with the float64 reference on a compact pool."""
    from specdec_lib import DeviceArray, ops
    from specdec_lib.ops import verify_attention_workspace_size
    Hkv, group, D, ps, dt = 8, 4, 128, 16, "float16"
    Hq = Hkv * group
    per_page = ps * Hkv * D
    first_far = I31 // per_page                    # 131072
    num_pages = first_far + 64
    need(2 * num_pages * per_page * 2 / GiB)
    k_cache, v_cache = big((num_pages, ps, Hkv, D), dt), big((num_pages, ps, Hkv, D), dt)
    L, qs = np.array([37, 300], np.int32), np.array([3, 5], np.int32)
    max_pages = 24
    pt = np.full((2, max_pages), -1, np.int32)
    pt[0] = 1 + np.arange(max_pages)
    # distinct pages: the boundary page (exactly element 2^31) first, the last page sixth
    far = first_far + np.concatenate([[0], 1 + rng.permutation(62)[:max_pages - 1]])
    far[5] = num_pages - 1
    pt[1] = far
    n_ctx = L + qs
    # K/V of every position of both sequences (history then block), fp16
    K = [rng.standard_normal((n, Hkv, D)).astype(np.float16) for n in n_ctx]
    V = [rng.standard_normal((n, Hkv, D)).astype(np.float16) for n in n_ctx]
    d_pt = dev(pt)
    # 1. the history: rows 0..L-1 at positions 0..L-1
    cu_h = np.array([0, L[0], L[0] + L[1]], np.int32)
    ops.append_kv(dev(np.concatenate([K[0][:L[0]], K[1][:L[1]]]), dt),
                  dev(np.concatenate([V[0][:L[0]], V[1][:L[1]]]), dt), k_cache, v_cache, d_pt,
                  dev(np.zeros(2, np.int32)), dev(cu_h))
    # 2. the block: rows at positions L .. L+q-1
    cu_q = np.array([0, qs[0], qs[0] + qs[1]], np.int32)
    ops.append_kv(dev(np.concatenate([K[0][L[0]:], K[1][L[1]:]]), dt),
                  dev(np.concatenate([V[0][L[0]:], V[1][L[1]:]]), dt), k_cache, v_cache, d_pt,
                  dev(L), dev(cu_q))
    # compact pool for the reference; the device pages must hold exactly that
    ck = np.zeros((2 * max_pages, ps, Hkv, D), np.float16)
    cv = np.zeros_like(ck)
    for b in range(2):
        for j in range(n_ctx[b]):
            ck[b * max_pages + j // ps, j % ps] = K[b][j]
            cv[b * max_pages + j // ps, j % ps] = V[b][j]
    for b in range(2):
        for j in range(-(-n_ctx[b] // ps)):
            p = int(pt[b, j])
            got_k = get(k_cache, p * per_page, (ps, Hkv, D), np.float16)
            got_v = get(v_cache, p * per_page, (ps, Hkv, D), np.float16)
            np.testing.assert_array_equal(got_k, ck[b * max_pages + j], err_msg=f"k page {p}")
            np.testing.assert_array_equal(got_v, cv[b * max_pages + j], err_msg=f"v page {p}")
    T = int(cu_q[-1])
    q = rng.standard_normal((T, Hq, D)).astype(np.float16)
    out, lse = poison((T, Hq, D), dt), poison((T, Hq), "float32")
    kw = {}
    if split:
        nb = verify_attention_workspace_size(T, Hq, Hkv, D, 2, max_pages * ps, num_splits=4)
        kw = dict(workspace=DeviceArray.empty((max(nb, 16),), "uint8"), num_splits=4)
    ops.verify_attention(dev(q, dt), k_cache, v_cache, d_pt, dev(L), dev(cu_q), out,
                         lse_out=lse, check_indices=True, **kw)
    cpt = np.arange(2 * max_pages, dtype=np.int32).reshape(2, max_pages)
    exp_o, exp_l = np.full((T, Hq, D), np.nan), np.full((T, Hq), np.nan)
    ref.verify_attention(q.astype(np.float64), ck.astype(np.float64), cv.astype(np.float64), cpt,
                         L, cu_q, exp_o, lse_out=exp_l)
    got_o = out.to_numpy().astype(np.float64)
    got_l = lse.to_numpy().astype(np.float64)
    for b in range(2):
        r = slice(cu_q[b], cu_q[b + 1])
        assert rel_err(got_o[r], exp_o[r]) < 2e-3, f"sequence {b}: out"
        assert rel_err(got_l[r], exp_l[r]) < 1e-4, f"sequence {b}: lse"


# ------------------------------------------------------------------ gdn

@pytest.mark.parametrize("layout,sdt", [("kv", "bfloat16"), ("vk", "float16")])
def test_gdn_verify_commit_slots_beyond_2_31(rng, layout, sdt):
    """A state pool of 2.15e9 16-bit elements (4.3 GiB): slot 16384 starts exactly at
    element 2^31, the last slot ends past byte 2^32; verify outputs and committed states
    of those slots equal the reference, neighbouring slots stay untouched."""
    from specdec_lib import ops
    from test_gdn import cast, empty_journal, empty_out, f64, make_block
    Hk, Hv, D = 4, 8, 128
    per_slot = Hv * D * D
    boundary = I31 // per_slot                      # 16384
    slots = boundary + 40
    need(slots * per_slot * 2 / GiB)
    host_dt = np.uint16 if sdt == "bfloat16" else np.float16
    pool = big((slots, Hv, D, D), sdt)              # zeros
    slot_ids = np.array([0, boundary, slots - 1], np.int32)
    compact = cast(0.5 * rng.standard_normal((3, Hv, D, D)), host_dt)
    for i, s in enumerate(slot_ids):
        put(pool, int(s) * per_slot, compact[i])
    q_lens = (3, 4, 2)
    cu_q, x, gat = make_block(rng, q_lens, Hk, Hv, D, D, np.uint16, fused=True, unit_k=False)
    T = int(cu_q[-1])
    W = ref.gdn_journal_width(Hk, Hv, D, D)
    d_out, d_j = poison((T, Hv, D), "float32"), poison((T, W), "float32")
    st = poison((3,), "int32")
    d_in = {n: (dev(a, "bfloat16") if a.dtype == np.uint16 else dev(a)) for n, a in {**x, **gat}.items()}
    ops.gdn_verify(**d_in, state=pool, slot_ids=dev(slot_ids), cu_q=dev(cu_q), out=d_out,
                   journal=d_j, qk_l2norm=True, layout=layout, status=st)
    assert not st.to_numpy().any()
    exp_o, exp_j = empty_out(T, Hv, D), empty_journal(T, Hk, Hv, D, D)
    local = np.arange(3, dtype=np.int32)
    ref.gdn_verify(**x, **gat, state=compact.copy(), slot_ids=local, cu_q=cu_q, out=exp_o,
                   journal=exp_j, qk_l2norm=True, layout=layout)
    e = rel_err(d_out.to_numpy(), exp_o)
    assert e < 2e-2, f"verify out rel err {e}"
    acc = np.array([2, 4, 0], np.int32)
    ops.gdn_commit(pool, dev(slot_ids), dev(cu_q), dev(acc), d_j, layout=layout, status=st)
    assert not st.to_numpy().any()
    exp = compact.copy()
    ref.gdn_commit(exp, local, cu_q, acc, d_j.to_numpy(), layout=layout)
    for i, s in enumerate(slot_ids):
        got = get(pool, int(s) * per_slot, (Hv, D, D), host_dt)
        if acc[i] == 0:
            np.testing.assert_array_equal(got.view(np.uint16), compact[i].view(np.uint16))
        else:
            er = rel_err(f64(got), f64(exp[i]))
            assert er < 5e-3, f"slot {s}: committed state rel err {er}"
    for s in (boundary - 1, boundary + 1, slots - 2):
        assert not get(pool, s * per_slot, (Hv, D, D), np.uint16).any(), f"slot {s} was written"


# ------------------------------------------------------------------ conv1d

def test_conv1d_verify_commit_slots_beyond_2_31(rng):
    """conv state pool [87422, 8192, 3] bf16 (2.15e9 elements): slots past element 2^31."""
    from specdec_lib import ops
    dim, Wd = 8192, 4
    per_slot = dim * (Wd - 1)
    slots = I31 // per_slot + 40                    # 87421
    need(slots * per_slot * 2 / GiB)
    pool = big((slots, dim, Wd - 1), "bfloat16")
    slot_ids = np.array([3, I31 // per_slot + 1, slots - 1], np.int32)
    compact = bf16(rng.standard_normal((3, dim, Wd - 1)))
    for i, s in enumerate(slot_ids):
        put(pool, int(s) * per_slot, compact[i])
    q_lens = [2, 4, 3]
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu_q[-1])
    xb = bf16(rng.standard_normal((T, dim)))
    wb = bf16(rng.standard_normal((dim, Wd)) / 2)
    bb = bf16(rng.standard_normal(dim))
    d_out, d_j = poison((T, dim), "bfloat16"), poison((T, dim), "bfloat16")
    st = poison((3,), "int32")
    ops.conv1d_verify(dev(xb, "bfloat16"), dev(wb, "bfloat16"), pool, dev(slot_ids), dev(cu_q),
                      d_out, bias=dev(bb, "bfloat16"), journal=d_j, status=st)
    assert not st.to_numpy().any()
    exp = np.full((T, dim), 0x7FC0, np.uint16)
    local = np.arange(3, dtype=np.int32)
    ref.conv1d_verify(xb, wb, compact.copy(), local, cu_q, exp, bias=bb)
    e = rel_err(f32(d_out.to_numpy()), f32(exp))
    assert e < 1e-2, f"out rel err {e}"
    acc = np.array([1, 4, 0], np.int32)
    ops.conv1d_commit(pool, dev(slot_ids), dev(cu_q), dev(acc), d_j, status=st)
    want = compact.copy()
    ref.conv1d_commit(want, local, cu_q, acc, xb)
    for i, s in enumerate(slot_ids):
        np.testing.assert_array_equal(get(pool, int(s) * per_slot, (dim, Wd - 1), np.uint16),
                                      want[i], err_msg=f"slot {s}")
    assert not get(pool, (slots - 2) * per_slot, (dim, Wd - 1), np.uint16).any()


# ------------------------------------------------------------------ spec_sample

def test_spec_sample_logits_beyond_2_31(rng):
    """logits [14200, 151936] bf16 (T*V = 2.16e9): greedy q=1 rows everywhere (zero rows ->
    token 0), random rows around element 2^31 and at the end, a greedy q=4 block and a
    sampled q=4 block (peaked rows, top-p) at the end, against the reference."""
    from specdec_lib import DeviceArray, ops
    from specdec_lib.ops import spec_sample_workspace_size
    V, T = 151936, 14200
    need(T * V * 2 / GiB)
    logits = big((T, V), "bfloat16")
    q_lens = [1] * (T - 8) + [4, 4]
    B = len(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    content = {}
    for r in (0, I31 // V - 1, I31 // V, I31 // V + 1, T - 9):    # row 14134 straddles 2^31
        content[r] = bf16(rng.standard_normal(V) * 2)
    for r in range(T - 8, T - 4):                                 # greedy block
        content[r] = bf16(rng.standard_normal(V) * 2)
    peaks = V - 1 - rng.permutation(1000)[:4]
    for i, r in enumerate(range(T - 4, T)):                       # sampled block, peaked rows
        row = rng.standard_normal(V)
        row[peaks[i]] = 60.0
        content[r] = bf16(row)
    for r, h in content.items():
        put(logits, r * V, h)
    am = {r: ref.sampling.greedy_argmax(f32(h)) for r, h in content.items()}
    drafts = np.array([am[T - 8], am[T - 7], (am[T - 6] + 1) % V, peaks[0], peaks[1], peaks[2]],
                      np.int32)
    temp = np.zeros(B, np.float32)
    temp[-1] = 0.8
    top_p = np.ones(B, np.float32)
    top_p[-1] = 0.9
    params = dict(temperature=temp, top_k=np.zeros(B, np.int32), top_p=top_p,
                  min_p=np.zeros(B, np.float32),
                  seed=np.arange(B, dtype=np.uint64) * np.uint64(7919) + np.uint64(3),
                  step=np.full(B, 5, np.int64))
    Wd = 4
    na, em, stt = poison((B,), "int32"), poison((B, Wd), "int32"), poison((B,), "int32")
    ws = DeviceArray.empty((spec_sample_workspace_size(T, V),), "uint8")
    ops.spec_sample(logits, dev(cu_q), dev(drafts), *[dev(params[k]) for k in
                    ("temperature", "top_k", "top_p", "min_p", "seed", "step")],
                    na, em, stt, workspace=ws)
    n, e, s = na.to_numpy(), em.to_numpy(), stt.to_numpy()
    assert not s.any(), f"status {np.flatnonzero(s)}"
    want0 = np.zeros(T - 8, np.int32)
    for r in content:
        if r < T - 8:
            want0[r] = am[r]
    np.testing.assert_array_equal(n[:T - 8], 0)
    np.testing.assert_array_equal(e[:T - 8, 0], want0)
    assert (e[:T - 8, 1:] == -1).all()
    # the last two blocks against the reference run on their rows alone (the Philox key is
    # (seed, step, block row, purpose): independent of the global row index)
    sub = np.stack([f32(content[r]) for r in range(T - 8, T)]).astype(np.float32)
    rp = {k: v[-2:] for k, v in params.items()}
    rn, rem, rst = np.zeros(2, np.int32), np.zeros((2, Wd), np.int32), np.zeros(2, np.int32)
    ref.spec_sample(sub, np.array([0, 4, 8], np.int32), drafts, rp["temperature"], rp["top_k"],
                    rp["top_p"], rp["min_p"], rp["seed"], rp["step"], rn, rem, rst)
    np.testing.assert_array_equal(n[-2:], rn)
    np.testing.assert_array_equal(e[-2:], rem)
    assert list(rn) == [2, 3] and list(rem[1]) == list(peaks[:4])


# ------------------------------------------------------------------ draft ops

def test_draft_carry_rows_beyond_2_31(rng):
    from specdec_lib import ops
    H = 8192
    T = I31 // H + 64                               # 262208 rows, row 262144 at element 2^31
    need(T * H * 2 / GiB)
    hidden = big((T, H), "bfloat16")
    r_b = I31 // H
    cu_q = np.array([0, 10, r_b + 5, T - 6, T], np.int32)
    acc = np.array([3, r_b - 10 + 1, (T - 7) - (r_b + 5) + 1, 6], np.int32)
    rows = cu_q[:-1] + acc - 1                      # 2, 2^18, T-7, T-1
    data = bf16(rng.standard_normal((4, H)))
    for i, r in enumerate(rows):
        put(hidden, int(r) * H, data[i])
    out = poison((4, H), "bfloat16")
    ops.draft_carry(hidden, dev(cu_q), dev(acc), out)
    np.testing.assert_array_equal(out.to_numpy(), data)


def test_capture_hidden_out_beyond_2_31(rng):
    """out [180000, 3*4096] bf16 (2.2e9 elements): tap 2 with a residual, rows around
    element 2^31 of out and at the end; the other taps' columns stay untouched."""
    from specdec_lib import ops
    H, T = 4096, 180000
    need((2 * T * H + 3 * T * H) * 2 / GiB)
    hidden, resid = big((T, H), "bfloat16"), big((T, H), "bfloat16")
    out = poison((T, 3 * H), "bfloat16")
    rows = [0, I31 // (3 * H), I31 // (3 * H) + 1, T - 2, T - 1]
    hs, rs = bf16(rng.standard_normal((5, H))), bf16(rng.standard_normal((5, H)))
    for i, r in enumerate(rows):
        put(hidden, r * H, hs[i])
        put(resid, r * H, rs[i])
    ops.capture_hidden(hidden, out, 2, residual=resid)
    for i, r in enumerate(rows):
        got = get(out, r * 3 * H, (3 * H,), np.uint16)
        want = bf16(f32(hs[i]).astype(np.float32) + f32(rs[i]).astype(np.float32))
        np.testing.assert_array_equal(got[2 * H:], want, err_msg=f"row {r}")
        assert (got[:2 * H] == 0xFFFF).all(), f"row {r}: wrote outside tap 2"
    got = get(out, (T - 3) * 3 * H + 2 * H, (H,), np.uint16)
    assert not got.any(), "a zero row was not written as zero"


@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
def test_draft_combine_embedding_table_beyond_2_31(rng, ids_dtype):
    """Embedding table [262400, 8192] bf16 (2.15e9 elements) gathered by token ids past
    element 2^31."""
    from specdec_lib import ops
    H = 8192
    Vt = I31 // H + 256
    need(Vt * H * 2 / GiB)
    table = big((Vt, H), "bfloat16")
    ids = np.array([Vt - 1, I31 // H, 5, Vt - 2, Vt + 3], ids_dtype)   # the last: unknown id
    rows = bf16(rng.standard_normal((4, H)))
    for i in range(4):
        put(table, int(ids[i]) * H, rows[i])
    hidden = bf16(rng.standard_normal((5, H)))
    we, wh = rng.standard_normal(H).astype(np.float32), rng.standard_normal(H).astype(np.float32)
    out = poison((5, 2 * H), "bfloat16")
    ops.draft_combine(table, dev(hidden, "bfloat16"), dev(we), dev(wh), out, token_ids=dev(ids))
    want = np.zeros((5, 2 * H))
    emb = np.zeros((5, H))
    emb[:4] = f32(rows)
    ref.draft_combine(emb, f32(hidden), we, wh, want)
    want[4, :H] = 0.0                                                  # unknown id: zero half
    got = f32(out.to_numpy())
    assert rel_err(got, want) < 5e-3
    assert not got[4, :H].any()
