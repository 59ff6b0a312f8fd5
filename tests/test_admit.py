"""orchestrator.state.admit (one staged host->device copy, one write a buffer for all the
admitted slots) leaves every buffer, the carry, the target's recurrent state and the slots'
``used`` marks bit for bit as the per-slot admission it replaced (``_admit_per_slot``, kept
here as the oracle): on the reference backend (numpy) and on torch tensors of the CPU, over
admissions of 1, 3 (a run of slots and scattered ones) and every slot, slot reuse, stop ids
and sequences, varied sampling parameters; buffers are poisoned first."""
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import needs_gpu
from specdec_lib.orchestrator import Request, reference_backend
from specdec_lib.orchestrator.state import (CallState, Parts, admit, call_shape, make_buffers,
                                            upload)


def _admit_per_slot(parts, st, admitted):
    """The admission before s20 (a copy or a fill a field, slot by slot)."""
    xp, buf = parts.be.xp, st.buf
    slots = [b for b, _ in admitted]
    reset = getattr(parts.target, "reset_slots", None)
    if reset is None and any(st.used[b] for b in slots):
        raise TypeError("target: reusing a slot needs target.reset_slots(slot_ids)")
    if reset is not None:
        reset(xp.asarray(np.asarray(slots, np.int32)))
    M = buf.stop_seqs.shape[2]
    for b, r in admitted:
        st.used[b] = True
        ids = np.full(buf.stop_ids.shape[1], -1, np.int32)
        ids[:len(r.stop_token_ids)] = r.stop_token_ids
        seqs = np.full(buf.stop_seqs.shape[1:], -1, np.int32)
        for j, sq in enumerate(r.stop_sequences):
            if len(sq):
                seqs[j, M - len(sq):] = sq
        buf.stop_ids[b] = xp.asarray(ids)
        buf.stop_seqs[b] = xp.asarray(seqs)
        prompt = np.zeros(buf.prompt.shape[1], np.int32)
        prompt[:len(r.prompt)] = r.prompt
        buf.prompt[b] = xp.asarray(prompt)
        buf.prompt_lens[b] = len(r.prompt)
        for name, v in (("max_new", r.max_new_tokens), ("temperature", r.temperature),
                        ("top_k", r.top_k), ("top_p", r.top_p), ("min_p", r.min_p),
                        ("seed", r.seed), ("seq_lens", 0), ("out_lens", 0),
                        ("last_token", r.prompt[-1]), ("finished", 0)):
            getattr(buf, name)[b] = v
        buf.out_tokens[b] = -1
        st.carry[b] = 0


class _Target:
    """A recurrent state per slot, cleared by ``reset_slots`` (the slots it was given are
    recorded as host ints)."""
    hidden_size = 24

    def __init__(self, xp, B, torch=None):
        self.xp, self.torch = xp, torch
        self.state = xp.ones((B, 3, 5), dtype=xp.float32)
        self.calls = []

    def reset_slots(self, slot_ids):
        ids = slot_ids.cpu().numpy() if self.torch is not None else np.asarray(slot_ids)
        self.calls.append([int(i) for i in ids])
        self.state[slot_ids] = 0


def _backends():
    """(name, backend, torch or None): the reference backend; torch tensors on the CPU; and
    on the GPU (torch's CUDA device: GPU runs only)."""
    out = [pytest.param("reference", reference_backend(), None, id="reference")]
    try:
        import torch
    except ImportError:
        return out
    from specdec_lib.orchestrator.backends import _TorchArrays
    for dev in ("cpu", "cuda"):
        be = SimpleNamespace(name="torch", xp=_TorchArrays(torch, torch.device(dev)))
        out.append(pytest.param(f"torch-{dev}", be, torch, id=f"torch-{dev}",
                                marks=[needs_gpu] if dev == "cuda" else []))
    return out


def _bytes(a, torch):
    if torch is not None:
        a = a.contiguous().view(torch.uint8).cpu().numpy()
    return np.ascontiguousarray(a).view(np.uint8).copy()


