"""Natural text for ``train-hybrid --text-tokens N``: plain-tokenised windows (no chat
template) from files on this machine that ``eval-hybrid`` never scores (no torch here).

The distillation data of the trainers' npz is SmolLM2's own chat replies: every sequence
starts with the chat template's system turn, so a hybrid trained only on them is measured
far worse on plain text from a fresh state (issue 30). These sources add such text.

``TRAINING_SOURCES`` (name -> (what, () -> [(label, path, text)])): a fixed, sorted,
deterministic selection, each file read if present (a missing or unreadable one is skipped
and logged), disjoint from ``hybrid_eval.NATURAL_SOURCES`` by construction and by check:

- ``stdlib-code``: the standard library's ``*.py`` (code and comments), without
  ``idlelib``, ``pydoc_data``, ``test`` / ``tests`` / ``idle_test`` directories,
  ``site-packages`` and ``lib2to3`` (grammar test data), and without any module whose
  top-level name ``models.prompts.heldout_module`` puts in the held-out split (their
  docstrings are held-out prompts of the npz). Overlap with the prompts: the prompt mix
  (``_STDLIB_MODULES``: 776 docstrings, 257 kB, and 1,026 functions of 4..25 lines, 386 kB,
  on Python 3.11) and ``models.prompts`` (2,131 training docstrings, 596 kB) quote text that
  is in these files: at most ~13% of their 9.5 MB here, and already in the npz's training
  prompts. The npz's *held-out* rows of the mix's docstring families (rewrite, summarise,
  code_review) draw from any of those modules, so their prompt text can be in this training
  text (the npz report of those three families may read a little optimistic). None of it
  is in eval-hybrid's natural text or its prompts (translation, chat, new).
- ``stdlib-docs``: the standard library's other ``*.txt`` / ``*.rst`` / ``*.html`` files
  (outside the directories above and ``LICENSE.txt``).
- ``package-texts``: for installed distributions (those of ``sys.path``, sorted by name) not
  in ``hybrid_eval._README_DISTS``: their METADATA long description and licence files
  (``*.dist-info/licenses/*``, ``LICENSE*``, ``COPYING*``, ``AUTHORS*``).
- ``system-docs``: ``/usr/share/common-licenses/*`` except GPL-3 (and anything whose real
  path is GPL-3: ``GPL`` is a link to it), and ``/usr/share/doc/*/`` README / NEWS /
  copyright / changelog / ``*.txt`` / ``*.md`` files (``.gz`` decompressed). Man pages are not
  used (roff markup, not text).

Beyond the path check, a file's lines of 40+ characters that also occur in an eval source
are removed (licences bundle other licences; a file that is mostly such lines is dropped).

Tokens: ``--text-tokens`` split evenly over the sources present (what a small source leaves
goes to the others), each file in a fixed hash order (spread over many modules), at most
``MAX_FILE_WINDOWS`` windows from one file. Windows of ``--seq-len`` tokens are cut
consecutively from each file's tokens: a file's first window starts at its start, the rest
mid-text; a share ``CHAT_SHARE`` of the windows (every 4th) is preceded by the chat
template's opening up to a user turn's content (as eval-hybrid ``--context chat`` scores),
so the model sees plain text both from a fresh state and after the system turn.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import os
import sys
import sysconfig

MAX_FILE_WINDOWS = 8      # windows one file may give (long files do not crowd out others)
CHAT_SHARE = 4            # every CHAT_SHARE-th window follows the chat opening
_MIN_LINE = 40            # lines this long are checked against the eval text

_STDLIB_SKIP_DIRS = {"idlelib", "pydoc_data", "test", "tests", "idle_test", "site-packages",
                     "dist-packages", "lib2to3", "__pycache__", "turtledemo", "ensurepip"}


def _stdlib_root():
    return sysconfig.get_paths()["stdlib"]


def _read_any(path, limit=2_000_000):
    """A file's text (its first ``limit`` bytes; ``.gz`` decompressed); binary refused."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as fh:
        data = fh.read(limit)
    if b"\x00" in data[:4096]:
        raise ValueError("binary")
    return data.decode("utf-8", errors="replace")


