"""conv1d_verify / conv1d_commit: numpy reference (CPU) and CUDA kernels (GPU) against it."""
import numpy as np
import pytest

from conftest import needs_gpu, poison, rel_err
from specdec_lib.reference.conv import (conv1d_commit, conv1d_decode_reference, conv1d_flush,
                                        conv1d_verify)
from specdec_lib.reference.gdn import to_f64
from test_gdn import _NAME, cast, dev, host      # the gdn tests' host/device array helpers

DT = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def nan_like(shape, dtype):
    return np.full(shape, 0x7FC0, np.uint16) if np.dtype(dtype) == np.uint16 else \
        np.full(shape, np.nan, dtype)


def case(rng, q_lens, dim, W, xdt=np.float32, sdt=np.float32, bias=True, slots=None):
    T = int(sum(q_lens))
    B = len(q_lens)
    slots = slots or B + 2
    return dict(
        x=cast(rng.standard_normal((T, dim)), xdt),
        weight=cast(rng.standard_normal((dim, W)) / 2, xdt),
        conv_state=cast(rng.standard_normal((slots, dim, W - 1)), sdt),
        slot_ids=rng.permutation(slots)[:B].astype(np.int32),
        cu_q=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        out=nan_like((T, dim), xdt),
        bias=cast(rng.standard_normal(dim), xdt) if bias else None,
    )


# ------------------------------------------------------------------ reference (CPU)

def test_conv1d_closed_form():
    # W = 3, one channel: state [1, 2], block x = [3, 4]
    st = np.array([[[1.0, 2.0]]], np.float32)
    w = np.array([[0.5, -1.0, 2.0]], np.float32)
    x = np.array([[3.0], [4.0]], np.float32)
    out = nan_like((2, 1), np.float32)
    conv1d_verify(x, w, st, np.array([0]), np.array([0, 2]), out, bias=np.array([0.25], np.float32),
                  activation=None)
    np.testing.assert_allclose(out[:, 0], [0.5 * 1 - 2 + 6 + 0.25, 0.5 * 2 - 3 + 8 + 0.25])
    np.testing.assert_array_equal(st, [[[1.0, 2.0]]])
    conv1d_commit(st, np.array([0]), np.array([0, 2]), np.array([1]), x)
    np.testing.assert_array_equal(st, [[[2.0, 3.0]]])
    out2 = nan_like((1, 1), np.float32)
    conv1d_verify(x[1:], w, st, np.array([0]), np.array([0, 1]), out2)
    y = 0.5 * 2 - 3 + 8
    np.testing.assert_allclose(out2[0, 0], y / (1 + np.exp(-y)))


