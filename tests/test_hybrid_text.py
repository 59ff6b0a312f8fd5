"""train-hybrid's natural training text (specdec_lib.train.hybrid_text): disjoint from
eval-hybrid's sources, cut into windows (some after the chat opening), mixed into the
batches; the held-out report's rows spread over the npz's families."""
import os

import pytest

from specdec_lib.train import hybrid_eval, hybrid_text
from specdec_lib.train.hybrid import spread
from specdec_lib.train.hybrid_text import TRAINING_SOURCES, source_files, text_windows


class _Tok:                  # one token per character (ids < 64)
    def encode(self, text):
        return [ord(c) % 61 + 3 for c in text]


def _eval_paths():
    paths = set()
    for name, (_, get) in hybrid_eval.NATURAL_SOURCES.items():
        try:
            _, files = get()
        except Exception:    # noqa: BLE001 - a source missing here reads nothing
            continue
        paths.update(os.path.realpath(f) for f in files if os.path.exists(f))
    return paths


def test_training_sources_are_not_eval_sources():
    evalp = _eval_paths()
    assert evalp, "eval-hybrid finds none of its sources here"
    srcs = source_files(log=lambda *a: None)
    assert set(srcs) == set(TRAINING_SOURCES)
    n = 0
    for name, files in srcs.items():
        for label, path, _ in files:
            n += 1
            if path is not None:
                assert os.path.realpath(path) not in evalp, (name, path)
                assert "idlelib" not in path.split(os.sep) and "pydoc_data" not in path
                assert os.sep + "test" + os.sep not in path or not path.startswith(
                    hybrid_text._stdlib_root())
            # eval-hybrid's ten package READMEs are not read either
            if label.startswith("pkg/"):
                dist = label[4:].split()[0].split("/")[0]
                assert dist not in {d.lower() for d in hybrid_eval._README_DISTS}, label
    assert n > 100
    # the stdlib code skips the modules whose docstrings are held-out prompts
    from specdec_lib.models.prompts import heldout_module
    code = [lbl for lbl, _, _ in srcs["stdlib-code"]]
    assert code and not any(heldout_module(lbl.split("/")[1].split(".")[0]) for lbl in code)
    # the selection is deterministic
    assert source_files(["stdlib-code"], log=lambda *a: None)["stdlib-code"] == srcs["stdlib-code"]


def test_gpl3_link_is_not_training_text():
    files = [p for _, p, _ in source_files(["system-docs"], log=lambda *a: None)["system-docs"]]
    gpl3 = os.path.realpath("/usr/share/common-licenses/GPL-3")
    assert all(os.path.realpath(p) != gpl3 for p in files)


def test_eval_path_is_refused(tmp_path, monkeypatch):
    lic = os.path.join(hybrid_text._stdlib_root(), "LICENSE.txt")
    if not os.path.isfile(lic):
        pytest.skip("no LICENSE.txt")
    with pytest.raises(AssertionError, match="is an eval-hybrid source"):
        text_windows(_Tok(), 1000, 64, names=[], extra_files=[lic], log=lambda *a: None)


def test_text_windows_fake_source(tmp_path, monkeypatch):
    a = tmp_path / "a.txt"
    a.write_text("lorem ipsum dolor sit amet, consectetur adipiscing elit\n" * 60)
    b = tmp_path / "b.txt"
    b.write_text("the quick brown fox jumps over the lazy dog again and again\n" * 60)
    missing = tmp_path / "nope.txt"
    monkeypatch.setitem(TRAINING_SOURCES, "fake", (
        "fake", lambda: [("a", str(a), None), ("nope", str(missing), None), ("b", str(b), None)]))
    logs = []
    wins, rep = text_windows(_Tok(), 1200, 100, names=["fake"], log=logs.append,
                             chat_prefix=[1, 2, 1])
    assert any("skip nope" in m for m in logs)                # missing: skipped and logged
    assert rep["fake"]["files"] == 2 and rep["fake"]["skipped"] == 1
    assert sum(map(len, wins)) == 1200 and all(len(w) <= 100 for w in wins)
    assert len(wins) == 12          # file a: its cap of MAX_FILE_WINDOWS windows; b the rest
    chat = [w for w in wins if w[:3] == [1, 2, 1]]
    assert len(chat) == len(wins) // hybrid_text.CHAT_SHARE    # every 4th after the opening
    assert wins[0][:5] == _Tok().encode("lorem")              # a file's start, then mid-text
    # lines of an eval source are removed from the training text
    lines = {"the quick brown fox jumps over the lazy dog again and again"}
    monkeypatch.setattr(hybrid_text, "eval_lines", lambda log=None: (lines, set()))
    wins, rep = text_windows(_Tok(), 10**6, 100, names=["fake"], log=lambda *x: None)
    assert rep["fake"]["dropped_as_eval"] == 1 and rep["fake"]["files"] == 1


def test_spread_covers_every_family():
    fams = ["x"] * 64 + ["y"] * 64 + ["z"] * 64 + ["w"] * 64
    rows = list(range(100, 100 + len(fams)))
    got = spread(rows, 64)
    assert len(got) == 64 == len(set(got)) and got == spread(rows, 64)
    counts = {f: sum(fams[r - 100] == f for r in got) for f in "xyzw"}
    assert counts == dict(x=16, y=16, z=16, w=16)
    assert spread(rows[:10], 64) == rows[:10]
