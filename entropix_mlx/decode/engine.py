"""Batched generation: several prompts decoded together, for `eval`.

Rows share one forward pass per step, but every decision stays per row: each
row has its own sampler instance, its own random key chain (the one `generate`
uses for the same seed) and its attention scores with the padding cut off, so a
row's answer does not depend on which rows share its batch. Greedy rows equal
unbatched `generate` runs token for token (tests/test_batch.py).

The cache is mlx-lm's `BatchKVCache` (`RowsKVCache`): a per-row left padding and a per-row
offset (the RoPE position), so each row's real tokens sit at positions 0, 1, ...
exactly as in an unbatched run, and its `make_mask` hides the padding from every
query. Continuous batching: a waiting prompt takes a finished row's place, so a
batch never idles on its longest answer. The prompt is not prefilled in a pass
of its own: its tokens ride along in the rows' next forward pass (`Model.packed`,
one set of weight products for all of them), into a batch-1 cache that is then
written into the finished row's slot (`RowsKVCache.place`; the finished row rides
that pass too, its output dropped). Where that cannot be (the prompt is longer
than the batch, rows branched), the row leaves the batch (`filter`) and the
prompt joins it (`merge` + `extend`), each a copy of the whole batch.

Samplers that run the model themselves (Entropix's branch rollouts and thinking
insertion) get the model and a batch-1 cache of their row (`_RowCache`, built
only if they touch it); when they hand back the state after their tokens
(`Choice.advanced`), the row leaves the batch and re-enters with that cache,
like a new prompt. A choice of several tokens without such a state is queued
and fed one token per step.

Rows can spawn rows (`Choice.spawn`, used by `deliberate`): each alternative
token starts a new row at the same position, on a copy of its parent's batch
row, and is fed in the same forward pass as every other row. With
`share_prefix`, rows hold only what follows the shared prefix
(`SharedPrefixBatchCache`), so a spawned row copies its parent's few generated
positions, never the prompt. Spawned rows come on top of `batch_size` (the
sampler that spawns them caps them) and are yielded under their root's request
index, with `parent` and `split` saying where they came from.

On the CPU backend MLX runs each stream's kernels on one thread, so the batch
is split into one group per core, each with its own cache and stream: their
forward passes run in parallel, and one group's sampler decisions (Python
thread) overlap the others' forward passes.
"""

import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Iterator

import mlx.core as mx

from ..accel.weights import gemm_uses_all_cores
from ..errors import ConfigError, ContextOverflowError
from ..model.cache import (
    PromptCache,
    RowsKVCache,
    SharedPrefixBatchCache,
    evaluate,
    fork_cache,
    make_cache,
    visible_key_mask,
)
from ..model.llama import Segment
from ..sampling.samplers import Sampler, choose_together
from .generate import SINGLE_PASS_TOKENS, prefill
from .rows import Request, RowResult, _Row, _RowCache, _RowScores


class _Group:
    """Rows that share one batched forward pass, on one MLX stream."""

    def __init__(self, samplers: list[Sampler], stream, branch_sampler=None):
        self.free = list(samplers)
        self.stream = stream
        self.rows: list[_Row] = []
        self.cache = None  # per layer, a BatchKVCache over self.rows
        self.branch_sampler = branch_sampler  # makes the sampler of each spawned row
        self.numbers = None  # shared counter of row numbers
        self.arrivals = []  # (row, batch-1 cache): joiners to write into the slots they took


def _joiner_cache(model, prefix_cache):
    """A long prompt's cache, filled in chunks (a riding prompt's is a `PromptCache`)."""
    cache = fork_cache(prefix_cache) if prefix_cache is not None else make_cache(model)
    for layer in cache:
        # Its first write allocates room for `step` positions: the prompt's few
        # tokens need 64, not 256 (4-5 ms less per prompt on the CPU).
        layer.step = RowsKVCache.step
    return cache


def _prefill_row(model, row: _Row, prefix_cache, prefix_len: int):
    """The row's prompt (after the shared prefix) into a batch-1 cache of its
    own, with `generate`'s own prefill: for prompts too long to ride along in
    the batch's forward pass (`_step`)."""
    cache = _joiner_cache(model, prefix_cache)
    logits, scores = prefill(model, row.request.prompt[prefix_len:], cache)
    row.logits, row.scores = logits[0, -1], [s[0] for s in scores]
    row.own_cache = cache