@pytest.mark.parametrize("W", [2, 4, 8])
@pytest.mark.parametrize("xdt,sdt", [("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("f16", "f16")])
def test_conv1d_chain_equals_sequential_decode(rng, W, xdt, sdt):
    dim, B = 5, 4
    xdt, sdt = DT[xdt], DT[sdt]
    c0 = case(rng, [1] * B, dim, W, xdt, sdt)
    state, seq = c0["conv_state"].copy(), c0["conv_state"].copy()
    slot_ids = c0["slot_ids"].copy()
    slot_ids[-1] = -1
    for _ in range(5):
        q_lens = rng.integers(1, 6, B)
        q_lens[0] = 1
        c = case(rng, q_lens, dim, W, xdt, sdt)
        c.update(weight=c0["weight"], bias=c0["bias"], slot_ids=slot_ids)
        journal = nan_like(c["x"].shape, sdt)
        before = state.copy()
        conv1d_verify(c["x"], c["weight"], state, slot_ids, c["cu_q"], c["out"], bias=c["bias"],
                      journal=journal)
        np.testing.assert_array_equal(state, before)
        out_seq = nan_like(c["out"].shape, xdt)
        conv1d_decode_reference(c["x"], c["weight"], seq.copy(), slot_ids, c["cu_q"], out_seq,
                                bias=c["bias"])
        np.testing.assert_array_equal(c["out"], out_seq)
        acc = np.array([rng.integers(0, q + 1) for q in q_lens], np.int32)
        conv1d_commit(state, slot_ids, c["cu_q"], acc, journal)
        for b in range(B):
            r0 = c["cu_q"][b]
            conv1d_decode_reference(c["x"][r0:r0 + acc[b]], c["weight"], seq, slot_ids[b:b + 1],
                                    np.array([0, acc[b]]), nan_like((acc[b], dim), xdt),
                                    bias=c["bias"])
        np.testing.assert_array_equal(state, seq)


def fused_rounds(rng, n_rounds, q_lens_of, dim, W, xdt, sdt, verify, commit, flush, slots=None,
                 padding=True):
    """Rounds of one batch two ways over the same inputs: verify + commit (``verify``,
    ``commit``), and fused (``verify`` with the previous round's x as the pending journal,
    ``flush`` at the end). Returns ([outs a round] x 2, [final state] x 2) as numpy. The
    ops are callables of numpy arrays (the reference, or a device wrapper)."""
    B = len(q_lens_of(0))
    c0 = case(rng, q_lens_of(0), dim, W, xdt, sdt, slots=slots)
    slot_ids = c0["slot_ids"].copy()
    if padding and B > 1:
        slot_ids[1] = -1
    st_a, st_b = c0["conv_state"].copy(), c0["conv_state"].copy()
    outs_a, outs_b = [], []
    prev = None                            # (x, cu_q, accept_len) of the previous round
    for r in range(n_rounds):
        q_lens = q_lens_of(r)
        c = case(rng, q_lens, dim, W, xdt, sdt, slots=slots)
        acc = np.array([rng.integers(0, q + 1) for q in q_lens], np.int32)
        out_a, st_a = verify(c["x"], c0["weight"], st_a, slot_ids, c["cu_q"], c["out"].copy(),
                             bias=c0["bias"])
        st_a = commit(st_a, slot_ids, c["cu_q"], acc, c["x"])
        pend = {}
        if prev is not None:
            pend = dict(pending_journal=prev[0], pending_row0=prev[1][:-1].copy(),
                        pending_len=prev[2])
        out_b, st_b = verify(c["x"], c0["weight"], st_b, slot_ids, c["cu_q"], c["out"].copy(),
                             bias=c0["bias"], **pend)
        outs_a.append(out_a)
        outs_b.append(out_b)
        prev = (c["x"], c["cu_q"], acc)
    st_b = flush(st_b, slot_ids, prev[0], prev[1][:-1].copy(), prev[2])
    return (outs_a, outs_b), (st_a, st_b)


def _ref_verify(x, w, st, sl, cq, out, **kw):
    conv1d_verify(x, w, st, sl, cq, out, **kw)
    return out, st


def _ref_commit(st, sl, cq, acc, j):
    return conv1d_commit(st, sl, cq, acc, j)


def _ref_flush(st, sl, j, r0, n):
    return conv1d_flush(st, sl, j, r0, n)


@pytest.mark.parametrize("W", [2, 3, 4, 8])
@pytest.mark.parametrize("xdt,sdt", [("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")])
def test_conv1d_fused_equals_verify_then_commit(rng, W, xdt, sdt):
    # the fused mode is the previous round's commit folded in: same outputs and final states,
    # bit for bit, over ragged rounds (q = 0 sequences, nothing accepted, all accepted)
    q_of = lambda r: [(1, 4, 0, 3, 5)[(b + r) % 5] for b in range(4)]   # noqa: E731
    (oa, ob), (sa, sb) = fused_rounds(rng, 5, q_of, 7, W, DT[xdt], DT[sdt], _ref_verify,
                                      _ref_commit, _ref_flush)
    for r, (a, b) in enumerate(zip(oa, ob)):
        np.testing.assert_array_equal(a, b, err_msg=f"round {r}")
    np.testing.assert_array_equal(sa, sb)


def test_conv1d_fused_closed_form():
    # W = 3, one channel: state [1, 2]; the previous round's accepted rows [5, 6, 7] (of 4,
    # starting at row 1 of its x) enter first: state [6, 7], then the block [3] is verified
    st = np.array([[[1.0, 2.0]]], np.float32)
    w = np.array([[0.5, -1.0, 2.0]], np.float32)
    prev_x = np.array([[9.0], [5.0], [6.0], [7.0], [8.0]], np.float32)
    out = nan_like((1, 1), np.float32)
    conv1d_verify(np.array([[3.0]], np.float32), w, st, np.array([0]), np.array([0, 1]), out,
                  activation=None, pending_journal=prev_x, pending_row0=np.array([1], np.int32),
                  pending_len=np.array([3], np.int32))
    np.testing.assert_array_equal(st, [[[6.0, 7.0]]])
    np.testing.assert_allclose(out[0, 0], 0.5 * 6 - 7 + 6)
    conv1d_flush(st, np.array([0]), prev_x, np.array([0], np.int32), np.array([1], np.int32))
    np.testing.assert_array_equal(st, [[[7.0, 9.0]]])


def test_conv1d_rejects(rng):
    c = case(rng, [2, 1], 4, 4)
    with pytest.raises(ValueError, match="weight"):
        conv1d_verify(**dict(c, weight=c["weight"][:, :3].copy()))
    with pytest.raises(ValueError, match="same slot"):
        conv1d_verify(**dict(c, slot_ids=np.array([1, 1], np.int32)))
    with pytest.raises(ValueError, match="out of range"):
        conv1d_verify(**dict(c, slot_ids=np.array([0, 9], np.int32)))
    with pytest.raises(ValueError, match="activation"):
        conv1d_verify(**c, activation="gelu")
    with pytest.raises(ValueError, match="width"):
        conv1d_verify(**dict(c, conv_state=np.zeros((4, 4, 8), np.float32),
                             weight=np.zeros((4, 9), np.float32)))
    with pytest.raises(ValueError, match="accept_len"):
        conv1d_commit(c["conv_state"], c["slot_ids"], c["cu_q"], np.array([3, 0]), c["x"])


def test_conv1d_ops_reject_host_arrays(rng):
    from specdec_lib import ops
    c = case(rng, [2, 1], 4, 4)
    with pytest.raises(TypeError, match="conv_state"):
        ops.conv1d_verify(**c)
    with pytest.raises(ValueError, match="activation"):
        ops.conv1d_verify(**c, activation="relu")


# ------------------------------------------------------------------ GPU

@needs_gpu
@pytest.mark.parametrize("W", [2, 4, 8])
@pytest.mark.parametrize("xdt,sdt", [("f32", "f32"), ("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32")])
@pytest.mark.parametrize("bias,act", [(True, "silu"), (False, None)])
def test_conv1d_gpu(rng, W, xdt, sdt, bias, act):
    from specdec_lib import ops
    xdt, sdt = DT[xdt], DT[sdt]
    dim = 8192 + 33 if W == 4 else 300                 # odd channel counts, a partial CTA
    q_lens = [1, 4, 0, 3, 5]
    c = case(rng, q_lens, dim, W, xdt, sdt, bias=bias)
    c["slot_ids"][1] = -1
    d_state = dev(c["conv_state"])
    d_out = poison(c["out"].shape, _NAME[np.dtype(xdt)])
    d_j = poison(c["x"].shape, _NAME[np.dtype(sdt)])
    d_status = poison((len(q_lens),), "int32")
    ops.conv1d_verify(dev(c["x"]), dev(c["weight"]), d_state, dev(c["slot_ids"]), dev(c["cu_q"]),
                      d_out, bias=None if c["bias"] is None else dev(c["bias"]), activation=act,
                      journal=d_j, status=d_status)
    assert not d_status.to_numpy().any()
    np.testing.assert_array_equal(host(d_state, c["conv_state"]), c["conv_state"])
    exp = c["out"].copy()
    j = nan_like(c["x"].shape, sdt)
    conv1d_verify(c["x"], c["weight"], c["conv_state"].copy(), c["slot_ids"], c["cu_q"], exp,
                  bias=c["bias"], activation=act, journal=j)
    got = host(d_out, exp)
    e = rel_err(to_f64(got), to_f64(exp))
    assert e < (1e-5 if xdt == np.float32 else 1e-2), f"out rel err {e}"
    np.testing.assert_array_equal(host(d_j, j), j)
    acc = np.array([1, 2, 0, 3, 5], np.int32)
    ops.conv1d_commit(d_state, dev(c["slot_ids"]), dev(c["cu_q"]), dev(acc), d_j)
    st = c["conv_state"].copy()
    conv1d_commit(st, c["slot_ids"], c["cu_q"], acc, j)
    np.testing.assert_array_equal(host(d_state, st), st)      # pure data movement: exact
    # commit straight from x (no journal copy), x dtype != state dtype rounds on the way in
    d_state2 = dev(c["conv_state"])
    ops.conv1d_commit(d_state2, dev(c["slot_ids"]), dev(c["cu_q"]), dev(acc), dev(c["x"]))
    st2 = c["conv_state"].copy()
    conv1d_commit(st2, c["slot_ids"], c["cu_q"], acc, c["x"])
    np.testing.assert_array_equal(host(d_state2, st2), st2)


@needs_gpu
def test_conv1d_gpu_rejects_before_launch(rng):
    from specdec_lib import ops
    c = case(rng, [2, 1], 64, 4)
    d_state = dev(c["conv_state"])
    args = dict(x=dev(c["x"]), weight=dev(c["weight"]), conv_state=d_state,
                slot_ids=dev(c["slot_ids"]), cu_q=dev(c["cu_q"]), out=poison(c["out"].shape, "float32"))
    for override, exc, match in [
        (dict(weight=dev(c["weight"][:, :3].copy())), ValueError, "weight"),
        (dict(slot_ids=dev(np.array([1, 1], np.int32))), ValueError, "same slot"),
        (dict(slot_ids=dev(np.array([0, 99], np.int32))), ValueError, "out of range"),
        (dict(x=dev(c["x"][:, :5].copy())), ValueError, "x: expected"),
        (dict(x=c["x"]), TypeError, "x:"),
    ]:
        with pytest.raises(exc, match=match):
            ops.conv1d_verify(**dict(args, **override))
    with pytest.raises(ValueError, match="accept_len"):
        ops.conv1d_commit(d_state, args["slot_ids"], args["cu_q"], dev(np.array([3, 0], np.int32)),
                          args["x"])
    np.testing.assert_array_equal(host(d_state, c["conv_state"]), c["conv_state"])


# ---------------------------------------------------------------- the argument contract (CPU)
from conftest import REFUSAL_PATHS, assert_refused, call_op, on_path, strided_last  # noqa: E402
from test_copy import _cast, _vals  # noqa: E402

_CV_ORDER = ("x", "weight", "conv_state", "slot_ids", "cu_q", "out")
_CC_ORDER = ("conv_state", "slot_ids", "cu_q", "accept_len", "journal")
_BF16 = {"x": "bfloat16", "conv_state": "bfloat16", "out": "bfloat16"}


def _conv_call(rng):
    T, dim, W = 5, 6, 4
    return {"x": rng.standard_normal((T, dim)).astype(np.float32),
            "weight": rng.standard_normal((dim, W)).astype(np.float32),
            "conv_state": rng.standard_normal((4, dim, W - 1)).astype(np.float32),
            "slot_ids": np.array([2, 0], np.int32), "cu_q": np.array([0, 2, 5], np.int32),
            "out": np.zeros((T, dim), np.float32), "journal": np.zeros((T, dim), np.float32),
            "accept_len": np.array([1, 3], np.int32)}


def _on(path, a):
    return on_path(path, {"a": a})["a"]


# (case id, paths, break(args, path), exception, message start)
_CONV1D_VERIFY_BAD = [
    ("x_float64", ("torch",), lambda a, p: a.update(x=_cast(p, a["x"], "float64")), TypeError, r"^x: dtype"),
    ("slot_ids_int64", ("torch",), lambda a, p: a.update(slot_ids=_cast(p, a["slot_ids"], "int64")),
     TypeError, r"^slot_ids: dtype"),
    ("cu_q_float32", REFUSAL_PATHS, lambda a, p: a.update(cu_q=_cast(p, a["cu_q"], "float32")),
     TypeError, r"^cu_q: dtype"),
    ("weight_wrong_width", REFUSAL_PATHS, lambda a, p: a.update(weight=a["weight"][:, :3]),
     ValueError, r"^weight: expected \[dim, W\]"),
    ("x_wrong_dim", REFUSAL_PATHS, lambda a, p: a.update(x=a["x"][:, :5]), ValueError, r"^x: expected"),
    ("x_not_contiguous", REFUSAL_PATHS, lambda a, p: a.update(x=strided_last(a["x"])),
     ValueError, r"^x: the last dimension must be contiguous"),
    ("out_wrong_rows", REFUSAL_PATHS, lambda a, p: a.update(out=a["out"][:4]), ValueError, r"^out: expected shape"),
    ("slot_out_of_range", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(0, 4),
     ValueError, r"^slot_ids: id 4 out of range"),
    ("slot_shared", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(0, 0), ValueError, r"^slot_ids: the same slot"),
    ("cu_q_decreasing", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 3, 2])),
     ValueError, r"^cu_q: must start at 0"),
    ("cu_q_ends_before_T", REFUSAL_PATHS, lambda a, p: a["cu_q"].__setitem__(slice(None), _vals(p, [0, 2, 4])),
     ValueError, r"^cu_q: .*end at T=5"),
    ("width_9", REFUSAL_PATHS, lambda a, p: a.update(conv_state=_on(p, np.zeros((4, 6, 8), np.float32)),
                                                    weight=_on(p, np.zeros((6, 9), np.float32))),
     ValueError, r"^conv_state: width W = 9"),
    ("activation_gelu", REFUSAL_PATHS, lambda a, p: a.update(activation="gelu"), ValueError, r"^activation"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _CONV1D_VERIFY_BAD, ids=[c[0] for c in _CONV1D_VERIFY_BAD])
def test_conv1d_verify_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _conv_call(rng), _BF16)
    args["activation"] = "silu"
    mutate(args, path)
    kw = {"journal": args["journal"], "activation": args["activation"]}
    assert_refused(lambda: call_op(path, "conv1d_verify", [args[n] for n in _CV_ORDER], kw), exc,
                   match, [args["out"], args["journal"], args["conv_state"]])