def _order(paths):
    """A fixed order that spreads a capped read over many files: by the sha256 of the path
    relative to its root (the same on every machine with the same files)."""
    return sorted(paths, key=lambda rp: hashlib.sha256(rp[0].encode()).hexdigest())


def _walk_stdlib(exts):
    from ..models.prompts import heldout_module
    root = _stdlib_root()
    out = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if x not in _STDLIB_SKIP_DIRS)
        top = None if rel == "." else rel.split(os.sep)[0]
        for f in sorted(files):
            if not f.endswith(exts) or (rel == "." and f == "LICENSE.txt"):
                continue
            mod = top or f.rsplit(".", 1)[0]
            if f.endswith(".py") and heldout_module(mod):
                continue
            rp = os.path.normpath(os.path.join(rel, f))
            out.append((f"stdlib/{rp}", os.path.join(d, f)))
    return _order(out)


def _package_files():
    from importlib import metadata

    from .hybrid_eval import _README_DISTS
    skip = {n.lower().replace("_", "-") for n in _README_DISTS}
    seen, out = set(), []
    dists = sorted(metadata.distributions(), key=lambda d: (d.metadata.get("Name") or "").lower())
    for d in dists:
        name = (d.metadata.get("Name") or "").lower().replace("_", "-")
        if not name or name in skip or name in seen:
            continue
        seen.add(name)
        body = d.metadata.get_payload() or d.metadata.get("Description") or ""
        if len(body) >= 200:
            out.append((f"pkg/{name} METADATA", None, body))
        for f in sorted(d.files or (), key=str):
            base = os.path.basename(str(f))
            if base.upper().startswith(("LICENSE", "COPYING", "AUTHORS", "NOTICE")) or \
                    "/licenses/" in f"/{f}":
                p = str(d.locate_file(f))
                if os.path.isfile(p) and os.path.getsize(p) < 200_000:
                    out.append((f"pkg/{name}/{base}", p, None))
    return out


def _system_files():
    gpl3 = os.path.realpath("/usr/share/common-licenses/GPL-3")
    out = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p) and os.path.realpath(p) != gpl3:
            out.append((p, p))
    keep = ("readme", "news", "copyright", "changelog", "changes")
    for p in sorted(glob.glob("/usr/share/doc/*/*")):
        b = os.path.basename(p).lower()
        if os.path.isfile(p) and os.path.realpath(p) != gpl3 and \
                (b.startswith(keep) or b.endswith((".txt", ".md", ".txt.gz", ".md.gz"))):
            out.append((p, p))
    return _order(out)


def _paths(lst):
    return [(label, path, None) for label, path in lst]


TRAINING_SOURCES = {
    "stdlib-code": ("the standard library's *.py outside idlelib / pydoc_data / tests / "
                    "lib2to3 and the held-out modules (code and comments)",
                    lambda: _paths(_walk_stdlib((".py",)))),
    "stdlib-docs": ("the standard library's other *.txt / *.rst / *.html files",
                    lambda: _paths(_walk_stdlib((".txt", ".rst", ".html")))),
    "package-texts": ("METADATA long descriptions and licence files of installed packages "
                      "other than eval-hybrid's ten", _package_files),
    "system-docs": ("/usr/share/common-licenses (not GPL-3) and /usr/share/doc READMEs, "
                    "NEWS, copyright files and changelogs", lambda: _paths(_system_files())),
}


def _norm(line):
    return " ".join(line.split())


def eval_lines(log=print):
    """The set of normalised 40+ character lines of eval-hybrid's natural-text sources (and
    their real file paths), for the contamination check."""
    from .hybrid_eval import NATURAL_SOURCES
    lines, paths = set(), set()
    for name, (_, get) in NATURAL_SOURCES.items():
        try:
            text, files = get()
        except Exception as e:      # noqa: BLE001 - unreadable: nothing to exclude
            log(f"text: eval source {name}: {type(e).__name__}: {e}")
            continue
        paths.update(os.path.realpath(f) for f in files if os.path.isfile(f))
        lines.update(n for n in map(_norm, text.splitlines()) if len(n) >= _MIN_LINE)
    return lines, paths


