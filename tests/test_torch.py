"""specdec_lib.torch: the ops as torch custom ops (torch.ops.specdec.*).

CPU: registration, opcheck (schema / fake tensors / aot dispatch) of every op on CPU
tensors (the reference kernels), fake-time checks on meta tensors, and a whole round
traced by torch.compile(fullgraph=True) with no graph break and the eager result.
GPU: the same round eagerly, under torch.compile(mode="reduce-overhead") (CUDA graphs)
and captured with torch.cuda.graph, bit for bit, replayed on fresh inputs.
"""
import numpy as np
import pytest

from conftest import needs_gpu

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
st = pytest.importorskip("specdec_lib.torch_ops")
from specdec_lib.reference.layers import rope_cos_sin_cache  # noqa: E402

ROUND_OPS = ("append_kv", "verify_attention", "spec_sample", "seq_stop", "seq_advance")


def _i32(x, dev):
    return torch.tensor(x, dtype=torch.int32, device=dev)


# ----------------------------------------------------------------- one round's inputs
def round_inputs(dev, seed=0, B=3, q=(1, 3, 4), L=(5, 17, 33), Hkv=2, Hq=4, D=64, page=16,
                 V=301, dtype=None):
    """append_kv -> verify_attention -> spec_sample -> seq_stop -> seq_advance inputs, on
    ``dev``, random; ragged blocks (q=1 plain decode included), greedy and sampled rows."""
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float16
    T = sum(q)
    max_pages = 4
    num_pages = B * max_pages + 1
    cu = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    perm = torch.randperm(num_pages, generator=g)[:B * max_pages].reshape(B, max_pages)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt).to(dev)

    x = dict(
        k=rnd(T, Hkv, D), v=rnd(T, Hkv, D),
        k_cache=rnd(num_pages, page, Hkv, D), v_cache=rnd(num_pages, page, Hkv, D),
        page_table=perm.to(torch.int32).to(dev), seq_lens=_i32(list(L), dev),
        cu_q=_i32(cu.tolist(), dev), q=rnd(T, Hq, D),
        logits=rnd(T, V, dt=torch.float32) * 3,
        draft_ids=torch.randint(0, V, (T - B,), generator=g).to(torch.int32).to(dev),
        temperature=torch.tensor([0.8, 0.0, 1.3], dtype=torch.float32, device=dev)[:B],
        top_k=_i32([0, 50, 0][:B], dev), top_p=torch.tensor([1.0, 0.9, 1.0][:B], device=dev),
        min_p=torch.zeros(B, device=dev), seed=torch.arange(B, dtype=torch.int64, device=dev) + seed,
        step=torch.full((B,), 7, dtype=torch.int64, device=dev),
        out_tokens=torch.randint(0, V, (B, 64), generator=g).to(torch.int32).to(dev),
        out_lens=_i32([3, 0, 10][:B], dev), stop_ids=_i32([[7, -1]] * B, dev),
        max_new_tokens=_i32([100, 2, 100][:B], dev),
        finished=torch.zeros(B, dtype=torch.uint8, device=dev),
        last_token=torch.zeros(B, dtype=torch.int32, device=dev),
    )
    # the greedy request (b=1) drafts its rows' argmax first: at least one accepted draft
    x["draft_ids"][cu[1] - 1] = x["logits"][cu[1]].argmax().to(torch.int32)
    return x