_CONV1D_COMMIT_BAD = [
    ("accept_len_int64", ("torch",), lambda a, p: a.update(accept_len=_cast(p, a["accept_len"], "int64")),
     TypeError, r"^accept_len: dtype"),
    ("accept_len_past_block", REFUSAL_PATHS, lambda a, p: a["accept_len"].__setitem__(1, 4),
     ValueError, r"^accept_len: sequence 1 accepts 4"),
    ("accept_len_wrong_length", REFUSAL_PATHS, lambda a, p: a.update(accept_len=a["accept_len"][:1]),
     ValueError, r"^accept_len: expected shape"),
    ("journal_wrong_dim", REFUSAL_PATHS, lambda a, p: a.update(journal=a["journal"][:, :5]),
     ValueError, r"^journal: expected"),
    ("slot_shared", REFUSAL_PATHS, lambda a, p: a["slot_ids"].__setitem__(0, 0), ValueError, r"^slot_ids: the same slot"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _CONV1D_COMMIT_BAD, ids=[c[0] for c in _CONV1D_COMMIT_BAD])
def test_conv1d_commit_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _conv_call(rng), _BF16)
    mutate(args, path)
    assert_refused(lambda: call_op(path, "conv1d_commit", [args[n] for n in _CC_ORDER]), exc, match,
                   [args["conv_state"]])


