"""``train-draft --init``: a head continued from a saved one, at toy size on the CPU (an
8-layer Llama GGUF, random token sequences as data). With 0 updates the continued heads
are the init's tensor for tensor (the EAGLE3 draft vocabulary included) and evaluate the
same; with updates they keep the init's architecture without the size options; every saved
config records the chain of training records it came from. Refused, naming the argument:
an init head of another method, one missing, two of a method, sizes that contradict it,
--eval beside it, and a head of another target (another hidden size, model or GGUF)."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from toy_models import toy_gguf, toy_llama

pytest.importorskip("gguf")
pytest.importorskip("torch")

METHODS = ("mtp", "eagle3")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(dir, gguf, npz, heads dir A): A from scratch, 3 updates per head (draft vocab 32,
    intermediate 24 / 40: none of them a default)."""
    from specdec_lib.train.cli import main
    from specdec_lib.train.data import save_data
    d = tmp_path_factory.mktemp("train_init")
    c, _ = toy_llama(8, 64, 2, 1, 64, 64, 64, 0, context=128, name="toy", float32=True)
    toy_gguf(d / "toy.gguf", c)
    rng = np.random.default_rng(3)
    seqs = [rng.integers(3, 64, int(rng.integers(14, 24))) for _ in range(30)]
    save_data(str(d / "d.npz"), seqs, [5] * 30, [0] * 24 + [1] * 6)
    toy = (d, d / "toy.gguf", d / "d.npz", d / "A")
    assert main(_argv(toy, "A", "--max-iters", "3", "--draft-vocab", "32",
                      "--eagle-intermediate", "24", "--mtp-intermediate", "40")) == 0
    return toy


def _argv(toy, out, *extra):
    d, gguf, data = toy[:3]
    return ["--gguf", str(gguf), "--data", str(data), "--steps", "2", "--batch-tokens", "256",
            "--device", "cpu", "--quiet", "--out", str(d / out), *extra]


def _head(path):
    from safetensors.torch import load_file
    cfg = json.loads((path / "config.json").read_text())
    return cfg, load_file(str(path / "model.safetensors"))


