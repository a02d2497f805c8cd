"""Phi-3 and Phi-3.5, as `mlx_lm.models.phi3` defines them. The checkpoints
fuse the q, k and v projections (`qkv_proj`) and the MLP's gate and up
projections (`gate_up_proj`); `sanitize` splits them by output rows into the
shared layers' separate projections. A split by rows is exact, also for
MLX-quantized weights, whose groups run along the input dimension."""

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import phi3
from mlx_lm.models.rope_utils import SuScaledRoPE

from .attention import Attention
from .transformer import MLP, Block, Transformer

ModelArgs = phi3.ModelArgs


def _rope(args: ModelArgs, head_dim: int) -> nn.Module:
    # mlx-lm's choice for Phi-3: SuScaledRoPE for "longrope"/"su", else a plain
    # (possibly linearly scaled) RoPE over the rotated part of each head.
    dims = int(head_dim * args.partial_rotary_factor)
    scaling = args.rope_scaling
    if scaling and scaling["type"] in ("longrope", "su"):
        return SuScaledRoPE(
            dims,
            base=args.rope_theta,
            max_position_embeddings=args.max_position_embeddings,
            original_max_position_embeddings=args.original_max_position_embeddings,
            short_factor=scaling["short_factor"],
            long_factor=scaling["long_factor"],
        )
    scale = 1 / scaling["factor"] if scaling and scaling["type"] == "linear" else 1.0
    return nn.RoPE(dims, traditional=args.rope_traditional, base=args.rope_theta, scale=scale)


class Model(Transformer):
    def __init__(self, args: ModelArgs):
        head_dim = args.hidden_size // args.num_attention_heads

        def norm():
            return nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

        heads = (args.num_attention_heads, args.num_key_value_heads)

        def layers():
            return [
                Block(Attention(args.hidden_size, *heads, head_dim, _rope(args, head_dim)), MLP(args), norm)
                for _ in range(args.num_hidden_layers)
            ]

        super().__init__(args, layers, norm(), tied=args.tie_word_embeddings)

    def sanitize(self, weights):
        attn = self.layers[0].self_attn
        q, kv = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
        out = {}
        for name, value in weights.items():
            if ".qkv_proj." in name:
                for part, rows in zip(("q_proj", "k_proj", "v_proj"), mx.split(value, [q, q + kv]), strict=True):
                    out[name.replace("qkv_proj", part)] = rows
            elif ".gate_up_proj." in name:
                gate, up = mx.split(value, 2)
                out[name.replace("gate_up_proj", "gate_proj")] = gate
                out[name.replace("gate_up_proj", "up_proj")] = up
            else:
                out[name] = value
        if self.tied:
            out.pop("lm_head.weight", None)
        return out