def _fused_call(rng):
    a = _conv_call(rng)
    a.update(pending_journal=rng.standard_normal((3, 6)).astype(np.float32),
             pending_row0=np.array([0, 1], np.int32), pending_len=np.array([2, 2], np.int32))
    return a


_PENDING = ("pending_journal", "pending_row0", "pending_len")
# fused mode (conv1d_verify with pending rows) and conv1d_flush: (case id, paths, break, exc, match)
_CONV1D_FUSED_BAD = [
    ("row0_without_journal", REFUSAL_PATHS, lambda a, p: a.update(pending_journal=None),
     ValueError, r"^pending_row0 / pending_len: given without pending_journal"),
    ("pending_is_out", REFUSAL_PATHS, lambda a, p: a.update(pending_journal=a["out"]),
     ValueError, r"^pending_journal: overlaps out"),
    ("pending_is_journal", REFUSAL_PATHS, lambda a, p: a.update(pending_journal=a["journal"][1:]),
     ValueError, r"^pending_journal: overlaps journal"),
    ("pending_wrong_width", REFUSAL_PATHS, lambda a, p: a.update(pending_journal=a["pending_journal"][:, :5]),
     ValueError, r"^pending_journal: expected \[Tp, 6\]"),
    ("pending_past_end", REFUSAL_PATHS, lambda a, p: a["pending_len"].__setitem__(1, 3),
     ValueError, r"^pending_row0 / pending_len: sequence 1 has pending rows 1..3"),
    ("pending_negative_len", REFUSAL_PATHS, lambda a, p: a["pending_len"].__setitem__(0, -1),
     ValueError, r"^pending_row0 / pending_len: sequence 0"),
    ("pending_len_int64", ("torch",), lambda a, p: a.update(pending_len=_cast(p, a["pending_len"], "int64")),
     TypeError, r"^pending_len: dtype"),
    ("pending_row0_short", REFUSAL_PATHS, lambda a, p: a.update(pending_row0=a["pending_row0"][:1]),
     ValueError, r"^pending_row0: expected shape"),
]


