"""A group of the batch engine's rows: one batched forward pass per step, on one
MLX stream. Each step makes every row's decision, lets finished rows leave,
admits waiting requests into the freed slots and starts the next pass."""

from dataclasses import dataclass, field

import mlx.core as mx

from ..model.cache import PromptCache, RowsKVCache, SharedPrefixBatchCache, fork_cache, make_cache, visible_key_mask
from ..model.transformer import Segment
from ..sampling.samplers import choose_together
from .prefill import SINGLE_PASS_TOKENS, prefill
from .rows import Row, RowCache, RowScores


class Group:
    """Rows that share one batched forward pass, on one MLX stream."""

    def __init__(self, engine, size: int, stream):
        self.engine, self.size, self.stream = engine, size, stream
        self.free = [engine.make_sampler() for _ in range(size)] if engine.make_sampler else []
        self.rows: list[Row] = []
        self.cache = None  # per layer, a BatchKVCache over self.rows
        self.arrivals = []  # (slot, batch-1 cache): joiners to write into the slots they took

    @property
    def taken(self) -> int:
        """Slots held by requests (spawned rows come on top of the batch size)."""
        return sum(row.result.parent is None for row in self.rows)

    def step(self) -> list[Row]:
        """One decision per row, then (asynchronously) the group's next forward
        pass; rows that advanced themselves and waiting requests (into freed
        slots) join the batch, and spawned rows enter on a copy of their
        parent's batch row. Returns the rows that finished."""
        pads, length = self._settle_cache()
        row_caches = [
            RowCache(self.cache, i, pads[i], length, self.engine.model.args.max_position_embeddings)
            if self.cache is not None
            else None
            for i in range(len(self.rows))
        ]
        outcome = self._take_decisions(row_caches)
        joiners = self._admit(outcome)
        riding = [row for row in joiners if len(row.request.prompt) - row.prefix_len <= SINGLE_PASS_TOKENS]
        # A riding prompt that fits the batch's length takes a finished row's place:
        # the row stays in this pass (fed a token whose output is dropped) and the
        # prompt's cache is written into its slot before the next pass, rather than
        # the whole batch being copied twice (`filter` without the row, `extend`
        # with the prompt).
        slots = {}
        if outcome.keep and not outcome.spawned and not self.engine.share_prefix:
            # `filter` (rows that finished without a taker leave) drops the padding all
            # remaining rows share, so the batch may shrink by up to the kept rows' least.
            room = length - min(pads[i] for i in outcome.keep) + 1
            fitting = [row for row in riding if len(row.request.prompt) <= room]
            slots = dict(zip(outcome.freed, fitting, strict=False))
        with mx.stream(self.stream):
            outputs = self._forward(outcome, riding, slots, pads, length)
            outputs += self._rejoin(outcome.rejoin, [row for row in joiners if row not in slots.values()])
            if outputs:
                mx.async_eval(outputs)
        return outcome.done

    def _settle_cache(self) -> tuple[list[int], int]:
        """The last pass's joiners written into the slots they took, padding that
        every row has dropped; (each row's left padding, the batch's length)."""
        cache = self.cache
        for slot, joined in self.arrivals:
            for c, layer in zip(cache, joined, strict=True):
                c.place(slot, layer)
        self.arrivals = []
        if cache is None:
            return [], 0
        pads = cache[0].left_padding.tolist()
        shared = min(pads)
        if shared > 0:  # padding every row has (left by joiners that took slots) is dropped
            for c in cache:
                c.drop_padding(shared)
            pads = [p - shared for p in pads]
        return pads, cache[0].keys_and_values()[0].shape[2]

    def _take_decisions(self, row_caches: list) -> "Outcome":
        """Every row's decision in one host sync (samplers.choose_together), then
        each row takes its own: what each row does next."""
        engine, model = self.engine, self.engine.model
        deciding = [(i, d) for i, row in enumerate(self.rows) if (d := row.decision(model, row_caches[i])) is not None]
        made = choose_together(
            [self.rows[i].sampler for i, _ in deciding], [d[0] for _, d in deciding], [d[1] for _, d in deciding]
        )
        choices = dict(zip((i for i, _ in deciding), made, strict=True))
        out = Outcome()
        for i, row in enumerate(self.rows):
            token = row.step(engine.eos, choices.get(i))
            if token is not None:
                out.fed[i] = token
                out.keep.append(i)
            elif row.finished:
                out.done.append(row)
                out.freed.append(i)
                if row.pooled:
                    self.free.append(row.sampler)
                if engine.on_finish is not None and row_caches[i] is not None:
                    engine.on_finish(row, row_caches[i])
            else:
                out.rejoin.append(row)
            taken = []  # children of row i, at the position it just decided
            for alt, logprob, metrics, *strategy in row.spawn:
                sampler = engine.branch_sampler()
                child = row.child(alt, logprob, metrics, sampler, next(engine.numbers), *strategy, taken.count(alt))
                taken.append(alt)
                if child.finished:
                    out.done.append(child)
                else:
                    out.spawned.append(child)
                    out.sources.append(i)
        return out

    def _admit(self, outcome: "Outcome") -> list[Row]:
        """Waiting requests into the freed slots, each with a sampler from the pool
        if it brought none. Their prompts ride along in the rows' forward pass:
        the weight products run once over all its tokens, so a short prompt costs
        a fraction of a pass of its own."""
        held = sum(self.rows[i].result.parent is None for i in outcome.keep)
        held += sum(row.result.parent is None for row in outcome.rejoin)
        joiners = self.engine.admit(self.size - held)
        for row in joiners:
            if row.sampler is None:
                row.sampler, row.pooled = self.free.pop(), True
                row.sampler.reset()
        return joiners

    def _forward(self, outcome: "Outcome", riding: list[Row], slots: dict, pads: list[int], length: int) -> list:
        """The batch's next pass over the kept and spawned rows and the riding
        prompts (one set of weight products); the arrays to evaluate."""
        model, cache = self.engine.model, self.cache
        order = sorted([*outcome.keep, *slots])
        tokens = [outcome.fed.get(i, 0) for i in order] + [c.result.tokens[-1] for c in outcome.spawned]
        outputs, segments = [], []
        if outcome.keep or outcome.spawned:
            rows = order + outcome.sources
            if rows != list(range(len(self.rows))):
                for c in cache:
                    c.filter(mx.array(rows))  # a repeated row is a copy: the spawned row's own cache
                pads = cache[0].left_padding.tolist()
                length = cache[0].keys_and_values()[0].shape[2]
            key_mask = visible_key_mask(cache[0], length + 1)
            segments.append(Segment(mx.array(tokens)[:, None], cache, key_mask=key_mask))
        else:
            cache = None
        for row in riding:
            row.own_cache = PromptCache.after(row.prefix_cache, model)
            segments.append(Segment(mx.array([row.request.prompt[row.prefix_len :]]), row.own_cache))
        passed = model.packed(segments) if segments else []
        if outcome.keep or outcome.spawned:
            logits, scores = passed.pop(0)
            outputs += [logits, scores]
        self.rows = [slots.get(i, self.rows[i]) for i in order] + outcome.spawned
        prefix = getattr(cache[0], "prefix_len", 0) if cache is not None else 0
        for i, row in enumerate(self.rows):
            row.logits, row.scores = logits[i, -1], RowScores(scores, i, pads[i], prefix)
        for row, (row_logits, row_scores) in zip(riding, passed, strict=True):
            row.logits, row.scores = row_logits[0, -1], [s[0] for s in row_scores]
        self.arrivals = [(order.index(i), row.own_cache) for i, row in slots.items()]
        placed = list(slots.values())
        outputs += [(row.logits, row.scores) for row in placed]
        for row in placed:
            row.own_cache = None
        self.cache = cache
        return outputs

    def _rejoin(self, rejoin: list[Row], joiners: list[Row]) -> list:
        """Rows that advanced themselves and joiners that took no finished row's
        slot (a long prompt prefilled now) enter the batch on their own caches;
        the arrays to evaluate."""
        for row in joiners:
            if row.own_cache is None:
                _prefill_row(self.engine.model, row)
        rejoin = rejoin + joiners
        if not rejoin:
            return []
        outputs = [(row.logits, row.scores) for row in rejoin]
        own = list(zip(*(row.own_cache for row in rejoin), strict=True))
        if self.engine.share_prefix:
            merged = [
                SharedPrefixBatchCache.merge_rows(p, list(layer))
                for p, layer in zip(self.engine.prefix_cache, own, strict=True)
            ]
        else:
            merged = [RowsKVCache.merge(list(layer)) for layer in own]
        for row in rejoin:
            row.own_cache = None
        if self.cache is None:
            self.cache = merged
        else:
            for c, m in zip(self.cache, merged, strict=True):
                c.extend(m)
        self.rows += rejoin
        return outputs


