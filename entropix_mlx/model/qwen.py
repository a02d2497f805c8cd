"""Qwen2 (Qwen2.5) and Qwen3, as `mlx_lm.models.qwen2` and `qwen3` define them:
Qwen2 has biases on the q, k and v projections (not the output's) and a head
size of hidden / heads; Qwen3 has no biases, its own head size and an RMSNorm
on every query and key head."""

import functools

import mlx.nn as nn
from mlx_lm.models import qwen2, qwen3
from mlx_lm.models.rope_utils import initialize_rope

from .attention import Attention
from .transformer import MLP, Block, Transformer


def _rope(args, head_dim: int, traditional: bool):
    return initialize_rope(
        head_dim,
        base=args.rope_theta,
        traditional=traditional,
        scaling_config=args.rope_scaling,
        max_position_embeddings=args.max_position_embeddings,
    )


def _layers(args, attention):
    """(a maker of the blocks, the final norm)."""

    def norm():
        return nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    return lambda: [Block(attention(), MLP(args), norm) for _ in range(args.num_hidden_layers)], norm()


def _sanitize(model, weights):
    if model.tied:
        weights.pop("lm_head.weight", None)
    return {k: v for k, v in weights.items() if "self_attn.rotary_emb.inv_freq" not in k}


class Qwen2(Transformer):
    def __init__(self, args: qwen2.ModelArgs):
        head_dim = args.hidden_size // args.num_attention_heads

        def attention():
            rope = _rope(args, head_dim, args.rope_traditional)
            heads = (args.num_attention_heads, args.num_key_value_heads)
            return Attention(args.hidden_size, *heads, head_dim, rope, bias=True)

        layers, norm = _layers(args, attention)
        super().__init__(args, layers, norm, tied=args.tie_word_embeddings)

    sanitize = _sanitize


class Qwen3(Transformer):
    def __init__(self, args: qwen3.ModelArgs):
        def attention():
            rope = _rope(args, args.head_dim, False)
            heads = (args.num_attention_heads, args.num_key_value_heads)
            qk_norm = functools.partial(nn.RMSNorm, eps=args.rms_norm_eps)
            return Attention(args.hidden_size, *heads, args.head_dim, rope, qk_norm=qk_norm)

        layers, norm = _layers(args, attention)
        super().__init__(args, layers, norm, tied=args.tie_word_embeddings)

    sanitize = _sanitize