@pytest.mark.parametrize("path", REFUSAL_PATHS)
@pytest.mark.parametrize("case", _CONV1D_FUSED_BAD, ids=[c[0] for c in _CONV1D_FUSED_BAD])
def test_conv1d_fused_refuses_bad_input(path, case, rng):
    name, paths, mutate, exc, match = case
    if path not in paths:
        pytest.skip(f"{name}: numpy arrays are checked by dtype kind on the reference path")
    args = on_path(path, _fused_call(rng), _BF16)
    mutate(args, path)
    kw = {"journal": args["journal"], **{k: args[k] for k in _PENDING}}
    assert_refused(lambda: call_op(path, "conv1d_verify", [args[n] for n in _CV_ORDER], kw), exc,
                   match, [args["out"], args["journal"], args["conv_state"]])
    if name in ("pending_is_out", "pending_is_journal"):
        return                                  # (flush writes neither)
    flush_args = [args["conv_state"], args["slot_ids"], *(args[k] for k in _PENDING)]
    if args["pending_journal"] is None:
        exc, match = (TypeError, ValueError), r"^pending_journal"
    assert_refused(lambda: call_op(path, "conv1d_flush", flush_args), exc, match,
                   [args["conv_state"]])


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_conv1d_fused_good_input_passes_the_contract(path, rng):
    args = on_path(path, _fused_call(rng), _BF16)
    np_of = lambda a: np.asarray(a.float() if path == "torch" else a)   # noqa: E731
    before = np_of(args["conv_state"]).copy()
    call_op(path, "conv1d_verify", [args[n] for n in _CV_ORDER],
            {"journal": args["journal"], **{k: args[k] for k in _PENDING}})
    assert np.count_nonzero(np_of(args["out"])) > 0
    after = np_of(args["conv_state"]).copy()
    assert not np.array_equal(before, after)          # the pending rows were committed
    call_op(path, "conv1d_flush", [args["conv_state"], args["slot_ids"], *(args[k] for k in _PENDING)])
    assert not np.array_equal(after, np_of(args["conv_state"]))


@pytest.mark.parametrize("path", REFUSAL_PATHS)
def test_conv1d_good_input_passes_the_contract(path, rng):
    args = on_path(path, _conv_call(rng), _BF16)
    before = (args["conv_state"].float().numpy() if path == "torch" else args["conv_state"]).copy()
    call_op(path, "conv1d_verify", [args[n] for n in _CV_ORDER], {"journal": args["journal"]})
    out = np.asarray(args["out"].float() if path == "torch" else args["out"])
    assert np.count_nonzero(out) > 0
    call_op(path, "conv1d_commit", [args[n] for n in _CC_ORDER])
    after = np.asarray(args["conv_state"].float() if path == "torch" else args["conv_state"])
    assert not np.array_equal(before, after)


# ---------------------------------------------------------------- the W = 4 kernels (issue 31)
# ops.conv.verify_kernel / commit_kernel pick conv1d_verify_w4_* / conv1d_commit_w4_* at W = 4;
# they must give the generic kernels' bytes exactly (outputs, journals, states, status).
from specdec_lib import _kernels  # noqa: E402
from specdec_lib.ops import conv as ops_conv  # noqa: E402

_LONG = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


@pytest.fixture
def conv_tuning():
    old = dict(ops_conv.TUNING)
    yield ops_conv.TUNING
    ops_conv.TUNING.clear()
    ops_conv.TUNING.update(old)


def test_conv_w4_dispatch_rule(conv_tuning, monkeypatch):
    monkeypatch.delenv(ops_conv.GENERIC_ENV, raising=False)
    vk, ck = ops_conv.verify_kernel, ops_conv.commit_kernel
    bf, f32, f16 = "bfloat16", "float32", "float16"
    assert vk(4, bf, bf, None, bf, bf, None) == "conv1d_verify_w4_bf16_bf16_jbf16"
    assert vk(4, bf, bf, bf, f32, bf, f32) == "conv1d_verify_w4_bf16_f32_jf32"
    assert vk(4, bf, bf, bf, f32, bf, bf) == "conv1d_verify_w4_bf16_f32_jbf16"   # journal in x's
    assert vk(4, f32, f32, None, bf, f32, None) == "conv1d_verify_w4_f32_bf16_jbf16"
    # what the W = 4 forms do not cover: another width, weight / bias / out dtype != x's, a
    # journal in neither x's nor the state's dtype
    assert vk(3, bf, bf, None, bf, bf, None) == "conv1d_verify"
    assert vk(8, f32, f32, None, f32, f32, None) == "conv1d_verify"
    assert vk(4, bf, f32, None, bf, bf, None) == "conv1d_verify"
    assert vk(4, bf, bf, f32, bf, bf, None) == "conv1d_verify"
    assert vk(4, bf, bf, None, bf, f32, None) == "conv1d_verify"
    assert vk(4, bf, bf, None, f32, bf, f16) == "conv1d_verify"
    assert ck(4, f32, bf) == "conv1d_commit_w4_f32_bf16"
    assert ck(2, f32, bf) == "conv1d_commit"
    # fused mode: the pending rows read with the journal's dtype (the pending one without a journal)
    assert vk(4, bf, bf, None, bf, bf, None, bf) == "conv1d_verify_w4_bf16_bf16_jbf16"
    assert vk(4, bf, bf, None, f32, bf, None, bf) == "conv1d_verify_w4_bf16_f32_jbf16"
    assert vk(4, bf, bf, None, f32, bf, f32, f32) == "conv1d_verify_w4_bf16_f32_jf32"
    assert vk(4, bf, bf, None, f32, bf, bf, f32) == "conv1d_verify"      # journal != pending
    assert vk(4, bf, bf, None, bf, bf, None, f16) == "conv1d_verify"     # (bf16, bf16, f16): none
    assert vk(3, bf, bf, None, bf, bf, None, bf) == "conv1d_verify"
    # every name the rule can return is in the kernel table
    names = _kernels.MODULES["conv"].kernels
    for x in _LONG.values():
        for s in _LONG.values():
            for j in (None, *_LONG.values()):
                assert vk(4, x, x, x, s, x, j) in names
                assert ck(4, x, s) in names
    assert len(_kernels.CONV_W4_VERIFY) == 15 and len(_kernels.CONV_W4_COMMIT) == 9
    # forced off: TUNING, then the environment
    conv_tuning["w4"] = False
    assert vk(4, bf, bf, None, bf, bf, None) == "conv1d_verify" and ck(4, bf, bf) == "conv1d_commit"
    conv_tuning["w4"] = None
    monkeypatch.setenv(ops_conv.GENERIC_ENV, "1")
    assert vk(4, bf, bf, None, bf, bf, None) == "conv1d_verify" and ck(4, bf, bf) == "conv1d_commit"
    monkeypatch.setenv(ops_conv.GENERIC_ENV, "0")
    assert ck(4, bf, bf) == "conv1d_commit_w4_bf16_bf16"
    conv_tuning["w4"] = True
    monkeypatch.setenv(ops_conv.GENERIC_ENV, "1")
    assert ck(4, bf, bf) == "conv1d_commit_w4_bf16_bf16"


