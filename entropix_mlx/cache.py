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


class SharedPrefixCache:
    """n rows that share one cache's prefix, for branch rollouts.

    The prefix stays in the parent (batch 1, never copied or repeated); each row
    stores only the positions it adds, in `room` preallocated slots. Forking the
    parent n times instead would copy the whole cache n times per branch step.
    """

    def __init__(self, parent: KVCache, n: int, room: int):
        self.start = self.offset = parent.offset
        self.n = n
        self.prefix_keys = parent.keys[..., : self.start, :]
        self.prefix_values = parent.values[..., : self.start, :]
        _, heads, _, dim = parent.keys.shape
        self.keys = mx.zeros((n, heads, room, dim), parent.keys.dtype)
        self.values = mx.zeros((n, heads, room, parent.values.shape[-1]), parent.values.dtype)

    def update_and_fetch(self, keys, values):
        written = self.offset - self.start
        end = written + keys.shape[2]
        self.keys[..., written:end, :] = keys
        self.values[..., written:end, :] = values
        self.offset += keys.shape[2]
        prefix_shape = (self.n, *self.prefix_keys.shape[1:])
        k = mx.concatenate([mx.broadcast_to(self.prefix_keys, prefix_shape), self.keys[..., :end, :]], axis=2)
        v = mx.concatenate([mx.broadcast_to(self.prefix_values, (self.n, *self.prefix_values.shape[1:])),
                            self.values[..., :end, :]], axis=2)
        return k, v

    def make_mask(self, n_queries, **kwargs):
        if n_queries > 1:
            raise ValueError("rollouts feed one token per row")
        return None

    def row(self, i: int):
        """The keys and values row i added, to append to the parent."""
        written = self.offset - self.start
        return self.keys[i:i + 1, :, :written, :], self.values[i:i + 1, :, :written, :]
