"""KV cache: mlx-lm's KVCache plus the two things the sampler needs.

mlx-lm's cache already grows in steps of 256 and trims by moving its offset, and
`update_and_fetch` returns exactly the keys written so far (never the empty slots
it preallocated), so positions stay contiguous. We add a maximum size (the
model's context) and a cheap fork for branching and multi-turn chat.
"""

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.models.cache import KVCache as _MlxLmKVCache

from ..errors import ContextOverflowError


class KVCache(_MlxLmKVCache):
    def __init__(self, max_size: int | None = None):
        super().__init__()
        self.max_size = max_size

    def update_and_fetch(self, keys, values):
        self._check_room(keys.shape[2])
        return super().update_and_fetch(keys, values)

    def _check_room(self, n: int) -> None:
        if self.max_size is not None and self.offset + n > self.max_size:
            raise ContextOverflowError(
                f"the conversation needs {self.offset + n} tokens but the "
                f"model's context holds {self.max_size}; shorten the prompt or start over"
            )

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


class PromptCache(KVCache):
    """A prompt's cache on its way into a batch (decode/group.py): written once, by
    the prompt's pass, then copied into a batch row, never decoded into. So a write
    is one concatenation to what it holds (the shared prefix it forks), where
    KVCache's first write after a fork allocates `step` empty slots, copies the
    prefix in and writes into them: 2 ops a layer instead of 10. Several writes
    stay correct, each a copy of the whole cache."""

    def update_and_fetch(self, keys, values):
        self._check_room(keys.shape[2])
        if self.keys is None:
            self.keys, self.values = keys, values
        else:  # it holds exactly `offset` positions (`after` cuts the prefix to them)
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
        self.offset += keys.shape[2]
        return self.keys, self.values

    @classmethod
    def after(cls, prefix: list[KVCache] | None, model) -> list["PromptCache"]:
        """One per layer, each holding what `prefix` holds (nothing if None)."""
        caches = []
        for i in range(len(model.layers)):
            c = cls(model.args.max_position_embeddings)
            if prefix is not None and prefix[i].keys is not None:
                c.offset = prefix[i].offset
                c.keys = prefix[i].keys[..., : c.offset, :]
                c.values = prefix[i].values[..., : c.offset, :]
            caches.append(c)
        return caches


def make_cache(model, max_size: int | None = None) -> list[KVCache]:
    if max_size is None:
        max_size = model.args.max_position_embeddings
    return [KVCache(max_size) for _ in model.layers]


def fork_cache(cache: list[KVCache]) -> list[KVCache]:
    return [c.fork() for c in cache]


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
        v = mx.concatenate(
            [mx.broadcast_to(self.prefix_values, (self.n, *self.prefix_values.shape[1:])), self.values[..., :end, :]],
            axis=2,
        )
        return k, v

    def make_mask(self, n_queries, window_size: int | None = None, **kwargs):
        if n_queries > 1:
            raise ValueError("rollouts feed one token per row")
        # No padding: key columns are positions, so only a sliding window hides keys.
        return None if window_size is None else create_causal_mask(1, self.offset, window_size=window_size)

    def keep_row(self, i: int) -> None:
        """From now on only row i goes on (a branch decided early drops the others)."""
        self.keys, self.values, self.n = self.keys[i : i + 1], self.values[i : i + 1], 1

    def row(self, i: int):
        """The keys and values row i added, to append to the parent."""
        written = self.offset - self.start
        return self.keys[i : i + 1, :, :written, :], self.values[i : i + 1, :, :written, :]


class RowsKVCache(BatchKVCache):
    """mlx-lm's BatchKVCache, grown 64 positions at a time instead of 256.

    Rows leave and join a batch (`filter`, `extend`) by copying its whole
    buffer, empty slots included; with answers of tens of tokens most of a
    256-slot buffer is empty, and those copies took 1.5 s of a 25 s eval."""

    step = 64

    def place(self, row: int, other: KVCache) -> None:
        """Row `row` becomes the positions of the batch-1 cache `other`, right-aligned
        at the batch's end (they must fit: `other.offset <= self._idx`); what the row
        held before them becomes left padding. A joining request takes a finished
        row's slot this way: two small writes per layer into a buffer nothing else
        holds (MLX does them in place), where `filter` and `extend` copy the whole
        batch."""
        n = other.offset
        start = self._idx - n
        if start < 0:
            raise ValueError(f"a cache of {n} positions does not fit a batch of {self._idx}")
        self.keys[row : row + 1, :, start : self._idx, :] = other.keys[..., :n, :]
        self.values[row : row + 1, :, start : self._idx, :] = other.values[..., :n, :]
        hit = mx.arange(self.left_padding.size) == row
        self.left_padding = mx.where(hit, start, self.left_padding)
        self.offset = mx.where(hit, n, self.offset)

    def drop_padding(self, n: int) -> None:
        """Forget the first n positions, padding in every row (as `filter` does after
        choosing its rows): a view of the same buffer, nothing is copied."""
        self.keys, self.values = self.keys[..., n:, :], self.values[..., n:, :]
        self._idx -= n
        self.left_padding = self.left_padding - n


