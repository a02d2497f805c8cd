"""exp for the CPU backend, and where it is hot: SwiGLU, softmax, logsumexp.

MLX's CPU `exp` and `sigmoid` cost 15-20 ns per element on Linux x86 (scalar
code). Over the bundled model's 30 layers that was 6 ms of an 8-row decode step
in the MLPs' silu and 25 ms of a pass over 32 tokens, as much as a third of the
weight products; the attention's softmax adds 2-4 ms more, and each row's
log-probability (a logsumexp over the 49,152-token vocabulary) 0.6 ms. Here exp is Cephes'
`expf` in MLX ops (range reduction to r in [-ln2/2, ln2/2] with ln 2 split in
two parts, a degree-7 polynomial, 2^n put in the float's exponent bits),
compiled so that MLX runs it as a few fused kernels: about 5 ns per element,
within 2e-7 of the exact value (tests/test_cpu_math.py). On a GPU, and for
other dtypes, MLX's own kernels stay.
"""

import mlx.core as mx
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4    # ln 2 = hi + lo; n * hi is exact in float32
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def exp(x: mx.array) -> mx.array:
    """e^x for float32 x: 0 below -87 (where float32 runs out of normal
    numbers), e^88 above 88 (no overflow to inf), NaN for NaN."""
    clipped = mx.clip(x, -87.0, 88.0)
    n = mx.floor(clipped * _LOG2E + 0.5)
    r = clipped - n * _LN2_HI - n * _LN2_LO
    p = _EXP_POLY[0]
    for c in _EXP_POLY[1:]:
        p = p * r + c
    p = p * r * r + r + 1.0
    e = p * mx.view(mx.left_shift(n.astype(mx.int32) + 127, 23), mx.float32)
    return mx.where(x < -87.0, 0.0, e)


@mx.compile
def _swiglu(gate: mx.array, up: mx.array) -> mx.array:
    return gate / (1.0 + exp(-gate)) * up


@mx.compile
def _softmax(x: mx.array) -> mx.array:
    e = exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@mx.compile
def _logsumexp(x: mx.array) -> mx.array:
    top = x.max(axis=-1, keepdims=True)
    finite_top = mx.where(mx.isinf(top), 0.0, top)
    out = mx.log(exp(x - finite_top).sum(axis=-1, keepdims=True)) + finite_top
    return mx.where(mx.isinf(top), top, out).squeeze(-1)     # all -inf: -inf; any +inf: inf


def on_cpu(x: mx.array) -> bool:
    return x.dtype == mx.float32 and mx.default_device() == mx.cpu


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up."""
    return _swiglu(gate, up) if on_cpu(gate) else mlx_lm_swiglu(gate, up)


def logsumexp(x: mx.array) -> mx.array:
    """log(sum(e^x)) over the last axis."""
    return _logsumexp(x) if on_cpu(x) else mx.logsumexp(x, axis=-1)


def softmax(x: mx.array) -> mx.array:
    """Softmax over the last axis (-inf entries get exactly 0)."""
    return _softmax(x) if on_cpu(x) else mx.softmax(x, axis=-1, precise=True)
