"""Llama forward pass that also returns the attention scores of the last query.

The layers, weights and hyper-parameters are mlx-lm's own (`mlx_lm.models.llama`):
same parameter names, same RoPE variants, same fused attention kernel. The one
thing mlx-lm cannot give is the attention scores the sampler's metrics need, since
`mx.fast.scaled_dot_product_attention` does not return them. So the attention
layer keeps the fused kernel for its output and computes, separately, the
pre-softmax scores of the last query row only: (heads, visible keys) per layer,
which costs one small matmul per layer instead of materialising full attention.

One pass can also carry several independent inputs (`Model.packed`), each with
its own cache: e.g. the batch's decode rows and a new prompt joining it. The
products with the weights run once over all their tokens, the attention per
input. On the CPU backend a product of 8 rows with a weight matrix costs little
more than one of 1, so a joining prompt that rides along costs a fraction of a
pass of its own.
"""

import functools
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

from ..accel.cpu_math import on_cpu, rope, rope_tables, softmax, swiglu
from .sharding import gather_heads

ModelArgs = llama.ModelArgs


@dataclass
class Segment:
    """One input of a pass: tokens (B, L) with their cache (one per layer)."""

    tokens: mx.array
    cache: list | None = None
    mask: mx.array | str | None = None  # default: causal over the cache (`create_attention_mask`)
    key_mask: mx.array | None = None  # (B, keys): which key columns each row's scores keep


class Attention(llama.Attention):
    def attend(self, queries, keys, values, shape, cache=None, mask=None, key_mask=None, rotation=None):
        """Attention of one segment, from its rows of the q/k/v projections.
        `rotation`: this segment's `rope_tables` (the same for every layer of a pass).
        Returns (output (B*L, heads*dim), last query's scores (B, heads, keys))."""
        B, L = shape
        queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

        # One RoPE call for queries and keys: it rotates each head by its position
        # alone, and on the CPU each call has a fixed cost whatever its size.
        offset = cache.offset if cache is not None else 0
        both = rope(self.rope, mx.concatenate([queries, keys], axis=1), offset, rotation)
        queries, keys = both[:, : self.n_heads], both[:, self.n_heads :]
        if cache is not None:
            # Returns the keys written so far, never the preallocated empty slots.
            keys, values = cache.update_and_fetch(keys, values)

        # Scores of the last query over every visible key. The last row of a causal
        # mask hides nothing, so only padding (batched decoding) needs masking.
        n_rep = self.n_heads // self.n_kv_heads
        if on_cpu(queries) and (mask == "causal" if isinstance(mask, str) else L == 1):
            # On the CPU the fused kernel is ops too: computed here, its attention
            # logits give the last query's scores for free, and a prompt's pass makes
            # ~10 fewer ops a layer (each a fixed cost on MLX's one CPU thread).
            q = (queries * self.scale).reshape(B, self.n_kv_heads, n_rep * L, -1)
            logits = q @ keys.swapaxes(-1, -2)  # (B, kv heads, n_rep * L, keys)
            if L == 1:
                scores = logits.reshape(B, self.n_heads, -1)
                if mask is not None:
                    logits = mx.where(mask, logits, -mx.inf) if mask.dtype == mx.bool_ else logits + mask
                output = (softmax(logits) @ values).reshape(B, -1)
            else:
                logits = logits.reshape(B, self.n_kv_heads, n_rep, L, -1)
                scores = logits[:, :, :, -1].reshape(B, self.n_heads, -1)
                probs = softmax(logits + _causal_bias(L, keys.shape[2]))
                output = probs.reshape(B, self.n_kv_heads, n_rep * L, -1) @ values
                output = output.reshape(B, self.n_heads, L, -1).transpose(0, 2, 1, 3).reshape(B * L, -1)
        else:
            q_last = queries[:, :, -1, :].reshape(B, self.n_kv_heads, n_rep, -1)
            last = (q_last * self.scale) @ keys.swapaxes(-1, -2)  # (B, kv heads, n_rep, keys)
            scores = last.reshape(B, self.n_heads, -1)
            output = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
            output = output.transpose(0, 2, 1, 3).reshape(B * L, -1)
        scores = scores.astype(mx.float32)
        if key_mask is not None:
            scores = mx.where(key_mask[:, None, :], scores, -mx.inf)
        return output, scores


@functools.lru_cache(maxsize=8)
def _causal_bias(queries: int, keys: int) -> mx.array:
    """(queries, keys): 0 where the query (the last `queries` of `keys` positions)
    sees the key, -inf after it. Made once for a pass's 30 layers."""
    visible = mx.arange(keys)[None] <= mx.arange(keys - queries, keys)[:, None]
    bias = mx.where(visible, 0.0, -mx.inf).astype(mx.float32)
    mx.eval(bias)
    return bias


