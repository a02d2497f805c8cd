"""Read and validate a GGUF file's header in Python, before any tensor is touched.

Every length, count, type and offset is bounds-checked, so a corrupt file becomes a
one-line `ModelLoadError` instead of an out-of-bounds read. The metadata values are
decoded on the way; the tensor table says where each tensor lies. Decoding the
tensors is `gguf`'s (gguf_tensors.py).

Why not `gguf.GGUFReader` for the header: it builds a NumPy view per string, and a
150k-token vocabulary then takes seconds longer than this reader (docs/models.md).
"""

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelLoadError, UnsupportedModelError

# GGUF metadata value types: id -> struct format of one scalar (strings/arrays apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


_STRING, _ARRAY = 8, 9


# Tensor types this project reads: the plain ones and every type gguf.quants dequantizes.
DEQUANTIZED = {
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
}  # fmt: skip
PLAIN = {"F32", "F16", "BF16"}
READABLE = PLAIN | DEQUANTIZED


SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass
class TensorInfo:
    name: str
    shape: tuple  # NumPy order (rows, columns): GGUF's dimensions reversed
    kind: str  # the GGML type's name: "Q4_K", "F32", ...
    start: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFHeader:
    path: Path
    metadata: dict = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)


def _printable(raw: bytes) -> str:
    """A name from the file, safe to put in a one-line message."""
    text = raw[:60].decode("utf-8", "replace")
    text = text if text.isprintable() else ascii(text)
    return text + ("..." if len(raw) > 60 else "")


class _Reader:
    def __init__(self, f, size, path):
        self.f, self.size, self.path = f, size, path

    def bad(self, what):
        return ModelLoadError(f"GGUF file {self.path} is corrupt or truncated ({what}); re-download or re-convert it")

    def read(self, n, what):
        if n < 0 or self.f.tell() + n > self.size:
            raise self.bad(f"{what} runs past the end of the file")
        return self.f.read(n)

    def unpack(self, fmt, what):
        return struct.unpack("<" + fmt, self.read(struct.calcsize("<" + fmt), what))[0]

    def string(self, what):
        n = self.unpack("Q", f"length of {what}")
        return self.read(n, what)

    def text(self, what):
        return self.string(what).decode("utf-8", "replace")

    def value(self, vtype, key, depth=0):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], f"value of {key}")
        if vtype == _STRING:
            return self.text(f"value of {key}")
        if vtype == _ARRAY and depth == 0:
            item_type = self.unpack("I", f"array type of {key}")
            count = self.unpack("Q", f"array length of {key}")
            if item_type in _SCALARS:  # fixed-size items: one bounds-checked read
                raw = self.read(count * struct.calcsize(_SCALARS[item_type]), f"array {key}")
                return np.frombuffer(raw, dtype=_NUMPY[item_type])
            if item_type in (_STRING, _ARRAY):
                if count > self.size:
                    raise self.bad(f"array {key} claims {count} items")
                return [self.value(item_type, key, depth + 1) for _ in range(count)]
            raise self.bad(f"array {key} has unknown item type {item_type}")
        raise self.bad(f"metadata {key} has unknown value type {vtype}")


def read_header(path: Path) -> GGUFHeader:
    """The metadata and tensor table, or a ModelLoadError naming what is wrong:
    not GGUF, one part of a split file, truncated, corrupt, or a tensor type that
    cannot be read."""
    path = Path(path)
    _check_split({}, path)  # by name first: a part cut short is still a part
    size = path.stat().st_size
    header = GGUFHeader(path)
    with open(path, "rb") as f:
        r = _Reader(f, size, path)
        if r.read(4, "magic") != b"GGUF":
            raise ModelLoadError(
                f"{path} is not a GGUF file (its first bytes are not 'GGUF'); "
                "give a .gguf file, a model directory or a Hugging Face repo id"
            )
        version = r.unpack("I", "version")
        if version not in (2, 3):
            raise ModelLoadError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors = r.unpack("Q", "tensor count")
        n_kv = r.unpack("Q", "metadata count")
        if n_tensors > size or n_kv > size:
            raise r.bad(f"header claims {n_tensors} tensors and {n_kv} metadata entries")
        for _ in range(n_kv):
            key = _printable(r.string("metadata key"))
            vtype = r.unpack("I", f"type of {key}")
            header.metadata[key] = r.value(vtype, key)
        _check_split(header.metadata, path)
        alignment = header.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise r.bad(f"alignment {alignment} is not a power of two")
        table = []
        for _ in range(n_tensors):
            name = _printable(r.string("tensor name"))
            n_dims = r.unpack("I", f"dimension count of {name}")
            if not 1 <= n_dims <= 4:
                raise r.bad(f"tensor {name} has {n_dims} dimensions")
            dims = [r.unpack("Q", f"shape of {name}") for _ in range(n_dims)]
            ttype = r.unpack("I", f"type of {name}")
            offset = r.unpack("Q", f"offset of {name}")
            table.append((name, dims, ttype, offset))
        data_start = -(-f.tell() // alignment) * alignment
    for name, dims, ttype, offset in table:
        kind = _type_name(ttype)
        if kind not in READABLE:
            raise UnsupportedModelError(
                f"{path}: tensor {name} has GGML type {kind}, which entropix-mlx cannot read "
                f"(readable: {', '.join(sorted(READABLE))}); re-quantize the model to one of these"
            )
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        count = 1
        for d in dims:
            if d == 0 or d > size * 2:
                raise r.bad(f"tensor {name} has dimension {d}")
            count *= d
        if dims[0] % block:
            raise r.bad(f"tensor {name}'s rows of {dims[0]} do not split into blocks of {block}")
        nbytes = count // block * block_bytes
        if offset % alignment or data_start + offset + nbytes > size:
            raise r.bad(f"tensor {name} lies outside the file")
        header.tensors.append(TensorInfo(name, tuple(reversed(dims)), kind, data_start + offset, nbytes))
    return header


def _type_name(ttype: int) -> str:
    try:
        return GGMLQuantizationType(ttype).name
    except ValueError:
        return f"{ttype} (unknown)"


def _check_split(metadata: dict, path: Path) -> None:
    """llama.cpp's gguf-split writes `NAME-00001-of-00003.gguf` parts, each a GGUF
    of its own with `split.count` set: one part is never the whole model."""
    count = metadata.get("split.count", 1)
    match = SPLIT_NAME.search(path.name)
    if (isinstance(count, int) and count > 1) or (match and int(match.group(2)) > 1):
        total = count if isinstance(count, int) and count > 1 else int(match.group(2))
        raise ModelLoadError(
            f"{path} is one part of a GGUF split into {total} files; join them into one file first "
            "(llama.cpp: 'llama-gguf-split --merge FIRST-PART OUT.gguf') and load that"
        )