def test_conv_fused_threads_rule(conv_tuning):
    ft = ops_conv._fused_threads
    assert ft(1, 8192, 132) == 64          # 128 CTAs of 64 on the H200
    assert ft(1, 8192, 108) == 128         # A100: 64 CTAs of 128
    assert ft(2, 8192, 132) == 128
    assert ft(4, 8192, 132) == 256         # 4 x 64 CTAs of 128 > 132
    assert ft(64, 4096, 132) == 256
    assert ft(1, 1, 132) == 64
    conv_tuning["threads"] = 256
    assert ft(1, 8192, 132) == 256
    conv_tuning["threads"] = 32
    with pytest.raises(ValueError, match="threads"):
        ft(1, 8192, 132)


class _Arr:
    def __init__(self, ptr, shape, strides, itemsize=2):
        self.ptr, self.shape, self.strides, self.itemsize = ptr, shape, strides, itemsize


def test_conv_w4_row_lanes_rule(conv_tuning):
    lanes = ops_conv._row_lanes
    x = _Arr(1 << 20, (4, 8192), (8192, 1))
    out = _Arr(1 << 24, (4, 8192), (8192, 1))
    none = _Arr(0, (), ())
    assert lanes(1, 4, 32, 132, x, out, none) == 4       # round_b1: 128 CTAs on the H200
    assert lanes(1, 4, 32, 108, x, out, none) == 2       # A100: 4 lanes would be 128 > 108
    assert lanes(1, 1, 32, 132, x, out, none) == 1       # q = 1
    assert lanes(1, 0, 32, 132, x, out, none) == 1       # T = 0
    assert lanes(1, 16, 1, 132, x, out, none) == 8       # capped at 8
    assert lanes(1, 3, 2, 132, x, out, none) == 2        # ceil(3 / 1) = 3 rows: 2 lanes
    assert lanes(64, 256, 32, 132, x, out, none) == 1    # B = 64
    assert lanes(4, 16, 32, 132, x, out, none) == 1      # 4 x 32 x 2 > 132
    # out or the journal overlapping x: one lane whatever is asked
    conv_tuning["lanes"] = 8
    assert lanes(64, 256, 32, 132, x, out, none) == 8
    assert lanes(1, 4, 32, 132, x, x, none) == 1
    assert lanes(1, 4, 32, 132, x, out, _Arr(x.ptr + 2 * 8192 * 3, (4, 8192), (8192, 1))) == 1
    assert lanes(1, 4, 32, 132, x, out, _Arr(x.ptr + 2 * 8192 * 4, (4, 8192), (8192, 1))) == 8
    conv_tuning["lanes"] = 3
    with pytest.raises(ValueError, match="lanes"):
        lanes(1, 4, 32, 132, x, out, none)


def _raw(d):
    return np.ascontiguousarray(d.to_numpy()).view(np.uint8)


def _both_paths(tuning, fn, lanes=None):
    """fn() under the generic kernels, then under the W = 4 ones (``lanes`` row lanes)."""
    tuning.update(w4=False, lanes=None)
    a = fn()
    tuning.update(w4=True, lanes=lanes)
    b = fn()
    return a, b


# (q_lens, dim): T = 0, q = 1, B = 1 q = 4 at the GDN shape, ragged with a zero-row sequence,
# odd dims (a partial CTA), one channel
_W4_SHAPES = [([0], 64), ([1], 300), ([4], 8192), ([1, 4, 0, 3, 5], 8192 + 33), ([2, 7], 1),
              ([9, 1, 16], 257)]