class MLP(llama.MLP):
    def __call__(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))  # a faster silu on the CPU


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x, segments: list[Segment], masks: list, layer: int, rotations: list):
        """x: (tokens, hidden), every segment's tokens in order. Returns the new
        hidden states and each segment's last-query scores."""
        attn = self.self_attn
        h = self.input_layernorm(x)
        queries, keys, values = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        outputs, scores, start = [], [], 0
        for seg, mask, rotation in zip(segments, masks, rotations, strict=False):
            n = seg.tokens.size
            rows = slice(start, start + n) if len(segments) > 1 else slice(None)
            cache = seg.cache[layer] if seg.cache is not None else None
            o, s = attn.attend(
                queries[rows], keys[rows], values[rows], seg.tokens.shape, cache, mask, seg.key_mask, rotation
            )
            outputs.append(o)
            scores.append(s)
            start += n
        r = attn.o_proj(outputs[0] if len(outputs) == 1 else mx.concatenate(outputs))
        h = x + r
        return h + self.mlp(self.post_attention_layernorm(h)), scores


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Model(nn.Module):
    """Same parameter tree as `mlx_lm.models.llama.Model`, so the same weights load
    into both. `__call__` returns `(logits, scores)`: logits `(B, L, vocab)` (or
    `(B, 1, vocab)` with `last_only`), scores a list with one `(B, heads, keys)`
    float32 array per layer for the last query position."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(
        self, inputs: mx.array, cache=None, last_only: bool = False, mask=None, key_mask: mx.array | None = None
    ):
        return self.packed([Segment(inputs, cache, mask, key_mask)], last_only)[0]

    def packed(self, segments: list[Segment], last_only: bool = True) -> list[tuple]:
        """One pass over several inputs, each with its own cache; returns each
        one's (logits, scores) as `__call__` would. Each segment's numbers are
        those of a pass of its own up to the weight products' rounding (the
        products see all segments' tokens as rows of one matrix)."""
        tokens = (
            segments[0].tokens.reshape(-1)
            if len(segments) == 1
            else mx.concatenate([seg.tokens.reshape(-1) for seg in segments])
        )
        h = self.model.embed_tokens(tokens)
        masks, rotations = [], []
        attn = self.layers[0].self_attn
        for seg in segments:
            first = seg.cache[0] if seg.cache is not None else None
            mask = seg.mask
            if mask is None:
                mask = create_attention_mask(seg.tokens[..., None], first)  # only L and the cache matter
            masks.append(mask)
            # Every layer rotates the same positions: the cos and sin tables are made once
            # (where `rope` would use them: float32 on the CPU).
            B, L = seg.tokens.shape
            offset = first.offset if first is not None else 0
            shape = (B, attn.n_heads + attn.n_kv_heads, L, attn.head_dim)
            rotations.append(rope_tables(attn.rope, shape, offset) if on_cpu(h) else None)
        scores = [[] for _ in segments]
        # On the CPU, building a decode step's graph in Python is a noticeable share of
        # the step, and MLX's thread would wait for all of it. Handed over two layers at
        # a time, the layers built so far are computed meanwhile. The GPU keeps one graph.
        pipelined = on_cpu(h)
        for i, layer in enumerate(self.layers):
            h, layer_scores = layer(h, segments, masks, i, rotations)
            if pipelined and i % 2:
                mx.async_eval(h)
            for mine, s in zip(scores, layer_scores, strict=False):
                mine.append(s)
        group = getattr(self, "head_group", None)
        if group is not None:  # tensor-parallel (`sharding`): the metrics need every rank's heads
            scores = [gather_heads(s, group) for s in scores]
        if last_only:
            # Prefill needs the next-token logits only: skip the vocabulary
            # projection for every other position.
            ends, start = [], 0
            for seg in segments:
                B, L = seg.tokens.shape
                ends += [start + b * L + L - 1 for b in range(B)]
                start += B * L
            h = h[mx.array(ends)] if len(ends) < h.shape[0] else h
        h = self.model.norm(h)
        if self.args.tie_word_embeddings:
            logits = self.model.embed_tokens.as_linear(h)
        else:
            logits = self.lm_head(h)
        out, start = [], 0
        for seg, s in zip(segments, scores, strict=False):
            B, L = seg.tokens.shape
            n = B if last_only else B * L
            rows = logits[start : start + n] if len(segments) > 1 else logits
            out.append((rows.reshape(B, n // B, -1), s))
            start += n
        return out

    def sanitize(self, weights):
        return llama.Model.sanitize(self, weights)

    @property
    def layers(self):
        return self.model.layers
