"""Drop-in adapters: the sampling entry points inference stacks call today, on ``spec_sample``.

* ``chain_speculative_sampling``: FlashInfer's ``flashinfer.sampling.chain_speculative_sampling``
  (same arguments, same outputs and -1 padding);
* ``rejection_sample``: vLLM v1's ``RejectionSampler.forward(metadata, draft_probs, logits,
  sampling_metadata)`` (duck-typed metadata objects; returns ``sampled_token_ids``).

Switching is one line (``from specdec_lib.adapters import chain_speculative_sampling``).
Both take torch tensors, run ``torch.ops.specdec.spec_sample`` (``specdec_lib.torch_ops``) on
the tensors' device and torch's current stream, allocate only with torch's allocator, and
on CPU tensors run the numpy reference (``specdec_lib.reference.spec_sample``), so CPU CI can
check them. Each docstring lists where the semantics differ from the original. Common to
both: the random numbers come from the library's counter-based Philox keyed by
``(seed[b], step[b], block row, purpose)``, not from the original's RNG, so sampled tokens
differ from the original's for the same seed (same distribution); a block that
``spec_sample`` flags (NaN / +inf in a row, an empty distribution; see
``specdec_lib.reference.sampling``) comes out as all -1 with 0 accepted, and its reason is
written to ``status`` when one is passed. Zero probabilities / -inf logits are ordinary
masked tokens, never a flagged row.

Seeds and steps: the same ``(seed, step)`` (``offset`` in FlashInfer's terms) draws the same
random numbers, so calls that pass them must move ``step`` on every round
(``specdec_lib.advance_step(step)`` on the int64 tensor, or ``step + 1``): reused, a round
with other probabilities draws tokens strongly correlated with the last round's (most often
the same token) instead of independent ones. Calls without them draw fresh seeds per call.
"""
from __future__ import annotations

from typing import Any

import torch

from . import torch_ops as _specdec_torch  # noqa: F401  (registers torch.ops.specdec.*)
from .reference.sampling import STATUS_EMPTY, STATUS_NONFINITE

__all__ = ["chain_speculative_sampling", "rejection_sample", "request_seeds"]

# golden-ratio increment: requests that share one scalar seed get distinct Philox keys
_SEED_STRIDE = 0x9E3779B9


def _spec_sample(*args, **kwargs):
    # the adapters build cu_q themselves (FlashInfer) or check the draft counts on the host
    # (vLLM): the op's own check_indices copy (a synchronisation per call) is never needed
    return torch.ops.specdec.spec_sample(*args, **kwargs, check_indices=False)


def _capturing(device):
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _refuse_flagged_rows(status, bad_draft):
    """The FlashInfer adapter without ``status=``: ValueError naming target_probs for a
    request that spec_sample flagged invalid (NaN / +inf logits = NaN, negative or +inf
    probabilities; a row with no mass), naming draft_probs for NaN or negative draft
    probabilities. One copy to the host: it waits for the call."""
    flags = torch.cat([status, bad_draft.reshape(1).to(status.dtype)]).cpu()
    st = flags[:-1]
    bad = (st == STATUS_NONFINITE) | (st == STATUS_EMPTY)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        why = ("a NaN, negative or +inf probability" if int(st[b]) == STATUS_NONFINITE
               else "a row with no mass (all zero)")
        raise ValueError(f"target_probs: request {b} has {why}; pass status= to get such "
                         f"requests flagged (all -1, 0 accepted) instead")
    if bool(flags[-1]):
        raise ValueError("draft_probs: NaN or negative probabilities; pass status= to skip "
                         "this check (such drafts are then accepted / resampled unspecified)")