def _state(be, torch, reqs, slots, k, carry_dtype, max_len=None):
    xp = be.xp
    shape = call_shape(reqs, slots, k, max_len, 1, 1, 3)
    rng = np.random.default_rng(7)
    buf = make_buffers(xp, shape, k)
    for name, a in vars(buf).items():              # poison: admit must write what it owns
        host = rng.integers(0, 256, _bytes(a, torch).size, dtype=np.uint8)
        if torch is not None:
            a.view(-1).view(torch.uint8).copy_(torch.from_numpy(host))
        else:
            a.reshape(-1).view(np.uint8)[:] = host
    target = _Target(xp, slots, torch)
    carry = xp.full((slots, target.hidden_size), 3.5, dtype=carry_dtype)
    st = CallState(shape, buf, carry, carry_dtype, [0])
    return Parts(be, target, None, k), st


def _requests(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(1, 12))
        stops = [rng.integers(0, 50, int(rng.integers(1, 4))).tolist()
                 for _ in range(int(rng.integers(0, 3)))] + ([[]] if i % 5 == 4 else [])
        out.append(Request(
            prompt=rng.integers(0, 50, L).tolist(), max_new_tokens=int(rng.integers(1, 9)),
            temperature=[0.0, 0.7, 1.3, 1 / 3][i % 4], top_k=int(rng.integers(0, 40)),
            top_p=[1.0, 0.9, 0.123456789][i % 3], min_p=[0.0, 0.05][i % 2],
            seed=int(rng.integers(-2**62, 2**62)),
            stop_token_ids=rng.integers(0, 50, int(rng.integers(0, 4))).tolist(),
            stop_sequences=stops))
    return out


def _snapshot(parts, st, torch):
    snap = {name: _bytes(a, torch) for name, a in sorted(vars(st.buf).items())}
    snap["carry"] = _bytes(st.carry, torch)
    snap["target.state"] = _bytes(parts.target.state, torch)
    return snap, list(st.used), list(parts.target.calls)


def _same(sn, so, where):
    assert sn[1] == so[1] and sn[2] == so[2], where
    assert list(sn[0]) == list(so[0])
    for f in so[0]:
        assert np.array_equal(sn[0][f], so[0][f]), (where, f)


@pytest.mark.parametrize("name,be,torch", _backends())
@pytest.mark.parametrize("carry_dtype", ["float32", "16bit", "float64"])
@pytest.mark.parametrize("k", [0, 3])
def test_admit_matches_per_slot_admission(name, be, torch, carry_dtype, k):
    B = 8
    reqs = _requests(24, seed=3)
    cd = getattr(be.xp, "bfloat16" if torch is not None else "float16") \
        if carry_dtype == "16bit" else getattr(be.xp, carry_dtype)
    new = _state(be, torch, reqs, B, k, cd)
    old = _state(be, torch, reqs, B, k, cd)
    _same(_snapshot(*new, torch), _snapshot(*old, torch), "poisoned")
    rounds = [[(2, reqs[0])],                                  # one slot
              [(3, reqs[1]), (4, reqs[2]), (5, reqs[3])],      # a run of slots
              [(7, reqs[4]), (0, reqs[5]), (6, reqs[6])],      # scattered
              [(b, reqs[7 + b]) for b in range(B)],            # every slot (reused)
              [(5, reqs[15])], [(1, reqs[16]), (3, reqs[17])],  # reuse, one and two
              [(b, reqs[16 + b]) for b in (6, 2, 4, 0, 7, 1, 5, 3)]]   # every slot, shuffled
    for i, adm in enumerate(rounds):
        admit(new[0], new[1], adm)
        _admit_per_slot(old[0], old[1], adm)
        _same(_snapshot(*new, torch), _snapshot(*old, torch), i)
        # touch the state between admissions (a round would): the next admission must reset it
        for a in (new, old):
            a[1].buf.seq_lens[...] = 5
            a[1].carry[...] = 1.25
            a[0].target.state[...] = 2.0


def test_admit_reuse_without_reset_slots_refused():
    be = reference_backend()
    reqs = _requests(3, seed=1)
    parts, st = _state(be, None, reqs, 4, 0, np.float32)
    parts = Parts(be, SimpleNamespace(hidden_size=24), None, 0)
    admit(parts, st, [(1, reqs[0])])
    with pytest.raises(TypeError, match="reset_slots"):
        admit(parts, st, [(0, reqs[1]), (1, reqs[2])])
    assert st.used == [False, True, False, False]


