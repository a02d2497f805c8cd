"""GGUF tensors to MLX arrays, decoded by llama.cpp's own `gguf` package.

Three ways, by the tensor's GGML type (docs/gguf.md has the table and the errors):

- F32, F16, BF16 stay as they are.
- Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are affine per block of 32 (`w = d*q + m`), and so
  are Q4_K's and Q5_K's sub-blocks of 32 (`w = d*sc*q - dmin*m`): exactly MLX's affine
  quantization, so their codes and scales are repacked unchanged.
- Every other type is dequantized by `gguf.quants.dequantize` to float32, then, for
  native weights, quantized again with `mx.quantize` at the bits and group size
  `REQUANTIZE` gives (MLX has no group of 16 and no non-linear grid); for float32
  weights it stays float32.
"""

from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from .gguf_check import TensorInfo

# (bits, group size) of the MLX quantization each GGML type becomes with native weights.
EXACT = {
    "Q4_0": (4, 32),
    "Q4_1": (4, 32),
    "Q5_0": (5, 32),
    "Q5_1": (5, 32),
    "Q8_0": (8, 32),
    "Q4_K": (4, 32),
    "Q5_K": (5, 32),
}
REQUANTIZE = {
    "Q6_K": (8, 32),  # sub-blocks of 16 with their own scales: 8 bits keep both
    "Q3_K": (6, 32),  # sub-blocks of 16
    "Q2_K": (4, 32),  # sub-blocks of 16
    "IQ4_NL": (6, 32),  # non-linear grids: more bits than the type's to follow them
    "IQ4_XS": (6, 32),
    "IQ3_XXS": (5, 32),
    "IQ3_S": (5, 32),
    "IQ2_XXS": (4, 32),
    "IQ2_XS": (4, 32),
    "IQ2_S": (4, 32),
    "IQ1_S": (4, 32),
    "IQ1_M": (4, 32),
}
QUANTIZATION = {**EXACT, **REQUANTIZE}


class TensorFile:
    """A GGUF file's tensor data, mapped once and read tensor by tensor."""

    def __init__(self, path: Path):
        self.data = np.memmap(path, dtype=np.uint8, mode="r")

    def raw(self, info: TensorInfo) -> np.ndarray:
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return self.data[info.start : info.start + info.nbytes].reshape(rows, -1)

    def read(self, info: TensorInfo, native: bool, scale_dtype=mx.float16):
        """An `mx.array`, or `(weight, scales, biases)` for a quantized matrix."""
        raw = self.raw(info)
        if info.kind == "F32":
            return mx.array(raw.view(np.float32).reshape(info.shape))
        if info.kind == "F16":
            return mx.array(raw.view(np.float16).reshape(info.shape))
        if info.kind == "BF16":
            return mx.array(raw.view(np.uint16).reshape(info.shape)).view(mx.bfloat16)
        k_quant = info.kind in ("Q4_K", "Q5_K")
        # (a K-quant's scale is a product, d*sc, rounded in scale_dtype: for float32, dequantize)
        if info.kind in EXACT and (native or not k_quant):
            unpack = repack_k if k_quant else repack
            weight, scales, biases = unpack(raw, info.kind, info.shape)
            return weight, scales.astype(scale_dtype), biases.astype(scale_dtype)
        values = dequantize(raw, GGMLQuantizationType[info.kind]).reshape(info.shape)
        if not native or len(info.shape) < 2:
            return mx.array(values)
        bits, group = REQUANTIZE[info.kind]
        weight, scales, biases = mx.quantize(mx.array(values), group_size=group, bits=bits)
        return weight, scales.astype(scale_dtype), biases.astype(scale_dtype)


def repack(raw: np.ndarray, kind: str, shape: tuple):
    """Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks as MLX affine quantization, value for value:
    the codes unchanged, scale d, bias m (or -d times the code of zero)."""
    width = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}[kind]
    blocks = raw.reshape(raw.shape[0], -1, width)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    if kind == "Q8_0":
        codes, bits, zero = blocks[..., 2:] ^ np.uint8(0x80), 8, 128  # int8 q as uint8 q + 128
    else:
        qs = blocks[..., width - 16 :]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # elements 0-15 low nibbles, 16-31 high
        bits, zero = (4, 8) if kind in ("Q4_0", "Q4_1") else (5, 16)
        if bits == 5:  # the fifth bits of the 32 codes, one uint32 before qs
            qh = blocks[..., width - 20 : width - 16].copy().view(np.uint32)
            codes = codes | (((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4)
    if kind in ("Q4_1", "Q5_1"):
        biases = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    else:
        biases = d * np.float16(-zero)
    weight = pack(codes.reshape(shape), bits)
    lead = shape[:-1]
    return mx.array(weight), mx.array(d.reshape(*lead, -1)), mx.array(biases.reshape(*lead, -1))


def repack_k(raw: np.ndarray, kind: str, shape: tuple):
    """Q4_K/Q5_K super-blocks of 256 as MLX groups of 32: each sub-block of 32 is
    `w = d*sc * q - dmin*m` with 6-bit sc and m (ggml's get_scale_min_k4)."""
    width = 144 if kind == "Q4_K" else 176
    blocks = raw.reshape(raw.shape[0], -1, width)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 4:16].astype(np.uint8)
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 0x0F) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    mins = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    qs = blocks[..., width - 128 :].reshape(*blocks.shape[:-1], 4, 32)  # 4 chunks of 32 bytes
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*blocks.shape[:-1], 8, 32)  # sub-block k
    bits = 4
    if kind == "Q5_K":
        qh = blocks[..., 16:48]  # bit k of qh[l] is the fifth bit of sub-block k's element l
        high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
        codes, bits = codes | (high << 4), 5
    scales = d * sc.astype(np.float32)
    biases = -(dmin * mins.astype(np.float32))
    lead = shape[:-1]
    weight = pack(codes.reshape(shape), bits)
    return mx.array(weight), mx.array(scales.reshape(*lead, -1)), mx.array(biases.reshape(*lead, -1))


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes in MLX's packing: a little-endian bit stream in uint32 words."""
    lead = codes.shape[:-1]
    if bits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8).reshape(*lead, -1).view(np.uint32)
    if bits == 4:
        return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(*lead, -1).view(np.uint32)
    eight = codes.reshape(-1, 8).astype(np.uint64)  # 8 codes fill `bits` whole bytes
    words = np.bitwise_or.reduce(eight << (np.arange(8, dtype=np.uint64) * np.uint64(bits)), axis=1)
    stream = words.view(np.uint8).reshape(-1, 8)[:, :bits]
    return np.ascontiguousarray(stream).reshape(*lead, -1).view(np.uint32)
