"""KV cache: mlx-lm's KVCache plus the two things the sampler needs.

mlx-lm's cache already grows in steps of 256 and trims by moving its offset, and
`update_and_fetch` returns exactly the keys written so far (never the empty slots
it preallocated), so positions stay contiguous. We add a maximum size (the
model's context) and a cheap fork for branching and multi-turn chat.
"""

import mlx.core as mx
from mlx_lm.models.cache import KVCache as _MlxLmKVCache

from .errors import ContextOverflowError


class KVCache(_MlxLmKVCache):
    def __init__(self, max_size: int | None = None):
        super().__init__()
        self.max_size = max_size

    def update_and_fetch(self, keys, values):
        if self.max_size is not None and self.offset + keys.shape[2] > self.max_size:
            raise ContextOverflowError(
                f"the conversation needs {self.offset + keys.shape[2]} tokens but the "
                f"model's context holds {self.max_size}; shorten the prompt or start over"
            )
        return super().update_and_fetch(keys, values)

    def fork(self) -> "KVCache":
        """An independent copy sharing the written prefix.

        Slicing makes new arrays, so later in-place writes to either cache cannot
        reach the other; nothing is copied until one of them grows.
        """
        clone = KVCache(self.max_size)
        clone.offset = self.offset
        if self.keys is not None:
            clone.keys = self.keys[..., : self.offset, :]
            clone.values = self.values[..., : self.offset, :]
        return clone


def make_cache(model, max_size: int | None = None) -> list[KVCache]:
    if max_size is None:
        max_size = model.args.max_position_embeddings
    return [KVCache(max_size) for _ in model.layers]


def fork_cache(cache: list[KVCache]) -> list[KVCache]:
    return [c.fork() for c in cache]


def trim_cache(cache: list[KVCache], n: int) -> int:
    """Drop the last n positions from every layer; returns how many were dropped."""
    return min(c.trim(n) for c in cache) if cache else 0


def cache_length(cache: list[KVCache]) -> int:
    return cache[0].offset if cache else 0


def evaluate(cache: list[KVCache]) -> None:
    mx.eval([c.keys for c in cache if c.keys is not None])
