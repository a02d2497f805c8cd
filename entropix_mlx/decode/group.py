"""A group of the batch engine's rows: one batched forward pass per step, on one
MLX stream. Each step makes every row's decision, lets finished rows leave,
admits waiting requests into the freed slots and starts the next pass."""

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
        engine = self.engine
        model, eos, share_prefix = engine.model, engine.eos, engine.share_prefix
        cache, context = self.cache, model.args.max_position_embeddings
        for slot, joined in self.arrivals:  # the last pass's joiners into the slots they took
            for c, layer in zip(cache, joined, strict=True):
                c.place(slot, layer)
        self.arrivals = []
        if cache is not None:
            pads = cache[0].left_padding.tolist()
            shared = min(pads)
            if shared > 0:  # padding every row has (left by joiners that took slots) is dropped
                for c in cache:
                    c.drop_padding(shared)
                pads = [p - shared for p in pads]
            length = cache[0].keys_and_values()[0].shape[2]
        fed, keep, rejoin, done, spawned, sources, freed = {}, [], [], [], [], [], []
        row_caches = [
            RowCache(cache, i, pads[i], length, context) if cache is not None else None for i in range(len(self.rows))
        ]
        # Every row's decision in one host sync (samplers.choose_together).
        deciding = [(i, d) for i, row in enumerate(self.rows) if (d := row.decision(model, row_caches[i])) is not None]
        made = choose_together(
            [self.rows[i].sampler for i, _ in deciding], [d[0] for _, d in deciding], [d[1] for _, d in deciding]
        )
        choices = dict(zip((i for i, _ in deciding), made, strict=True))
        for i, row in enumerate(self.rows):
            token = row.step(eos, choices.get(i))
            if token is not None:
                fed[i] = token
                keep.append(i)
            elif row.finished:
                done.append(row)
                freed.append(i)
                if row.pooled:
                    self.free.append(row.sampler)
                if engine.on_finish is not None and row_caches[i] is not None:
                    engine.on_finish(row, row_caches[i])
            else:
                rejoin.append(row)
            taken = []  # children of row i, at the position it just decided
            for alt, logprob, metrics, *strategy in row.spawn:
                sampler = engine.branch_sampler()
                child = row.child(alt, logprob, metrics, sampler, next(engine.numbers), *strategy, taken.count(alt))
                taken.append(alt)
                if child.finished:
                    done.append(child)
                else:
                    spawned.append(child)
                    sources.append(i)

        # Waiting requests take the freed slots. Their prompts ride along in the
        # rows' forward pass: the weight products run once over all its tokens, so
        # a short prompt costs a fraction of a pass of its own.
        joiners = engine.admit(
            self.size
            - sum(self.rows[i].result.parent is None for i in keep)
            - sum(row.result.parent is None for row in rejoin)
        )
        for row in joiners:
            if row.sampler is None:
                row.sampler, row.pooled = self.free.pop(), True
                row.sampler.reset()
        riding = [row for row in joiners if len(row.request.prompt) - row.prefix_len <= SINGLE_PASS_TOKENS]
        # A riding prompt that fits the batch's length takes a finished row's place:
        # the row stays in this pass (fed a token whose output is dropped) and the
        # prompt's cache is written into its slot before the next pass, rather than
        # the whole batch being copied twice (`filter` without the row, `extend`
        # with the prompt).
        slots = {}
        if keep and not spawned and not share_prefix:
            # `filter` (rows that finished without a taker leave) drops the padding all
            # remaining rows share, so the batch may shrink by up to the kept rows' least.
            room = length - min(pads[i] for i in keep) + 1
            fitting = [row for row in riding if len(row.request.prompt) <= room]
            slots = dict(zip(freed, fitting, strict=False))
        placed = list(slots.values())
        order = sorted([*keep, *slots])
        tokens = [fed.get(i, 0) for i in order] + [c.result.tokens[-1] for c in spawned]

        with mx.stream(self.stream):
            outputs, segments = [], []
            if keep or spawned:
                rows = order + sources
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
            if keep or spawned:
                logits, scores = passed.pop(0)
                outputs += [logits, scores]
            self.rows = [slots.get(i, self.rows[i]) for i in order] + spawned
            prefix = getattr(cache[0], "prefix_len", 0) if cache is not None else 0
            for i, row in enumerate(self.rows):
                row.logits, row.scores = logits[i, -1], RowScores(scores, i, pads[i], prefix)
            for row, (row_logits, row_scores) in zip(riding, passed, strict=True):
                row.logits, row.scores = row_logits[0, -1], [s[0] for s in row_scores]
            self.arrivals = [(order.index(i), row.own_cache) for i, row in slots.items()]
            outputs += [(row.logits, row.scores) for row in placed]
            for row in placed:
                row.own_cache = None

            for row in joiners:
                if row in placed:
                    continue
                if row.own_cache is None:
                    _prefill_row(model, row)
                rejoin.append(row)
            if rejoin:
                outputs += [(row.logits, row.scores) for row in rejoin]
                own = list(zip(*(row.own_cache for row in rejoin), strict=True))
                if share_prefix:
                    merged = [
                        SharedPrefixBatchCache.merge_rows(p, list(layer))
                        for p, layer in zip(engine.prefix_cache, own, strict=True)
                    ]
                else:
                    merged = [RowsKVCache.merge(list(layer)) for layer in own]
                for row in rejoin:
                    row.own_cache = None
                if cache is None:
                    cache = merged
                else:
                    for c, m in zip(cache, merged, strict=True):
                        c.extend(m)
                self.rows += rejoin
            self.cache = cache
            if outputs:
                mx.async_eval(outputs)
        return done


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
