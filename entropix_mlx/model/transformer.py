"""The forward pass every family shares: embeddings, blocks, norm, head, and
the last query's attention scores per layer.

One pass can also carry several independent inputs (`Transformer.packed`),
each with its own cache: e.g. the batch's decode rows and a new prompt joining
it. The products with the weights run once over all their tokens, the
attention per input. On the CPU backend a product of 8 rows with a weight
matrix costs little more than one of 1, so a joining prompt that rides along
costs a fraction of a pass of its own.
"""

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.gemma3_text import clip_residual

from ..accel.backend import Backend
from .attention import rope_key
from .sharding import gather_heads


@dataclass
class Segment:
    """One input of a pass: tokens (B, L) with their cache (one per layer)."""

    tokens: mx.array
    cache: list | None = None
    # Default: causal over the cache (`create_attention_mask`). Given, it replaces the
    # mask of the full-attention layers; sliding-window layers take theirs from the cache.
    mask: mx.array | str | None = None
    key_mask: mx.array | None = None  # (B, keys): which key columns each row's scores keep


class MLP(llama.MLP):
    """gate, up and down projections with SiLU (mlx-lm's names and biases)."""

    def __call__(self, x, backend: Backend):
        return self.down_proj(backend.swiglu(self.gate_proj(x), self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm attention and MLP. `sandwich`: Gemma's layout, where the
    attention's and the MLP's outputs are normed too before their residual
    sums (its `post_attention_layernorm` norms the attention's output, where
    Llama's norms the MLP's input)."""

    def __init__(self, attention, mlp, norm, sandwich: bool = False):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.sandwich = sandwich
        if sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()

    def __call__(self, x, segments: list[Segment], masks: list, layer: int, rotations: list, backend: Backend):
        """x: (tokens, hidden), every segment's tokens in order. Returns the new
        hidden states and each segment's last-query scores."""
        r, scores = self.self_attn(self.input_layernorm(x), segments, masks, layer, rotations, backend)
        if self.sandwich:
            h = clip_residual(x, self.post_attention_layernorm(r))
            r = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h), backend))
            return clip_residual(h, r), scores
        h = x + r
        return h + self.mlp(self.post_attention_layernorm(h), backend), scores


class Body(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, make_layers, norm: nn.Module):
        super().__init__()
        # Made in mlx-lm's order, so a random initialisation under one seed is the same.
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.layers = make_layers()
        self.norm = norm


class Transformer(nn.Module):
    """A family's model: the same parameter tree as mlx-lm's model of that
    family, so the same weights load into both. `__call__` returns `(logits,
    scores)`: logits `(B, L, vocab)` (or `(B, 1, vocab)` with `last_only`),
    scores a list with one `(B, heads, keys)` float32 array per layer for the
    last query position, -inf where that query does not see the key."""

    def __init__(self, args, make_layers, norm: nn.Module, tied: bool, embed_scale: float | None = None):
        """`make_layers()`: the family's list of `Block`s."""
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = Body(args.vocab_size, args.hidden_size, make_layers, norm)
        self.tied = tied
        self.embed_scale = embed_scale  # Gemma scales the embeddings by sqrt(hidden)
        self.head_group = None  # the ranks that share out the heads (sharding.shard), or None
        self.backend = Backend.here()
        if not tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(
        self, inputs: mx.array, cache=None, last_only: bool = False, mask=None, key_mask: mx.array | None = None
    ):
        return self.packed([Segment(inputs, cache, mask, key_mask)], last_only)[0]

    def packed(self, segments: list[Segment], last_only: bool = True, hidden_at: tuple[int, ...] = ()) -> list[tuple]:
        """One pass over several inputs, each with its own cache; returns each
        one's (logits, scores) as `__call__` would. Each segment's numbers are
        those of a pass of its own up to the weight products' rounding (the
        products see all segments' tokens as rows of one matrix). `hidden_at`:
        layer indices (negative from the end) whose output residual stream is
        returned too, as a third element `{layer: (B, L, hidden)}` (the answer
        confidence's probe reads it)."""
        tokens = (
            segments[0].tokens.reshape(-1)
            if len(segments) == 1
            else mx.concatenate([seg.tokens.reshape(-1) for seg in segments])
        )
        h = self.model.embed_tokens(tokens)
        if self.embed_scale is not None:
            h = h * mx.array(self.embed_scale, mx.bfloat16).astype(h.dtype)  # rounded as Gemma's own code does
        masks = [self._masks(seg) for seg in segments]
        backend = self.backend
        rotations = [self._rotations(seg, backend) if backend.takes(h) else {} for seg in segments]
        scores = [[] for _ in segments]
        pipelined = backend.pipelined(h)  # the layers built so far computed while the next are built
        keep = {i % len(self.layers) for i in hidden_at} if hidden_at else ()  # (none on a decode step)
        kept = {}
        for i, layer in enumerate(self.layers):
            h, layer_scores = layer(h, segments, masks, i, rotations, backend)
            if i in keep:
                kept[i] = h
            if pipelined and i % 2:
                mx.async_eval(h)
            for mine, s in zip(scores, layer_scores, strict=False):
                mine.append(s)
        group = self.head_group
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
        logits = self.model.embed_tokens.as_linear(h) if self.tied else self.lm_head(h)
        out, start = [], 0
        for seg, s in zip(segments, scores, strict=False):
            B, L = seg.tokens.shape
            n = B if last_only else B * L
            rows = logits[start : start + n] if len(segments) > 1 else logits
            if keep:
                first = sum(x.tokens.size for x in segments[: len(out)])  # kept states cover every token
                states = {i: v[first : first + B * L].reshape(B, L, -1) for i, v in kept.items()}
                out.append((rows.reshape(B, n // B, -1), s, states))
            else:
                out.append((rows.reshape(B, n // B, -1), s))
            start += n
        return out

    def _masks(self, seg: Segment) -> dict:
        """The segment's attention masks, by window (None: full attention). Every
        layer's cache holds the same positions, so the first one's make them."""
        first = seg.cache[0] if seg.cache is not None else None
        placeholder = seg.tokens[..., None]  # only L and the cache matter
        masks = {None: seg.mask if seg.mask is not None else create_attention_mask(placeholder, first)}
        for window in self.windows:
            masks[window] = create_attention_mask(placeholder, first, window_size=window)
        return masks

    def _rotations(self, seg: Segment, backend: Backend) -> dict:
        """Every layer rotates the same positions: the cos and sin tables are made
        once per kind of RoPE (where the backend's `rope` uses them)."""
        tables = {}
        first = seg.cache[0] if seg.cache is not None else None
        B, L = seg.tokens.shape
        offset = first.offset if first is not None else 0
        for layer in self.layers:
            attn = layer.self_attn
            key = rope_key(attn.rope)
            if key not in tables:
                shape = (B, attn.n_heads + attn.n_kv_heads, L, attn.head_dim)
                tables[key] = backend.rope_tables(attn.rope, shape, offset)
        return tables

    @property
    def windows(self) -> list[int]:
        """The sliding windows of the model's layers, each once."""
        return sorted({layer.self_attn.window for layer in self.layers} - {None})

    @property
    def layers(self):
        return self.model.layers
