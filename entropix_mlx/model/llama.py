"""Llama and Mistral (mlx-lm runs Mistral as Llama): `mlx_lm.models.llama`'s
hyper-parameters, names and RoPE variants (`initialize_rope`: default, linear,
dynamic, llama3, yarn, longrope), on the shared attention with scores."""

import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.rope_utils import initialize_rope

from .attention import Attention
from .transformer import MLP, Block, Segment, Transformer

ModelArgs = llama.ModelArgs

__all__ = ["Model", "ModelArgs", "Segment"]


def attention(args: ModelArgs, window: int | None = None) -> Attention:
    head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
    rope = initialize_rope(
        head_dim, args.rope_theta, args.rope_traditional, args.rope_scaling, args.max_position_embeddings
    )
    bias = args.attention_bias
    return Attention(
        args.hidden_size,
        args.num_attention_heads,
        args.num_key_value_heads,
        head_dim,
        rope,
        bias=bias,
        output_bias=bias,
        window=window,
    )


class Model(Transformer):
    def __init__(self, args: ModelArgs):
        def norm():
            return nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

        def layers():
            return [
                Block(attention(args, args.sliding_window if kind == "sliding_attention" else None), MLP(args), norm)
                for kind in args.layer_types
            ]

        super().__init__(args, layers, norm(), tied=args.tie_word_embeddings)

    def sanitize(self, weights):
        return llama.Model.sanitize(self, weights)
