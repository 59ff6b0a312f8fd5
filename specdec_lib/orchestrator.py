"""SpeculativeDecoder: one chain-speculative round after another, on either backend.

The host stack supplies two objects:

``target``  ``reset(batch, max_len)``; ``forward(tokens, positions, cu_q, seq_lens,
            finished) -> (logits [T, V] float32, hidden [T, H] float32)`` (calls
            append_kv / verify_attention / conv1d_verify / gdn_verify; writes no
            recurrent state); ``commit(cu_q, accept_len)`` (gdn_commit / conv1d_commit).
            Optional: ``prefill(tokens, positions, cu_q, seq_lens, finished, *, row_counts)
            -> (None, hidden)`` runs whole prompts of fresh sequences (any length) in one
            pass; without it prompts go through ``forward`` in blocks of 16 rows.
            ``hidden_dtype`` (default float32) is the dtype of ``hidden`` and the carry.
``draft``   ``propose(carry [B, H], last_token [B], k) -> draft tokens [B, k]``; may be
            None when ``num_speculative_tokens == 0`` (target-only decoding). A draft with
            ``uses_context = True`` is called ``propose(carry, last_token, k, context)`` where
            ``context`` holds the device buffers ``prompt [B, P]``, ``prompt_lens [B]``,
            ``output [B, O]``, ``output_lens [B]`` (prompt-lookup drafting reads them).

Each round, on one stream and with no synchronisation inside it::

    seq_build_block -> target.forward -> spec_sample -> seq_stop -> target.commit
        -> seq_advance -> draft_carry (a draft that reads the carry) -> draft.propose

The block of every sequence, finished ones included, is ``k + 1`` rows, so ``T`` is fixed
and the round needs no host value (graph-capturable); finished rows are computed and
never committed. After the round the host reads ``finished`` and ``num_accepted`` (two
small copies) to know whether to stop and for the metrics. With ``cuda_graph=True`` the
first round runs eagerly and is then captured once as a CUDA graph (cupy math, library
kernels, draft pass); every later round is one graph launch, its inputs (lengths, steps,
seeds, tokens) living in device buffers that the graph reads.

Backends: ``"reference"`` (numpy arrays, ``specdec_lib.reference`` ops), ``"cuda"``
(cupy arrays, ``specdec_lib.ops``, all on one non-blocking stream of the backend's) and
``"torch"`` (torch tensors, ``specdec_lib.ops`` on torch's current stream, the round captured
with ``torch.cuda.CUDAGraph``). cupy and torch are imported only by their backends.
"""
from __future__ import annotations

import contextlib
import inspect
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from .reference import sequence as _seq_ref

MAX_BLOCK_ROWS = 16          # verify_attention's limit on rows per sequence
FINISH_REASONS = _seq_ref.FINISH_REASONS
SLOT_IDLE = 255              # finished[] of a slot with no request: never committed
# prefill="auto" admits this many prompts or more in one batched pass rather than one
# bucket replay each: on the H200 a SmolLM2 bucket replay (64-256 rows) takes 1.49-1.58 ms
# of GPU (s14, flash prefill attention; 1.66-1.76 with a draft head's prefill), one eager
# batched pass of 32 prompts 23 ms (s11), ~20 ms of it fixed host enqueueing: 16 replays
# cost about one batched pass.
BATCHED_PREFILL_FROM = 16

_OPS = ("append_kv", "rope_append_kv", "verify_attention", "conv1d_verify", "conv1d_commit",
        "gdn_verify", "gdn_commit", "spec_sample", "seq_stop", "seq_advance", "seq_build_block",
        "draft_carry", "capture_hidden", "draft_combine", "draft_map_tokens", "ngram_propose",
        "rms_norm", "rope", "silu_mul")
# (name on a backend, op) for every op a backend carries: the _OPS under their own names, and
# ``row_linear`` = ops.linear (the row-invariant GEMM), kept off ``linear``, which on the cuda
# backend is the host models' float64 GEMM (and absent elsewhere: tiny_hybrid falls back to
# x @ w.T)
_BACKEND_OPS = tuple(zip(_OPS, _OPS)) + (("row_linear", "linear"),)
_REFERENCE_MODULES = ("copy", "attention", "conv", "gdn", "sampling", "sequence", "draft",
                      "layers")


def reference_backend():
    """numpy arrays, reference ops (float64 math inside each op)."""
    import importlib
    mods = [importlib.import_module(f"specdec_lib.reference.{m}")   # (the package's
            for m in _REFERENCE_MODULES]                              # `copy` is a function)
    gdn = mods[3]
    ns = SimpleNamespace(name="reference", xp=np, kv_dtype=np.float32,
                         gdn_journal_width=gdn.gdn_journal_width,
                         to_host=np.asarray, synchronize=lambda: None,
                         device_synchronize=lambda: None,
                         stream_scope=contextlib.nullcontext, capture=None)
    for name, op in _BACKEND_OPS:
        setattr(ns, name, next(getattr(m, op) for m in mods if hasattr(m, op)))
    return ns