def _step(model, group: _Group, eos: set, pending: deque, prefix_cache, prefix_len: int, share_prefix=False):
    """One decision per row of the group, then (asynchronously) the group's next
    forward pass; rows that advanced themselves and waiting requests (into
    freed slots) join the batch, and spawned rows enter on a copy of their
    parent's batch row. Returns the rows that finished."""
    cache, context = group.cache, model.args.max_position_embeddings
    for slot, joined in group.arrivals:  # the last pass's joiners into the slots they took
        for c, layer in zip(cache, joined, strict=False):
            c.place(slot, layer)
    group.arrivals = []
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
        _RowCache(cache, i, pads[i], length, context) if cache is not None else None for i in range(len(group.rows))
    ]
    # Every row's decision in one host sync (samplers.choose_together).
    deciding = [(i, d) for i, row in enumerate(group.rows) if (d := row.decision(model, row_caches[i])) is not None]
    made = choose_together(
        [group.rows[i].sampler for i, _ in deciding], [d[0] for _, d in deciding], [d[1] for _, d in deciding]
    )
    choices = dict(zip((i for i, _ in deciding), made, strict=False))
    for i, row in enumerate(group.rows):
        row_cache = row_caches[i]
        token = row.step(eos, choices.get(i))
        if token is not None:
            fed[i] = token
            keep.append(i)
        elif row.finished:
            done.append(row)
            freed.append(i)
            if row.result.parent is None:  # a spawned row's sampler is not a batch slot's
                group.free.append(row.sampler)
            keep_cache = getattr(group, "keep_cache", None)  # the server keeps a finished row's cache
            if keep_cache is not None and row_cache is not None:
                keep_cache(row, row_cache)
        else:
            rejoin.append(row)
        for alt, logprob, metrics in row.spawn:  # children of row i, at the position it just decided
            sampler = group.branch_sampler()
            child = row.child(alt, logprob, metrics, sampler, next(group.numbers))
            if child.finished:
                done.append(child)
            else:
                spawned.append(child)
                sources.append(i)

    # Waiting requests take the freed slots. Their prompts ride along in the
    # rows' forward pass: the weight products run once over all its tokens, so
    # a short prompt costs a fraction of a pass of its own.
    joiners = []
    while pending and group.free:
        index, request = pending.popleft()
        joiners.append(_Row(index, request, group.free.pop(), next(group.numbers)))
    riding = [row for row in joiners if len(row.request.prompt) - prefix_len <= SINGLE_PASS_TOKENS]
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

    with mx.stream(group.stream):
        outputs, segments = [], []
        if keep or spawned:
            rows = order + sources
            if rows != list(range(len(group.rows))):
                for c in cache:
                    c.filter(mx.array(rows))  # a repeated row is a copy: the spawned row's own cache
                pads = cache[0].left_padding.tolist()
                length = cache[0].keys_and_values()[0].shape[2]
            key_mask = visible_key_mask(cache[0], length + 1)
            segments.append(Segment(mx.array(tokens)[:, None], cache, key_mask=key_mask))
        else:
            cache = None
        for row in riding:
            row.own_cache = PromptCache.after(prefix_cache, model)
            segments.append(Segment(mx.array([row.request.prompt[prefix_len:]]), row.own_cache))
        passed = model.packed(segments) if segments else []
        if keep or spawned:
            logits, scores = passed.pop(0)
            outputs += [logits, scores]
        group.rows = [slots.get(i, group.rows[i]) for i in order] + spawned
        prefix = getattr(cache[0], "prefix_len", 0) if cache is not None else 0
        for i, row in enumerate(group.rows):
            row.logits, row.scores = logits[i, -1], _RowScores(scores, i, pads[i], prefix)
        for row, (row_logits, row_scores) in zip(riding, passed, strict=False):
            row.logits, row.scores = row_logits[0, -1], [s[0] for s in row_scores]
        group.arrivals = [(order.index(i), row.own_cache) for i, row in slots.items()]
        outputs += [(row.logits, row.scores) for row in placed]
        for row in placed:
            row.own_cache = None

        for row in joiners:
            if row in placed:
                continue
            if row.own_cache is None:
                _prefill_row(model, row, prefix_cache, prefix_len)
            rejoin.append(row)
        if rejoin:
            outputs += [(row.logits, row.scores) for row in rejoin]
            if share_prefix:
                merged = [
                    SharedPrefixBatchCache.merge_rows(p, list(layer))
                    for p, layer in zip(
                        prefix_cache, zip(*(row.own_cache for row in rejoin), strict=False), strict=False
                    )
                ]
            else:
                merged = [
                    RowsKVCache.merge(list(layer)) for layer in zip(*(row.own_cache for row in rejoin), strict=False)
                ]
            for row in rejoin:
                row.own_cache = None
            if cache is None:
                cache = merged
            else:
                for c, m in zip(cache, merged, strict=False):
                    c.extend(m)
            group.rows += rejoin
        group.cache = cache
        if outputs:
            mx.async_eval(outputs)
    return done


