"""The code paths and streams a model's passes take, chosen once, when the model
is built: the CPU's own kernels (`cpu_math`) where MLX's CPU backend runs float32
arrays, MLX's fused ones (what a Mac's GPU runs) everywhere else. Model code asks
its `Backend` and holds no device test of its own."""

import functools
import os
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu
from mlx_lm.models.base import scaled_dot_product_attention

from . import cpu_math
from .weights import gemm_uses_all_cores


@dataclass(eq=False)
class Backend:
    """`cpu_kernels`: whether float32 arrays take the CPU's own kernels (the
    model was built on MLX's CPU backend); off, a pass takes a GPU's code paths
    on any device, which the tests use to check both give the same tokens."""

    cpu_kernels: bool
    _streams: list = field(default_factory=list, repr=False)

    @classmethod
    def here(cls) -> "Backend":
        """The paths for the device models are built on now."""
        return cls(cpu_kernels=mx.default_device() == mx.cpu)

    def takes(self, x: mx.array) -> bool:
        """Whether the CPU's own kernels take `x`."""
        return self.cpu_kernels and x.dtype == mx.float32

    def swiglu(self, gate: mx.array, up: mx.array) -> mx.array:
        """silu(gate) * up."""
        return cpu_math.swiglu(gate, up) if self.takes(gate) else mlx_lm_swiglu(gate, up)

    def softmax(self, x: mx.array) -> mx.array:
        """Softmax over the last axis (-inf entries get exactly 0)."""
        return cpu_math.softmax(x) if self.takes(x) else mx.softmax(x, axis=-1, precise=True)

    def rope_tables(self, module, shape: tuple, offset):
        """cos and sin for `rope` on an x of `shape` (B, heads, L, dims), made once
        and reused by every layer of a pass (their positions are the same); None
        where MLX's own kernel rotates (a GPU, or a RoPE other than plain `nn.RoPE`)."""
        if not self.cpu_kernels or type(module) is not nn.RoPE or module.dims != shape[-1] or module.scale != 1.0:
            return None
        return cpu_math.rope_tables(module, shape, offset)

    def rope(self, module, x: mx.array, offset, tables=None) -> mx.array:
        """`module(x, offset=offset)` for x (B, heads, L, dims); `tables`: this
        module's `rope_tables` for x's shape and offset, made once for several calls."""
        if self.takes(x) and tables is None:
            tables = self.rope_tables(module, x.shape, offset)
        if not self.takes(x) or tables is None:
            return module(x, offset=offset)
        return cpu_math.rotate(x, *tables, module.traditional)

    def pipelined(self, h: mx.array) -> bool:
        """Whether a pass hands its graph over two layers at a time: on the CPU,
        building a decode step's graph in Python is a noticeable share of the step,
        and MLX's thread would wait for all of it; a GPU keeps one graph."""
        return self.takes(h)

    def attention(self, queries, keys, values, scale: float, mask=None, cache=None):
        """Attention of queries (B, heads, L, dim) over keys and values (B, kv
        heads, keys, dim). Returns (output (B*L, heads*dim), the last query's
        pre-softmax scores (B, heads, keys))."""
        B, n_heads, L, _ = queries.shape
        n_kv_heads = keys.shape[1]
        n_rep = n_heads // n_kv_heads
        if self.takes(queries) and (mask == "causal" if isinstance(mask, str) else L == 1):
            # On the CPU the fused kernel is ops too: computed here, its attention
            # logits give the last query's scores for free, and a prompt's pass makes
            # fewer ops a layer (each a fixed cost on MLX's one CPU thread).
            q = (queries * scale).reshape(B, n_kv_heads, n_rep * L, -1)
            logits = q @ keys.swapaxes(-1, -2)  # (B, kv heads, n_rep * L, keys)
            if L == 1:
                scores = logits.reshape(B, n_heads, -1)
                if mask is not None:
                    logits = mx.where(mask, logits, -mx.inf) if mask.dtype == mx.bool_ else logits + mask
                return (cpu_math.softmax(logits) @ values).reshape(B, -1), scores
            logits = logits.reshape(B, n_kv_heads, n_rep, L, -1)
            scores = logits[:, :, :, -1].reshape(B, n_heads, -1)
            probs = cpu_math.softmax(logits + _causal_bias(L, keys.shape[2]))
            output = probs.reshape(B, n_kv_heads, n_rep * L, -1) @ values
            return output.reshape(B, n_heads, L, -1).transpose(0, 2, 1, 3).reshape(B * L, -1), scores
        # The fused kernel returns no scores: the last query's, one small matmul.
        q_last = queries[:, :, -1, :].reshape(B, n_kv_heads, n_rep, -1)
        scores = ((q_last * scale) @ keys.swapaxes(-1, -2)).reshape(B, n_heads, -1)
        output = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask)
        return output.transpose(0, 2, 1, 3).reshape(B * L, -1), scores

    def groups(self, batch_size: int, model=None) -> int:
        """How many parallel groups a batch of `batch_size` rows is split into:
        one per CPU core on the CPU backend, whose kernels are single-threaded; one
        on a GPU, whose kernels already use the whole device, and one for float32
        weights with OpenBLAS: its GEMM already spreads over the cores, and one
        GEMM over all rows costs little more than over one."""
        if not self.cpu_kernels:
            return 1
        if model is not None and model.head_group is not None:
            # A model split across ranks exchanges data in each forward pass: the
            # ranks must make their exchanges in one order, so one group, one stream.
            return 1
        if model is not None and gemm_uses_all_cores(model):
            return 1
        return max(1, min(batch_size, os.cpu_count() or 1))

    def streams(self, n: int) -> list:
        """n streams for the groups' forward passes. With several groups none is
        the default stream: the samplers' small ops run there and must not queue
        behind a group's forward pass. Kept for the model's later engines (each
        stream holds a thread)."""
        if n == 1:
            return [mx.default_stream(mx.default_device())]
        while len(self._streams) < n:
            self._streams.append(mx.new_stream(mx.default_device()))
        return self._streams[:n]


@functools.lru_cache(maxsize=8)
def _causal_bias(queries: int, keys: int) -> mx.array:
    """(queries, keys): 0 where the query (the last `queries` of `keys` positions)
    sees the key, -inf after it. Made once for a pass's layers."""
    visible = mx.arange(keys)[None] <= mx.arange(keys - queries, keys)[:, None]
    bias = mx.where(visible, 0.0, -mx.inf).astype(mx.float32)
    mx.eval(bias)
    return bias
