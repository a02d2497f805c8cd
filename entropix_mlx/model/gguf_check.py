"""Validate a GGUF file's header in Python before handing it to `mx.load`.

`mx.load` trusts the header: a file with a corrupt length or offset makes it read
out of bounds and the process dies (SIGSEGV/SIGBUS, seen on 17 of 60 randomly
mutated headers), which no `try` can catch. So every length, count, type and
offset is bounds-checked here first; a bad file becomes a `ModelLoadError`.
"""

import struct
from pathlib import Path

from ..errors import ModelLoadError

# GGUF metadata value types: id -> struct format of one scalar (strings/arrays apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


_STRING, _ARRAY = 8, 9


# Tensor types mx.load decodes: id -> (name, elements per block, bytes per block).
TENSOR_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34)}


_GGML_NAMES = {
    6: "Q5_0",
    7: "Q5_1",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
}


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

    def value(self, vtype, key, depth=0):
        if vtype in _SCALARS:
            self.unpack(_SCALARS[vtype], f"value of {key}")
        elif vtype == _STRING:
            self.string(f"value of {key}")
        elif vtype == _ARRAY and depth == 0:
            item_type = self.unpack("I", f"array type of {key}")
            count = self.unpack("Q", f"array length of {key}")
            if item_type in _SCALARS:  # fixed-size items: skip them in one bounds-checked read
                self.read(count * struct.calcsize(_SCALARS[item_type]), f"array {key}")
            elif item_type in (_STRING, _ARRAY):
                if count > self.size:
                    raise self.bad(f"array {key} claims {count} items")
                for _ in range(count):
                    self.value(item_type, key, depth + 1)
            else:
                raise self.bad(f"array {key} has unknown item type {item_type}")
        else:
            raise self.bad(f"metadata {key} has unknown value type {vtype}")


def check_gguf(path: Path) -> None:
    """Raise ModelLoadError unless the header and tensor table are self-consistent
    and every tensor lies inside the file in a type mx.load decodes."""
    path = Path(path)
    size = path.stat().st_size
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
        alignment = 32
        for _ in range(n_kv):
            key = _printable(r.string("metadata key"))
            vtype = r.unpack("I", f"type of {key}")
            start = f.tell()
            r.value(vtype, key)
            if key == "general.alignment":
                f.seek(start)
                alignment = r.unpack(_SCALARS.get(vtype, "I"), key) if vtype in _SCALARS else 0
                if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
                    raise r.bad(f"alignment {alignment} is not a power of two")
        tensors = []
        for _ in range(n_tensors):
            name = _printable(r.string("tensor name"))
            n_dims = r.unpack("I", f"dimension count of {name}")
            if not 1 <= n_dims <= 4:
                raise r.bad(f"tensor {name} has {n_dims} dimensions")
            dims = [r.unpack("Q", f"shape of {name}") for _ in range(n_dims)]
            ttype = r.unpack("I", f"type of {name}")
            offset = r.unpack("Q", f"offset of {name}")
            tensors.append((name, dims, ttype, offset))
        data_start = -(-f.tell() // alignment) * alignment
    for name, dims, ttype, offset in tensors:
        if ttype not in TENSOR_TYPES:
            kind = _GGML_NAMES.get(ttype, f"type {ttype}")
            raise ModelLoadError(
                f"{path}: tensor {name} is {kind}; entropix-mlx reads Q4_0, Q4_1, Q8_0, F16 and F32 "
                "GGUF tensors only (convert the model to one of these)"
            )
        _, block, block_bytes = TENSOR_TYPES[ttype]
        count = 1
        for d in dims:
            if d == 0 or d > size * 2:
                raise r.bad(f"tensor {name} has dimension {d}")
            count *= d
        if dims[0] % block:
            raise r.bad(f"tensor {name}'s rows of {dims[0]} do not split into blocks of {block}")
        if offset % alignment or data_start + offset + count // block * block_bytes > size:
            raise r.bad(f"tensor {name} lies outside the file")