def _same_tensors(a, b):
    import torch
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_zero_updates_start_from_the_init_exactly_and_record_the_chain(toy):
    """--init A (a parent of smollm2_mtp / smollm2_eagle3), 0 updates -> B: B's tensors are
    A's (bf16 saved, read as float32, saved as bf16 again: exact), its config A's but for
    the training record, whose ``init`` is A's record. C from B's two heads named one by
    one (the EAGLE3 one first): the same tensors and the same held-out report as B (both
    evaluated the same bf16 weights), and C's chain is C -> B -> A."""
    from specdec_lib.train.cli import main
    d, A = toy[0], toy[3]
    argv_b = _argv(toy, "B", "--init", str(A), "--max-iters", "0")
    assert main(argv_b) == 0
    argv_c = _argv(toy, "C", "--init", f"{d / 'B' / 'smollm2_eagle3'},{d / 'B' / 'smollm2_mtp'}",
                   "--max-iters", "0")
    assert main(argv_c) == 0
    for m in METHODS:
        (ca, ta), (cb, tb), (cc, tc) = (_head(d / x / f"smollm2_{m}") for x in "ABC")
        assert _same_tensors(ta, tb) and _same_tensors(tb, tc), m
        ra, rb, rc = (c.pop("specdec_training") for c in (ca, cb, cc))
        assert ca == cb == cc, m
        assert rb["init"] == ra and "init" not in ra
        assert rc["init"] == rb and rc["init"]["init"] == ra
        assert rb["command"] == "python -m specdec_lib train-draft " + " ".join(argv_b)
        assert rc["command"] == "python -m specdec_lib train-draft " + " ".join(argv_c)
        assert rb["init_sha256"] == hashlib.sha256(
            (A / f"smollm2_{m}" / "model.safetensors").read_bytes()).hexdigest()
        assert rc["heldout"] == rb["heldout"], m
    ce = _head(d / "C" / "smollm2_eagle3")[0]
    assert ce["draft_vocab_size"] == 32 and ce["intermediate_size"] == 24
    assert ce["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert _head(d / "C" / "smollm2_mtp")[0]["intermediate_size"] == 40
    assert len(ce["target_gguf_sha256"]) == 64


def test_updates_keep_the_architecture_and_the_draft_vocabulary(toy):
    """--init A/smollm2_eagle3 --method eagle3 with 2 updates and none of the size options:
    the weights move, the draft vocabulary (d2t / t2d) and the sizes stay A's (from scratch
    the defaults, 2816 -> the target's 64 and 512, would have been taken); an explicit
    --draft-vocab equal to the init's is accepted."""
    from specdec_lib.train.cli import main
    d, A = toy[0], toy[3]
    assert main(_argv(toy, "D", "--init", str(A / "smollm2_eagle3"), "--method", "eagle3",
                      "--max-iters", "2", "--draft-vocab", "32", "--name-prefix", "x")) == 0
    (ca, ta), (cd, td) = _head(A / "smollm2_eagle3"), _head(d / "D" / "x_eagle3")
    assert ta["d2t"].tolist() == td["d2t"].tolist() and ta["t2d"].tolist() == td["t2d"].tolist()
    assert not _same_tensors(ta, td)
    for k in ("draft_vocab_size", "intermediate_size", "eagle_config"):
        assert cd[k] == ca[k], k
    assert not (d / "D" / "x_mtp").exists()


def _refused(capsys, argv, *words):
    from specdec_lib.train.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, (w, err)


def test_refusals_naming_the_argument(toy, capsys, tmp_path):
    """Checked before anything is loaded (argparse errors, exit 2)."""
    A = toy[3]
    mtp, eagle = str(A / "smollm2_mtp"), str(A / "smollm2_eagle3")
    out = tmp_path / "never"
    base = ["--data", "x.npz", "--out", str(out)]
    _refused(capsys, base + ["--method", "mtp", "--init", eagle], "--init", "an eagle3 head",
             "--method mtp")
    _refused(capsys, base + ["--init", mtp], "--init", "no eagle3 head", "--method both")
    _refused(capsys, base + ["--method", "mtp", "--init", f"{mtp},{mtp}"], "two mtp heads")
    _refused(capsys, base + ["--init", str(tmp_path)], "--init", "no head here")
    _refused(capsys, base + ["--init", str(tmp_path / "nothing")], "no such directory")
    _refused(capsys, base + ["--init", str(A), "--draft-vocab", "16"], "--draft-vocab 16",
             "draft_vocab_size 32", "--init head")
    _refused(capsys, base + ["--init", str(A), "--eagle-intermediate", "512"],
             "--eagle-intermediate 512", "intermediate_size 24")
    _refused(capsys, base + ["--init", str(A), "--mtp-intermediate", "64"],
             "--mtp-intermediate 64", "intermediate_size 40")
    _refused(capsys, base + ["--init", str(A), "--eval", mtp], "--init with --eval")
    half = tmp_path / "half"
    shutil.copytree(A / "smollm2_mtp", half)
    (half / "model.safetensors").unlink()
    _refused(capsys, base + ["--method", "mtp", "--init", str(half)], "no model.safetensors")
    assert not out.exists()


@pytest.mark.parametrize("key,value,words", [
    ("hidden_size", 48, "hidden_size 48"),
    ("target_model", "other", "target_model 'other'"),
    ("target_gguf_sha256", "0" * 64, "sha256 " + "0" * 64),
    ("target_hybrid_weights_sha256", "1" * 64, "--hybrid"),
])
def test_head_of_another_target_refused(toy, tmp_path, key, value, words):
    """An init head whose config names another target: ValueError naming --init (and what
    differs), raised once the base is read, before the data or the teacher."""
    from specdec_lib.train.cli import main
    other = tmp_path / "other"
    shutil.copytree(toy[3] / "smollm2_mtp", other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(cfg, **{key: value})))
    argv = _argv(toy, "never", "--method", "mtp", "--init", str(other), "--max-iters", "0")
    argv[argv.index("--data") + 1] = str(tmp_path / "none.npz")   # never generated
    with pytest.raises(ValueError, match="--init .*other") as e:
        main(argv)
    assert words in str(e.value)
    assert not (toy[0] / "never").exists() and not (tmp_path / "none.npz").exists()


