"""Gemma 3 (text), as `mlx_lm.models.gemma3_text` defines it: sliding-window
("local") layers with their own RoPE base between full-attention ones, norms
before and after both the attention and the MLP, (1 + w) RMSNorm (also on
every query and key head), embeddings scaled by sqrt(hidden), a GELU-tanh MLP
and scores scaled by `query_pre_attn_scalar`.

The local layers keep the full cache and hide the keys outside their window
with their mask, where mlx-lm keeps a rotating cache of the window alone: the
batch engine's caches (padding, shared prefixes, forks) then hold the same
positions in every layer, and a local layer's scores are those of its window
with -inf elsewhere. The cost is memory for keys the local layers no longer read.
"""

import functools
from dataclasses import dataclass

from mlx_lm.models import gemma3_text
from mlx_lm.models.gemma3_text import RMSNorm  # RMSNorm scales by (1 + w)
from mlx_lm.models.rope_utils import initialize_rope

from .attention import Attention
from .transformer import Block, Transformer


class MLP(gemma3_text.MLP):
    """mlx-lm's GELU-tanh MLP, called as the blocks call theirs (it has no CPU kernel)."""

    def __call__(self, x, backend=None):
        return super().__call__(x)


@dataclass
class ModelArgs(gemma3_text.ModelArgs):
    # Which layers are local, as Hugging Face configs list them; without it,
    # every `sliding_window_pattern`-th layer is global (mlx-lm's rule).
    layer_types: list[str] | None = None

    def is_sliding(self, layer: int) -> bool:
        if self.layer_types is not None:
            return self.layer_types[layer] == "sliding_attention"
        return (layer + 1) % self.sliding_window_pattern != 0


class Model(Transformer):
    def __init__(self, args: ModelArgs):
        def norm():
            return RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

        def attention(layer: int) -> Attention:
            sliding = args.is_sliding(layer)
            if sliding:
                rope = initialize_rope(args.head_dim, base=args.rope_local_base_freq, traditional=False)
            else:
                rope = initialize_rope(
                    args.head_dim,
                    base=args.rope_theta,
                    traditional=False,
                    max_position_embeddings=args.max_position_embeddings,
                    scaling_config=args.rope_scaling,
                )
            return Attention(
                args.hidden_size,
                args.num_attention_heads,
                args.num_key_value_heads,
                args.head_dim,
                rope,
                scale=args.query_pre_attn_scalar**-0.5,
                qk_norm=functools.partial(RMSNorm, eps=args.rms_norm_eps),
                window=args.sliding_window if sliding else None,
            )

        def layers():
            return [
                Block(attention(i), MLP(args.hidden_size, args.intermediate_size), norm, sandwich=True)
                for i in range(args.num_hidden_layers)
            ]

        super().__init__(args, layers, norm(), tied=False, embed_scale=args.hidden_size**0.5)

    def sanitize(self, weights):
        # Checkpoints without an output projection reuse the embeddings (mlx-lm's rule).
        if "lm_head.weight" not in weights:
            self.tied = True
            self.pop("lm_head", None)
        return weights
