"""One row of the batch engine: a request being answered, its sampler, its key
chain, what it has produced, and its view of the batch's last forward pass."""

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from ..model.cache import KVCache, visible_columns
from ..sampling.penalties import Penalties
from ..sampling.samplers import Sampler, Step, TokenChoice

DEFAULT_MAX_TOKENS = 256  # an answer's length when a caller names none


@dataclass
class Request:
    prompt: list[int]  # token ids, chat template applied
    seed: int = 0  # the row's key chain starts at mx.random.key(seed), as in `generate`
    max_tokens: int = DEFAULT_MAX_TOKENS
    penalties: Penalties | None = None  # applied to the logits before the sampler sees them


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)  # per generated token
    logprobs: list = field(default_factory=list)  # nats; None where the sampler could not know it
    finish_reason: str = "running"  # "eos" or "length" when done
    thinking_insertions: int = 0
    prompt_tokens: int = 0
    metrics: list = field(default_factory=list)  # per generated token, the sampler's metrics dict
    params: list = field(default_factory=list)  # per generated token, the sampling parameters used
    notes: list = field(default_factory=list)  # per generated token, what the sampler repaired ("" if nothing)
    tops: list = field(default_factory=list)  # per generated token, the most likely tokens if recorded
    row: int = 0  # this row's number within the call
    parent: int | None = None  # spawned rows: the row they branched from
    split: int | None = None  # spawned rows: index of their first own token
    extra: dict = field(default_factory=dict)  # a whole-answer decoder's fields for eval's record (its candidates)


class RowCache(Sequence):
    """One row of a group's BatchKVCache as a list of batch-1 `KVCache`s, made on
    first use (most steps never touch it). The keys are lazy slices: reading
    them copies nothing, and writes go to new arrays, never to the batch."""

    def __init__(self, batch_cache, row: int, pad: int, length: int, max_size: int):
        self._args = batch_cache, row, pad, length, max_size
        self._layers = None

    def _materialize(self):
        if self._layers is None:
            batch_cache, row, pad, length, max_size = self._args
            self._layers = []
            for c in batch_cache:
                layer = KVCache(max_size)
                keys, values = c.keys_and_values()
                p = getattr(c, "prefix_len", 0)  # a shared prefix sits before the padding
                layer.keys = visible_positions(keys[row : row + 1, :, :length], pad, p)
                layer.values = visible_positions(values[row : row + 1, :, :length], pad, p)
                layer.offset = length - pad
                self._layers.append(layer)
        return self._layers

    def __getitem__(self, i):
        return self._materialize()[i]

    def __len__(self):
        return len(self._args[0])


class RowScores(Sequence):
    """One row's per-layer attention scores (heads, visible keys), cut out of the
    batch's scores when a sampler first reads a layer: greedy without metrics
    never does, and cutting every row of every layer is 240 ops a step for 8
    rows. The batch's scores are evaluated with the pass, so this holds no graph."""

    def __init__(self, scores: list, row: int, pad: int, prefix: int):
        self._scores, self._row, self._pad, self._prefix = scores, row, pad, prefix
        self._cut = {}

    def __getitem__(self, i: int):
        i = range(len(self))[i]  # negative indices as a list's; IndexError past the end
        if i not in self._cut:
            self._cut[i] = visible_columns(self._scores[i][self._row], self._pad, self._prefix)
        return self._cut[i]

    def __len__(self):
        return len(self._scores)


def visible_positions(x: mx.array, pad: int, prefix: int) -> mx.array:
    """(1, heads, positions, dim) of one row without its padding positions."""
    if not prefix:
        return x[:, :, pad:]
    return mx.concatenate([x[:, :, :prefix], x[:, :, prefix + pad :]], axis=2)