@needs_gpu
@pytest.mark.parametrize("xs,ss,js", _kernels.CONV_W4_VERIFY)
@pytest.mark.parametrize("shape", range(len(_W4_SHAPES)))
@pytest.mark.parametrize("lanes", [None, 1, 2])   # auto: 4 at shape 2, 8 at shape 5
def test_conv1d_w4_equals_generic_gpu(rng, conv_tuning, xs, ss, js, shape, lanes):
    from specdec_lib import ops
    q_lens, dim = _W4_SHAPES[shape]
    xdt, sdt, jdt = DT[xs], DT[ss], DT[js]
    bias = shape % 2 == 0
    act = None if shape == 3 else "silu"
    c = case(rng, q_lens, dim, 4, xdt, sdt, bias=bias)
    if len(q_lens) > 1:
        c["slot_ids"][1] = -1                          # a padding row: outputs zero
    B, T = len(q_lens), int(sum(q_lens))
    d = {k: dev(c[k]) for k in ("x", "weight", "conv_state", "slot_ids", "cu_q")}
    d_bias = dev(c["bias"]) if bias else None
    acc = np.array([rng.integers(0, q + 1) for q in q_lens], np.int32)
    acc[0] = q_lens[0]                                 # one sequence accepts its whole block

    def run():
        d_state = dev(c["conv_state"])
        d_out = poison((T, dim), _LONG[xs])
        d_j = poison((T, dim), _LONG[js])
        d_status = poison((B,), "int32")
        ops.conv1d_verify(d["x"], d["weight"], d_state, d["slot_ids"], d["cu_q"], d_out,
                          bias=d_bias, activation=act, journal=d_j, status=d_status)
        out_nj = poison((T, dim), _LONG[xs])           # no journal
        ops.conv1d_verify(d["x"], d["weight"], d_state, d["slot_ids"], d["cu_q"], out_nj,
                          bias=d_bias, activation=act)
        before = _raw(d_state)
        c_status = poison((B,), "int32")
        ops.conv1d_commit(d_state, d["slot_ids"], d["cu_q"], dev(acc), d_j, status=c_status)
        d_state2 = dev(c["conv_state"])                # commit straight from x
        ops.conv1d_commit(d_state2, d["slot_ids"], d["cu_q"], dev(acc), d["x"])
        return dict(out=_raw(d_out), journal=_raw(d_j), status=d_status.to_numpy(),
                    out_nj=_raw(out_nj), state_after_verify=before, state=_raw(d_state),
                    c_status=c_status.to_numpy(), state_from_x=_raw(d_state2))

    gen, w4 = _both_paths(conv_tuning, run, lanes)
    for k in gen:
        np.testing.assert_array_equal(w4[k], gen[k], err_msg=k)
    assert not gen["status"].any() and not gen["c_status"].any()
    np.testing.assert_array_equal(gen["state_after_verify"], _raw(d["conv_state"]))


@needs_gpu
@pytest.mark.parametrize("xs,ss", [("bf16", "bf16"), ("f32", "bf16"), ("f16", "f32")])
@pytest.mark.parametrize("alias", ["out", "journal"])
def test_conv1d_w4_in_place_equals_generic_gpu(rng, conv_tuning, xs, ss, alias):
    # out = x, or journal = x (x's dtype): one row lane whatever TUNING asks
    # (ops.conv._row_lanes), and the generic kernel's bytes
    from specdec_lib import ops
    q_lens, dim = [4, 3], 8192
    c = case(rng, q_lens, dim, 4, DT[xs], DT[ss])

    def run():
        x = dev(c["x"])
        other = poison(c["x"].shape, _LONG[xs])
        out, jn = (x, other) if alias == "out" else (other, x)
        ops.conv1d_verify(x, dev(c["weight"]), dev(c["conv_state"]), dev(c["slot_ids"]),
                          dev(c["cu_q"]), out, bias=dev(c["bias"]), journal=jn)
        return _raw(x), _raw(other)

    gen, w4 = _both_paths(conv_tuning, run, lanes=4)
    np.testing.assert_array_equal(w4[0], gen[0])
    np.testing.assert_array_equal(w4[1], gen[1])


@needs_gpu
@pytest.mark.parametrize("xs,ss,js", [("bf16", "bf16", "bf16"), ("f32", "f16", "f32"),
                                      ("f16", "bf16", "bf16")])
def test_conv1d_w4_against_reference_gpu(rng, conv_tuning, xs, ss, js):
    # the W = 4 kernels against the float64 reference on their own (row lanes forced), outputs
    # poisoned first
    from specdec_lib import ops
    conv_tuning.update(w4=True, lanes=4)
    q_lens, dim = [4, 1, 6], 8192 + 7
    xdt, sdt, jdt = DT[xs], DT[ss], DT[js]
    c = case(rng, q_lens, dim, 4, xdt, sdt)
    d_state = dev(c["conv_state"])
    d_out = poison(c["out"].shape, _LONG[xs])
    d_j = poison(c["x"].shape, _LONG[js])
    ops.conv1d_verify(dev(c["x"]), dev(c["weight"]), d_state, dev(c["slot_ids"]), dev(c["cu_q"]),
                      d_out, bias=dev(c["bias"]), journal=d_j)
    exp = c["out"].copy()
    j = nan_like(c["x"].shape, jdt)
    conv1d_verify(c["x"], c["weight"], c["conv_state"].copy(), c["slot_ids"], c["cu_q"], exp,
                  bias=c["bias"], journal=j)
    e = rel_err(to_f64(host(d_out, exp)), to_f64(exp))
    assert e < (1e-5 if xdt == np.float32 else 1e-2), f"out rel err {e}"
    np.testing.assert_array_equal(host(d_j, j), j)
    acc = np.array([4, 0, 5], np.int32)
    ops.conv1d_commit(d_state, dev(c["slot_ids"]), dev(c["cu_q"]), dev(acc), d_j)
    st = c["conv_state"].copy()
    conv1d_commit(st, c["slot_ids"], c["cu_q"], acc, j)
    np.testing.assert_array_equal(host(d_state, st), st)


