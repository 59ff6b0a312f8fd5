"""The README's python examples run as written.

Each ```python block runs in a fresh namespace (in a temporary working directory). Its first
line may say what it needs: ``# needs a GPU`` (skipped, with the reason, where there is none),
``# needs torch`` (skipped without torch), or ``# excerpt`` (a piece of a host's code whose
inputs are the reader's: compiled, not run). Every other block must run on a CPU.
"""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

pytestmark = pytest.mark.skipif(not os.path.isfile(README), reason="needs the source tree")


def python_blocks(text):
    """[(line number of the block's first line, source)] of every ```python block."""
    return [(text[:m.start(1)].count("\n") + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, re.S | re.M)]


def _blocks():
    if not os.path.isfile(README):
        return []
    return python_blocks(open(README, encoding="utf-8").read())


def test_readme_has_cpu_examples():
    blocks = _blocks()
    assert len(blocks) >= 3
    cpu = [src for _, src in blocks if not src.startswith(("# needs", "# excerpt"))]
    assert len(cpu) >= 2, "the README should keep examples that run on a CPU"


@pytest.mark.parametrize("line,src", _blocks(), ids=[f"line{n}" for n, _ in _blocks()])
def test_readme_block(line, src, tmp_path, monkeypatch):
    first = src.splitlines()[0].strip().lower() if src.strip() else ""
    code = compile(src, f"README.md:{line}", "exec")     # every block at least parses
    if first.startswith("# excerpt"):
        return
    if first.startswith("# needs torch"):
        pytest.importorskip("torch")
    if first.startswith("# needs a gpu"):
        from specdec_lib import runtime
        reason = runtime.gpu_unavailable_reason()
        if reason:
            pytest.skip(f"README.md:{line} needs a GPU: {reason}")
        if "torch" in first:
            pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    exec(code, {"__name__": "__readme__"})