def test_eval_still_reads_saved_heads(toy, capsys):
    """--eval (which builds the head configs beside --init's checks) reports on A's heads:
    the anchors of their recorded held-out report."""
    from specdec_lib.train.cli import main
    A = toy[3]
    heads = [A / f"smollm2_{m}" for m in METHODS]
    argv = _argv(toy, "E", "--eval", ",".join(map(str, heads)))
    argv.remove("--quiet")
    assert main(argv) == 0
    log = capsys.readouterr().out
    for h in heads:
        line = [ln for ln in log.splitlines() if ln.startswith(f"{h}: {{")]
        rec = json.loads((h / "config.json").read_text())["specdec_training"]["heldout"]
        assert len(line) == 1 and json.loads(line[0].split(": ", 1)[1])["anchors"] == rec["anchors"]
    assert not (toy[0] / "E").exists()


def test_continue_in_place(toy, tmp_path):
    """--init DIR --out DIR: the heads are rewritten in place, recording the hash of the
    files they started from (taken before they were overwritten)."""
    from specdec_lib.train.cli import main
    here = tmp_path / "here"
    shutil.copytree(toy[3], here)
    sha = {m: hashlib.sha256((here / f"smollm2_{m}" / "model.safetensors").read_bytes())
           .hexdigest() for m in METHODS}
    before = {m: _head(here / f"smollm2_{m}") for m in METHODS}
    argv = _argv(toy, "x", "--init", str(here), "--max-iters", "1")
    argv[argv.index("--out") + 1] = str(here)
    assert main(argv) == 0
    for m in METHODS:
        cfg, t = _head(here / f"smollm2_{m}")
        assert cfg["specdec_training"]["init_sha256"] == sha[m]
        assert cfg["specdec_training"]["init"] == before[m][0]["specdec_training"]
        assert not _same_tensors(t, before[m][1])


def test_init_from_packed_heads(toy, tmp_path):
    """--init a packed copy of A (the shipped heads are packed): the same tensors as A's, the
    recorded init_sha256 the plain file's (A's weights_sha256); continued in place, the
    rewritten heads are plain files with no stale packed one beside them."""
    from specdec_lib.models.packed import main as pack_weights
    from specdec_lib.train.cli import main
    A, pk = toy[3], tmp_path / "packed"
    shutil.copytree(A, pk)
    assert pack_weights([str(pk / f"smollm2_{m}") for m in METHODS]) == 0
    assert main(_argv(toy, "P", "--init", str(pk), "--max-iters", "0")) == 0
    for m in METHODS:
        cfg, t = _head(toy[0] / "P" / f"smollm2_{m}")
        assert _same_tensors(t, _head(A / f"smollm2_{m}")[1])
        want = json.loads((A / f"smollm2_{m}" / "config.json").read_text())["weights_sha256"]
        assert cfg["specdec_training"]["init_sha256"] == want
    argv = _argv(toy, "x", "--init", str(pk), "--max-iters", "0")
    argv[argv.index("--out") + 1] = str(pk)
    assert main(argv) == 0
    for m in METHODS:
        assert sorted(os.listdir(pk / f"smollm2_{m}")) == ["config.json", "model.safetensors"]