def clean(text, bad_lines):
    """(text without its lines that are in ``bad_lines``, the share of long lines removed)."""
    keep, long_n, cut = [], 0, 0
    for ln in text.splitlines():
        n = _norm(ln)
        if len(n) >= _MIN_LINE:
            long_n += 1
            if n in bad_lines:
                cut += 1
                continue
        keep.append(ln)
    return "\n".join(keep), cut / max(1, long_n)


def source_files(names=None, log=print):
    """{source: [(label, path or None, text or None)]} of ``TRAINING_SOURCES`` (``names``:
    a subset), each listing in its fixed order; a failing source is logged and empty."""
    out = {}
    for n in (TRAINING_SOURCES if names is None else names):
        try:
            out[n] = TRAINING_SOURCES[n][1]()
        except Exception as e:      # noqa: BLE001 - not here: skipped, logged
            log(f"text: source {n}: {type(e).__name__}: {e}")
            out[n] = []
    return out


def text_windows(tok, total_tokens, seq_len, names=None, extra_files=(), log=print,
                 chat_prefix=None, eval_check=True):
    """(windows, report): up to ``total_tokens`` tokens of training text as token lists of at
    most ``seq_len`` tokens (every ``CHAT_SHARE``-th one ``chat_prefix`` + text), and per
    source the files used, their tokens and what was skipped. ``extra_files``: more files,
    one source ``files`` (tests, or any text a user adds)."""
    srcs = source_files(names, log)
    if extra_files:
        srcs["files"] = [(os.path.basename(f), f, None) for f in extra_files]
    bad_lines, bad_paths = eval_lines(log) if eval_check else (set(), set())
    prefix = list(chat_prefix or [])
    per_file = MAX_FILE_WINDOWS * seq_len
    windows, report = [], {}
    todo = [n for n in srcs if srcs[n]]
    left = total_tokens
    for k, n in enumerate(todo):
        cap = left // (len(todo) - k)
        got, used, skipped, dropped = 0, 0, 0, 0
        for label, path, text in srcs[n]:
            if got >= cap:
                break
            if path is not None and os.path.realpath(path) in bad_paths:
                raise AssertionError(f"training text {path} is an eval-hybrid source")
            try:
                text = _read_any(path) if text is None else text
            except Exception as e:      # noqa: BLE001 - missing / unreadable: skipped, logged
                skipped += 1
                log(f"text: skip {label}: {type(e).__name__}: {e}")
                continue
            text, share = clean(text, bad_lines)
            if share > 0.5:
                dropped += 1
                continue
            ids = tok.encode(text[:16 * per_file])[:min(per_file, cap - got)]
            if len(ids) < 32:
                continue
            for i in range(0, len(ids), seq_len):
                w = ids[i:i + seq_len]
                if len(w) < 32:
                    break
                if prefix and len(windows) % CHAT_SHARE == CHAT_SHARE - 1:
                    w = prefix + w[:seq_len - len(prefix)]
                windows.append(w)
                got += len(w)
            used += 1
        left -= got
        report[n] = dict(files=used, tokens=got, skipped=skipped, dropped_as_eval=dropped)
        log(f"text: {n}: {got} tokens from {used} files"
            + (f", {skipped} unreadable" if skipped else "")
            + (f", {dropped} dropped (eval text)" if dropped else ""))
    return windows, report


def available_tokens(tok, names=None, log=print, chars_per_token=None):
    """{source: (files, characters, tokens or estimated tokens)}: what the sources hold
    (estimated from characters when ``chars_per_token`` is given)."""
    out = {}
    for n, files in source_files(names, log).items():
        chars = toks = nf = 0
        for label, path, text in files:
            try:
                text = _read_any(path) if text is None else text
            except Exception:       # noqa: BLE001
                continue
            nf += 1
            chars += len(text)
            if chars_per_token is None:
                toks += len(tok.encode(text))
        out[n] = (nf, chars, toks if chars_per_token is None else int(chars / chars_per_token))
    return out


if __name__ == "__main__":         # a quick census: python -m specdec_lib.train.hybrid_text
    print(available_tokens(None, chars_per_token=3.5), file=sys.stdout)