def run_round(x):
    """One speculative round through torch.ops.specdec; functional from the caller's view
    (state inputs are cloned, so a compiled graph mutates only its own buffers)."""
    ops = torch.ops.specdec
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    B, W = x["seq_lens"].shape[0], 5
    ops.append_kv(x["k"], x["v"], kc, vc, x["page_table"], x["seq_lens"], x["cu_q"],
                  check_indices=False)
    out = torch.empty_like(x["q"])
    lse = torch.empty(x["q"].shape[:2], dtype=torch.float32, device=x["q"].device)
    ops.verify_attention(x["q"], kc, vc, x["page_table"], x["seq_lens"], x["cu_q"], out, None, lse)
    dev = x["logits"].device
    n_acc = torch.empty(B, dtype=torch.int32, device=dev)
    emitted = torch.empty((B, W), dtype=torch.int32, device=dev)
    status = torch.empty(B, dtype=torch.int32, device=dev)
    ops.spec_sample(x["logits"], x["cu_q"], x["draft_ids"], x["temperature"], x["top_k"],
                    x["top_p"], x["min_p"], x["seed"], x["step"], n_acc, emitted, status)
    accept_len = torch.empty(B, dtype=torch.int32, device=dev)
    finished = x["finished"].clone()
    ops.seq_stop(emitted, n_acc, x["out_tokens"], x["out_lens"], x["stop_ids"], None,
                 x["max_new_tokens"], accept_len, finished)
    seq_lens, out_tokens = x["seq_lens"].clone(), x["out_tokens"].clone()
    out_lens, last_token = x["out_lens"].clone(), x["last_token"].clone()
    ops.seq_advance(emitted, accept_len, seq_lens, out_tokens, out_lens, last_token, finished)
    return (kc, vc, out, lse, n_acc, emitted, status, accept_len, finished, seq_lens,
            out_tokens, out_lens, last_token)


def assert_same(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float16 else x,
                           y.view(torch.uint8) if y.dtype == torch.float16 else y), f"output {i} differs"