_STREAMS: list = []


def _streams(n: int) -> list:
    """n streams for the groups' forward passes. With several groups none is the
    default stream: the samplers' small ops run there and must not queue behind
    a group's forward pass. Streams are reused across calls (each holds a thread)."""
    if n == 1:
        return [mx.default_stream(mx.default_device())]
    while len(_STREAMS) < n:
        _STREAMS.append(mx.new_stream(mx.default_device()))
    return _STREAMS[:n]


def default_groups(batch_size: int, model=None) -> int:
    """One group per CPU core on the CPU backend, whose kernels are single-threaded;
    one on a GPU, whose kernels already use the whole device, and one for float32
    weights with OpenBLAS: its GEMM already spreads over the cores, and one GEMM
    over all rows costs little more than over one."""
    if mx.default_device() != mx.cpu:
        return 1
    if model is not None and gemm_uses_all_cores(model):
        return 1
    return max(1, min(batch_size, os.cpu_count() or 1))


def generate_batch(
    model,
    tokenizer,
    requests: list[Request],
    make_sampler: Callable[[], Sampler],
    batch_size: int = 8,
    prefix: list[int] | None = None,
    groups: int | None = None,
    share_prefix: bool = False,
    branch_sampler: Callable[[], Sampler] | None = None,
    prefix_cache=None,
) -> Iterator[tuple[int, RowResult, float]]:
    """Answer every request; yields `(request index, result, seconds)` as rows
    finish (not in request order). `seconds` is the wall time since the previous
    yield, so the seconds of a whole run add up to its duration.

    `prefix`: tokens every prompt starts with (e.g. the chat template's system
    turn), run through the model once and shared by all rows. `groups`: how many
    parallel streams the batch is split into (default: `default_groups`). One
    sampler per batch slot, reset for each new request.

    `share_prefix`: the batch stores the prefix once, not per row (for rows
    that fork, see `Choice.spawn`). `branch_sampler`: makes the sampler of
    each spawned row (default: `make_sampler`). `prefix_cache`: the prefix
    already run through the model (e.g. a chat's cache): read, never written."""
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch_size}")
    eos = set(tokenizer.eos_token_ids)
    context = model.args.max_position_embeddings
    for r in requests:
        if not r.prompt:
            raise ConfigError("a prompt is empty; every request needs at least one token")
        if len(r.prompt) + r.max_tokens > context:
            raise ContextOverflowError(
                f"a prompt of {len(r.prompt)} tokens plus {r.max_tokens} new tokens exceeds the "
                f"model's context of {context}; lower --max-tokens or shorten the prompt"
            )
    prefix = list(prefix or [])
    if prefix and any(len(r.prompt) <= len(prefix) or r.prompt[: len(prefix)] != prefix for r in requests):
        raise ValueError("every prompt must start with the prefix and be longer than it")
    if share_prefix and not prefix:
        raise ValueError("share_prefix needs a prefix")
    if prefix_cache is not None and prefix_cache[0].offset != len(prefix):
        raise ValueError("prefix_cache must hold exactly the prefix")
    if prefix and requests and prefix_cache is None:
        prefix_cache = make_cache(model)
        model(mx.array([prefix]), prefix_cache, last_only=True)
        evaluate(prefix_cache)

    batch_size = min(batch_size, max(1, len(requests)))
    n_groups = min(groups or default_groups(batch_size, model), batch_size)
    sizes = [batch_size // n_groups + (g < batch_size % n_groups) for g in range(n_groups)]
    all_groups = [
        _Group([make_sampler() for _ in range(n)], s, branch_sampler or make_sampler)
        for n, s in zip(sizes, _streams(n_groups), strict=False)
    ]
    numbers = itertools.count()
    for group in all_groups:
        group.numbers = numbers
    pending = deque(enumerate(requests))
    last = time.perf_counter()
    for group in all_groups:  # fill every slot before the first decision
        _step(model, group, eos, pending, prefix_cache, len(prefix), share_prefix)
    while any(g.rows for g in all_groups):
        for group in all_groups:
            for row in _step(model, group, eos, pending, prefix_cache, len(prefix), share_prefix):
                now = time.perf_counter()
                yield row.index, row.result, now - last
                last = now
