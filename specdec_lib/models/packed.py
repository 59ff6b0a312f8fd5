"""Shipped weights packed losslessly: ``model.safetensors.packed`` beside (or instead of) a
``model.safetensors``, about 0.7 of its size.

The tree travels to the GPU machine with every call (64 MiB in all), and bf16 weights barely
compress as they are: their high bytes (sign + exponent) do, to 35-43% with lzma, the low
bytes (mantissa) not at all. So the body is split into byte planes of 16-bit words and each
plane is lzma-compressed (stored raw where that does not pay). Format, little-endian:

    magic b"SDPACKST", u32 version (1), u64 size and 32-byte sha256 of the plain file,
    u64 H and the plain file's first H bytes verbatim (the 8-byte length + JSON header),
    then 2 planes (the body padded to even length; plane 0 the words' low bytes, plane 1
    their high bytes), each: u8 codec (0 raw, 1 lzma), u64 stored length, the bytes.

Every reader of a weights directory accepts the packed file where the plain one is absent
(``resolve``; ``registry.open_safetensors`` reads it from memory, unpacked once per open);
config.json's ``weights_size`` / ``weights_sha256`` stay those of the plain file and are
checked against the unpacked bytes. Training writes plain files; packing is the shipping step:

    python -m specdec_lib pack-weights specdec_lib/models/heads/smollm2_mtp \\
        specdec_lib/models/heads/smollm2_eagle3 specdec_lib/models/hybrid/smollm2_hybrid \\
        specdec_lib/models/hybrid/smollm2_hybrid/smollm2_hybrid_mtp

(``--unpack`` restores the plain files.)
"""
from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import struct
import sys

import numpy as np

from ..registry import DraftWeightError

__all__ = ["PACKED_SUFFIX", "drop_packed", "pack", "unpack_bytes", "is_packed", "resolve", "weights_file",
           "plain_size", "plain_sha256", "check_digest", "main"]

PACKED_SUFFIX = ".packed"
MAGIC = b"SDPACKST"
VERSION = 1
_FIXED = struct.Struct("<8sIQ32sQ")     # magic, version, plain size, sha256, H
_PLANE = struct.Struct("<BQ")           # codec, stored length
RAW, LZMA = 0, 1


def is_packed(path) -> bool:
    return os.fspath(path).endswith(PACKED_SUFFIX)


def resolve(path) -> str:
    """``path``, or its packed twin where ``path`` is absent and the twin is there."""
    path = os.fspath(path)
    if not os.path.exists(path) and os.path.isfile(path + PACKED_SUFFIX):
        return path + PACKED_SUFFIX
    return path


def weights_file(directory, name="model.safetensors") -> str | None:
    """The weights file of ``directory``: plain, else packed, else None."""
    f = resolve(os.path.join(os.fspath(directory), name))
    return f if os.path.isfile(f) else None


def drop_packed(plain) -> None:
    """Remove the packed twin of the plain file ``plain`` about to be (re)written: a shipped
    directory trained again must not keep a packing of the old weights beside the new."""
    if os.path.exists(os.fspath(plain) + PACKED_SUFFIX):
        os.remove(os.fspath(plain) + PACKED_SUFFIX)


def pack(src, dst) -> None:
    """Write the packed form of the safetensors file ``src`` to ``dst`` (checked by unpacking
    it before it replaces ``dst``)."""
    with open(src, "rb") as fh:
        data = fh.read()
    if len(data) < 8 or 8 + struct.unpack_from("<Q", data)[0] > len(data):
        raise DraftWeightError(f"{src}: not a safetensors file (header beyond its end)")
    head_len = 8 + struct.unpack_from("<Q", data)[0]
    body = data[head_len:] + b"\0" * ((len(data) - head_len) % 2)
    words = np.frombuffer(body, np.uint8)
    out = [_FIXED.pack(MAGIC, VERSION, len(data), hashlib.sha256(data).digest(), head_len),
           data[:head_len]]
    for plane in (words[0::2].tobytes(), words[1::2].tobytes()):
        z = lzma.compress(plane, preset=9)
        codec, stored = (LZMA, z) if len(z) < len(plane) else (RAW, plane)
        out += [_PLANE.pack(codec, len(stored)), stored]
    tmp = os.fspath(dst) + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(b"".join(out))
    try:
        if unpack_bytes(tmp) != data:
            raise DraftWeightError(f"{src}: packed copy does not unpack to it")
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _fixed(path, buf):
    if len(buf) < _FIXED.size:
        raise DraftWeightError(f"{path}: not a packed weights file (too short)")
    magic, version, size, sha, head_len = _FIXED.unpack_from(buf)
    if magic != MAGIC:
        raise DraftWeightError(f"{path}: not a packed weights file (bad magic {magic!r})")
    if version != VERSION:
        raise DraftWeightError(f"{path}: packed format version {version}, this library reads "
                               f"{VERSION}")
    if not 8 <= head_len <= size:
        raise DraftWeightError(f"{path}: corrupt (header length {head_len}, size {size})")
    return size, sha, head_len


def _read_fixed(path):
    """(plain size, plain sha256, header length) from a packed file's fixed header."""
    with open(path, "rb") as fh:
        return _fixed(path, fh.read(_FIXED.size))