class Row:
    def __init__(
        self, index: int, request: Request, sampler: Sampler, number: int = 0, prefix_cache=None, prefix_len: int = 0
    ):
        self.index, self.request, self.sampler = index, request, sampler
        self.max_tokens = request.max_tokens  # its own: a cancel or stop lowers it, never the caller's request
        self.prefix_cache, self.prefix_len = prefix_cache, prefix_len  # what its prompt starts from
        self.pooled = False  # its sampler goes back to the batch's pool when it finishes
        self.key = mx.random.key(request.seed)
        self.queue: deque = deque()  # (token, logprob, choice, its index in the choice) chosen but not yet fed
        self.result = RowResult(prompt_tokens=len(request.prompt), row=number)
        self.logits = self.scores = None  # the row's view of its last forward pass
        self.own_cache = None  # set when the row's state lives outside the batch
        self.spawn: list = []  # (token, logprob, metrics) alternatives chosen this step
        self.split_top: list = []  # the most likely tokens where they were chosen (TokenChoice.top)
        if sampler is not None:  # else the engine gives it a pooled one
            sampler.reset()

    def child(
        self,
        token: int,
        logprob: float,
        metrics: dict,
        sampler: Sampler,
        number: int,
        strategy: str = "branch",
        repeat: int = 0,
    ) -> "Row":
        """A row that takes `token` instead of this row's last decision, at the
        same position. Its key chain is its own, fixed by the request's seed,
        the position, the token and how many siblings took the same token
        before it (`repeat`: sampled answers may start alike), so it does not
        depend on the batch."""
        at = self.split_point
        seed = (self.request.seed * 1_000_003 + (at + 1) * 65_537 + token + repeat * 7_919_993) % 2**63
        request = Request(self.request.prompt, seed, self.max_tokens, self.request.penalties)
        row = Row(self.index, request, sampler, number)
        res, mine = row.result, self.result
        res.tokens, res.logprobs = mine.tokens[:at], mine.logprobs[:at]
        res.strategies, res.metrics = mine.strategies[:at], mine.metrics[:at]
        res.params, res.notes, res.tops = mine.params[:at], mine.notes[:at], mine.tops[:at]
        res.parent, res.split = mine.row, at
        if token in self.eos:
            res.finish_reason = "eos"
            return row
        row._record(token, logprob, strategy, metrics, top=self.split_top)
        if len(res.tokens) >= row.max_tokens:
            res.finish_reason = "length"
        return row

    def _record(self, token, logprob, strategy, metrics=None, params=None, note="", top=None):
        res = self.result
        res.tokens.append(token)
        res.logprobs.append(logprob)
        res.strategies.append(strategy)
        res.metrics.append(metrics or {})
        res.params.append(params or {})
        res.notes.append(note)
        res.tops.append(top or [])

    def _take(self, token, logprob, choice, i: int):
        # Alternatives are known only where the sampler itself chose: a choice's first token.
        top = choice.top if i == 0 else None
        self._record(token, logprob, choice.strategy, choice.metrics_at(i), choice.params, choice.note, top)

    def decision(self, model, row_cache) -> tuple[Step, mx.array] | None:
        """The step and key of this row's next sampler decision; None while
        tokens of an earlier decision are still queued."""
        if self.queue:
            return None
        # The key chain of `generate`: one split per sampler decision.
        self.key, step_key = mx.random.split(self.key)
        logits, penalties = self.logits, self.request.penalties
        if penalties is not None:
            logits = penalties.apply(logits, self.result.tokens)
        return Step(logits, self.scores, self.result.tokens, model, row_cache, penalties), step_key

    def step(self, eos: set, choice: TokenChoice | None) -> int | None:
        """Take `choice` (None: feed the queue). Returns the token to feed next;
        None when the row has finished or has advanced itself (then `own_cache`
        is set)."""
        res, limit = self.result, self.max_tokens
        self.spawn, self.eos = [], eos
        if choice is not None:
            res.thinking_insertions += bool(getattr(choice, "inserted", False))
            tokens = choice.tokens[: limit - len(res.tokens)]
            last = getattr(choice, "last", "")
            ends = len(res.tokens) + len(tokens) >= limit or any(t in eos for t in tokens) or bool(last)
            if choice.advanced is None and len(tokens) == 1:
                self.spawn, self.split_point = list(getattr(choice, "spawn", ())), len(res.tokens)
                self.split_top = choice.top  # its branches' first token has the same alternatives
            if ends:  # the row's last tokens: recorded now, none of them needs a forward pass
                for i, (token, logprob) in enumerate(zip(tokens, choice.logprobs, strict=False)):
                    if token in eos:
                        res.finish_reason = "eos"
                        return None
                    self._take(token, logprob, choice, i)
                res.finish_reason = last or "length"
                return None
            if choice.advanced is not None:
                for i, (token, logprob) in enumerate(zip(tokens, choice.logprobs, strict=False)):
                    self._take(token, logprob, choice, i)
                cache, logits, scores = choice.advanced
                self.own_cache = list(cache)
                self.logits, self.scores = logits[0, -1], [s[0] for s in scores]
                return None
            self.queue.extend(
                (t, lp, choice, i) for i, (t, lp) in enumerate(zip(tokens, choice.logprobs, strict=False))
            )
        token, logprob, choice, i = self.queue.popleft()
        if token in eos:
            res.finish_reason = "eos"
            return None
        self._take(token, logprob, choice, i)
        if len(res.tokens) >= limit:
            res.finish_reason = "length"
            return None
        return token

    @property
    def finished(self) -> bool:
        return self.result.finish_reason != "running"