def _as_i64(name, value, B, device):
    """int, or int64/uint64 tensor of 1 or B entries -> int64 [B] on ``device`` (uint64 bit
    patterns kept)."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in (torch.int64, torch.uint64):
            raise TypeError(f"{name}: tensor dtype must be int64 or uint64, got {value.dtype}")
        if value.ndim != 1 or value.shape[0] not in (1, B):
            raise ValueError(f"{name}: expected a 1-D tensor of 1 or {B} entries, got shape "
                             f"{list(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name}: on {value.device}, the probabilities are on {device}")
        v = value.view(torch.int64) if value.dtype == torch.uint64 else value
        return v.expand(B).contiguous(), value.shape[0] == 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int or a tensor, got {type(value).__name__}")
    v = value % (1 << 64)
    v = v - (1 << 64) if v >= 1 << 63 else v
    return torch.full((B,), v, dtype=torch.int64, device=device), True


def request_seeds(B: int, device: torch.device | str,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """[B] int64 Philox seeds drawn from ``generator`` (torch's default generator of
    ``device`` when None): one draw per call, so a seeded generator gives reproducible
    rounds. Runs on the device (no host synchronisation)."""
    gdev = generator.device if generator is not None else device
    s = torch.randint(-(1 << 63), (1 << 63) - 1, (B,), dtype=torch.int64, device=gdev,
                      generator=generator)
    return s.to(device)


def _spread(seed, shared, B):
    """Distinct keys for requests that share one seed value: seed + b * stride (mod 2^64)."""
    if not shared or B <= 1:
        return seed
    return seed + torch.arange(B, dtype=torch.int64, device=seed.device) * _SEED_STRIDE


def _outputs(B, W, device, status):
    num_acc = torch.empty((B,), dtype=torch.int32, device=device)
    emitted = torch.empty((B, W), dtype=torch.int32, device=device)
    if status is None:
        status = torch.empty((B,), dtype=torch.int32, device=device)
    elif status.shape != (B,) or status.dtype != torch.int32 or status.device != device:
        raise ValueError(f"status: expected an int32 tensor of shape [{B}] on {device}, got "
                         f"{status.dtype}{list(status.shape)} on {status.device}")
    return num_acc, emitted, status


def _counter(name, t, B, device):
    if t is None:
        return torch.zeros((B,), dtype=torch.int32, device=device)
    if not isinstance(t, torch.Tensor) or t.shape != (B,) or t.device != device:
        raise ValueError(f"{name}: expected a tensor of shape [{B}] on {device}")
    return t


def chain_speculative_sampling(
        draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
        maybe_output_accepted_token_num: torch.Tensor | None = None,
        maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
        deterministic: bool = True, generator: torch.Generator | None = None,
        seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
        *, status: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's ``chain_speculative_sampling`` on ``spec_sample``.

    draft_probs ``[B, n, V]``, draft_token_ids ``[B, n]`` (int32/int64), target_probs
    ``[B, n+1, V]`` (float, probabilities). Returns ``(output_token_ids [B, n+1] int32,
    output_accepted_token_num [B], output_emitted_draft_token_num [B])``: the accepted
    drafts, then the correction token (or the bonus token when all n are accepted), then
    -1 padding; the two counters are *added to* the given tensors in place (fresh int32
    zeros when None), as FlashInfer does.

    How it maps: logits = log(target_probs) in float32 (a zero probability becomes -inf,
    a masked token), temperature 1, no top-k/top-p/min-p, so p = target_probs / sum;
    draft_probs become spec_sample's ``draft_probs`` (exact rejection sampling: accept
    with min(1, p/q), resample from norm(max(0, p - q))).

    Where it differs from FlashInfer:

    * counters: ``output_emitted_draft_token_num`` is FlashInfer's exactly (n accepted
      drafts). ``output_accepted_token_num`` in FlashInfer counts the drafts that would pass
      their test independently (past the first rejection too); spec_sample stops at the
      first rejection, so the same n is added here (a lower bound of FlashInfer's count).
    * seeds: ``seed`` / ``offset`` (ints, or int64/uint64 tensors of 1 or B entries, both
      or neither) become Philox ``seed[b]`` / ``step[b]``; a seed shared by the batch is
      spread as ``seed + b * 0x9E3779B9`` so requests draw independent numbers. Without
      them one seed per request is drawn from ``generator`` (torch's default when None)
      with step 0. Same seed/offset -> same tokens on every run; the tokens are not
      FlashInfer's (different RNG), their distribution is. ``offset`` must move on between
      calls with the same seed (``specdec_lib.advance_step(offset)``, or ``offset + 1``):
      reused, the draws of two calls are strongly correlated.
    * ``deterministic`` is accepted and ignored (spec_sample is always deterministic).
    * residual with no mass (p <= q everywhere after a rejection, only possible with
      rounding): spec_sample samples from p.
    * the acceptance uniform lies on a 2^-24 grid and p is recomputed from log(probs)
      (float32 rounding of the log): ties at u*q == p can resolve differently.
    * invalid input: without ``status`` a NaN, negative or +inf probability or a row with
      no mass in ``target_probs``, or a NaN or negative ``draft_probs``, raises ValueError
      naming the argument. It is read from the kernel's status after the call (plus one
      reduction over draft_probs), so the call waits for the GPU then (a small copy); the
      counters are left untouched. With ``status`` ([B] int32, optional output) the call
      stays asynchronous and capturable: such a request gives all -1 and 0 accepted,
      flagged in ``status`` (1 NaN/+inf, 3 no mass), and draft_probs are not checked.
      While a CUDA graph captures, nothing can be read back: the check is skipped.

    ``workspace``: optional uint8 device buffer of ``spec_sample_workspace_size(B*(n+1), V)``
    bytes (allocated per call when None). CUDA-graph capturable when ``seed`` / ``offset``
    are device tensors.
    """
    if not isinstance(target_probs, torch.Tensor) or target_probs.ndim != 3:
        raise ValueError("target_probs: expected a [B, n+1, V] tensor")
    B, q, V = target_probs.shape
    n = q - 1
    dev = target_probs.device
    if not isinstance(draft_probs, torch.Tensor) or tuple(draft_probs.shape) != (B, n, V):
        raise ValueError(f"draft_probs: expected shape [{B}, {n}, {V}] (from target_probs), got "
                         f"{list(getattr(draft_probs, 'shape', []))}")
    if not isinstance(draft_token_ids, torch.Tensor) or tuple(draft_token_ids.shape) != (B, n):
        raise ValueError(f"draft_token_ids: expected shape [{B}, {n}], got "
                         f"{list(getattr(draft_token_ids, 'shape', []))}")
    if draft_token_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"draft_token_ids: dtype must be int32 or int64, got {draft_token_ids.dtype}")
    for name, t in (("draft_probs", draft_probs), ("draft_token_ids", draft_token_ids)):
        if t.device != dev:
            raise ValueError(f"{name}: on {t.device}, target_probs is on {dev}")
    if (seed is None) != (offset is None) or (seed is not None and
                                              isinstance(seed, torch.Tensor) != isinstance(offset, torch.Tensor)):
        raise ValueError("seed / offset: pass both (both ints or both tensors) or neither")
    acc_out = _counter("maybe_output_accepted_token_num", maybe_output_accepted_token_num, B, dev)
    em_out = _counter("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num,
                      B, dev)
    if seed is None:
        seed_t, step_t = request_seeds(B, dev, generator), torch.zeros((B,), dtype=torch.int64, device=dev)
    else:
        seed_t, shared = _as_i64("seed", seed, B, dev)
        seed_t = _spread(seed_t, shared, B)
        step_t, _ = _as_i64("offset", offset, B, dev)
    logits = torch.log(target_probs.to(torch.float32)).reshape(B * q, V)
    dprobs = draft_probs.to(torch.float32).reshape(B * n, V).contiguous()
    drafts = draft_token_ids.to(torch.int32).reshape(B * n).contiguous()
    cu_q = torch.arange(B + 1, dtype=torch.int32, device=dev) * q
    refuse = status is None and not _capturing(dev)
    num_acc, emitted, status = _outputs(B, q, dev, status)
    bad_draft = ~(dprobs >= 0).all() if refuse else None     # NaN fails >= 0 too
    _spec_sample(logits, cu_q, drafts, torch.ones((B,), dtype=torch.float32, device=dev),
                 torch.zeros((B,), dtype=torch.int32, device=dev),
                 torch.ones((B,), dtype=torch.float32, device=dev),
                 torch.zeros((B,), dtype=torch.float32, device=dev), seed_t, step_t,
                 num_acc, emitted, status, dprobs, None, None, workspace, filters=False)
    if refuse:
        _refuse_flagged_rows(status, bad_draft)
    acc_out.add_(num_acc.to(acc_out.dtype))
    em_out.add_(num_acc.to(em_out.dtype))
    return emitted, acc_out, em_out


