"""exp for the CPU backend, and where it is hot: SwiGLU, softmax, logsumexp; and RoPE.

MLX's CPU `exp` and `sigmoid` are scalar code on Linux x86, slow enough that the
MLPs' silu costs a sizeable share of a pass next to its weight products, and the
attention's softmax and each row's log-probability (a logsumexp over the whole
vocabulary) add more. Here exp is Cephes' `expf` in MLX ops (range reduction to
r in [-ln2/2, ln2/2] with ln 2 split in two parts, a degree-7 polynomial, 2^n put
in the float's exponent bits), compiled so that MLX runs it as a few fused
kernels, within 2e-7 of the exact value (tests/test_cpu_math.py). On a GPU, and
for other dtypes, MLX's own kernels stay. Figures are in docs/speed.md.

RoPE: on the CPU `mx.fast.rope` falls back to a dozen small kernels, whose
overhead outweighs a decode step's rotation itself. The same formula (MLX's own
frequencies, `base ** (-2j / dims)` computed as MLX computes it) is bit for bit
equal (tests/test_cpu_math.py) and split in two: the cos and sin tables, made
once per pass (every layer rotates the same positions), and the rotation, one
fused kernel on contiguous arrays.
"""

import functools

import mlx.core as mx
import mlx.nn as nn

_LOG2E = 1.4426950408889634


_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = hi + lo; n * hi is exact in float32


# 1.5 * 2**23: a float32 sum with it keeps no fraction, so (v + _ROUND) - _ROUND is v
# rounded to an integer (|v| < 2**22). MLX's CPU `floor` is a libm call per element,
# a large share of the whole exp's cost; two additions are not.
_ROUND = 12582912.0


_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def exp(x: mx.array) -> mx.array:
    """e^x for float32 x: 0 below -87 (where float32 runs out of normal
    numbers), e^88 above 88 (no overflow to inf), NaN for NaN."""
    clipped = mx.clip(x, -87.0, 88.0)
    n = (clipped * _LOG2E + _ROUND) - _ROUND  # the nearest integer, in two additions
    r = clipped - n * _LN2_HI - n * _LN2_LO
    p = _EXP_POLY[0]
    for c in _EXP_POLY[1:]:
        p = p * r + c
    p = p * r * r + r + 1.0
    e = p * mx.view(mx.left_shift(n.astype(mx.int32) + 127, 23), mx.float32)
    return mx.where(x < -87.0, 0.0, e)


@mx.compile
def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, for float32 arrays."""
    return gate / (1.0 + exp(-gate)) * up


@mx.compile
def softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis of a float32 array (-inf entries get exactly 0)."""
    e = exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@mx.compile
def _logsumexp(x: mx.array) -> mx.array:
    top = x.max(axis=-1, keepdims=True)
    finite_top = mx.where(mx.isinf(top), 0.0, top)
    out = mx.log(exp(x - finite_top).sum(axis=-1, keepdims=True)) + finite_top
    return mx.where(mx.isinf(top), top, out).squeeze(-1)  # all -inf: -inf; any +inf: inf


@mx.compile
def _rope_tables(
    offset: mx.array, inv_freq: mx.array, positions: mx.array, heads: mx.array, traditional: bool
) -> tuple[mx.array, mx.array]:
    positions = (offset.reshape(-1, 1) + positions).astype(mx.float32)  # (B or 1, L)
    theta = positions[..., None] * inv_freq  # (B or 1, L, dims/2)
    cos, sin = mx.cos(theta), mx.sin(theta)
    if traditional:  # rotated pairs are neighbours: (x0, x1), (x2, x3), ...
        cos2 = mx.stack([cos, cos], axis=-1).reshape(*cos.shape[:-1], -1)
        sin2 = mx.stack([-sin, sin], axis=-1).reshape(*sin.shape[:-1], -1)
    else:  # rotated pairs are (x_i, x_{i + dims/2})
        cos2, sin2 = mx.concatenate([cos, cos], axis=-1), mx.concatenate([-sin, sin], axis=-1)
    # Written out for every head: the rotation then reads contiguous arrays of x's shape.
    return cos2[:, None] * heads, sin2[:, None] * heads


@mx.compile
def rotate(x: mx.array, cos2: mx.array, sin2: mx.array, traditional: bool) -> mx.array:
    if traditional:
        swapped = x.reshape(*x.shape[:-1], -1, 2)[..., ::-1].reshape(x.shape)
    else:
        half = x.shape[-1] // 2
        swapped = mx.concatenate([x[..., half:], x[..., :half]], axis=-1)
    # x1 cos - x2 sin and x2 cos + x1 sin with the very roundings of MLX's own
    # kernel: x2 (-sin) is -(x2 sin) exactly, and a sum does not depend on its order.
    return x * cos2 + swapped * sin2


def rope_tables(module: nn.RoPE, shape: tuple, offset) -> tuple[mx.array, mx.array]:
    """cos and sin for `rotate` on an x of `shape` (B, heads, L, dims) by a plain
    `nn.RoPE` module (unscaled, over all of each head), made once and reused by
    every layer of a pass (their positions are the same): the angles and their
    sines were most of a RoPE call's kernels on the CPU."""
    inv_freq = _inverse_frequencies(module.dims, module.base)
    offset = offset.astype(mx.int32) if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
    return _rope_tables(offset, inv_freq, mx.arange(shape[2]), mx.ones((1, shape[1], 1, 1)), module.traditional)


@functools.cache
def _inverse_frequencies(dims: int, base: float) -> mx.array:
    # MLX's formula, so the angles are bit for bit its own.
    log_base = mx.log(mx.array(base, dtype=mx.float32))
    return mx.exp(-mx.arange(dims // 2, dtype=mx.float32) * (2.0 / dims) * log_base)


def logsumexp(x: mx.array) -> mx.array:
    """log(sum(e^x)) over the last axis: this exp for float32 arrays on the CPU
    backend, MLX's own elsewhere."""
    return _logsumexp(x) if x.dtype == mx.float32 and mx.default_device() == mx.cpu else mx.logsumexp(x, axis=-1)
