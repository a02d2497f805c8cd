"""Llama forward pass that also returns the attention scores of the last query.

The layers, weights and hyper-parameters are mlx-lm's own (`mlx_lm.models.llama`):
same parameter names, same RoPE variants, same fused attention kernel. The one
thing mlx-lm cannot give is the attention scores the sampler's metrics need, since
`mx.fast.scaled_dot_product_attention` does not return them. So the attention
layer keeps the fused kernel for its output and computes, separately, the
pre-softmax scores of the last query row only: (heads, visible keys) per layer,
which costs one small matmul per layer instead of materialising full attention.
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

ModelArgs = llama.ModelArgs


class Attention(llama.Attention):
    def __call__(self, x, mask=None, cache=None, key_mask: Optional[mx.array] = None):
        B, L, _ = x.shape
        queries = self.q_proj(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

        offset = cache.offset if cache is not None else 0
        queries = self.rope(queries, offset=offset)
        keys = self.rope(keys, offset=offset)
        if cache is not None:
            # Returns the keys written so far, never the preallocated empty slots.
            keys, values = cache.update_and_fetch(keys, values)

        output = scaled_dot_product_attention(
            queries, keys, values, cache=cache, scale=self.scale, mask=mask
        )
        output = self.o_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))

        # Scores of the last query over every visible key. The last row of a causal
        # mask hides nothing, so only padding (batched decoding) needs masking.
        n_rep = self.n_heads // self.n_kv_heads
        q_last = queries[:, :, -1, :].reshape(B, self.n_kv_heads, n_rep, -1)
        scores = (q_last * self.scale) @ keys.swapaxes(-1, -2)
        scores = scores.reshape(B, self.n_heads, -1).astype(mx.float32)
        if key_mask is not None:
            scores = mx.where(key_mask[:, None, :], scores, -mx.inf)
        return output, scores


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = llama.MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x, mask=None, cache=None, key_mask=None):
        r, scores = self.self_attn(self.input_layernorm(x), mask, cache, key_mask)
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

    def __call__(self, inputs: mx.array, cache=None, last_only: bool = False,
                 mask=None, key_mask: Optional[mx.array] = None):
        h = self.model.embed_tokens(inputs)
        if cache is None:
            cache = [None] * len(self.layers)
        if mask is None:
            mask = create_attention_mask(h, cache[0])
        scores = []
        for layer, layer_cache in zip(self.layers, cache):
            h, s = layer(h, mask, layer_cache, key_mask)
            scores.append(s)
        if last_only:
            # Prefill needs the next-token logits only: skip the vocabulary
            # projection for every other position.
            h = h[:, -1:, :]
        h = self.model.norm(h)
        if self.args.tie_word_embeddings:
            logits = self.model.embed_tokens.as_linear(h)
        else:
            logits = self.lm_head(h)
        return logits, scores

    def sanitize(self, weights):
        return llama.Model.sanitize(self, weights)

    @property
    def layers(self):
        return self.model.layers