def _bind_ops(ns, ops, backend, stream_of, alloc_bytes):
    """Put every op of ``_BACKEND_OPS`` on ``ns`` (under its backend name) with
    ``stream=stream_of()`` (read at each call) and no host-side index checks; ``spec_sample``
    gets a workspace per (T, V) from ``alloc_bytes(n)``, allocated once and reused (it never
    allocates itself)."""
    missing = [op for _, op in _BACKEND_OPS if not hasattr(ops, op)]
    if missing:
        raise RuntimeError(f"{backend} backend: specdec_lib.ops lacks " + ", ".join(missing))

    def bind(fn):
        # host-side index checks copy to the host and synchronise: never inside a round
        # (the kernels skip or flag bad indices instead of faulting)
        takes_check = "check_indices" in inspect.signature(fn).parameters

        def call(*a, **kw):
            kw.setdefault("stream", stream_of())
            if takes_check:
                kw.setdefault("check_indices", False)
            return fn(*a, **kw)
        return call
    for name, op in _BACKEND_OPS:
        setattr(ns, name, bind(getattr(ops, op)))
    workspaces = {}
    sample = ns.spec_sample

    def spec_sample(logits, *args, **kw):
        T, V = logits.shape
        ws = workspaces.get((T, V))
        if ws is None:
            ws = workspaces[(T, V)] = alloc_bytes(ops.spec_sample_workspace_size(T, V))
        kw.setdefault("workspace", ws)
        return sample(logits, *args, **kw)
    ns.spec_sample = spec_sample


def cuda_backend(device: int = 0):
    """cupy arrays, library kernels and cupy math on one non-blocking stream of the
    backend's own (``ns.stream``; the decoder makes it cupy's current stream while it
    runs). ``ns.capture(fn)`` records ``fn``'s work as a CUDA graph and returns a replay
    function. Raises if cupy or the compiled ops are unavailable."""
    import cupy  # noqa: F401  (the host model's dense math)
    from . import ops
    from .reference.gdn import gdn_journal_width
    cupy.cuda.Device(device).use()
    # a stream of our own: capture is impossible on the legacy stream, and a non-blocking
    # stream keeps other libraries' legacy-stream work from serialising with the round
    stream = cupy.cuda.Stream(non_blocking=True)
    ns = SimpleNamespace(name="cuda", xp=cupy, kv_dtype=cupy.float16,
                         gdn_journal_width=gdn_journal_width, device=device, stream=stream,
                         to_host=lambda a: cupy.asnumpy(a, stream=stream),
                         synchronize=stream.synchronize, stream_scope=lambda: stream,
                         device_synchronize=lambda: cupy.cuda.Device().synchronize())
    _bind_ops(ns, ops, "cuda", lambda: stream.ptr, lambda n: cupy.empty(n, cupy.uint8))

    def capture(fn):
        """Run nothing; record ``fn()``'s work on the stream as a graph. Memory that
        ``fn`` allocates comes from a pool private to the graph and lives as long as
        the returned replay function, so later allocations can never alias it."""
        pool = cupy.cuda.MemoryPool()
        with stream, cupy.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            try:
                fn()
            finally:
                graph = stream.end_capture()

        def replay(_keep=(graph, pool)):
            graph.launch(stream)
        return replay
    ns.capture = capture
    ns.linear = _cupy_linear(cupy)
    return ns


_LINEAR_F64 = r"""
extern "C" __global__ void linear_f64(const double* x, const double* w, double* y,
                                      int M, int N, int K) {
  // one warp per output (m, n): lanes stride K (coalesced rows of x and w), then a fixed
  // butterfly, so the bits are the same every run and in every graph replay
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), m = blockIdx.y;
  if (n >= N) return;
  const double* xr = x + (long long)m * K;
  const double* wr = w + (long long)n * K;
  double acc = 0.0;
  for (int k = lane; k < K; k += 32) acc = fma(xr[k], wr[k], acc);
  for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
  if (lane == 0) y[(long long)m * N + n] = acc;
}
"""


def _cupy_linear(cupy):
    """float64 x [M, K] @ w [N, K].T for host models on the cuda backend. cupy refuses to
    call cuBLAS while a stream is being captured, so a round holding cupy matmuls could
    not become a CUDA graph; this plain kernel can (and gives the same bits eagerly)."""
    kern = cupy.RawKernel(_LINEAR_F64, "linear_f64")

    def linear(x, w):
        x = cupy.ascontiguousarray(x, dtype=cupy.float64)
        w = cupy.ascontiguousarray(w, dtype=cupy.float64)
        M, K = x.shape
        N = w.shape[0]
        if w.shape[1] != K or M > 65535:
            raise ValueError(f"linear: x [{M}, {K}] (at most 65535 rows) and w {tuple(w.shape)}")
        y = cupy.empty((M, N), dtype=cupy.float64)
        if M and N:
            kern(((N + 7) // 8, M), (256,), (x, w, y, cupy.int32(M), cupy.int32(N),
                                             cupy.int32(K)))
        return y
    return linear