def test_hybrid_reset_slots_torch_branch_on_cpu():
    """LlamaHybridTarget.reset_slots on torch (index_fill_ over the layers' pools and the
    pending rows of fused mode), run on CPU tensors: the slots named by an int32 or int64
    tensor or a host array are zero in every layer and have nothing pending, the others
    untouched."""
    torch = pytest.importorskip("torch")
    from specdec_lib.models.llama_hybrid import LlamaHybridTarget
    m = SimpleNamespace(name="torch", torch=torch, dev=torch.device("cpu"),
                        table=lambda a: torch.as_tensor(np.asarray(a)))
    g = torch.Generator().manual_seed(0)
    me = SimpleNamespace(m=m, _state_pool=torch.randn(3, 6, 2, 4, 4, generator=g).bfloat16(),
                         _conv_pool=torch.randn(3, 6, 5, 3, generator=g),
                         _journals=SimpleNamespace(len=torch.arange(1, 7, dtype=torch.int32)))
    want_s, want_c = me._state_pool.clone(), me._conv_pool.clone()
    for ids in (torch.tensor([1, 4], dtype=torch.int32), torch.tensor([5], dtype=torch.int64),
                np.array([0, 2], np.int32)):
        LlamaHybridTarget.reset_slots(me, ids)
        for j in range(3):                   # the per-layer writes it replaced
            want_s[j][torch.as_tensor(np.asarray(ids)).long()] = 0
            want_c[j][torch.as_tensor(np.asarray(ids)).long()] = 0
        assert torch.equal(me._state_pool.view(torch.int16), want_s.view(torch.int16))
        assert torch.equal(me._conv_pool, want_c)
    assert bool((me._state_pool[:, 3] != 0).any())
    assert me._journals.len.tolist() == [0, 0, 0, 4, 0, 0]


def test_serve_counts_admissions(tmp_path):
    """Metrics: admit's host time is counted apart (and inside prefill_s), with the number of
    admissions (round boundaries that admitted) and of requests admitted."""
    from specdec_lib.models import (TinyHybridTarget, TinyMTPDraft, load_demo_checkpoint,
                                    make_demo_checkpoint)
    from specdec_lib.orchestrator import SpeculativeDecoder
    make_demo_checkpoint(str(tmp_path))
    cfg, tensors, dw = load_demo_checkpoint(str(tmp_path))
    be = reference_backend()
    dec = SpeculativeDecoder(TinyHybridTarget(cfg, tensors, be), TinyMTPDraft(cfg, dw, tensors, be),
                             num_speculative_tokens=2, backend=be)
    reqs = [Request(prompt=p, max_new_tokens=4)
            for p in ([1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11, 12])]
    dec.serve(reqs, slots=2, arrivals=[0, 0, 0, 3, 50])
    m = dec.metrics
    assert m.admitted == 5 and 3 <= m.admissions <= 5
    assert 0 < m.admit_s <= m.prefill_s


@pytest.mark.parametrize("name,be,torch", _backends())
def test_tiny_hybrid_reset_slots(name, be, torch):
    """TinyHybridTarget.reset_slots writes a device zero (no python scalar through a device
    index): the named slots of every linear-attention layer are zero, and so are their
    pending rows (fused mode), the rest untouched."""
    from specdec_lib.models import TinyHybridTarget
    xp = be.xp
    rng = np.random.default_rng(0)
    layers = [dict(kind=k) for k in ("linear_attention", "full_attention", "linear_attention")]
    for L in layers:
        if L["kind"] == "linear_attention":
            L["state"] = xp.asarray(rng.standard_normal((5, 2, 3, 3)).astype(np.float32))
            L["conv_state"] = xp.asarray(rng.standard_normal((5, 4, 3)).astype(np.float32))
    host = (lambda a: a.cpu().numpy()) if torch is not None else np.array
    want = [{k: np.array(host(L[k])) for k in L if k != "kind"} for L in layers]
    pending = SimpleNamespace(len=xp.asarray(np.arange(1, 6, dtype=np.int32)))
    me = SimpleNamespace(layers=layers, _zero=xp.zeros((), dtype=xp.float32),
                         _zero_i32=xp.zeros((), dtype=xp.int32), _journals=pending)
    idx = xp.asarray(np.array([3, 0], np.int64))
    TinyHybridTarget.reset_slots(me, idx)
    for L, w in zip(layers, want):
        for k, a in w.items():
            a[[3, 0]] = 0
            assert np.array_equal(host(L[k]), a), k
    assert host(pending.len).tolist() == [0, 2, 3, 0, 5]


class _FillTarget:
    """A target whose reset_slots clears a device state with ``index_fill_`` (as the hybrid
    does on torch)."""
    hidden_size = 24

    def __init__(self, torch, B):
        self.state = torch.ones((B, 3, 5), device="cuda")

    def reset_slots(self, slot_ids):
        self.state.index_fill_(0, slot_ids.long(), 0)     # (itself when int64)


