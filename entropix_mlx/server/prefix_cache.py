"""Prompt-prefix cache shared by the server's requests.

Each entry is a KV cache together with the token ids whose keys and values it
holds. A request takes the entry with the longest common prefix with its
prompt, forks it (MLX arrays have value semantics: the fork's writes never
reach the entry) and trims the fork to that prefix, so only the rest of the
prompt is prefilled. A follow-up turn of a conversation therefore prefills the
end of the previous answer plus the new message, as `chat` does.

Bounded twice: at most `max_entries` entries and `max_tokens` cached positions
in all; the least recently used entries go first.
"""

from collections import OrderedDict

from ..decode.chat import common_prefix_length
from ..model.cache import fork_cache


class PrefixCache:
    def __init__(self, max_entries: int = 8, max_tokens: int = 32768):
        self.max_entries, self.max_tokens = max_entries, max_tokens
        self._entries: OrderedDict[int, tuple[list[int], list]] = OrderedDict()
        self._next = 0
        self._tokens = 0  # kept as a number: /health reads it from another thread

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def take(self, ids: list[int]) -> tuple[list | None, int]:
        """(a cache holding the first `n` ids of `ids`, n), or (None, 0).

        At least one id is always left for the caller to run, since the next
        token's logits need one position."""
        best, best_len = None, 0
        for key, (cached, _) in self._entries.items():
            n = common_prefix_length(cached, ids)
            if n > best_len:
                best, best_len = key, n
        best_len = min(best_len, len(ids) - 1)
        if best is None or best_len <= 0:
            return None, 0
        self._entries.move_to_end(best)
        cache = fork_cache(self._entries[best][1])
        for layer in cache:
            layer.trim(layer.offset - best_len)
        return cache, best_len

    def put(self, ids: list[int], cache: list) -> None:
        """Keep `cache`, which holds the keys and values of `ids` (it must not be
        written to afterwards). Entries whose ids are a prefix of `ids` add
        nothing any more and are dropped; `ids` already held by an entry are
        not stored twice."""
        n = min(min(layer.offset for layer in cache), len(ids))
        if n <= 0 or self.max_entries <= 0 or n > self.max_tokens:
            return
        for layer in cache:
            layer.trim(layer.offset - n)
        ids = list(ids[:n])
        for key, (cached, _) in self._entries.items():
            if len(cached) >= n and cached[:n] == ids:  # already held (a request that added nothing)
                self._entries.move_to_end(key)
                return
        for key in [k for k, (cached, _) in self._entries.items() if len(cached) <= n and ids[: len(cached)] == cached]:
            self._tokens -= len(self._entries.pop(key)[0])
        self._entries[self._next] = (ids, cache)
        self._next += 1
        self._tokens += n
        while len(self._entries) > self.max_entries or self._tokens > self.max_tokens:
            self._tokens -= len(self._entries.popitem(last=False)[1][0])