def _attr(obj, name, what):
    if not hasattr(obj, name):
        raise TypeError(f"{what}: has no attribute {name!r} (expected vLLM's {what} fields)")
    return getattr(obj, name)


def _check_draft_counts(metadata, cu_num, B, num_tokens, max_spec_len):
    """Every request's draft count fits ``max_spec_len`` and the counts add up (host values:
    see rejection_sample's docstring); ValueError naming the metadata field."""
    if max_spec_len < 0:
        raise ValueError(f"metadata.max_spec_len: must be >= 0, got {max_spec_len}")
    if cu_num.ndim != 1:
        raise ValueError(f"metadata.cu_num_draft_tokens: expected a [B] tensor, got shape "
                         f"{list(cu_num.shape)}")
    listed = getattr(metadata, "num_draft_tokens", None)
    if cu_num.device.type == "cpu" or (listed is None and not _capturing(cu_num.device)):
        name = "metadata.cu_num_draft_tokens"
        cu = cu_num.cpu().to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1)).tolist()
    elif listed is not None:
        name, counts = "metadata.num_draft_tokens", [int(c) for c in listed]
    else:
        return                                 # captured: the kernel flags (status 4)
    if len(counts) != B:
        raise ValueError(f"{name}: {len(counts)} requests, cu_num_draft_tokens has {B}")
    if counts and min(counts) < 0:
        raise ValueError(f"{name}: request {counts.index(min(counts))} has a negative draft "
                         f"count (cu_num_draft_tokens must not decrease)")
    if sum(counts) != num_tokens:
        raise ValueError(f"{name}: {sum(counts)} draft tokens in all, draft_token_ids has "
                         f"{num_tokens}")
    if counts and max(counts) > max_spec_len:
        b = counts.index(max(counts))
        raise ValueError(f"metadata.max_spec_len: {max_spec_len}, but request {b} has "
                         f"{counts[b]} draft tokens (it must be at least the longest)")


