"""models/packed.py, the shipped weights' lossless packing: pack / unpack_bytes byte-exact on
awkward files (BF16, F32, I64, BOOL; odd and empty bodies), every damage refused naming the
file, the readers (registry, heads, hybrid, digest checks) the same on a packed directory as
on the plain one, and ``python -m specdec_lib pack-weights`` there and back."""
import hashlib
import json
import os
import shutil
import struct

import numpy as np
import pytest

from specdec_lib.models import packed
from specdec_lib.models.heads import SMOLLM2_HEADS, hybrid_head, smollm2_head
from specdec_lib.models.smollm2_hybrid import (SHIPPED_DIR, HybridWeightsError,
                                               load_hybrid_weights)
from specdec_lib.registry import (DraftWeightError, check_weights_digest, load_draft_weights,
                                  open_safetensors)


def _safetensors(path, tensors):
    """Write {name: (dtype name, shape, raw bytes)} as a safetensors file, by hand: numpy
    has no bfloat16, and a BOOL tensor last makes the body's length odd."""
    header, at = {}, 0
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head + b"".join(t[2] for t in tensors.values()))
    return path


def _awkward(rng, n_bool=7):
    bf16 = (rng.standard_normal(301).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return {"w.bf16": ("BF16", (7, 43), bf16.tobytes()),
            "w.f32": ("F32", (5, 3), rng.standard_normal(15).astype(np.float32).tobytes()),
            "ids.i64": ("I64", (9,), rng.integers(-2**40, 2**40, 9).tobytes()),
            "mask.bool": ("BOOL", (n_bool,), (rng.random(n_bool) < 0.5).tobytes())}


@pytest.fixture
def awkward(tmp_path):
    """(plain file, packed file) of the awkward tensors (body length odd)."""
    rng = np.random.default_rng(5)
    f = _safetensors(str(tmp_path / "model.safetensors"), _awkward(rng))
    packed.pack(f, f + packed.PACKED_SUFFIX)
    return f, f + packed.PACKED_SUFFIX


@pytest.mark.parametrize("n_bool", [7, 8, 1])
def test_pack_unpack_bytes_round_trip(tmp_path, n_bool):
    rng = np.random.default_rng(n_bool)
    f = _safetensors(str(tmp_path / "a.safetensors"), _awkward(rng, n_bool))
    raw = open(f, "rb").read()
    body = len(raw) - 8 - struct.unpack_from("<Q", raw)[0]
    assert body % 2 == n_bool % 2
    packed.pack(f, str(tmp_path / "a.packed"))
    assert packed.unpack_bytes(str(tmp_path / "a.packed")) == raw
    assert packed.plain_size(str(tmp_path / "a.packed")) == len(raw)
    assert not os.path.exists(str(tmp_path / "a.packed.tmp"))


def test_pack_unpack_bytes_header_only(tmp_path):
    """An empty body (no tensors): two empty planes, stored raw."""
    f = _safetensors(str(tmp_path / "e.safetensors"), {})
    packed.pack(f, str(tmp_path / "e.packed"))
    assert packed.unpack_bytes(str(tmp_path / "e.packed")) == open(f, "rb").read()


def test_pack_compresses_bf16_high_bytes(tmp_path):
    """A bf16 body shrinks to about 0.7 (the exponent plane compresses, the mantissa one is
    stored raw), as the shipped files do."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(1 << 16).astype(np.float32) * 0.02).view(np.uint32) >> 16
    f = _safetensors(str(tmp_path / "w.safetensors"),
                     {"w": ("BF16", (1 << 16,), w.astype(np.uint16).tobytes())})
    packed.pack(f, f + ".packed")
    ratio = os.path.getsize(f + ".packed") / os.path.getsize(f)
    assert 0.55 < ratio < 0.8, ratio


def test_packed_file_reads_as_the_plain_one(awkward):
    plain, pk = awkward
    a, b = open_safetensors(plain), open_safetensors(pk)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k].dtype, a[k].shape) == (b[k].dtype, b[k].shape)
        assert a[k].numpy().tobytes() == b[k].numpy().tobytes(), k
    assert b["w.bf16"].path == pk and not b["w.bf16"].numpy().flags.writeable


def test_plain_file_beside_a_packed_one_wins(awkward, tmp_path):
    """A directory: the plain file where both are (training writes plain files), else the
    packed one; a path to the absent plain file reads its packed twin."""
    plain, pk = awkward
    d = os.path.dirname(plain)
    assert {t.path for t in open_safetensors(d).values()} == {plain}
    os.remove(plain)
    assert {t.path for t in open_safetensors(d).values()} == {pk}
    assert {t.path for t in open_safetensors(plain).values()} == {pk}
    assert packed.weights_file(d) == pk and packed.weights_file(tmp_path / "none") is None


def _damaged(pk, how):
    raw = bytearray(open(pk, "rb").read())
    head_len = struct.unpack_from("<Q", raw, 52)[0]
    if how == "magic":
        raw[:8] = b"NOTPACKD"
    elif how == "version":
        raw[8:12] = struct.pack("<I", 99)
    elif how == "header":               # the verbatim safetensors header: only the sha256 sees it
        raw[60 + 20] ^= 1
    elif how == "plane":                # the last bytes: plane 1's lzma stream
        raw[-3] ^= 0x40
    elif how == "trailing":
        raw += b"\0"
    else:                               # truncated: at the fixed part, the header, a plane
        raw = raw[:{"cut_fixed": 40, "cut_header": 60 + head_len // 2, "cut_plane": -5}[how]]
    with open(pk, "wb") as fh:
        fh.write(raw)


@pytest.mark.parametrize("how,words", [
    ("magic", "bad magic"), ("version", "version 99"), ("header", "sha256"),
    ("plane", "corrupt"), ("trailing", "after the planes"), ("cut_fixed", "too short"),
    ("cut_header", "truncated"), ("cut_plane", "truncated"),
])
def test_unpack_bytes_refuses_damage_naming_the_file(awkward, how, words):
    _, pk = awkward
    _damaged(pk, how)
    for read in (packed.unpack_bytes, open_safetensors):
        with pytest.raises(DraftWeightError, match="model.safetensors.packed: ") as e:
            read(pk)
        assert words in str(e.value), str(e.value)


def test_shipped_weights_ship_packed_and_pass_their_digest():
    """Every shipped weights file is packed and unpacks to the size and sha256 its
    config.json records (those of the plain file trained)."""
    dirs = [smollm2_head(m) for m in SMOLLM2_HEADS] + [SHIPPED_DIR, hybrid_head(SHIPPED_DIR)]
    for d in dirs:
        f = packed.weights_file(d)
        cfg = json.loads(open(os.path.join(d, "config.json")).read())
        assert packed.is_packed(f) and not os.path.exists(os.path.join(d, "model.safetensors"))
        check_weights_digest(d, cfg)
        assert packed.plain_size(f) == cfg["weights_size"]
        assert packed.plain_sha256(f) == cfg["weights_sha256"]


def _copy(src, dst):
    """A copy of a weights directory without the head directory inside a hybrid's."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("smollm2_hybrid_mtp"))
    return str(dst)


def test_digest_check_refuses_other_weights(tmp_path):
    """A tampered packed file fails before a tensor is read; so does an intact packed file of
    other weights than config.json records (its own sha256 passes, the config's not)."""
    d = _copy(smollm2_head("mtp"), tmp_path / "mtp")
    cfg = json.loads(open(os.path.join(d, "config.json")).read())
    pk = packed.weights_file(d)
    raw = bytearray(open(pk, "rb").read())
    raw[len(raw) // 2] ^= 1
    with open(pk, "wb") as fh:
        fh.write(bytes(raw))
    for check in (lambda: check_weights_digest(d, cfg), lambda: load_draft_weights("mtp", d)):
        with pytest.raises(DraftWeightError, match="mtp/model.safetensors.packed: corrupt"):
            check()
    other = _safetensors(str(tmp_path / "x.safetensors"), _awkward(np.random.default_rng(1)))
    packed.pack(other, pk)
    with pytest.raises(DraftWeightError, match=r"packed: unpacks to .* config says"):
        check_weights_digest(d, cfg)
    with pytest.raises(DraftWeightError, match=r"packed: unpacked sha256 .* \(altered file\)"):
        check_weights_digest(d, dict(cfg, weights_size=packed.plain_size(pk)))


def test_load_from_packed_equals_plain(tmp_path):
    """The shipped head and hybrid, unpacked by the CLI into a copy: every tensor the same
    through load_draft_weights / load_hybrid_weights as from the packed directory."""
    from specdec_lib.models.packed import main
    for m in SMOLLM2_HEADS:
        d = _copy(smollm2_head(m), tmp_path / m)
        assert main(["--unpack", d]) == 0
        a, b = load_draft_weights(m, smollm2_head(m)), load_draft_weights(m, d)
        assert a.names() == b.names()
        for n in a.names():
            assert a.lazy(n).numpy().tobytes() == b.lazy(n).numpy().tobytes(), (m, n)
    d = _copy(SHIPPED_DIR, tmp_path / "hybrid")
    assert main(["--unpack", d]) == 0
    (ca, ta), (cb, tb) = load_hybrid_weights(SHIPPED_DIR), load_hybrid_weights(d)
    assert ca == cb and ta.keys() == tb.keys()
    assert all(np.array_equal(ta[n], tb[n]) for n in ta)


def test_loaders_unpack_a_packed_file_once(monkeypatch):
    """A load unpacks the packed file once: the digest check reads the sha256 that unpacking
    checked, not a second unpacking (s50: the EAGLE3 head was unpacked twice, ~0.25 s)."""
    calls = []
    real = packed.unpack_bytes
    monkeypatch.setattr(packed, "unpack_bytes", lambda p: calls.append(p) or real(p))
    load_draft_weights("mtp", smollm2_head("mtp"))
    load_hybrid_weights(SHIPPED_DIR)
    assert [os.path.basename(os.path.dirname(c)) for c in calls] == ["smollm2_mtp",
                                                                     "smollm2_hybrid"]


def test_load_hybrid_weights_refuses_a_damaged_packed_file(tmp_path):
    d = _copy(SHIPPED_DIR, tmp_path / "hybrid")
    _damaged(packed.weights_file(d), "plane")
    with pytest.raises(HybridWeightsError, match="model.safetensors.packed: unreadable"):
        load_hybrid_weights(d)


def test_pack_weights_cli_round_trip(tmp_path, capsys):
    """pack-weights DIR packs DIR/model.safetensors and removes it (sizes printed); --unpack
    restores the same bytes; a directory with neither file fails naming it."""
    from specdec_lib.__main__ import main
    d = tmp_path / "h"
    d.mkdir()
    f = _safetensors(str(d / "model.safetensors"), _awkward(np.random.default_rng(2)))
    sha = hashlib.sha256(open(f, "rb").read()).hexdigest()
    assert main(["pack-weights", str(d)]) == 0
    assert not os.path.exists(f) and os.path.isfile(f + ".packed")
    assert "model.safetensors.packed: " in capsys.readouterr().out
    assert main(["pack-weights", "--unpack", f + ".packed"]) == 0
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == sha
    assert not os.path.exists(f + ".packed")
    assert main(["pack-weights", "--unpack", str(d)]) == 2
    assert "model.safetensors.packed: no such file" in capsys.readouterr().err
