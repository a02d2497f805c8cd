"""Attention that also returns the attention scores of the last query.

Every family's layers use this one module; what differs between them is
configuration: q/k/v (and output) biases, a q/k RMSNorm, the head size, the
score scale, the RoPE module, and a sliding window. The parameter names are
mlx-lm's (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `q_norm`, `k_norm`), so the
same weights load into both.

`mx.fast.scaled_dot_product_attention` does not return the scores the
sampler's metrics need, so the output keeps the fused kernel and the
pre-softmax scores of the last query row are computed separately: (heads,
keys) per layer, one small matmul instead of the full attention matrix. Keys
the query does not see (padding, or outside a sliding window) are -inf there.
"""

import mlx.core as mx
import mlx.nn as nn


class Attention(nn.Module):
    def __init__(
        self,
        dims: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        rope: nn.Module,
        scale: float | None = None,
        bias: bool = False,
        output_bias: bool = False,
        qk_norm=None,
        window: int | None = None,
    ):
        """`qk_norm`: a norm class applied to each head of the queries and keys
        (`qk_norm(head_dim)`), or None. `window`: the query sees only the last
        `window` positions (itself included), or every earlier one if None."""
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window = window
        self.q_proj = nn.Linear(dims, n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dims, n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dims, n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * head_dim, dims, bias=output_bias)
        if qk_norm is not None:
            self.q_norm = qk_norm(head_dim)
            self.k_norm = qk_norm(head_dim)
        self.rope = rope

    def __call__(self, h, segments, masks: list[dict], layer: int, rotations: list[dict], backend):
        """h: (tokens, hidden), every segment's tokens in order; `masks` and
        `rotations`: per segment, by window and by `rope_key`. Returns the
        output projection and each segment's last-query scores."""
        queries, keys, values = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        outputs, scores, start = [], [], 0
        rotation_key = rope_key(self.rope)
        for seg, mask, rotation in zip(segments, masks, rotations, strict=False):
            n = seg.tokens.size
            rows = slice(start, start + n) if len(segments) > 1 else slice(None)
            cache = seg.cache[layer] if seg.cache is not None else None
            o, s = self.attend(
                backend,
                queries[rows],
                keys[rows],
                values[rows],
                seg.tokens.shape,
                cache,
                mask[self.window],
                seg.key_mask,
                rotation.get(rotation_key),
            )
            outputs.append(o)
            scores.append(s)
            start += n
        return self.o_proj(outputs[0] if len(outputs) == 1 else mx.concatenate(outputs)), scores

    def attend(self, backend, queries, keys, values, shape, cache=None, mask=None, key_mask=None, rotation=None):
        """Attention of one segment, from its rows of the q/k/v projections.
        `rotation`: this segment's `rope_tables` (the same for every layer of a pass).
        Returns (output (B*L, heads*dim), last query's scores (B, heads, keys))."""
        B, L = shape
        queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        if "q_norm" in self:
            queries, keys = self.q_norm(queries), self.k_norm(keys)

        # One RoPE call for queries and keys: it rotates each head by its position
        # alone, and on the CPU each call has a fixed cost whatever its size.
        offset = cache.offset if cache is not None else 0
        both = backend.rope(self.rope, mx.concatenate([queries, keys], axis=1), offset, rotation)
        queries, keys = both[:, : self.n_heads], both[:, self.n_heads :]
        if cache is not None:
            # Returns the keys written so far, never the preallocated empty slots.
            keys, values = cache.update_and_fetch(keys, values)
        # The last row of a causal mask hides nothing: only padding (batched
        # decoding) and a window need masking in the last query's scores.
        output, scores = backend.attention(queries, keys, values, self.scale, mask, cache)
        scores = scores.astype(mx.float32)
        if self.window is not None and isinstance(mask, mx.array) and mask.dtype == mx.bool_:
            # The keys the last query's window leaves out (and padding) as -inf.
            scores = mx.where(mask[..., -1, :].reshape(-1, 1, scores.shape[-1]), scores, -mx.inf)
        if key_mask is not None:
            scores = mx.where(key_mask[:, None, :], scores, -mx.inf)
        return output, scores


def rope_key(module) -> tuple | int:
    """Equal for RoPE modules that rotate alike, so a pass makes their CPU
    tables once (`Backend.rope_tables` makes them for plain `nn.RoPE` only)."""
    if type(module) is nn.RoPE:
        return (module.dims, module.base, module.scale, module.traditional)
    return id(module)