# ----------------------------------------------------------------- samples of every op (CPU)
def _samples():
    """name -> (args, kwargs) on CPU that the reference accepts (opcheck runs them)."""
    r = np.random.default_rng(5)
    f = lambda *s: torch.from_numpy(r.standard_normal(s).astype(np.float32))  # noqa: E731
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    x = round_inputs("cpu", seed=1)
    B, T = 3, 8
    s = {}
    s["copy"] = ((torch.zeros(4, 6), f(1, 6)), {})
    s["append_kv"] = ((x["k"], x["v"], x["k_cache"].clone(), x["v_cache"].clone(), x["page_table"],
                       x["seq_lens"], x["cu_q"]), {})
    T_pos = (x["seq_lens"].repeat_interleave(torch.diff(x["cu_q"]))
             + torch.arange(T) - x["cu_q"][:-1].repeat_interleave(torch.diff(x["cu_q"])))
    cos_sin = torch.from_numpy(rope_cos_sin_cache(64, x["q"].shape[2], 10000.0))
    s["rope_append_kv"] = ((x["q"].clone(), x["k"].clone(), x["v"], T_pos.to(torch.int32), cos_sin,
                            x["k_cache"].clone(), x["v_cache"].clone(), x["page_table"],
                            x["seq_lens"], x["cu_q"], x["finished"]), {})
    s["verify_attention"] = ((x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seq_lens"],
                              x["cu_q"], torch.empty_like(x["q"]), None,
                              torch.empty(T, 4)), {})
    Hk, Hv, Dk, Dv, slots = 1, 2, 8, 8, 4
    W = 1 * Dk + Hv * Dv + 2 * Hv
    gdn_in = (f(T, Hk, Dk), f(T, Hk, Dk), f(T, Hv, Dv), f(slots, Hv, Dk, Dv), i32([2, 0, 3]),
              x["cu_q"], torch.empty(T, Hv, Dv), torch.empty(T, W))
    s["gdn_verify"] = (gdn_in, dict(g=-f(T, Hv).abs(), beta=torch.sigmoid(f(T, Hv))))
    s["gdn_commit"] = ((f(slots, Hv, Dk, Dv), i32([2, 0, 3]), x["cu_q"], i32([1, 2, 4]),
                        f(T, W)), {})
    s["gdn_flush"] = ((f(slots, Hv, Dk, Dv), i32([2, 0, 3]), f(T, W), i32([0, 1, 4]),
                       i32([1, 2, 0])), {})
    dim, Wc = 16, 4
    s["conv1d_verify"] = ((f(T, dim), f(dim, Wc), f(slots, dim, Wc - 1), i32([2, 0, 3]), x["cu_q"],
                           torch.empty(T, dim)), dict(bias=f(dim), journal=torch.empty(T, dim)))
    s["conv1d_commit"] = ((f(slots, dim, Wc - 1), i32([2, 0, 3]), x["cu_q"], i32([1, 3, 2]),
                           f(T, dim)), {})
    s["conv1d_flush"] = ((f(slots, dim, Wc - 1), i32([2, 0, 3]), f(T, dim), i32([0, 1, 4]),
                          i32([1, 2, 0])), {})
    s["spec_sample"] = ((x["logits"], x["cu_q"], x["draft_ids"], x["temperature"], x["top_k"],
                         x["top_p"], x["min_p"], x["seed"], x["step"], torch.empty(B, dtype=torch.int32),
                         torch.empty(B, 5, dtype=torch.int32), torch.empty(B, dtype=torch.int32),
                         None, None, torch.empty(B, 5)), {})
    em = i32([[4, 7, -1, -1, -1], [1, 2, 3, -1, -1], [9, -1, -1, -1, -1]])
    na = i32([1, 2, 0])
    s["seq_stop"] = ((em, na, x["out_tokens"], x["out_lens"], x["stop_ids"], None,
                      x["max_new_tokens"], torch.empty(B, dtype=torch.int32),
                      torch.zeros(B, dtype=torch.uint8)), {})
    s["seq_advance"] = ((em, i32([2, 3, 1]), x["seq_lens"].clone(), x["out_tokens"].clone(),
                         x["out_lens"].clone(), torch.zeros(B, dtype=torch.int32),
                         torch.zeros(B, dtype=torch.uint8)), {})
    s["seq_build_block"] = ((i32([1, 2, 3]), i32([[4, 5], [6, 7], [8, 9]]), i32([2, 0, 1]),
                             x["seq_lens"], torch.empty(B + 1, dtype=torch.int32),
                             torch.empty(B * 3, dtype=torch.int32), torch.empty(B * 3, dtype=torch.int32),
                             torch.empty(B * 2, dtype=torch.int32)), {})
    s["draft_carry"] = ((f(T, 16), x["cu_q"], i32([1, 2, 4]), torch.empty(B, 16)), {})
    s["capture_hidden"] = ((f(T, 16), torch.zeros(T, 48), 1), dict(residual=f(T, 16)))
    s["draft_combine"] = ((f(T, 16), f(T, 16), f(16), f(16), torch.empty(T, 32)), dict(eps=1e-5))
    b = lambda *sh: f(*sh).to(torch.bfloat16)   # noqa: E731  (linear takes 16-bit x only)
    s["linear"] = ((b(T, 16), b(12, 16), torch.empty(T, 6, dtype=torch.bfloat16)),
                   dict(norm_weight=f(16), eps=1e-5, residual=b(T, 16),
                        residual_out=torch.empty(T, 16, dtype=torch.bfloat16), epilogue="silu_mul"))
    # gated_rms_norm: float32 x / weight, bf16 z / out, a [G] z_bias beside a [C] weight
    s["gated_rms_norm"] = ((f(T, 16), b(T, 16), f(16), torch.empty(T, 16, dtype=torch.bfloat16)),
                           dict(group_size=8, z_bias=f(8), eps=1e-5))
    s["draft_map_tokens"] = ((i32([0, 3, 9, 2]), i32([5, 5, 6, 7]), torch.empty(4, dtype=torch.int32)),
                             dict(offsets=True))
    return s


SAMPLES = _samples()


def test_every_public_op_is_registered():
    from specdec_lib import ops as gpu_ops
    public = [n for n in dir(gpu_ops) if not n.startswith("_") and callable(getattr(gpu_ops, n))
              and not n.endswith(("_size", "_width", "_cache"))     # host helpers, not ops
              and n not in ("advance_step",)]
    for name in public:
        assert name in st.OPS, f"{name} has no torch custom op entry"
        assert hasattr(torch.ops.specdec, name)
    for name in ("rms_norm", "rope", "silu_mul", "ngram_propose"):
        assert (name in st.OPS) != (name in st.MISSING)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_opcheck_cpu(name):
    args, kwargs = SAMPLES[name]
    if name in ("gdn_verify", "gdn_commit", "gdn_flush", "verify_attention"):
        utils = ("test_schema", "test_faketensor")   # aot_dispatch_dynamic: slow, round test covers it
    else:
        utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(getattr(torch.ops.specdec, name).default, args, kwargs, test_utils=utils)


