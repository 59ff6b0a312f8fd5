"""Prompts made from text every machine has: the docstrings of the Python standard library.

``specdec_lib.train`` builds its training set from the target's replies to these; the
held-out split (every module whose name hashes to 0 mod 10) is where draft heads are measured
(``tools/perf/e2e_smollm2.py --prompts heldout``). Deterministic for one Python version: modules in
sorted order, members in sorted order, a fixed instruction per item.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import sys
import warnings
import zlib

# modules that open windows, print, start things or are platform-only
_SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__phello__",
         "_pyrepl", "lib2to3", "msilib", "winreg", "winsound", "_winapi", "nt", "ensurepip",
         "pydoc_data", "xxsubtype", "_testcapi", "_testinternalcapi", "_testbuffer", "idle",
         "_tkinter", "curses", "_curses", "_curses_panel", "readline", "webbrowser", "pty",
         "tty", "crypt", "nis", "spwd", "ossaudiodev", "sndhdr", "audioop", "_msi"}

_INSTRUCTIONS = (
    "Summarize the following Python documentation in two or three sentences.\n\n{doc}",
    "Explain in simple words what `{name}` does.\n\n{doc}",
    "Rewrite this documentation as a short bulleted list.\n\n{doc}",
    "Write a short Python example that uses `{name}`, based on this documentation:\n\n{doc}",
    "What are the main points of this text?\n\n{doc}",
    "Rewrite this text in plain English for a beginner:\n\n{doc}",
)


# variant v's instruction is _VARIANT_STEP[v] places after the docstring's first one: the
# first three every other one (as the shipped heads' data was made), then the rest
_VARIANT_STEP = (0, 2, 4, 1, 3, 5)


def clip_paragraphs(doc: str, limit: int) -> str:
    """The first paragraphs of ``doc`` that fit in ``limit`` characters (at least one)."""
    out = []
    for para in doc.strip().split("\n\n"):
        if out and len("\n\n".join(out + [para])) > limit:
            break
        out.append(para)
    return "\n\n".join(out)[:limit]


@functools.lru_cache(maxsize=None)      # the train and held-out splits walk it once
def _documented(min_chars=100, max_chars=700):
    items = []
    for mod_name in sorted(getattr(sys, "stdlib_module_names", ())):
        if mod_name in _SKIP or mod_name.startswith("_"):
            continue
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:      # noqa: BLE001 - not importable here: not part of the set
            continue
        members = [(mod_name, mod)]
        for attr in sorted(getattr(mod, "__all__", None) or dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            if not str(getattr(obj, "__module__", None) or "").lstrip("_").startswith(mod_name):
                continue
            members.append((f"{mod_name}.{attr}", obj))
            if inspect.isclass(obj):           # and the class's own public methods
                for meth in sorted(vars(obj)):
                    f = vars(obj)[meth]
                    if not meth.startswith("_") and callable(f):
                        members.append((f"{mod_name}.{attr}.{meth}", f))
        for name, obj in members:
            doc = inspect.getdoc(obj) or ""
            if len(doc) >= min_chars:
                items.append((mod_name, name, clip_paragraphs(doc, max_chars)))
    return tuple(items)


def heldout_module(mod_name: str) -> bool:
    return zlib.crc32(mod_name.encode()) % 10 == 0


def stdlib_prompts(split="train", limit=None, variants=1):
    """User messages from standard-library docstrings: ``split`` 'train' or 'heldout'
    (disjoint by module). Duplicated docstrings appear once, under ``variants`` (1..6)
    different instructions (variant v of a docstring is the same prompt whatever ``variants``
    says: more variants only add prompts)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split: 'train' or 'heldout', not {split!r}")
    if not 1 <= variants <= len(_INSTRUCTIONS):
        raise ValueError(f"variants: 1..{len(_INSTRUCTIONS)}, not {variants}")
    seen, out = set(), []
    for mod_name, name, doc in _documented():
        if heldout_module(mod_name) != (split == "heldout") or doc in seen:
            continue
        seen.add(doc)
        first = zlib.crc32(name.encode())
        for v in range(variants):
            tmpl = _INSTRUCTIONS[(first + _VARIANT_STEP[v]) % len(_INSTRUCTIONS)]
            out.append(tmpl.format(name=name, doc=doc))
    return out[:limit]