def test_remap_vocab_keeps_trained_rows_and_starts_new_ones_from_the_target():
    """``DraftHead.remap_vocab``: tokens of both vocabularies keep their (trained) rows, new
    tokens take the target's lm_head rows, the id maps follow, and lm_head stays a leaf the
    optimizer can take."""
    import torch
    from types import SimpleNamespace
    from specdec_lib.train.head import DraftHead
    h = DraftHead.__new__(DraftHead)
    h.T, h.p = SimpleNamespace(lm_head=torch.randn(64, 8), c=SimpleNamespace(vocab_size=64)), {}
    h.set_vocab(torch.tensor([2, 5, 9, 11]))
    with torch.no_grad():
        h.p["lm_head"] += torch.randn(4, 8)            # "trained": no longer the target's
    old = h.p["lm_head"].detach().clone()
    assert h.remap_vocab(torch.tensor([5, 7, 11, 20])) == 2
    new = h.p["lm_head"]
    assert new.is_leaf and new.requires_grad
    assert torch.equal(new[0], old[1]) and torch.equal(new[2], old[3])
    assert torch.equal(new[1], h.T.lm_head[7]) and torch.equal(new[3], h.T.lm_head[20])
    assert h.to_draft[[5, 7, 11, 20]].tolist() == [0, 1, 2, 3]
    assert h.to_draft[[2, 9]].tolist() == [-1, -1]


def test_draft_vocab_from_data_rechooses_the_vocabulary(toy, tmp_path):
    """--init A's EAGLE3 head on other data (tokens 3..35 only) with --draft-vocab-from data
    and 0 updates: the vocabulary is re-chosen (every id now in 3..35, size kept), rows of
    tokens A had are A's; the default (init) keeps A's vocabulary on the same data."""
    import torch
    from specdec_lib.train.cli import main
    from specdec_lib.train.data import save_data
    d, A = toy[0], toy[3]
    rng = np.random.default_rng(5)
    save_data(str(tmp_path / "e.npz"), [rng.integers(3, 36, 20) for _ in range(30)],
              [5] * 30, [0] * 24 + [1] * 6)
    argv = ["--init", str(A / "smollm2_eagle3"), "--method", "eagle3", "--max-iters", "0",
            "--data", str(tmp_path / "e.npz")]
    assert main(_argv(toy, "E", *argv, "--draft-vocab-from", "data")) == 0
    assert main(_argv(toy, "F", *argv)) == 0
    (_, ta), (ce, te), (_, tf) = (_head(p) for p in (A / "smollm2_eagle3",
                                                     d / "E" / "smollm2_eagle3",
                                                     d / "F" / "smollm2_eagle3"))
    ids = lambda t: (t["d2t"] + torch.arange(len(t["d2t"]))).tolist()  # noqa: E731
    assert ids(tf) == ids(ta) and ce["draft_vocab_size"] == 32
    assert ids(te) != ids(ta) and len(ids(te)) == 32
    old = {t: r for r, t in enumerate(ids(ta))}
    for r, t in enumerate(ids(te)):
        if t in old:
            assert torch.equal(te["lm_head.weight"][r], ta["lm_head.weight"][old[t]]), t


def test_draft_vocab_grows_when_rechosen(toy, tmp_path, capsys):
    """--init a 32-token EAGLE3 head with --draft-vocab 48 --draft-vocab-from data+rank: the
    head has 48 tokens (the size an option the init's architecture does not fix once the
    vocabulary is re-chosen), its trained rows kept; --draft-vocab 48 without re-choosing is
    still refused."""
    import torch
    from specdec_lib.train.cli import main
    from specdec_lib.train.data import save_data
    d, A = toy[0], toy[3]
    rng = np.random.default_rng(7)
    save_data(str(tmp_path / "g.npz"), [rng.integers(3, 40, 20) for _ in range(30)],
              [5] * 30, [0] * 24 + [1] * 6)
    argv = ["--init", str(A / "smollm2_eagle3"), "--method", "eagle3", "--max-iters", "0",
            "--data", str(tmp_path / "g.npz"), "--draft-vocab", "48"]
    assert main(_argv(toy, "W", *argv, "--draft-vocab-from", "data+rank")) == 0
    (_, ta), (cw, tw) = (_head(p) for p in (A / "smollm2_eagle3", d / "W" / "smollm2_eagle3"))
    ids = (tw["d2t"] + torch.arange(len(tw["d2t"]))).tolist()
    assert cw["draft_vocab_size"] == 48 and len(ids) == 48 == len(set(ids))
    assert tw["lm_head.weight"].shape[0] == 48 and int(tw["t2d"].sum()) == 48
    old = {t: r for r, t in enumerate((ta["d2t"] + torch.arange(len(ta["d2t"]))).tolist())}
    kept = [t for t in ids if t in old]
    assert kept
    for r, t in enumerate(ids):
        if t in old:
            assert torch.equal(tw["lm_head.weight"][r], ta["lm_head.weight"][old[t]]), t
    _refused(capsys, _argv(toy, "X", *argv), "--draft-vocab 48")


