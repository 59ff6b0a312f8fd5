"""The kernel table: the one place where kernel dispatch lives.

setup.py reads it to know what to compile, runtime.py to know what to load, and
``python -m specdec_lib inspect --check`` (specdec_lib.cubins) to know what every shipped
cubin must contain.
This file must stay importable without the rest of the package (setup.py execs it).

Build model: each module's source is compiled once per *code family* to PTX
(compute_75, compute_80, compute_90 and, where asked, compute_90a); ptxas turns
the PTX into the cubins below.  Inside a kernel ``__CUDA_ARCH__`` is therefore
750, 800 or 900: three code paths, each of which can be run on a Hopper GPU by
forcing the family's PTX (``SPECDEC_FORCE_ARCH=75|80|90``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# cubin arch -> the PTX family it is assembled from
CUBIN_ARCHS = {"75": "75", "80": "80", "86": "80", "89": "80", "90": "90"}
# families whose PTX ships (the loader's last resort, and the forced-arch test path)
PTX_FAMILIES = ("75", "80", "90")


@dataclass(frozen=True)
class KernelModule:
    name: str                 # cubin stem: _cubin/<name>.sm_90.cubin
    source: str               # translation unit, relative to the repo root
    params_header: str        # relative to cuda_src/ (also included by the Cython launcher)
    kernels: dict = field(default_factory=dict)   # extern "C" symbol -> param struct name
    sm90a: bool = False       # also build compute_90a PTX / sm_90a cubin (wgmma, setmaxnreg)
    allow_local: tuple = ()   # kernels allowed a stack frame (inspect --check)

    def cubin_archs(self):
        archs = list(CUBIN_ARCHS)
        if self.sm90a:
            archs.append("90a")
        return archs

    def ptx_families(self):
        fams = list(PTX_FAMILIES)
        if self.sm90a:
            fams.append("90a")
        return fams


KV8_FORMATS = ("fp8", "int8")   # 8-bit KV cache formats (specdec_lib/reference/kvquant.py)


def _copy_kernels():
    ks = {}
    for e in (1, 2, 4, 8):
        ks[f"copy_strided_e{e}"] = "CopyParams"
        ks[f"append_kv_e{e}"] = "AppendKVParams"
    # 8-bit caches, quantise on write (issue 32): cache format x source dtype
    for fmt in KV8_FORMATS:
        for t in ("f32", "f16", "bf16"):
            ks[f"append_kv8_{fmt}_{t}"] = "AppendKV8Params"
    return ks


MODULES: dict[str, KernelModule] = {}

# linear's small-M forms: (rows, units a lane) instantiated (cuda_src/layers/linear.cu)
LINEAR_SMALL_SHAPES = ((1, 4), (2, 4), (4, 4), (1, 8), (2, 8), (4, 8))
# ... and (rows, units a lane) of its four-columns-a-warp forms (linear_w4_m*_k*)
LINEAR_WIDE_SHAPES = ((1, 4), (2, 4))     # (the k8 form needs 213-248 registers)

# (activation, weight) dtypes of the RMSNorm kernels (draft_combine, rms_norm): the weight is
# the activation dtype or float32 (common/rms_norm.cuh: SPECDEC_FOR_NORM_DTYPES)
NORM_DTYPES = (("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"), ("bf16", "f32"))
# (out, x, weight) dtypes of gated_rms_norm (layers.cu SPECDEC_FOR_GATED_NORM_DTYPES): z is out's
# dtype, x float32 or out's, weight and z_bias float32 or out's
GATED_NORM_DTYPES = tuple((t, x, w) for t in ("f32", "f16", "bf16")
                          for x in dict.fromkeys((t, "f32")) for w in dict.fromkeys((t, "f32")))


def register(module: KernelModule) -> KernelModule:
    MODULES[module.name] = module
    return module


register(KernelModule(
    name="copy",
    source="cuda_src/copy/copy.cu",
    params_header="copy/copy_params.h",
    kernels=_copy_kernels(),
))

register(KernelModule(
    name="attention",
    source="cuda_src/attention/verify_attention.cu",
    params_header="attention/attention_params.h",
    kernels={**{f"verify_attention_d{d}_{t}": "VerifyAttentionParams"
                for d in (64, 128, 256) for t in ("f16", "bf16")},
             **{f"verify_attention_merge_{t}": "VerifyAttentionMergeParams" for t in ("f16", "bf16")},
             # sm_90, small batch (issue 31): one launch, a cluster of KV splits per head group
             # merged through distributed shared memory (compute_75 / 80: traps, never planned)
             **{f"verify_attention_cluster_d{d}_{t}": "VerifyAttentionParams"
                for d in (64, 128, 256) for t in ("f16", "bf16")}},
))

# verify_attention over 8-bit caches (issue 32): its own translation unit so that the 16-bit
# kernels stay untouched; the split merge is the attention module's verify_attention_merge_*
register(KernelModule(
    name="verify_attention_kv8",
    source="cuda_src/attention/verify_attention_kv8.cu",
    params_header="attention/attention_params.h",
    kernels={f"verify_attention_kv8_d{d}_{t}_{fmt}": "VerifyAttentionKV8Params"
             for d in (64, 128, 256) for t in ("f16", "bf16") for fmt in KV8_FORMATS},
    # D=256 holds 128 accumulator + 64 q registers: 8-24 bytes of stack on sm_80 / sm_90 (the
    # 16-bit kernel sits at 252 registers there too). int8 D=128 bf16 q at 128 registers (four
    # CTAs an SM, s37): 4 bytes spilled, 8 of stack, as measured. Others have no stack frame.
    allow_local=tuple(f"verify_attention_kv8_d256_{t}_{fmt}"
                      for t in ("f16", "bf16") for fmt in KV8_FORMATS)
    + ("verify_attention_kv8_d128_bf16_int8",),
))

# the attention family's second translation unit: rope + append_kv fused (its launcher is
# pyx/_attention.pyx, found from the params header's folder)
register(KernelModule(
    name="rope_append_kv",
    source="cuda_src/attention/rope_append_kv.cu",
    params_header="attention/attention_params.h",
    kernels={f"rope_append_kv_{t}": "RopeAppendKVParams" for t in ("f32", "f16", "bf16")},
))

register(KernelModule(
    name="gdn",
    source="cuda_src/gdn/gdn.cu",
    params_header="gdn/gdn_params.h",
    kernels={f"gdn_{op}{mma}_{lay}_d{d}_{t}": ("GdnCommitParams" if op == "commit" else "GdnVerifyParams")
             for op in ("verify", "commit", "verify_fused") for lay in ("kv", "vk") for d in (64, 128)
             for t in ("f32", "f16", "bf16")
             # _mma: 16-bit states with tensor-core dots (gdn.cu gdn_verify_mma_impl); _small: the
             # CUDA-core kernels' small-batch form (gdn.cu small_prologue, ops/gdn.py _small_batch)
             for mma in (("", "_mma", "_small") if t != "f32" else ("", "_small"))},
))

# W = 4 forms of the conv kernels (issue 31: compile-time width and dtypes, bit-identical to the
# generic conv1d_verify / conv1d_commit; conv.cu "W = 4, compile-time dtypes"). verify: (x, state,
# journal) with weight, bias and out in x's dtype, the journal in the state's or in x's dtype;
# commit: (journal, state). Which call takes which kernel: specdec_lib/ops/conv.py.
CONV_DTYPES = ("f32", "f16", "bf16")
CONV_W4_VERIFY = tuple((x, s, j) for x in CONV_DTYPES for s in CONV_DTYPES for j in dict.fromkeys((s, x)))
CONV_W4_COMMIT = tuple((j, s) for j in CONV_DTYPES for s in CONV_DTYPES)


def conv_w4_verify_kernel(x, s, j):
    return f"conv1d_verify_w4_{x}_{s}_j{j}"


def conv_w4_commit_kernel(j, s):
    return f"conv1d_commit_w4_{j}_{s}"


register(KernelModule(
    name="conv",
    source="cuda_src/conv/conv.cu",
    params_header="conv/conv_params.h",
    kernels={"conv1d_verify": "ConvVerifyParams", "conv1d_commit": "ConvCommitParams",
             **{conv_w4_verify_kernel(*k): "ConvVerifyParams" for k in CONV_W4_VERIFY},
             **{conv_w4_commit_kernel(*k): "ConvCommitParams" for k in CONV_W4_COMMIT}},
))

register(KernelModule(
    name="sampling",
    source="cuda_src/sampling/spec_sample.cu",
    params_header="sampling/sampling_params.h",
    kernels={**{f"spec_sample_{stage}_{t}": "SpecSampleParams"
                for stage in ("tiles", "threshold", "finish") for t in ("f32", "f16", "bf16")},
             # 16-bit logits only: the exact-value histogram of the filters
             **{f"spec_sample_hist_{t}": "SpecSampleParams" for t in ("f16", "bf16")},
             # sm_90, 16-bit logits, one-hot drafts: one cluster per row + the block chain
             **{f"spec_sample_rows_{t}": "SpecSampleParams" for t in ("f16", "bf16")},
             "spec_sample_chain": "SpecSampleParams",
             # sm_90, small calls (one wave of clusters): the rows layout, shorter chain
             **{f"spec_sample_small_{t}": "SpecSampleParams" for t in ("f16", "bf16")},
             "spec_sample_chain_pre": "SpecSampleParams"},
))

register(KernelModule(
    name="sequence",
    source="cuda_src/sequence/sequence.cu",
    params_header="sequence/sequence_params.h",
    kernels={"seq_stop": "SeqStopParams", "seq_advance": "SeqAdvanceParams",
             "seq_build_block": "SeqBuildBlockParams"},
))

register(KernelModule(
    name="draft",
    source="cuda_src/draft/draft.cu",
    params_header="draft/draft_params.h",
    kernels={**{f"draft_carry_v{u}": "DraftCarryParams" for u in (1, 2, 4, 8, 16)},
             **{f"capture_hidden_{t}": "CaptureHiddenParams" for t in ("f32", "f16", "bf16")},
             **{f"draft_combine_{t}_w{w}": "DraftCombineParams" for t, w in NORM_DTYPES},
             "draft_map_tokens": "DraftMapTokensParams",
             "ngram_propose": "NgramProposeParams"},
))

register(KernelModule(
    name="layers",
    source="cuda_src/layers/layers.cu",
    params_header="layers/layers_params.h",
    kernels={**{f"rms_norm{u}_{t}_w{w}": "RmsNormParams" for t, w in NORM_DTYPES
                for u in ("", "_unit")},
             **{f"{op}_{t}": p for op, p in (("rope", "RopeParams"), ("silu_mul", "SiluMulParams"))
                for t in ("f32", "f16", "bf16")},
             **{f"gated_rms_norm_{t}_x{x}_w{w}": "GatedRmsNormParams"
                for t, x, w in GATED_NORM_DTYPES}},
    # ptxas 13.0 spills 8 bytes of the weights-first rms_norm's bf16 / f32-weight form on
    # sm_86 / sm_89 only (their cubins are built from the compute_80 PTX, which sm_80 fits)
    allow_local=("rms_norm_bf16_wf32",),
))

# the layers family's small-M GEMM (its own translation unit; launcher: pyx/_layers.pyx)
register(KernelModule(
    name="linear",
    source="cuda_src/layers/linear.cu",
    params_header="layers/linear_params.h",
    kernels={**{f"linear_{t}_w{w}": "LinearParams" for t, w in NORM_DTYPES if t != "f32"},
             # few rows (ops.layers._linear_small): m rows a CTA, k units a lane
             **{f"linear_m{m}_k{k}_{t}_w{w}": "LinearParams" for t, w in NORM_DTYPES
                if t != "f32" for m, k in LINEAR_SMALL_SHAPES if (m, k) != (4, 8) or w == t},
             # ... four columns a warp (the default where instantiated: ops.layers._linear_small)
             **{f"linear_w4_m{m}_k{k}_{t}_w{w}": "LinearParams" for t, w in NORM_DTYPES
                if t != "f32" for m, k in LINEAR_WIDE_SHAPES}},
))

# linear's few-row form on the tensor cores (ops.layers.TUNING["linear_mma"]: <= 8 rows, K <=
# 256 x units a lane, 16-byte rows): mma m16n8k16 with the weights as A, its own translation unit
# (launcher: pyx/_layers.pyx, the same LinearParams)
LINEAR_MMA_UNITS = (4, 8)     # units a lane: K <= 1024, K <= 2048


def linear_mma_kernel(units, t, w):
    return f"linear_mma_k{units}_{t}_w{w}"


register(KernelModule(
    name="linear_mma",
    source="cuda_src/layers/linear_mma.cu",
    params_header="layers/linear_params.h",
    kernels={linear_mma_kernel(u, t, w): "LinearParams" for t, w in NORM_DTYPES if t != "f32"
             for u in LINEAR_MMA_UNITS},
))

# the float64 GEMM of the host models on the orchestrator's cuda backend (a plain kernel, so
# that a round holding the host model's math can be captured as a CUDA graph; launcher:
# pyx/_layers.pyx; caller: specdec_lib/orchestrator/backends.py)
register(KernelModule(
    name="linear_f64",
    source="cuda_src/layers/linear_f64.cu",
    params_header="layers/linear_f64_params.h",
    kernels={"linear_f64": "LinearF64Params"},
))
