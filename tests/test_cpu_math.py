"""The CPU exp (Cephes' expf in MLX ops), its SwiGLU and softmax, against float64 numpy."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from entropix_mlx.accel import cpu_math
from entropix_mlx.accel.backend import Backend
from entropix_mlx.accel.cpu_math import logsumexp

CPU = Backend(cpu_kernels=True)
swiglu, softmax, rope = CPU.swiglu, CPU.softmax, CPU.rope

# These are the CPU's own kernels: they run only on the CPU device (elsewhere MLX's run).
pytestmark = pytest.mark.usefixtures("on_cpu")


def test_cpu_exp_is_within_a_float_rounding_of_the_exact_one():
    x = np.concatenate([np.linspace(-87, 87, 1_000_001), np.linspace(-2, 2, 100_001)]).astype(np.float32)
    got = np.array(cpu_math.exp(mx.array(x)), dtype=np.float64)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - exact) / exact) < 2e-7


def test_cpu_swiglu_matches_the_exact_silu_everywhere():
    x = np.concatenate([np.linspace(-120, 120, 1_000_001), np.linspace(-3, 3, 100_001)]).astype(np.float32)
    up = np.random.default_rng(0).normal(size=x.shape).astype(np.float32)
    got = np.array(swiglu(mx.array(x), mx.array(up)), dtype=np.float64)
    x64 = x.astype(np.float64)
    exact = x64 / (1 + np.exp(-x64)) * up
    # Relative, except far below zero: for x < -87 exp(-x) saturates at e^87,
    # so silu(-120) comes out ~1e-36 instead of ~1e-50.
    assert np.all(np.abs(got - exact) <= 3e-7 * np.abs(exact) + 1e-34)
    # ... and at least as close as MLX's own silu, which it replaces on the CPU.
    theirs = np.array(mlx_lm_swiglu(mx.array(x), mx.array(up)), dtype=np.float64)
    assert np.max(np.abs(got - exact)) <= np.max(np.abs(theirs - exact))


def test_cpu_swiglu_keeps_signed_zeros_infinities_and_nans():
    x = mx.array([0.0, -0.0, np.inf, np.nan, 1e-30, -1e-30], dtype=mx.float32)
    got = np.array(swiglu(x, mx.ones(x.shape)))
    assert got[0] == 0 and got[1] == 0 and got[2] == np.inf and np.isnan(got[3])
    np.testing.assert_allclose(got[4:], [5e-31, -5e-31], rtol=1e-6)


def test_other_dtypes_keep_mlx_lms_swiglu():
    x = mx.array([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=mx.float16)
    assert mx.array_equal(swiglu(x, x), mlx_lm_swiglu(x, x))


def test_cpu_softmax_matches_the_exact_one_and_gives_hidden_keys_nothing():
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(6, 3, 300)) * 8).astype(np.float32)
    x[:, :, :7] = -np.inf  # hidden (padding) keys
    got = np.array(softmax(mx.array(x)), dtype=np.float64)
    x64 = x.astype(np.float64)
    exact = np.exp(x64 - x64.max(-1, keepdims=True))
    exact /= exact.sum(-1, keepdims=True)
    assert np.all(got[:, :, :7] == 0)
    np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-12)


def test_cpu_logsumexp_matches_the_exact_one_and_mlxs_edge_cases():
    x = (np.random.default_rng(3).normal(size=(4, 49152)) * 6).astype(np.float32)
    x[1, :100] = -np.inf
    x64 = x.astype(np.float64)
    top = x64.max(-1, keepdims=True)
    exact = (np.log(np.exp(x64 - top).sum(-1, keepdims=True)) + top)[:, 0]
    # float32 summation over 49,152 terms: ~1e-6 relative, as MLX's own logsumexp
    np.testing.assert_allclose(np.array(logsumexp(mx.array(x))), exact, rtol=3e-6)
    for row in ([-np.inf, -np.inf], [1.0, np.inf], [np.nan, 1.0], [-np.inf, 3.0]):
        a = mx.array(np.array(row, dtype=np.float32))
        np.testing.assert_equal(logsumexp(a).item(), mx.logsumexp(a).item())


@pytest.mark.parametrize("traditional", [True, False])
def test_cpu_rope_equals_mlxs_bit_for_bit(traditional):
    module = nn.RoPE(64, traditional=traditional, base=100000.0)
    rng = np.random.default_rng(4)
    for batch, length, offset in (
        (1, 1, 0),
        (1, 1, 7),
        (1, 24, 31),
        (1, 3, 8000),
        (3, 1, mx.array([0, 17, 4096])),
        (3, 5, mx.array([2, 0, 9])),
    ):
        x = mx.array(rng.normal(size=(batch, 12, length, 64)).astype(np.float32))
        expected = module(x, offset=offset)  # mx.fast.rope
        assert CPU.rope_tables(module, x.shape, offset) is not None  # the CPU's own rotation runs
        got = rope(module, x, offset)
        assert mx.array_equal(got, expected).item(), (batch, length, offset)
        if length > 1:  # (position 0 is no rotation at all)
            assert not mx.array_equal(got, x).item()
    # a rotation of part of each head, or scaled positions: MLX's own kernel
    partial = nn.RoPE(32, base=10000.0)
    x = mx.array(rng.normal(size=(1, 2, 4, 64)).astype(np.float32))
    assert CPU.rope_tables(partial, x.shape, 5) is None
    assert mx.array_equal(rope(partial, x, 5), partial(x, offset=5)).item()
