"""Concurrent requests decoded together, streaming per row: the server's use of
batch.py's continuous batching.

batch.py's `_step` makes one decision per row of a group and runs the group's
next forward pass; this module drives it for requests that arrive at any time:
each step admits at most one waiting request per group (its prompt, after its
prompt-prefix cache entry, rides along in that step's forward pass), and
after each step hands every row's new tokens to its request, with the record
`run --json` writes. Every row keeps its own sampler, key chain and
detokenizer, so a request's answer does not depend on which others share its
batch (tests/test_batch.py checks this for batch.py).

A request that is cancelled (client gone) or meets a stop string is cut by
lowering its row's token limit: the row leaves the batch at its next decision.
When a row finishes, batch.py hands over its cache (`keep_cache`), which goes
into the prefix cache for the next turn of that conversation.
"""

import itertools
from collections import deque

import mlx.core as mx

from ..decode.engine import _Group, _step, _streams, default_groups
from ..decode.events import plain
from ..decode.rows import Request
from ..model.cache import KVCache
from .recorder import Recorder
from .responses import chat_logprob
from .stops import StopScanner


class _Slot:
    def __init__(self, number: int, job, tokenizer, cache, cached: int):
        self.number, self.job = number, job
        self.sampler = Recorder(job.sampler, job.top_logprobs)
        self.detokenizer = tokenizer.detokenizer  # a fresh copy per caller (mlx-lm)
        self.scanner = StopScanner(job.stop)
        self.request = Request(job.ids, job.seed, job.max_tokens)
        self.cache, self.cached = cache, cached
        self.row = None
        self.sent = 0  # tokens handed to the request so far
        self.finish = None  # "stop" (stop string) or "cancelled", set before the row ends


class BatchRunner:
    def __init__(self, engine, batch_size: int = 8, groups: int | None = None):
        self.engine = engine
        model = engine.model
        n = min(groups or default_groups(batch_size, model), batch_size)
        sizes = [batch_size // n + (g < batch_size % n) for g in range(n)]
        numbers = itertools.count()
        self.groups = []
        for size, stream in zip(sizes, _streams(n), strict=False):
            group = _Group([], stream)
            group.numbers, group.size, group.waiting = numbers, size, deque()
            group.keep_cache = self._keep_cache
            self.groups.append(group)
        self.slots: dict[int, _Slot] = {}
        self._numbers = itertools.count()
        self.eos = set(engine.tokenizer.eos_token_ids)

    @property
    def idle(self) -> bool:
        return not self.slots

    @property
    def has_room(self) -> bool:
        return any(len(g.rows) + len(g.waiting) < g.size for g in self.groups)

    def add(self, job):
        cache, cached = self.engine.prefix_cache.take(job.ids)
        slot = _Slot(next(self._numbers), job, self.engine.tokenizer, cache, cached)
        self.slots[slot.number] = slot
        group = min(self.groups, key=lambda g: (len(g.rows) + len(g.waiting)) / g.size)
        group.waiting.append(slot)

    def step(self):
        for group in self.groups:
            pending, admitted = deque(), None
            group.free = []
            while group.waiting and group.waiting[0].job.cancelled:  # its client left before it started
                self.slots.pop(group.waiting.popleft().number)
                self.engine.cancelled += 1
            if group.waiting and len(group.rows) < group.size:
                admitted = group.waiting.popleft()
                pending.append((admitted.number, admitted.request))
                group.free = [admitted.sampler]
            if not group.rows and not pending:
                continue
            done = _step(
                self.engine.model,
                group,
                self.eos,
                pending,
                admitted.cache if admitted else None,
                admitted.cached if admitted else 0,
            )
            if admitted is not None:
                admitted.row = next(r for r in group.rows if r.index == admitted.number)
                self.engine.emit(
                    admitted.job, "start", {"prompt_tokens": len(admitted.job.ids), "cached_tokens": admitted.cached}
                )
            for row in group.rows:
                self._send(self.slots[row.index])
            for row in done:
                self._end(self.slots.pop(row.index))

    def fail(self, message: str):
        """A step raised: every request of the batch gets the error; start over."""
        for slot in self.slots.values():
            self.engine.emit(slot.job, "error", message)
        self.__init__(self.engine, sum(g.size for g in self.groups), len(self.groups))

    def _send(self, slot: _Slot):
        res, job = slot.row.result, slot.job
        while slot.sent < len(res.tokens) and slot.finish is None:
            i = slot.sent
            slot.sent += 1
            token = res.tokens[i]
            params, note, top = slot.sampler.pending.popleft() if slot.sampler.pending else ({}, "", [])
            slot.detokenizer.add_token(token)
            if slot.sent == job.max_tokens:
                slot.detokenizer.finalize()  # the last token: flush held-back bytes
            record = {
                "token": token,
                "text": slot.detokenizer.last_segment,
                "strategy": res.strategies[i],
                **res.metrics[i],
                **params,
                "logprob": res.logprobs[i],
                **({"note": note} if note else {}),
            }
            record = plain(record)
            entry = None
            if job.logprobs:
                with self.engine.tokenizer_lock:
                    entry = chat_logprob(self.engine.tokenizer, _Event(token, res.logprobs[i]), top)
            text, hit = slot.scanner.feed(record["text"])
            self.engine.emit(job, "token", record, entry, text)
            if hit or job.cancelled:
                slot.finish = "stop" if hit else "cancelled"
                # The row leaves the batch at its next decision.
                slot.request.max_tokens = len(res.tokens) + 1

    def _end(self, slot: _Slot):
        self._send(slot)
        res = slot.row.result
        if slot.finish == "cancelled":
            self.engine.cancelled += 1
        finish = slot.finish or {"eos": "stop"}.get(res.finish_reason, "length")
        tail = "" if slot.finish == "stop" else slot.scanner.feed(_flush(slot.detokenizer))[0] + slot.scanner.flush()
        self.engine.emit(slot.job, "end", finish, tail, None)
        self.engine.served += 1

    def _keep_cache(self, row, row_cache):
        """Called by batch.py as a row leaves: its prompt and answer go into the prefix cache."""
        slot = self.slots.get(row.index)
        if slot is None:
            return
        layers = []
        for layer in row_cache:
            copy = KVCache(layer.max_size)
            # A copy, not a view: a view would keep the whole batch's buffer alive.
            copy.keys, copy.values = mx.contiguous(layer.keys), mx.contiguous(layer.values)
            copy.offset = layer.offset
            layers.append(copy)
        mx.eval([(c.keys, c.values) for c in layers])
        self.engine.prefix_cache.put(slot.job.ids + row.result.tokens, layers)


class _Event:  # what chat_logprob reads from a token
    def __init__(self, token, logprob):
        self.token, self.logprob = token, logprob


def _flush(detokenizer) -> str:
    before = detokenizer.text
    detokenizer.finalize()
    return detokenizer.text[len(before) :]