def test_opcheck_cpu_conv1d_verify_fused():
    # the fused mode writes conv_state (a mutated argument of the schema)
    args, kwargs = SAMPLES["conv1d_verify"]
    T, dim = args[0].shape
    kwargs = dict(kwargs, pending_journal=torch.randn(T, dim), pending_row0=torch.tensor(
        [0, 1, 4], dtype=torch.int32), pending_len=torch.tensor([1, 2, 0], dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.conv1d_verify.default, args, kwargs,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_every_sampled_op_has_a_sample():
    assert set(SAMPLES) == set(st.OPS) - {"rms_norm", "rope", "silu_mul", "ngram_propose"}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_fake_kernel_on_meta_tensors_returns_nothing(name):
    args, kwargs = SAMPLES[name]
    to_meta = lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
    assert getattr(torch.ops.specdec, name)(*[to_meta(a) for a in args],
                                            **{k: to_meta(v) for k, v in kwargs.items()}) is None


def test_fake_kernel_checks_output_shapes():
    args, kwargs = SAMPLES["spec_sample"]
    bad = list(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    bad[10] = torch.empty(2, 5, dtype=torch.int32, device="meta")   # emitted: wrong batch
    with pytest.raises(ValueError, match="emitted"):
        torch.ops.specdec.spec_sample(*bad)
    args, _ = SAMPLES["append_kv"]
    bad = [a.to("meta") for a in args]
    bad[0] = bad[0].to(torch.float32)            # k: not the caches' dtype
    with pytest.raises(TypeError, match="^k: dtype"):
        torch.ops.specdec.append_kv(*bad)


def test_fake_tensor_mode_traces_the_round():
    from torch._subclasses.fake_tensor import FakeTensorMode
    x = round_inputs("cpu")
    with FakeTensorMode() as mode:
        fx = {k: mode.from_tensor(v) for k, v in x.items()}
        outs = run_round(fx)
    real = run_round(x)
    for f_, r in zip(outs, real):
        assert f_.shape == r.shape and f_.dtype == r.dtype and f_.device == r.device


def test_round_under_compile_has_no_graph_break_and_matches_eager():
    x = round_inputs("cpu", seed=3)
    eager = run_round(x)
    explain = torch._dynamo.explain(run_round)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(run_round, fullgraph=True, backend="aot_eager")
    for s in (3, 4):
        x = round_inputs("cpu", seed=s)
        assert_same(compiled(x), run_round(x))
    assert_same(run_round(round_inputs("cpu", seed=3)), eager)


def test_round_on_cpu_equals_the_reference():
    from specdec_lib import reference as ref
    x = round_inputs("cpu", seed=2)
    got = run_round(x)
    n = {k: v.numpy().copy() for k, v in x.items()}
    B = 3
    ref.append_kv(n["k"], n["v"], n["k_cache"], n["v_cache"], n["page_table"], n["seq_lens"], n["cu_q"])
    out = np.empty_like(n["q"])
    ref.verify_attention(n["q"], n["k_cache"], n["v_cache"], n["page_table"], n["seq_lens"],
                         n["cu_q"], out)
    na, em, stt = np.empty(B, np.int32), np.empty((B, 5), np.int32), np.empty(B, np.int32)
    ref.spec_sample(n["logits"], n["cu_q"], n["draft_ids"], n["temperature"], n["top_k"],
                    n["top_p"], n["min_p"], n["seed"], n["step"], na, em, stt)
    np.testing.assert_array_equal(got[0].numpy(), n["k_cache"])
    np.testing.assert_array_equal(got[2].numpy(), out)
    np.testing.assert_array_equal(got[5].numpy(), em)
    np.testing.assert_array_equal(got[4].numpy(), na)


def test_bf16_cpu_tensors_round_trip_through_float32():
    dst = torch.zeros(3, 4, dtype=torch.bfloat16)
    src = torch.randn(3, 4).to(torch.bfloat16)
    torch.ops.specdec.copy(dst, src)
    assert torch.equal(dst, src)


def test_bad_argument_raises_naming_it_before_writing():
    args, _ = SAMPLES["seq_advance"]
    before = [a.clone() for a in args]
    bad = list(a.clone() for a in args)
    bad[2] = torch.zeros(2, dtype=torch.int32)       # seq_lens: wrong batch
    with pytest.raises(ValueError, match="seq_lens"):
        torch.ops.specdec.seq_advance(*bad)
    for a, b in zip(bad[3:], before[3:]):
        assert torch.equal(a, b)


# ----------------------------------------------------------------- GPU
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device (CPU build or no GPU)")
    return torch.device("cuda", torch.cuda.current_device())


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_round_gpu_compiled_cudagraphs_bit_identical(dtype):
    dev = _cuda()
    from specdec_lib import runtime
    if dtype == "bfloat16" and runtime.arch_family(dev.index) < 80:
        pytest.skip("bf16 verify_attention needs the sm_80 code path")
    dt = getattr(torch, dtype)
    from torch._dynamo.utils import counters
    counters.clear()
    compiled = torch.compile(run_round, fullgraph=True, mode="reduce-overhead")
    for s in range(4):   # warm-up, record, then replays on fresh inputs
        x = round_inputs(dev, seed=10 + s, dtype=dt)
        eager = [t.clone() for t in run_round(x)]
        got = [t.clone() for t in compiled(x)]
        torch.cuda.synchronize()
        assert_same(got, eager)
        assert int(got[6].abs().sum()) == 0, "a block was flagged"
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])


@needs_gpu
def test_round_gpu_torch_cuda_graph_capture_replays():
    dev = _cuda()
    x = round_inputs(dev, seed=21)
    static = {k: v.clone() for k, v in x.items()}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run_round(static)   # warm-up (lazy module loads) off the default stream
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run_round(static)
    for seed in (22, 23):
        fresh = round_inputs(dev, seed=seed)
        for k in static:
            static[k].copy_(fresh[k])
        graph.replay()
        torch.cuda.synchronize()
        assert_same([o.clone() for o in outs], run_round(fresh))


@needs_gpu
@pytest.mark.parametrize("name", ROUND_OPS + ("copy", "draft_carry", "seq_build_block",
                                              "gated_rms_norm"))
def test_opcheck_gpu(name):
    dev = _cuda()
    args, kwargs = SAMPLES[name]
    mv = lambda v: v.to(dev) if isinstance(v, torch.Tensor) else v  # noqa: E731
    torch.library.opcheck(getattr(torch.ops.specdec, name).default, tuple(mv(a) for a in args),
                          {k: mv(v) for k, v in kwargs.items()},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@needs_gpu
def test_torch_op_equals_native_op_on_gpu():
    dev = _cuda()
    from specdec_lib import ops
    x = round_inputs(dev, seed=31)
    outs = run_round(x)
    B = 3
    n_acc = torch.full((B,), -5, dtype=torch.int32, device=dev)
    em = torch.full((B, 5), -5, dtype=torch.int32, device=dev)
    stt = torch.full((B,), -5, dtype=torch.int32, device=dev)
    ws = torch.empty(ops.spec_sample_workspace_size(x["logits"].shape[0], x["logits"].shape[1]),
                     dtype=torch.uint8, device=dev)
    ops.spec_sample(x["logits"], x["cu_q"], x["draft_ids"], x["temperature"], x["top_k"],
                    x["top_p"], x["min_p"], x["seed"], x["step"], n_acc, em, stt, workspace=ws,
                    stream=torch.cuda.current_stream(dev).cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(em, outs[5]) and torch.equal(n_acc, outs[4])


def test_round_under_inductor_on_cpu_matches_eager():
    """The default backend (inductor: functionalization, then re-inplacing of the written
    arguments) on CPU tensors; about a minute on two cores."""
    compiled = torch.compile(run_round, fullgraph=True)
    x = round_inputs("cpu", seed=5)
    assert_same(compiled(x), run_round(x))