def _syncs(torch, fn) -> int:
    """Synchronising CUDA calls torch makes while ``fn()`` runs (its sync debug mode)."""
    import warnings
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchronizing CUDA operation" in str(x.message) for x in w)


@needs_gpu
def test_admit_synchronises_once_on_cuda():
    """On the GPU (torch) an admission makes one synchronising call, its host->device copy,
    for one slot, a run, scattered slots and all of them; the hybrid's reset_slots none. (The
    per-slot admission made at least 1 + 3 a request: its pageable copies.)"""
    torch = pytest.importorskip("torch")
    from specdec_lib.models.llama_hybrid import LlamaHybridTarget
    from specdec_lib.orchestrator.backends import _TorchArrays
    be = SimpleNamespace(name="torch", xp=_TorchArrays(torch, torch.device("cuda")))
    B = 8
    reqs = _requests(3 * B, seed=5)
    _, st = _state(be, torch, reqs, B, 3, torch.bfloat16)
    parts = Parts(be, _FillTarget(torch, B), None, 3)
    batches = [[(2, reqs[0])], [(3, reqs[1]), (4, reqs[2]), (5, reqs[3])],
               [(7, reqs[4]), (0, reqs[5]), (6, reqs[6])], [(b, reqs[8 + b]) for b in range(B)]]
    for adm in batches:
        assert _syncs(torch, lambda: admit(parts, st, adm)) == 1, [b for b, _ in adm]
    for adm in batches[:2]:
        old = _syncs(torch, lambda: _admit_per_slot(parts, st, adm))
        assert old >= 1 + 3 * len(adm), old
    dev = torch.device("cuda", torch.cuda.current_device())
    me = SimpleNamespace(m=SimpleNamespace(name="torch", torch=torch, dev=dev),
                         _state_pool=torch.ones((17, B, 2, 64, 64), dtype=torch.bfloat16,
                                                device=dev),
                         _conv_pool=torch.ones((17, B, 384, 3), device=dev),
                         _journals=SimpleNamespace(len=torch.ones(B, dtype=torch.int32,
                                                                  device=dev)))
    idx = torch.tensor([1, 6], dtype=torch.int64, device=dev)
    assert _syncs(torch, lambda: LlamaHybridTarget.reset_slots(me, idx)) == 0
    assert float(me._state_pool[:, [1, 6]].abs().sum()) == 0
    assert me._journals.len.tolist() == [1, 0, 1, 1, 1, 1, 0, 1]
    assert float(me._conv_pool[:, [0, 2, 3, 4, 5, 7]].sum()) == 17 * 6 * 384 * 3


@pytest.mark.parametrize("name,be,torch", _backends())
def test_upload_views(name, be, torch):
    """upload: every array comes back with its values, dtype and shape (odd sizes, empty
    ones, 8-byte values after odd-sized blocks, a block read as another dtype)."""
    rng = np.random.default_rng(1)
    xp = be.xp
    half = np.float16 if torch is None else None
    arrays = dict(a=rng.integers(-9, 9, 3).astype(np.int32), b=np.zeros((2, 0), np.int32),
                  c=rng.integers(-2**62, 2**62, 5), d=np.arange(7, dtype=np.uint8),
                  e=rng.standard_normal((3, 5)).astype(np.float32),
                  f=np.array([2**40 + 3], np.int64),
                  g=(np.full((2, 3), 0x3C00, np.uint16), half or xp.float16))
    got = upload(xp, arrays)
    assert list(got) == list(arrays)
    for k, v in arrays.items():
        a = v[0] if isinstance(v, tuple) else v
        out = got[k].cpu().numpy() if torch is not None else got[k]
        assert tuple(out.shape) == a.shape, k
        if k == "g":
            assert (out == 1.0).all()
        else:
            assert out.dtype == a.dtype and np.array_equal(out, a), k
    assert upload(xp, {}) == {}


class _FakeEvent:
    def __init__(self, log, i):
        self.log, self.i = log, i

    def record(self):
        self.log.append(("record", self.i))

    def synchronize(self):
        self.log.append(("sync", self.i))


