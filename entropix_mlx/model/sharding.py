"""Tensor parallelism: each rank holds a share of every layer's heads and MLP.

As mlx-lm's `shard()` for its Llama: q, k, v, gate and up projections are split
by output rows ("all-to-sharded"), o and down projections by input columns
("sharded-to-all", an `all_sum` after the product), so each rank keeps about
1/size of the layers' weights and every rank ends each layer with the same
hidden state. The embeddings, norms and output head stay whole on every rank,
so every rank computes the same logits and, with the same seed, takes the same
sampling decisions.

The sampler's attention metrics need every head's scores: `gather_heads` puts
the ranks' heads back together (rank r holds heads r*h/size ... (r+1)*h/size - 1,
the rows q_proj gives it), once per pass for all layers.
"""

import mlx.core as mx
from mlx.nn.layers.distributed import shard_linear

from ..errors import UnsupportedModelError


def shard(model, group) -> None:
    """Split `model`'s layers across `group`'s ranks, in place."""
    n = group.size()
    attn = model.layers[0].self_attn
    if attn.n_kv_heads % n or attn.n_heads % n:
        raise UnsupportedModelError(
            f"{n} ranks cannot share this model's {attn.n_kv_heads} key/value heads and {attn.n_heads} "
            f"query heads evenly; launch a number of ranks that divides {attn.n_kv_heads}"
        )
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, name, shard_linear(getattr(attn, name), "all-to-sharded", group=group))
        attn.o_proj = shard_linear(attn.o_proj, "sharded-to-all", group=group)
        attn.n_heads //= n
        attn.n_kv_heads //= n
        mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
        mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
        mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)
    model.head_group = group
    mx.eval(model.parameters())


def gather_heads(scores: list[mx.array], group) -> list[mx.array]:
    """Per-layer scores (B, heads of this rank, keys) -> (B, all heads, keys)."""
    stacked = mx.stack(scores).transpose(2, 0, 1, 3)  # (heads, layers, B, keys): all_gather joins axis 0
    whole = mx.distributed.all_gather(stacked, group=group).transpose(1, 2, 0, 3)
    return list(whole)
