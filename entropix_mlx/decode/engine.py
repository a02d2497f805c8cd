"""The batch engine: several requests decoded together. Eval, `deliberate` and the
server drive it through `BatchEngine` (add, step, cancel) or `generate_batch`.

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
insertion) get the model and a batch-1 cache of their row (`RowCache`, built
only if they touch it); when they hand back the state after their tokens
(`TokenChoice.advanced`), the row leaves the batch and re-enters with that cache,
like a new prompt. A choice of several tokens without such a state is queued
and fed one token per step.

Rows can spawn rows (`TokenChoice.spawn`, used by `deliberate`): each alternative
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
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx

from ..errors import ConfigError, ContextOverflowError
from ..model.cache import (
    evaluate,
    make_cache,
)
from ..sampling.samplers import Sampler
from .group import Group
from .rows import Request, Row, RowResult


@dataclass
class _Waiting:
    index: int
    request: Request
    sampler: Sampler | None  # None: one of the batch's pooled samplers
    prefix_cache: list | None  # what the prompt starts from, already run (read, never written)
    prefix_len: int


class BatchEngine:
    """Rows decoded together, one forward pass per group per step.

    `add` queues a request; `step` makes one decision per row, admits waiting
    requests into free slots and returns the rows that finished; `cancel` cuts a
    row (it leaves at its next decision) or drops a waiting request. Running
    rows (`rows`) hold their results so far (`Row.result`).

    `make_sampler`: a pool of one sampler per slot, used for requests added
    without one (reset for each). `prefix_cache` (with `share_prefix`): the
    prefix every prompt starts with, already run, stored once for all rows (rows
    that spawn rows, see `TokenChoice.spawn`). `branch_sampler` makes each spawned
    row's sampler. `joins_per_step`: the most requests a group admits per step
    (None: as many as it has free slots). `on_finish(row, row_cache)` sees each
    finishing row's cache (the server keeps it for the next turn)."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 8,
        groups: int | None = None,
        make_sampler: Callable[[], Sampler] | None = None,
        branch_sampler: Callable[[], Sampler] | None = None,
        prefix_cache=None,
        share_prefix: bool = False,
        joins_per_step: int | None = None,
        on_finish: Callable | None = None,
    ):
        if batch_size < 1:
            raise ConfigError(f"batch size must be at least 1, got {batch_size}")
        self.model, self.tokenizer = model, tokenizer
        self.eos = set(tokenizer.eos_token_ids)
        self.make_sampler, self.branch_sampler = make_sampler, branch_sampler or make_sampler
        self.prefix_cache, self.share_prefix = prefix_cache, share_prefix
        self.joins_per_step, self.on_finish = joins_per_step, on_finish
        self.batch_size = batch_size
        n = min(groups or model.backend.groups(batch_size, model), batch_size)
        sizes = [batch_size // n + (g < batch_size % n) for g in range(n)]
        self.numbers = itertools.count()  # row numbers, shared by all groups
        self.groups = [Group(self, size, stream) for size, stream in zip(sizes, model.backend.streams(n), strict=True)]
        self.waiting: deque[_Waiting] = deque()
        self.stopped: set[int] = set()  # requests whose running rows were stopped (`stop`)

    def add(
        self,
        index: int,
        request: Request,
        sampler: Sampler | None = None,
        prefix_cache=None,
        prefix_len=None,
        first: bool = False,
    ):
        """Queue `request` under `index` (how its rows are reported). `prefix_cache`:
        its prompt's first `prefix_len` tokens already run (default: the engine's).
        `first`: ahead of the waiting requests (more rows for a request in flight)."""
        if prefix_cache is None and prefix_len is None:
            prefix_cache = self.prefix_cache
            prefix_len = prefix_cache[0].offset if prefix_cache is not None else 0
        entry = _Waiting(index, request, sampler, prefix_cache, prefix_len or 0)
        if first:
            self.waiting.appendleft(entry)
        else:
            self.waiting.append(entry)

    def cancel(self, index: int) -> bool:
        """Drop the waiting request `index` (True), or cut its running row: it
        leaves the batch at its next decision (False)."""
        for entry in self.waiting:
            if entry.index == index:
                self.waiting.remove(entry)
                return True
        self._end_rows(index, 1)
        return False

    def stop(self, index: int) -> None:
        """End every running row of request `index` at its next decision, with
        finish_reason "stopped" (its answer is already decided: `deliberate`'s
        early stop)."""
        self.stopped.add(index)
        self._end_rows(index, 0)  # its next decision adds no token

    def _end_rows(self, index: int, more: int) -> None:
        """Let request `index`'s running rows take `more` tokens, then end."""
        for row in self.rows:
            if row.index == index:
                row.max_tokens = len(row.result.tokens) + more

    def step(self) -> list[Row]:
        """One step of every group that has rows or can admit; the rows that finished."""
        done = []
        for group in self.groups:
            if group.rows or (self.waiting and group.taken < group.size):
                done += group.step()
        for row in done:
            if row.index in self.stopped and row.result.finish_reason == "length":
                row.result.finish_reason = "stopped"
        return done

    def admit(self, free: int) -> list[Row]:
        """Rows for up to `free` waiting requests (fewer with `joins_per_step`)."""
        joiners = []
        limit = free if self.joins_per_step is None else min(free, self.joins_per_step)
        while self.waiting and len(joiners) < limit:
            w = self.waiting.popleft()
            joiners.append(Row(w.index, w.request, w.sampler, next(self.numbers), w.prefix_cache, w.prefix_len))
        return joiners

    @property
    def rows(self) -> list[Row]:
        return [row for group in self.groups for row in group.rows]

    @property
    def idle(self) -> bool:
        return not self.waiting and not any(group.rows for group in self.groups)

    @property
    def has_room(self) -> bool:
        return len(self.waiting) + sum(group.taken for group in self.groups) < self.batch_size


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
    stop_when: Callable[[int, RowResult], bool] | None = None,
    follow_up: Callable[[int, RowResult], list] | None = None,
) -> Iterator[tuple[int, RowResult, float]]:
    """Answer every request; yields `(request index, result, seconds)` as rows
    finish (not in request order). `seconds` is the wall time since the previous
    yield, so the seconds of a whole run add up to its duration.

    `prefix`: tokens every prompt starts with (e.g. the chat template's system
    turn), run through the model once and shared by all rows. `groups`: how many
    parallel streams the batch is split into (default: `Backend.groups`). One
    sampler per batch slot, reset for each new request.

    `share_prefix`: the batch stores the prefix once, not per row (for rows
    that fork, see `TokenChoice.spawn`). `branch_sampler`: makes the sampler of
    each spawned row (default: `make_sampler`). `prefix_cache`: the prefix
    already run through the model (e.g. a chat's cache): read, never written.
    `stop_when(index, result)`, asked of each finished row: True stops the
    request's other rows (`BatchEngine.stop`). `follow_up(index, result)`, asked
    next: (request, sampler) pairs that start more rows under that index, ahead
    of the waiting requests (`deliberate`'s second stage)."""
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1, got {batch_size}")
    context = model.args.max_position_embeddings
    for r in requests:
        if not r.prompt:
            raise ConfigError("a prompt is empty; every request needs at least one token")
        if len(r.prompt) + r.max_tokens > context:
            raise ContextOverflowError(
                f"a prompt of {len(r.prompt)} tokens plus {r.max_tokens} new tokens exceeds the "
                f"model's context of {context}; lower max_tokens or shorten the prompt",
                settings=("max_tokens",),
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
    engine = BatchEngine(
        model,
        tokenizer,
        batch_size,
        groups,
        make_sampler,
        branch_sampler,
        prefix_cache if prefix else None,
        share_prefix,
    )
    for index, request in enumerate(requests):
        engine.add(index, request)
    last = time.perf_counter()
    while not engine.idle:
        for row in engine.step():
            if stop_when is not None and row.index not in engine.stopped and stop_when(row.index, row.result):
                engine.stop(row.index)
            more = follow_up(row.index, row.result) if follow_up is not None else []
            for request, sampler in reversed(more):  # each goes first: in reverse, they keep their order
                engine.add(row.index, request, sampler, first=True)
            now = time.perf_counter()
            yield row.index, row.result, now - last
            last = now


def forking_batch(
    model,
    tokenizer,
    requests,
    make_root,
    make_branch,
    batch_size: int,
    prefix: list[int],
    prefix_cache=None,
    stop_when=None,
    follow_up=None,
) -> Iterator[tuple[int, RowResult, float]]:
    """`generate_batch` for rows that spawn rows (`TokenChoice.spawn`: deliberate's
    branches, a vote's samples): one group, so a spawned row shares its parent's
    batch, and the prefix stored once, so it copies only its parent's own
    positions. `make_root` makes each request's sampler, `make_branch` each
    spawned row's; `stop_when` and `follow_up` as in `generate_batch`."""
    return generate_batch(
        model,
        tokenizer,
        requests,
        make_root,
        batch_size,
        prefix=prefix,
        share_prefix=bool(prefix),
        groups=1,
        branch_sampler=make_branch,
        prefix_cache=prefix_cache,
        stop_when=stop_when,
        follow_up=follow_up,
    )


def by_request(
    rows: Iterator[tuple[int, RowResult, float]], more: dict[int, int] | None = None
) -> Iterator[tuple[int, list[RowResult], float]]:
    """`generate_batch`'s rows gathered per request once its root row, every
    row spawned from it (`TokenChoice.spawn`; the root's metrics count them as
    `spawned`) and `more[index]` rows started later (`follow_up`) have finished:
    (request index, results root first then by row number, the seconds of them all)."""
    done: dict[int, list[RowResult]] = {}
    seconds: dict[int, float] = {}
    more = {} if more is None else more
    for index, result, spent in rows:
        done.setdefault(index, []).append(result)
        seconds[index] = seconds.get(index, 0.0) + spent
        if all_finished(done[index], more.get(index, 0)):
            yield index, sorted(done.pop(index), key=lambda r: (r.parent is not None, r.row)), seconds.pop(index)


def all_finished(results: list[RowResult], more: int = 0) -> bool:
    """Whether a request's finished rows are all it has: its root, every row
    spawned from it (the root's metrics count them as `spawned`) and `more`."""
    root = next((r for r in results if r.parent is None), None)
    return root is not None and len(results) >= 1 + more + sum(m.get("spawned", 0) for m in root.metrics)