def test_draft_vocab_from_refuses_other_values(toy, capsys):
    _refused(capsys, _argv(toy, "G", "--draft-vocab-from", "target"), "--draft-vocab-from")


def test_choose_vocab_data_then_rank():
    """``choose_vocab``: "data" takes the most frequent ids; "data+rank" the ids seen at least
    twice, most frequent first, then the lowest ids not chosen, up to the size; sorted."""
    import torch
    from specdec_lib.train.loop import choose_vocab
    counts = torch.zeros(40, dtype=torch.int64)
    counts[[30, 7, 21, 12]] = torch.tensor([9, 5, 1, 3])
    assert choose_vocab(counts, 3, "data").tolist() == [7, 12, 30]
    assert choose_vocab(counts, 6, "data+rank").tolist() == [0, 1, 2, 7, 12, 30]
    assert choose_vocab(counts, 2, "data+rank").tolist() == [7, 30]
    with pytest.raises(ValueError, match="how"):
        choose_vocab(counts, 3, "rank")


def test_draft_vocab_from_data_plus_rank(toy, tmp_path, monkeypatch):
    """--draft-vocab-from data+rank: the vocabulary is ``choose_vocab(counts, 32,
    "data+rank")`` of the training targets' counts (saved as the head's d2t); rows of tokens
    the --init head had stay its rows."""
    import torch
    from specdec_lib.train import loop
    from specdec_lib.train.cli import main
    from specdec_lib.train.data import save_data
    d, A = toy[0], toy[3]
    calls = []
    real = loop.choose_vocab

    def spy(counts, size, how="data"):
        out = real(counts, size, how)
        calls.append((how, size, out.tolist(), int((counts >= 2).sum())))
        return out
    monkeypatch.setattr(loop, "choose_vocab", spy)
    rng = np.random.default_rng(6)
    save_data(str(tmp_path / "r.npz"), [rng.integers(3, 13, 20) for _ in range(30)],
              [5] * 30, [0] * 24 + [1] * 6)
    argv = ["--init", str(A / "smollm2_eagle3"), "--method", "eagle3", "--max-iters", "0",
            "--data", str(tmp_path / "r.npz"), "--draft-vocab-from", "data+rank"]
    assert main(_argv(toy, "R", *argv)) == 0
    (_, ta), (cr, tr) = (_head(p) for p in (A / "smollm2_eagle3", d / "R" / "smollm2_eagle3"))
    ids = (tr["d2t"] + torch.arange(len(tr["d2t"]))).tolist()
    assert [c[:3] for c in calls] == [("data+rank", 32, ids)] and cr["draft_vocab_size"] == 32
    assert calls[0][3] < 32 and ids[0] == 0          # fewer seen twice: the rank fill ran
    old = {t: r for r, t in enumerate((ta["d2t"] + torch.arange(len(ta["d2t"]))).tolist())}
    for r, t in enumerate(ids):
        if t in old:
            assert torch.equal(tr["lm_head.weight"][r], ta["lm_head.weight"][old[t]]), t