class _TorchArrays:
    """The few numpy-style constructors the decoder uses (``xp.zeros``, ``xp.asarray``, ...),
    on torch tensors of one device, so the round code is the same on every backend."""

    def __init__(self, torch, device):
        self.torch, self.device = torch, device
        for name in ("int32", "int64", "uint8", "float32", "float64", "bfloat16", "float16"):
            setattr(self, name, getattr(torch, name))

    def _dt(self, dtype):
        return self.torch.float32 if dtype is None else dtype

    def zeros(self, shape, dtype=None):
        return self.torch.zeros(shape, dtype=self._dt(dtype), device=self.device)

    def ones(self, shape, dtype=None):
        return self.torch.ones(shape, dtype=self._dt(dtype), device=self.device)

    def full(self, shape, value, dtype=None):
        return self.torch.full(shape if isinstance(shape, tuple) else (shape,), value,
                               dtype=self._dt(dtype), device=self.device)

    def empty(self, shape, dtype=None):
        return self.torch.empty(shape, dtype=self._dt(dtype), device=self.device)

    def empty_like(self, a):
        return self.torch.empty_like(a)

    def arange(self, n, dtype=None):
        return self.torch.arange(n, dtype=dtype or self.torch.int64, device=self.device)

    def asarray(self, a, dtype=None):
        t = a if isinstance(a, self.torch.Tensor) else self.torch.as_tensor(np.asarray(a))
        return t.to(self.device, dtype) if dtype is not None else t.to(self.device)

    def where(self, cond, a, b):
        return self.torch.where(cond, a, b)