def test_pinned_writes_ring():
    """``_PinnedWrites`` (GPU backends' ``to_device_async``): each copy returns its words;
    a staging buffer is refilled only after the event recorded behind its last copy was
    waited for (never before its first use), a copy larger than the buffer gets a new one
    (a power of two of words, at least 1,024), and the ring has RING buffers."""
    from specdec_lib.orchestrator.backends import _PinnedWrites
    log, made = [], []

    def pinned(n):
        made.append(n)
        return np.full(n, -7, np.int32)

    def copy(buf, n):
        log.append(("copy", n))
        return buf[:n].copy()
    events = iter(range(100))
    w = _PinnedWrites(pinned, lambda b: b, copy, lambda: _FakeEvent(log, next(events)))
    R = w.RING
    rng = np.random.default_rng(3)
    sizes = [5, 0, 1024, 3, 1500, 7, 2, 9, 4100]
    for i, n in enumerate(sizes):
        words = rng.integers(-2**31, 2**31, n).astype(np.int32)
        log.clear()
        got = w(words)
        assert got.dtype == np.int32 and np.array_equal(got, words), i
        first = i < R
        assert log == ([] if first else [("sync", i % R)]) + [("copy", n), ("record", i % R)]
    assert made == [1024, 1024, 1024, 1024, 2048, 8192]


def test_upload_through_a_copy_function():
    """upload(..., copy): the same arrays, the one host array handed to ``copy`` (int32
    words); ``device_copy`` gives the backend's ``to_device_async`` only with ASYNC_UPLOAD."""
    from specdec_lib.orchestrator import state
    seen = []

    def copy(words):
        seen.append(words.dtype)
        return words.copy()
    arrays = dict(a=np.arange(5, dtype=np.int32), c=np.array([2**40 + 3], np.int64),
                  d=np.arange(7, dtype=np.uint8), e=np.linspace(0, 1, 6, dtype=np.float32))
    want, got = upload(np, arrays), upload(np, arrays, copy)
    assert seen == [np.int32] and list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    be = SimpleNamespace(xp=np, to_device_async=copy)
    was = state.ASYNC_UPLOAD
    try:
        state.ASYNC_UPLOAD = False
        assert state.device_copy(be) is None
        state.ASYNC_UPLOAD = True
        assert state.device_copy(be) is copy
        assert state.device_copy(reference_backend()) is None
    finally:
        state.ASYNC_UPLOAD = was


@needs_gpu
@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_to_device_async_on_gpu(backend):
    """A GPU backend's ``to_device_async``: every copy arrives as its words, while the ring
    goes round and its buffers grow, with later copies queued before earlier ones are read."""
    from specdec_lib.orchestrator import make_backend
    if backend == "cuda":
        pytest.importorskip("cupy")
    be = make_backend(backend)
    rng = np.random.default_rng(11)
    sent = [rng.integers(-2**31, 2**31, n).astype(np.int32)
            for n in (3, 1024, 1, 0, 5000, 17, 70000, 2, 9)]
    got = [be.to_device_async(w) for w in sent]
    for w, g in zip(sent, got):
        assert np.array_equal(be.to_host(g), w)


@needs_gpu
def test_admit_async_upload_on_gpu():
    """With ASYNC_UPLOAD an admission on the GPU (torch) makes no synchronising call and
    writes what the pageable copy writes, for every batch of admissions (the staging ring
    goes round: more admissions than RING buffers)."""
    torch = pytest.importorskip("torch")
    from specdec_lib.orchestrator import make_backend, state
    be = make_backend("torch")
    B = 8
    reqs = _requests(3 * B, seed=9)
    batches = [[(2, reqs[0])], [(3, reqs[1]), (4, reqs[2]), (5, reqs[3])],
               [(7, reqs[4]), (0, reqs[5]), (6, reqs[6])], [(b, reqs[8 + b]) for b in range(B)],
               [(1, reqs[16])], [(b, reqs[16 + b]) for b in range(1, B)]]
    snaps, was = {}, state.ASYNC_UPLOAD
    for on in (False, True):
        _, st = _state(be, torch, reqs, B, 3, torch.float32)
        parts = Parts(be, _FillTarget(torch, B), None, 3)      # (a reset without syncs)
        parts.target.calls = []
        state.ASYNC_UPLOAD = on
        try:
            for adm in batches:
                n = _syncs(torch, lambda: admit(parts, st, adm))
                assert n == (0 if on else 1), (on, n)
        finally:
            state.ASYNC_UPLOAD = was
        snaps[on] = _snapshot(parts, st, torch)
    _same(snaps[True], snaps[False], "async upload")