@dataclass
class Outcome:
    """What a step's decisions did, by row index in the group (`fed`, `keep`,
    `freed`) or by row (`rejoin`, `done`, `spawned`, with each spawned row's
    parent index in `sources`)."""

    fed: dict = field(default_factory=dict)  # row index -> the token it is fed next
    keep: list = field(default_factory=list)  # rows that stay in the batch
    freed: list = field(default_factory=list)  # rows that finished: their slots are free
    rejoin: list = field(default_factory=list)  # rows that advanced themselves (their own cache)
    done: list = field(default_factory=list)  # finished rows, spawned ones that ended at once too
    spawned: list = field(default_factory=list)  # new rows, each on a copy of its parent's row
    sources: list = field(default_factory=list)


def _joiner_cache(model, prefix_cache):
    """A long prompt's cache, filled in chunks (a riding prompt's is a `PromptCache`)."""
    cache = fork_cache(prefix_cache) if prefix_cache is not None else make_cache(model)
    for layer in cache:
        # Its first write allocates room for `step` positions: a prompt's few
        # tokens need far fewer than a whole answer's.
        layer.step = RowsKVCache.step
    return cache


def _prefill_row(model, row: Row):
    """The row's prompt (after its prefix) into a batch-1 cache of its own, with
    `generate`'s own prefill: for prompts too long to ride along in the batch's
    forward pass."""
    cache = _joiner_cache(model, row.prefix_cache)
    logits, scores = prefill(model, row.request.prompt[row.prefix_len :], cache)
    row.logits, row.scores = logits[0, -1], [s[0] for s in scores]
    row.own_cache = cache