def plain_size(path) -> int:
    """The size of the plain safetensors bytes of ``path`` (packed: read from its header)."""
    if not is_packed(path):
        return os.path.getsize(path)
    return _read_fixed(path)[0]


def unpack_bytes(path) -> bytes:
    """The plain safetensors bytes of the packed file ``path``, their sha256 checked:
    DraftWeightError naming the file on a bad magic, an unknown version, truncation or
    corruption."""
    with open(path, "rb") as fh:
        buf = fh.read()
    size, sha, head_len = _fixed(path, buf)
    at = _FIXED.size + head_len
    n = (size - head_len + 1) // 2          # bytes a plane holds
    planes = []
    for i in range(2):
        if at + _PLANE.size > len(buf):
            raise DraftWeightError(f"{path}: truncated (plane {i} missing)")
        codec, stored = _PLANE.unpack_from(buf, at)
        at += _PLANE.size
        if at + stored > len(buf):
            raise DraftWeightError(f"{path}: truncated (plane {i} holds {len(buf) - at} of "
                                   f"{stored} bytes)")
        chunk = buf[at:at + stored]
        at += stored
        if codec == LZMA:
            try:
                chunk = lzma.decompress(chunk)
            except lzma.LZMAError as e:
                raise DraftWeightError(f"{path}: corrupt (plane {i}: {e})") from None
        elif codec != RAW:
            raise DraftWeightError(f"{path}: corrupt (plane {i}: unknown codec {codec})")
        if len(chunk) != n:
            raise DraftWeightError(f"{path}: corrupt (plane {i} unpacks to {len(chunk)} "
                                   f"bytes, expected {n})")
        planes.append(chunk)
    if at != len(buf):
        raise DraftWeightError(f"{path}: corrupt ({len(buf) - at} bytes after the planes)")
    body = np.empty(2 * n, np.uint8)
    body[0::2], body[1::2] = (np.frombuffer(p, np.uint8) for p in planes)
    data = buf[_FIXED.size:_FIXED.size + head_len] + body[:size - head_len].tobytes()
    if hashlib.sha256(data).digest() != sha:
        raise DraftWeightError(f"{path}: corrupt (unpacked bytes do not match its sha256 "
                               f"{sha.hex()})")
    return data


def plain_sha256(path, unpacked=False) -> str:
    """sha256 (hex) of the plain safetensors bytes of ``path`` (plain or packed). ``unpacked``:
    the packed file was unpacked already (``unpack_bytes`` checked its bytes against the
    sha256 its header records), so that record is read instead of unpacking it again."""
    if is_packed(path):
        if unpacked:
            return _read_fixed(path)[1].hex()
        return hashlib.sha256(unpack_bytes(path)).hexdigest()
    from .gguf_llama import sha256_of
    return sha256_of(path)


def check_digest(path, size, sha256, error, unpacked=False) -> None:
    """``gguf_llama.check_recorded_digest`` for a weights file, plain or packed: a config's
    size / sha256 (``None``: not checked) are the plain bytes'; ``error`` names ``path``.
    ``unpacked``: a loader that opened the packed file first (``open_safetensors`` unpacks
    and checks it), so it is not unpacked twice (~0.25 s for the EAGLE3 head)."""
    if not is_packed(path):
        from .gguf_llama import check_recorded_digest
        check_recorded_digest(path, size, sha256, error)
        return
    got = plain_size(path)          # before unpacking: it costs no decompression
    if size is not None and got != size:
        raise error(f"{path}: unpacks to {got:,} bytes, config says {size:,}")
    if sha256 is not None:
        digest = plain_sha256(path, unpacked)
        if digest != sha256:
            raise error(f"{path}: unpacked sha256 {digest}, config says {sha256} (altered file)")


def main(argv=None) -> int:
    """``python -m specdec_lib pack-weights [--unpack] PATH...``."""
    p = argparse.ArgumentParser(
        prog="python -m specdec_lib pack-weights",
        description="Pack each PATH's model.safetensors (PATH: a weights directory or the "
                    "file) into model.safetensors.packed and remove the plain file; --unpack: "
                    "the reverse. Lossless: the plain bytes' sha256 is checked either way.")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--unpack", action="store_true", help="restore the plain files")
    args = p.parse_args(argv)
    for path in args.paths:
        plain = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
        if plain.endswith(PACKED_SUFFIX):
            plain = plain[:-len(PACKED_SUFFIX)]
        src, dst = (plain + PACKED_SUFFIX, plain) if args.unpack else (plain, plain + PACKED_SUFFIX)
        if not os.path.isfile(src):
            print(f"pack-weights: {src}: no such file", file=sys.stderr)
            return 2
        try:
            if args.unpack:
                data = unpack_bytes(src)
                with open(dst + ".tmp", "wb") as fh:
                    fh.write(data)
                os.replace(dst + ".tmp", dst)
            else:
                pack(src, dst)
        except DraftWeightError as e:
            print(f"pack-weights: {e}", file=sys.stderr)
            return 2
        a, b = os.path.getsize(src), os.path.getsize(dst)
        os.remove(src)
        print(f"{dst}: {a:,} -> {b:,} bytes ({b / a:.3f})")
    return 0