# ---------------------------------------------------------------- fused mode on the GPU
def _gpu_ops(tuning_state, d_status=None):
    """fused_rounds' callables on the GPU (numpy in, numpy out; the state goes up and comes
    back every call), status of the last fused verify in ``d_status`` if given."""
    from specdec_lib import ops

    def verify(x, w, st, sl, cq, out, bias=None, **pend):
        d_st, d_out = dev(st), poison(out.shape, _NAME[np.dtype(out.dtype)])
        if pend:
            pend = dict(pending_journal=dev(pend["pending_journal"]),
                        pending_row0=dev(pend["pending_row0"]), pending_len=dev(pend["pending_len"]))
        ops.conv1d_verify(dev(x), dev(w), d_st, dev(sl), dev(cq), d_out,
                          bias=None if bias is None else dev(bias), **pend)
        return host(d_out, out), host(d_st, st)

    def commit(st, sl, cq, acc, j):
        d_st = dev(st)
        ops.conv1d_commit(d_st, dev(sl), dev(cq), dev(acc), dev(j))
        return host(d_st, st)

    def flush(st, sl, j, r0, n):
        d_st = dev(st)
        ops.conv1d_flush(d_st, dev(sl), dev(j), dev(r0), dev(n))
        return host(d_st, st)
    return verify, commit, flush


# (W, x dtype, state dtype, dim, w4, threads): W = 4 forms (the B=1 shape, ragged, odd dims),
# the generic kernel (W = 3 / 8, mixed dtypes, W = 4 forced generic)
_FUSED_GPU = [(4, "bf16", "bf16", 8192, None, None), (4, "bf16", "bf16", 8192 + 33, None, 256),
              (4, "f32", "bf16", 300, None, 64), (4, "f16", "f32", 1, None, 128),
              (4, "bf16", "bf16", 8192, False, None), (3, "bf16", "f32", 257, None, None),
              (8, "f16", "f16", 300, None, None), (2, "f32", "f32", 64, None, None)]


@needs_gpu
@pytest.mark.parametrize("W,xs,ss,dim,w4,threads", _FUSED_GPU)
@pytest.mark.parametrize("batch", ["b1", "ragged"])
def test_conv1d_fused_gpu(rng, conv_tuning, W, xs, ss, dim, w4, threads, batch):
    # rounds of fused verifies + a flush equal verify + commit on the GPU byte for byte, and the
    # reference's fused chain (states exactly, outputs by relative error)
    conv_tuning.update(w4=w4, threads=threads)
    q_of = (lambda r: [4]) if batch == "b1" else \
        (lambda r: [(1, 4, 0, 3, 5)[(b + r) % 5] for b in range(5)])   # noqa: E731
    seed = int(rng.integers(1 << 30))
    gpu = fused_rounds(np.random.default_rng(seed), 4, q_of, dim, W, DT[xs], DT[ss], *_gpu_ops(None))
    ref = fused_rounds(np.random.default_rng(seed), 4, q_of, dim, W, DT[xs], DT[ss], _ref_verify,
                       _ref_commit, _ref_flush)
    (ga, gb), (gsa, gsb) = gpu
    (ra, rb), (rsa, rsb) = ref
    for r in range(4):
        np.testing.assert_array_equal(gb[r].view(np.uint8), ga[r].view(np.uint8), err_msg=f"round {r}")
        e = rel_err(to_f64(gb[r]), to_f64(rb[r]))
        assert e < (1e-5 if xs == "f32" else 1e-2), f"round {r}: out rel err {e}"
    np.testing.assert_array_equal(gsb, gsa)
    np.testing.assert_array_equal(gsb, rsb)


@needs_gpu
@pytest.mark.parametrize("w4", [None, False])
def test_conv1d_fused_gpu_flags_a_bad_pending_range(rng, conv_tuning, w4):
    # check_indices=False: a pending range outside the pending rows sets ConvStatus.BAD_PENDING
    # for that sequence, commits nothing for it (its outputs come from its state as it was) and
    # the others go on
    from specdec_lib import ops
    from specdec_lib.status import ConvStatus
    conv_tuning.update(w4=w4)
    c = case(rng, [4, 2, 3], 300, 4, np.uint16, np.uint16)
    prev = cast(rng.standard_normal((6, 300)), np.uint16)
    r0, n = np.array([0, 5, 2], np.int32), np.array([2, 3, 1], np.int32)   # sequence 1: rows 5..7
    d_st, d_out, d_status = dev(c["conv_state"]), poison(c["out"].shape, "bfloat16"), poison((3,), "int32")
    ops.conv1d_verify(dev(c["x"]), dev(c["weight"]), d_st, dev(c["slot_ids"]), dev(c["cu_q"]), d_out,
                      bias=dev(c["bias"]), status=d_status, check_indices=False,
                      pending_journal=dev(prev), pending_row0=dev(r0), pending_len=dev(n))
    assert d_status.to_numpy().tolist() == [0, int(ConvStatus.BAD_PENDING), 0]
    st, exp = c["conv_state"].copy(), c["out"].copy()
    n_ok = np.where(np.arange(3) == 1, 0, n).astype(np.int32)
    conv1d_verify(c["x"], c["weight"], st, c["slot_ids"], c["cu_q"], exp, bias=c["bias"],
                  pending_journal=prev, pending_row0=r0, pending_len=n_ok)
    np.testing.assert_array_equal(host(d_st, st), st)
    assert rel_err(to_f64(host(d_out, exp)), to_f64(exp)) < 1e-2
    with pytest.raises(ValueError, match="pending_row0 / pending_len: sequence 1"):
        ops.conv1d_flush(d_st, dev(c["slot_ids"]), dev(prev), dev(r0), dev(n))
    f_status = poison((3,), "int32")
    ops.conv1d_flush(d_st, dev(c["slot_ids"]), dev(prev), dev(r0), dev(n), status=f_status,
                     check_indices=False)
    assert f_status.to_numpy().tolist() == [0, int(ConvStatus.BAD_PENDING), 0]
    conv1d_flush(st, c["slot_ids"], prev, r0, n_ok)
    np.testing.assert_array_equal(host(d_st, st), st)