class SharedPrefixBatchCache(RowsKVCache):
    """mlx-lm's BatchKVCache for rows that all start with one prefix, stored once.

    The rows hold only the positions after the prefix (left-padded as usual);
    the prefix's keys are put in front when attention reads them, a transient
    broadcast that is never stored per row. So rows may be forked freely
    (`filter` with a repeated index, as `deliberate` does at each branch): a
    fork copies the row's own few positions, never the prompt.

    Row i's keys are laid out [prefix | left padding i | its own positions];
    `visible(i)` says which of them the row really sees.
    """

    def __init__(self, prefix: KVCache, left_padding: list[int]):
        super().__init__(left_padding)
        self.prefix_len = prefix.offset
        self.prefix_keys = prefix.keys[..., : prefix.offset, :]
        self.prefix_values = prefix.values[..., : prefix.offset, :]
        self.offset = self.offset + self.prefix_len  # RoPE positions continue after the prefix

    def keys_and_values(self):
        keys, values = super().keys_and_values()
        rows = keys.shape[0]
        return (
            mx.concatenate([mx.broadcast_to(self.prefix_keys, (rows, *self.prefix_keys.shape[1:])), keys], 2),
            mx.concatenate([mx.broadcast_to(self.prefix_values, (rows, *self.prefix_values.shape[1:])), values], 2),
        )

    def make_mask(self, n_queries: int, return_array: bool = False, window_size: int | None = None, **kwargs):
        p, end = self.prefix_len, self.prefix_len + self._idx + n_queries
        keys = mx.arange(end)[None]
        queries = mx.arange(end - n_queries, end)[:, None]
        pad = self.left_padding[:, None, None, None]
        mask = (queries >= keys) & ((keys < p) | (keys >= p + pad))
        if window_size is not None:
            # By position, not column: a row's padding sits between the prefix and its own keys.
            key_positions = mx.where(keys < p, keys, keys - pad)
            mask = mask & (key_positions > queries - pad - window_size)
        return mask

    @classmethod
    def merge_rows(cls, prefix: KVCache, caches: list[KVCache]) -> "SharedPrefixBatchCache":
        """Batch-1 caches that each start with `prefix` (forks of it) as one
        batch holding only what each added after it."""
        p = prefix.offset
        lengths = [c.offset - p for c in caches]
        longest = max(lengths)
        merged = cls(prefix, [longest - n for n in lengths])
        if longest == 0:
            return merged
        shape = lambda a: (len(caches), a.shape[1], longest, a.shape[3])  # noqa: E731
        merged.keys = mx.zeros(shape(caches[0].keys), caches[0].keys.dtype)
        merged.values = mx.zeros(shape(caches[0].values), caches[0].values.dtype)
        for i, (n, c) in enumerate(zip(lengths, caches, strict=False)):
            merged.keys[i : i + 1, :, longest - n :] = c.keys[..., p : c.offset, :]
            merged.values[i : i + 1, :, longest - n :] = c.values[..., p : c.offset, :]
        merged.offset = merged.offset + longest
        merged._idx = longest
        return merged


def visible_key_mask(cache, length: int) -> mx.array:
    """(rows, length): which of a batch cache's `length` key columns each row
    sees (its left padding is hidden; a shared prefix is seen by every row)."""
    columns = mx.arange(length)[None]
    pad = cache.left_padding[:, None]
    prefix = getattr(cache, "prefix_len", 0)
    return (columns < prefix) | (columns >= prefix + pad)


def visible_columns(row_scores: mx.array, pad: int, prefix: int = 0) -> mx.array:
    """One row's (heads, keys) attention scores without its padding columns."""
    if not prefix:
        return row_scores[..., pad:]
    return mx.concatenate([row_scores[..., :prefix], row_scores[..., prefix + pad :]], axis=-1)