def torch_backend(device: int = 0):
    """torch tensors on one GPU; library ops on torch's *current* stream (read at each call,
    so inside ``torch.cuda.graph`` they go to the capture stream); ``ns.capture(fn)`` records
    ``fn``'s work with ``torch.cuda.CUDAGraph`` and returns its replay. The host model's dense
    math is torch (cuBLAS, SDPA), which captures fine."""
    import torch
    from . import ops
    from .reference.gdn import gdn_journal_width
    if not torch.cuda.is_available():
        raise RuntimeError("torch backend: torch sees no CUDA GPU")
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    ns = SimpleNamespace(name="torch", xp=_TorchArrays(torch, dev), kv_dtype=torch.bfloat16,
                         device=dev, gdn_journal_width=gdn_journal_width,
                         to_host=lambda a: a.cpu().numpy(),
                         synchronize=torch.cuda.synchronize,
                         device_synchronize=torch.cuda.synchronize,
                         stream_scope=contextlib.nullcontext)

    _bind_ops(ns, ops, "torch", lambda: torch.cuda.current_stream().cuda_stream,
              lambda n: torch.empty(n, dtype=torch.uint8, device=dev))

    def capture(fn):
        """Record ``fn()`` as a CUDA graph (its allocations come from the graph's private
        pool, alive as long as the replay function)."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            fn()

        def replay(_keep=graph):
            graph.replay()
        return replay
    ns.capture = capture
    return ns


BACKENDS = ("reference", "cuda", "torch")


def make_backend(name: str = "reference", device: int = 0):
    if name == "reference":
        return reference_backend()
    if name == "cuda":
        return cuda_backend(device)
    if name == "torch":
        return torch_backend(device)
    raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {name!r}")


@dataclass
class Request:
    """One generation request. ``temperature <= 0`` is greedy. Stop sequences may span
    rounds (matched against the request's own output)."""
    prompt: Sequence[int]
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    stop_token_ids: Sequence[int] = ()
    stop_sequences: Sequence[Sequence[int]] = ()


@dataclass
class Result:
    tokens: list
    finish_reason: str


@dataclass
class Metrics:
    num_speculative_tokens: int = 0
    rounds: int = 0
    row_rounds: int = 0              # (running sequence, round) pairs: target rows verified
    proposed: int = 0                # drafts proposed to running sequences
    accepted: int = 0                # drafts accepted (before stop conditions)
    accept_counts: list = field(default_factory=list)   # [j]: rounds with > j accepted
    emitted: int = 0                 # tokens committed to outputs
    wall_s: float = 0.0
    launch_s: float = 0.0            # host time enqueueing rounds 2.. (no syncs inside)
    launched_rounds: int = 0
    graph_captured: bool = False
    capture_s: float = 0.0           # time spent recording the round graph (not decoding)
    prefill_s: float = 0.0           # host time of the prefill passes (their GPU work overlaps)

    @property
    def host_us_per_round(self):
        """Mean host time to enqueue one round (eager ops, or one graph launch)."""
        return 1e6 * self.launch_s / self.launched_rounds if self.launched_rounds else float("nan")

    @property
    def acceptance_rate(self):
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def mean_accepted_length(self):
        """Tokens emitted per sequence per target pass (accepted drafts + 1)."""
        return (self.accepted + self.row_rounds) / self.row_rounds if self.row_rounds else 0.0

    @property
    def per_position_acceptance(self):
        """P(draft j accepted), j = 0..k-1, over running (sequence, round) pairs."""
        return [c / self.row_rounds if self.row_rounds else float("nan")
                for c in self.accept_counts]

    @property
    def tokens_per_s(self):
        """Tokens emitted per second of decoding: prefill included, graph capture not."""
        t = self.wall_s - self.capture_s
        return self.emitted / t if t > 0 else float("nan")

    @property
    def decode_tokens_per_s(self):
        """Tokens emitted per second with the prefill's host time left out too (its GPU work
        runs behind the enqueueing, so this is decoding alone, up to that tail)."""
        t = self.wall_s - self.capture_s - self.prefill_s
        return self.emitted / t if t > 0 else float("nan")


def _bucket_size(nb, B):
    return 2 * nb + 2 * B + 2


def _bucket_fields(a, nb, B):
    """The fields of a prefill bucket's input array ``a`` (int32, ``_bucket_size``), as views:
    tokens [nb], next [nb] (the draft head's token per row), cu_q [B+1], valid [B], slot [1];
    the same layout on the host staging array and on the device buffer the graph reads."""
    c, v = 2 * nb, 2 * nb + B + 1
    return SimpleNamespace(all=a, tokens=a[:nb], next=a[nb:c], cu_q=a[c:v],
                           valid=a[v:v + B], slot=a[v + B:])


class SpeculativeDecoder:
    """Owns the round buffers and runs rounds until every request has finished."""

    def __init__(self, target, draft=None, *, num_speculative_tokens: int = 3,
                 backend="reference", max_stop_ids: int = 4, max_stop_sequences: int = 2,
                 max_stop_length: int = 4, cuda_graph: bool = False,
                 capture_first: bool = False, prefill: str = "auto", max_len=None):
        k = int(num_speculative_tokens)
        if not 0 <= k < MAX_BLOCK_ROWS:
            raise ValueError(f"num_speculative_tokens: {k} outside 0..{MAX_BLOCK_ROWS - 1}")
        if k > 0 and draft is None:
            raise ValueError("draft: required when num_speculative_tokens > 0")
        self.target, self.draft, self.k = target, draft, k
        # drafts with their own KV cache (trained heads) read the target's block rows
        self._block_draft = k > 0 and getattr(draft, "uses_target_block", False)
        # the carry (hidden of each sequence's last committed row) feeds only a draft that
        # proposes from it: not a head that reads the block, not prompt lookup, not k = 0
        self._uses_carry = (k > 0 and not self._block_draft
                            and not getattr(draft, "uses_context", False))
        self.be = make_backend(backend) if isinstance(backend, str) else backend
        self.max_stop_ids = max_stop_ids
        self.max_stop_sequences = max_stop_sequences
        self.max_stop_length = max_stop_length
        # cuda_graph: capture the round (target pass, ops, draft pass) once per generate()
        # and replay it; the target/draft must then enqueue work without host syncs.
        # Ignored on backends that cannot capture (reference).
        self.cuda_graph = bool(cuda_graph)
        # capture_first: record the graph before the first round instead of after an eager
        # one (for a process that already ran a round of the same shapes: libraries loaded,
        # lazy allocations made). Capture runs nothing, so the first replay is round one.
        self.capture_first = bool(capture_first)
        # prefill: "batched" = every prompt admitted at a round boundary in one pass of the
        # target's prefill (eager); "bucketed" = one prompt at a time, its rows padded to a
        # length bucket (pads are dead rows past the prompt, like rejected drafts), so the
        # pass has one shape per bucket and, with cuda_graph, is recorded once per bucket and
        # replayed; "auto" = bucketed where the round is graph-captured and the target pads
        # (``pads_prefill``), batched otherwise and for bursts of BATCHED_PREFILL_FROM prompts
        if prefill not in ("auto", "batched", "bucketed"):
            raise ValueError(f"prefill: expected 'auto', 'batched' or 'bucketed', got {prefill!r}")
        if prefill == "bucketed" and not getattr(target, "pads_prefill", False):
            raise ValueError("prefill: 'bucketed' needs a target with a padded one-pass prefill "
                             "(pads_prefill = True)")
        self.prefill = prefill
        # max_len: positions per slot (prompt + max_new_tokens + k + 1) for every call; with
        # it the buffers, caches and graphs of one call serve the next call of the same batch
        # (no re-capture); without it they are sized per call (and kept while sizes repeat)
        if max_len is not None and int(max_len) < k + 2:
            raise ValueError(f"max_len: {max_len} leaves no room for a prompt and k + 1 rows")
        self.max_len = None if max_len is None else int(max_len)
        self._state = None
        self.metrics = Metrics(num_speculative_tokens=k, accept_counts=[0] * k)

    def reset_metrics(self):
        """Start counting afresh (e.g. after a warm-up call; buffers and graphs are kept)."""
        self.metrics = Metrics(num_speculative_tokens=self.k, accept_counts=[0] * self.k)

    # ------------------------------------------------------------------ buffers
    @staticmethod
    def positions_needed(reqs, k):
        """Positions a slot needs for the longest of ``reqs`` at ``k`` drafts (prompt +
        max_new_tokens + a last block of k + 1 rows): the ``max_len`` that fits them."""
        return max(len(r.prompt) + r.max_new_tokens for r in reqs) + k + 1

    def _shape(self, reqs, slots):
        """Everything the buffers, caches and graphs of a call depend on: (slots, positions
        per slot, stop ids, stop sequences and their length, output and prompt widths,
        whether any request filters). Equal shapes let a call reuse the last one's."""
        need = [self.positions_needed([r], self.k) for r in reqs]
        if self.max_len is not None:
            i = int(np.argmax(need))
            if need[i] > self.max_len:
                raise ValueError(f"requests[{i}]: prompt + max_new_tokens + k + 1 = {need[i]} "
                                 f"positions exceed max_len={self.max_len}")
        max_len = self.max_len or max(need)
        S = max([self.max_stop_ids] + [len(r.stop_token_ids) for r in reqs])
        NS = max([self.max_stop_sequences] + [len(r.stop_sequences) for r in reqs])
        M = max([self.max_stop_length] + [len(s) for r in reqs for s in r.stop_sequences])
        out_w = self.max_len or max(r.max_new_tokens for r in reqs)
        prompt_w = self.max_len or max(len(r.prompt) for r in reqs)
        # known for the whole call (so one captured graph fits every round): when no
        # sampled request filters, spec_sample skips its two filter launches
        filters = any(r.temperature > 0 and (r.top_k > 0 or r.top_p < 1 or r.min_p > 0)
                      for r in reqs)
        return (int(slots), max_len, S, NS, M, out_w, prompt_w, filters)

    def _buffers(self, shape):
        """Device buffers of a call's ``shape``; every slot starts idle (``finished =
        SLOT_IDLE``: computed each round, never committed)."""
        xp, K = self.be.xp, self.k
        B, _, S, NS, M, out_w, prompt_w, _ = shape
        i32 = xp.int32
        h = dict(stop_ids=xp.full((B, S), -1, dtype=i32), stop_seqs=xp.full((B, NS, M), -1, dtype=i32),
                 max_new=xp.ones(B, dtype=i32), temperature=xp.zeros(B, dtype=xp.float32),
                 top_k=xp.zeros(B, dtype=i32), top_p=xp.ones(B, dtype=xp.float32),
                 min_p=xp.zeros(B, dtype=xp.float32), seed=xp.zeros(B, dtype=xp.int64),
                 step=xp.zeros(B, dtype=xp.int64), seq_lens=xp.zeros(B, dtype=i32),
                 finished=xp.full(B, SLOT_IDLE, dtype=xp.uint8),
                 out_tokens=xp.full((B, out_w), -1, dtype=i32),
                 out_lens=xp.zeros(B, dtype=i32), last_token=xp.zeros(B, dtype=i32),
                 num_draft=xp.full(B, K, dtype=i32), draft_tokens=xp.zeros((B, K), dtype=i32),
                 cu_q=xp.zeros(B + 1, dtype=i32), block_tokens=xp.zeros(B * (K + 1), dtype=i32),
                 positions=xp.zeros(B * (K + 1), dtype=i32),
                 draft_ids=xp.zeros(max(B * K, 1), dtype=i32), num_accepted=xp.zeros(B, dtype=i32),
                 emitted=xp.full((B, K + 1), -1, dtype=i32), status=xp.zeros(B, dtype=i32),
                 accept_len=xp.zeros(B, dtype=i32),
                 # the context prompt-lookup drafts search: prompt ++ out_tokens[:out_lens]
                 prompt=xp.zeros((B, prompt_w), dtype=i32),
                 prompt_lens=xp.zeros(B, dtype=i32))
        return SimpleNamespace(**h)

    def _admit(self, buf, carry, admit):
        """Put requests into free slots: per-slot parameters, fresh recurrent state, a
        zero carry, and running status. ``admit`` is [(slot, Request)]."""
        xp = self.be.xp
        slots = [b for b, _ in admit]
        reset = getattr(self.target, "reset_slots", None)
        if reset is None and any(self._used[b] for b in slots):
            raise TypeError("target: reusing a slot needs target.reset_slots(slot_ids)")
        if reset is not None:
            reset(xp.asarray(np.asarray(slots, np.int32)))
        M = buf.stop_seqs.shape[2]
        for b, r in admit:
            self._used[b] = True
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
            carry[b] = 0

    # ------------------------------------------------------------------ prefill
    @property
    def _can_capture(self):
        """Rounds and prefill buckets are recorded as graphs (cuda_graph on a backend that can)."""
        return self.cuda_graph and self.be.capture is not None

    def _bucketed(self):
        if self.prefill == "auto":
            return self._can_capture and getattr(self.target, "pads_prefill", False)
        return self.prefill == "bucketed"

    def _prefill(self, admit, buf, carry, st):
        """Commit prompt[:-1] of every admitted request and propose its first drafts; in
        buckets (``_prefill_bucket``, one prompt at a time) or batched (``_prefill_batched``).
        One-token prompts have nothing to prefill: they take the batched path's empty pass."""
        long = [(b, r) for b, r in admit if len(r.prompt) >= 2]
        if not self._bucketed() or (self.prefill == "auto" and len(long) >= BATCHED_PREFILL_FROM):
            return self._prefill_batched(admit, buf, carry)
        for b, r in long:
            self._prefill_bucket(b, r, buf, carry, st)
        if len(long) < len(admit):
            self._prefill_batched([(b, r) for b, r in admit if len(r.prompt) < 2], buf, carry)

    @staticmethod
    def prefill_bucket(n, max_len):
        """Rows a prompt of ``n`` prefill rows is padded to: the next power of two from 16
        up to 512, then the next multiple of 256; never past the slot's ``max_len``."""
        nb = max(16, 1 << (n - 1).bit_length()) if n <= 512 else -(-n // 256) * 256
        return min(nb, max_len)

    def _prefill_bucket(self, b, r, buf, carry, st):
        """Prefill request ``r`` alone into slot ``b``, its n = len(prompt) - 1 rows padded
        to the bucket's nb rows (token 0 at positions n..nb-1: their K/V land past the
        committed length, dead rows that later appends overwrite, and the causal attention
        keeps them out of the real rows). The pass reads only device buffers of the bucket
        (tokens, the draft's next tokens, cu_q and the valid counts that name slot ``b``),
        so with ``cuda_graph`` it is recorded on its bucket's first use and replayed after."""
        xp, B = self.be.xp, carry.shape[0]
        n = len(r.prompt) - 1
        nb = self.prefill_bucket(n, st.shape[1])
        pb = st.prefills.get(nb)
        if pb is None:
            pb = st.prefills[nb] = _bucket_fields(xp.zeros(_bucket_size(nb, B), dtype=xp.int32),
                                                  nb, B)
            pb.positions, pb.replay = xp.arange(nb, dtype=xp.int32), None
        host = _bucket_fields(np.zeros(_bucket_size(nb, B), np.int32), nb, B)
        host.tokens[:n] = r.prompt[:-1]
        host.next[:n] = r.prompt[1:]
        host.cu_q[b + 1:] = nb                              # slot b holds all nb rows
        host.valid[b] = n
        host.slot[0] = b
        pb.all[...] = xp.asarray(host.all)                  # one copy for every field

        def prefill_pass():
            self._prefill_pass(pb, nb, buf, carry)
        if pb.replay is not None:
            pb.replay()
            return
        prefill_pass()          # the bucket's first use runs eagerly (libraries initialised)
        if self._can_capture:
            tc = time.perf_counter()
            pb.replay = self.be.capture(prefill_pass)
            self.metrics.capture_s += time.perf_counter() - tc

    def _prefill_pass(self, pb, nb, buf, carry):
        """The bucket's pass: target prefill, commit, carry and first drafts of the slot
        that ``pb.slot`` names (other slots have 0 rows and keep their drafts)."""
        xp, be, B = self.be.xp, self.be, carry.shape[0]
        counts = [nb] + [0] * (B - 1)       # the plan's row split (one prompt of nb rows);
        # which slot holds it is device data (cu_q), so one recording serves every slot
        _, hidden = self.target.prefill(pb.tokens, pb.positions, pb.cu_q, buf.seq_lens,
                                        buf.finished, row_counts=counts)
        self.target.commit(pb.cu_q, pb.valid)
        buf.seq_lens += pb.valid
        if self._uses_carry:
            new_carry = xp.empty_like(carry)
            be.draft_carry(hidden, pb.cu_q, pb.valid, new_carry)
            carry[pb.slot] = new_carry[pb.slot]
        if not self.k:
            return
        if self._block_draft:
            proposal = self.draft.propose_block(SimpleNamespace(
                hidden=hidden, tokens=pb.next, positions=pb.positions, cu_q=pb.cu_q,
                valid=pb.valid, seq_lens=buf.seq_lens, finished=buf.finished,
                row_counts=counts), self.k)
        else:
            proposal = self._propose(buf, carry)
        buf.draft_tokens[pb.slot] = proposal[pb.slot]

    def _prefill_batched(self, admit, buf, carry):
        """Commit prompt[:-1] of every admitted request (other slots get 0 rows): in one
        pass through ``target.prefill`` where the target has it, else in blocks of <= 16 rows
        through ``forward``; carry[b] = hidden of the last prompt row (zeros for one-token
        prompts); then propose the admitted slots' first drafts."""
        xp, be = self.be.xp, self.be
        B = carry.shape[0]
        todo = [[] for _ in range(B)]
        for b, r in admit:
            todo[b] = list(r.prompt[:-1])
        done = [0] * B
        whole = getattr(self.target, "prefill", None)
        block_draft = self._block_draft     # then it prefills on the target's prompt rows
        if block_draft and whole is None:
            raise TypeError("draft: a head with its own cache needs target.prefill (one pass)")
        prompts = {b: list(r.prompt) for b, r in admit}
        proposal = None
        while any(done[b] < len(todo[b]) for b in range(B)):
            qs = [len(todo[b]) - done[b] if whole else min(MAX_BLOCK_ROWS, len(todo[b]) - done[b])
                  for b in range(B)]
            cu = np.concatenate([[0], np.cumsum(qs)]).astype(np.int32)
            toks = np.concatenate([todo[b][done[b]:done[b] + qs[b]] for b in range(B)]).astype(np.int32)
            pos = np.concatenate([np.arange(done[b], done[b] + qs[b]) for b in range(B)]).astype(np.int32)
            cu_q = xp.asarray(cu)
            acc = xp.asarray(np.asarray(qs, np.int32))
            if whole:
                logits, hidden = whole(xp.asarray(toks), xp.asarray(pos), cu_q, buf.seq_lens,
                                       buf.finished, row_counts=qs)
            else:
                logits, hidden = self.target.forward(xp.asarray(toks), xp.asarray(pos), cu_q,
                                                     buf.seq_lens, buf.finished)
            self.target.commit(cu_q, acc)
            buf.seq_lens += acc
            if self._uses_carry:
                new_carry = xp.empty_like(carry)
                be.draft_carry(hidden, cu_q, acc, new_carry)
                last = np.asarray([done[b] + qs[b] == len(todo[b]) and qs[b] > 0
                                   for b in range(B)])
                rows = xp.asarray(np.flatnonzero(last))
                carry[rows] = new_carry[rows]
            if block_draft:     # the draft's own prefill: each prompt row fed its next token
                nxt = np.concatenate([prompts[b][done[b] + 1:done[b] + qs[b] + 1]
                                      if qs[b] else [] for b in range(B)])
                proposal = self.draft.propose_block(SimpleNamespace(
                    hidden=hidden, tokens=xp.asarray(nxt.astype(np.int32)),
                    positions=xp.asarray(pos), cu_q=cu_q, valid=acc, seq_lens=buf.seq_lens,
                    finished=buf.finished, row_counts=qs), self.k)
            done = [done[b] + qs[b] for b in range(B)]
        if self.k:
            rows = xp.asarray(np.asarray([b for b, _ in admit], np.int64))
            if not block_draft:
                proposal = self._propose(buf, carry)
            elif proposal is None:      # one-token prompts only: nothing to prefill
                proposal = self.draft.propose_block(self._empty_block(buf, B), self.k)
            buf.draft_tokens[rows] = proposal[rows]

    def _empty_block(self, buf, B):
        xp = self.be.xp
        return SimpleNamespace(
            hidden=xp.zeros((0, self.target.hidden_size), dtype=self._carry_dtype),
            tokens=xp.zeros(0, dtype=xp.int32), positions=xp.zeros(0, dtype=xp.int32),
            cu_q=xp.zeros(B + 1, dtype=xp.int32), valid=xp.zeros(B, dtype=xp.int32),
            seq_lens=buf.seq_lens, finished=buf.finished, row_counts=[0] * B)

    def _propose(self, buf, carry):
        if getattr(self.draft, "uses_context", False):
            ctx = SimpleNamespace(prompt=buf.prompt, prompt_lens=buf.prompt_lens,
                                  output=buf.out_tokens, output_lens=buf.out_lens)
            return self.draft.propose(carry, buf.last_token, self.k, ctx)
        return self.draft.propose(carry, buf.last_token, self.k)

    # ------------------------------------------------------------------ rounds
    def _round(self, buf, carry, T, B):
        """Enqueue one round on the backend's stream; no host value is read."""
        be, K = self.be, self.k
        be.seq_build_block(buf.last_token, buf.draft_tokens, buf.num_draft, buf.seq_lens,
                           buf.cu_q, buf.block_tokens, buf.positions, buf.draft_ids)
        logits, hidden = self.target.forward(buf.block_tokens, buf.positions, buf.cu_q,
                                             buf.seq_lens, buf.finished)
        buf.step[...] = buf.seq_lens
        be.spec_sample(logits, buf.cu_q, buf.draft_ids[:T - B], buf.temperature, buf.top_k,
                       buf.top_p, buf.min_p, buf.seed, buf.step, buf.num_accepted,
                       buf.emitted, buf.status, filters=self._filters)
        be.seq_stop(buf.emitted, buf.num_accepted, buf.out_tokens, buf.out_lens,
                    buf.stop_ids, buf.stop_seqs, buf.max_new, buf.accept_len, buf.finished)
        self.target.commit(buf.cu_q, buf.accept_len)
        be.seq_advance(buf.emitted, buf.accept_len, buf.seq_lens, buf.out_tokens,
                       buf.out_lens, buf.last_token, buf.finished)
        if self._uses_carry:
            be.draft_carry(hidden, buf.cu_q, buf.accept_len, carry)
        if self._block_draft:
            # every block row is fed the token emitted after it (row j of sequence b:
            # emitted[b, j]; -1 past the accepted ones, a zero embedding: dead rows)
            buf.draft_tokens[...] = self.draft.propose_block(SimpleNamespace(
                hidden=hidden, tokens=buf.emitted.reshape(-1), positions=buf.positions,
                cu_q=buf.cu_q, valid=buf.accept_len, seq_lens=buf.seq_lens,
                finished=buf.finished, row_counts=None), K)
        elif K:
            buf.draft_tokens[...] = self._propose(buf, carry)

    def generate(self, requests, *, progress=None):
        """Run every request to completion, all in one batch (one slot each); returns
        [Result] in request order. ``progress(done_tokens, total_tokens)`` is called after
        every round if given."""
        reqs = self._check(requests)
        return self.serve(reqs, slots=len(reqs), progress=progress) if reqs else []

    def serve(self, requests, *, slots: int, arrivals=None, progress=None, on_round=None):
        """Continuous batching over ``slots`` slots. Request i may start at round
        ``arrivals[i]`` (default 0); waiting requests take free slots first come first
        served at a round boundary (prefilled there, eagerly), run with the others, and
        free their slot in the round they finish. Every round has the same shape (idle
        slots are computed, never committed), so one captured graph serves all of them.
        Returns [Result] in request order; ``self.slot_stats`` counts admissions/releases.
        ``on_round(round_index)`` is called after every round if given (monitoring).
        """
        reqs = self._check(requests)
        if not reqs:
            return []
        slots = int(slots)
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots}")
        arrivals = [0] * len(reqs) if arrivals is None else [int(a) for a in arrivals]
        if len(arrivals) != len(reqs) or min(arrivals) < 0:
            raise ValueError("arrivals: one round index >= 0 per request")
        with self.be.stream_scope():
            return self._serve(reqs, slots, arrivals, progress, on_round)

    @staticmethod
    def _check(requests):
        reqs = [r if isinstance(r, Request) else Request(**r) for r in requests]
        for i, r in enumerate(reqs):
            if len(r.prompt) < 1:
                raise ValueError(f"requests[{i}].prompt: needs at least one token")
            if r.max_new_tokens < 1:
                raise ValueError(f"requests[{i}].max_new_tokens: must be >= 1")
        return reqs

    def _call_state(self, reqs, B):
        """This call's buffers, carry and graphs: the last call's when its shape repeats and
        nobody reset the target or the draft since (their ``cache_epoch`` unchanged: the
        graphs hold their caches), fresh ones otherwise (caches reset, graphs recorded anew).
        A target without ``cache_epoch`` and ``reset_slots`` gets fresh ones every call."""
        xp = self.be.xp
        shape = self._shape(reqs, B)
        parts = [self.target] + ([self.draft] if self.k and hasattr(self.draft, "reset") else [])

        def epochs():
            return [getattr(p, "cache_epoch", None) for p in parts]
        st = self._state
        if (st is not None and st.shape == shape and hasattr(self.target, "reset_slots")
                and st.epochs == epochs() and None not in st.epochs):
            st.buf.finished[...] = SLOT_IDLE      # every slot idle again; caches stay
            return st
        self._state = None                        # the old graphs go before the new caches
        max_len = shape[1]
        self.be.device_synchronize()              # weights/caches made on other streams are ready
        self.target.reset(B, max_len)
        if len(parts) > 1:
            self.draft.reset(B, max_len)
        self._used = [False] * B
        self._filters = shape[-1]
        self._carry_dtype = getattr(self.target, "hidden_dtype", xp.float32)
        carry = xp.zeros((B, self.target.hidden_size), dtype=self._carry_dtype)
        st = self._state = SimpleNamespace(
            shape=shape, buf=self._buffers(shape), carry=carry, replay=None, prefills={},
            epochs=epochs())
        return st

    def _serve(self, reqs, slots, arrivals, progress, on_round):
        be, K, B = self.be, self.k, slots
        st = self._call_state(reqs, B)
        buf, carry = st.buf, st.carry
        m = self.metrics
        total = sum(r.max_new_tokens for r in reqs)
        T = B * (K + 1)
        order = sorted(range(len(reqs)), key=lambda i: arrivals[i])
        waiting, free, owner = list(order), list(range(B)), [None] * B
        results = [None] * len(reqs)
        stats = self.slot_stats = {"admitted": 0, "released": 0, "max_busy": 0}
        now, emitted = 0, 0
        can_capture = self._can_capture

        def record():
            """The round as a graph; its recording time is kept apart from decoding."""
            tc = time.perf_counter()
            graph = be.capture(lambda: self._round(buf, carry, T, B))
            m.capture_s += time.perf_counter() - tc
            m.graph_captured = True
            return graph
        t0 = time.perf_counter()
        first_round = True
        while waiting or any(o is not None for o in owner):
            admit = []
            while free and waiting and arrivals[waiting[0]] <= now:
                i, b = waiting.pop(0), free.pop(0)
                owner[b] = i
                admit.append((b, reqs[i]))
            busy = [o is not None for o in owner]
            if not any(busy):                  # nobody running: skip to the next arrival
                now = arrivals[waiting[0]]
                continue
            if admit:
                tp = time.perf_counter()
                self._admit(buf, carry, admit)
                self._prefill(admit, buf, carry, st)
                m.prefill_s += time.perf_counter() - tp
                stats["admitted"] += len(admit)
            stats["max_busy"] = max(stats["max_busy"], sum(busy))
            if can_capture and self.capture_first and st.replay is None:
                st.replay = record()
            tl = time.perf_counter()
            if st.replay is not None:
                st.replay()
            else:
                self._round(buf, carry, T, B)
            if not first_round:   # steady state only: the first round compiles and allocates
                m.launch_s += time.perf_counter() - tl
                m.launched_rounds += 1
            first_round = False
            if can_capture and st.replay is None:
                # the first round ran eagerly (cupy kernels compiled, pools and the sampling
                # workspace allocated); every later round replays its graph
                st.replay = record()
            # --- end of the round: two small device->host reads for control and metrics
            running = np.asarray(busy)
            n = be.to_host(buf.num_accepted)[running]
            fin = be.to_host(buf.finished)
            m.rounds += 1
            m.row_rounds += int(running.sum())
            m.proposed += K * int(running.sum())
            m.accepted += int(n.sum())
            for j in range(K):
                m.accept_counts[j] += int((n > j).sum())
            done = [b for b in range(B) if owner[b] is not None and fin[b] != 0]
            if done:
                out_tokens, out_lens = be.to_host(buf.out_tokens), be.to_host(buf.out_lens)
                for b in done:
                    results[owner[b]] = Result(
                        tokens=out_tokens[b, :out_lens[b]].tolist(),
                        finish_reason=FINISH_REASONS.get(int(fin[b]), str(int(fin[b]))))
                    emitted += int(out_lens[b])
                    owner[b] = None
                    free.append(b)
                    stats["released"] += 1
            if on_round is not None:
                on_round(now)
            if progress is not None:
                live = be.to_host(buf.out_lens)
                progress(emitted + sum(int(live[b]) for b in range(B) if owner[b] is not None),
                         total)
            now += 1
        be.synchronize()
        m.wall_s += time.perf_counter() - t0
        m.emitted += emitted
        return results