def rejection_sample(
        metadata: Any, draft_probs: torch.Tensor | None, logits: torch.Tensor,
        sampling_metadata: Any, *, seed: int | torch.Tensor | None = None,
        step: int | torch.Tensor | None = None, min_p: torch.Tensor | None = None,
        status: torch.Tensor | None = None, accepted_logprobs: torch.Tensor | None = None,
        workspace: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM v1's ``RejectionSampler.forward`` on ``spec_sample``; returns the
    ``sampled_token_ids`` tensor ``[B, max_spec_len + 1]`` int32 (wrap it in vLLM's
    ``SamplerOutput(sampled_token_ids=..., logprobs_tensors=None)``).

    ``metadata`` (vLLM's ``SpecDecodeMetadata``; read: ``draft_token_ids [num_tokens]``,
    ``cu_num_draft_tokens [B]`` (inclusive cumulative draft counts, device int32),
    ``max_spec_len``), ``draft_probs [num_tokens, V]`` float32 or None (n-gram / EAGLE:
    one-hot drafts), ``logits [num_tokens + B, V]`` (float32/float16/bfloat16): vLLM's layout,
    request b's k_b draft rows followed by its bonus row (``target_logits_indices`` /
    ``bonus_logits_indices`` as vLLM builds them), ``sampling_metadata`` (read:
    ``temperature [B]`` or None when ``all_greedy``, ``all_greedy``, ``top_k [B]`` or None,
    ``top_p [B]`` or None, ``generators`` dict request index -> torch.Generator).

    Output: row b holds the accepted drafts, then the recovered token (first rejection) or
    the bonus token, then -1 (vLLM's PLACEHOLDER_TOKEN_ID), as vLLM returns it; requests
    with temperature not > 0 (vLLM's greedy -1 or 0) take the argmax path (accept while
    the draft equals the argmax, then the argmax), mixed with sampled ones in one call.

    Where it differs from vLLM:

    * bonus token: vLLM samples it with its main Sampler (every sampling parameter and
      logits processor: penalties, min_p, logit bias, ...); here it comes from the bonus
      row with the same temperature / top-k / top-p as the draft rows, and the logits
      processors vLLM applies to target rows are not applied. Apply processors to
      ``logits`` before the call if you need them; ``min_p`` ([B] float32, optional)
      applies min-p to every row.
    * filters: vLLM's top-k / top-p mask on temperature-scaled logits with its sort-based
      tie handling; spec_sample keeps ties at the threshold (see
      ``specdec_lib.reference.sampling``). The kept set can differ at exact ties.
    * acceptance: vLLM rejects a draft with q(x) = 0; spec_sample accepts it iff p(x) > 0
      (u*q < p). Residual with no mass: spec_sample samples p (vLLM: argmax of zeros).
    * seeds: requests with a ``generators`` entry get one Philox seed drawn from their
      generator per call (reproducible for a seeded request, though not vLLM's tokens);
      the others a seed from torch's default generator; step 0. Pass ``seed`` / ``step``
      ([B] int64 device tensors) for counter-based, CUDA-graph-safe seeding instead; then
      ``step`` must move on every round (``specdec_lib.advance_step(step)``): a reused
      (seed, step) draws tokens strongly correlated with the last round's.
    * ``metadata.max_spec_len`` must be at least every request's draft count (the output
      width is ``max_spec_len + 1``): ValueError otherwise. The counts are read from
      ``metadata.num_draft_tokens`` (vLLM's host list) or from a CPU
      ``cu_num_draft_tokens``; without either, a CUDA ``cu_num_draft_tokens`` is copied to
      the host (a wait), except while a CUDA graph captures (then a request longer than
      max_spec_len comes out as all -1, status 4).
    * logprobs: not computed by vLLM's path here; ``accepted_logprobs`` ([B, max_spec_len+1]
      float32, optional output) receives spec_sample's per-token log-probabilities.
    * invalid rows (NaN / +inf logits, no mass): all -1, flagged in ``status``.
    """
    draft_ids = _attr(metadata, "draft_token_ids", "metadata")
    cu_num = _attr(metadata, "cu_num_draft_tokens", "metadata")
    max_spec_len = int(_attr(metadata, "max_spec_len", "metadata"))
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise ValueError("logits: expected a [num_tokens + B, V] tensor")
    dev = logits.device
    T, V = logits.shape
    B = int(cu_num.shape[0])
    if draft_ids.ndim != 1 or draft_ids.shape[0] + B != T:
        raise ValueError(f"logits: {T} rows, expected num_tokens + B = {draft_ids.shape[0]} + {B} "
                         "(each request's draft rows, then its bonus row)")
    if draft_probs is not None and tuple(draft_probs.shape) != (draft_ids.shape[0], V):
        raise ValueError(f"draft_probs: expected shape [{draft_ids.shape[0]}, {V}], got "
                         f"{list(draft_probs.shape)}")
    for name, t in (("draft_token_ids", draft_ids), ("cu_num_draft_tokens", cu_num),
                    ("draft_probs", draft_probs)):
        if t is not None and t.device != dev:
            raise ValueError(f"{name}: on {t.device}, logits are on {dev}")
    _check_draft_counts(metadata, cu_num, B, int(draft_ids.shape[0]), max_spec_len)
    all_greedy = bool(getattr(sampling_metadata, "all_greedy", False))
    temp = _attr(sampling_metadata, "temperature", "sampling_metadata")
    if all_greedy or temp is None:
        temp = torch.zeros((B,), dtype=torch.float32, device=dev)
    top_k = getattr(sampling_metadata, "top_k", None)
    top_p = getattr(sampling_metadata, "top_p", None)
    filtering = not all_greedy and (top_k is not None or top_p is not None or min_p is not None)
    top_k = (torch.zeros((B,), dtype=torch.int32, device=dev) if top_k is None
             else top_k.to(device=dev, dtype=torch.int32))
    top_p = (torch.ones((B,), dtype=torch.float32, device=dev) if top_p is None
             else top_p.to(device=dev, dtype=torch.float32))
    min_p = (torch.zeros((B,), dtype=torch.float32, device=dev) if min_p is None
             else min_p.to(device=dev, dtype=torch.float32))
    if seed is None:
        seed = request_seeds(B, dev)
        for b, g in (getattr(sampling_metadata, "generators", None) or {}).items():
            seed[b:b + 1] = request_seeds(1, dev, g)
    if step is None:
        step = torch.zeros((B,), dtype=torch.int64, device=dev)
    cu_q = torch.zeros((B + 1,), dtype=torch.int32, device=dev)
    cu_q[1:] = cu_num.to(torch.int32) + torch.arange(1, B + 1, dtype=torch.int32, device=dev)
    num_acc, emitted, status = _outputs(B, max_spec_len + 1, dev, status)
    _spec_sample(logits, cu_q, draft_ids.to(torch.int32).contiguous(),
                 temp.to(device=dev, dtype=torch.float32).contiguous(), top_k.contiguous(),
                 top_p.contiguous(), min_p.contiguous(), seed, step, num_acc, emitted, status,
                 None if draft_probs is None else draft_probs.to(torch.float32).contiguous(),
                 None, accepted_logprobs, workspace, filters=None if filtering else False)
    return emitted
