"""Concurrent requests decoded together, streaming per row: the server's use of
the batch engine.

Requests arrive at any time: each step admits at most one waiting request per
group (its prompt, after its prompt-prefix cache entry, rides along in that
step's forward pass), and after each step hands every row's new tokens to its
request, with the per-token JSON record. Every row keeps its own sampler,
key chain and text stream, so a request's answer does not depend on which
others share its batch.

A request that is cancelled (client gone) or meets a stop string is cut
(`BatchEngine.cancel`): its row leaves the batch at its next decision. When a
row finishes, its cache goes into the prefix cache for the next turn of that
conversation.
"""

import itertools

import mlx.core as mx

from ..decode.engine import BatchEngine
from ..decode.events import TextStream, TokenEvent
from ..decode.rows import Request
from ..model.cache import KVCache, make_cache
from ..sampling.recorder import recording
from .responses import chat_logprob, record
from .stops import StopScanner


class _Slot:
    def __init__(self, number: int, job, tokenizer, cache, cached: int):
        self.number, self.job = number, job
        self.sampler = recording(job.sampler, job.top_logprobs)
        self.text = TextStream(tokenizer)
        self.scanner = StopScanner(job.stop)
        self.request = Request(job.ids, job.seed, job.max_tokens, job.penalties)
        self.cache, self.cached = cache, cached
        self.row = None
        self.sent = 0  # tokens handed to the request so far
        self.finish = None  # "stop" (stop string) or "cancelled", set before the row ends


class BatchRunner:
    def __init__(self, engine, batch_size: int = 8, groups: int | None = None):
        self.engine = engine
        self.batch_size, self.n_groups = batch_size, groups
        self.batch = BatchEngine(
            engine.model, engine.tokenizer, batch_size, groups, joins_per_step=1, on_finish=self._keep_cache
        )
        self.slots: dict[int, _Slot] = {}
        self.cancelled: set[int] = set()  # the slots being cut in this step
        self._numbers = itertools.count()

    @property
    def idle(self) -> bool:
        return not self.slots

    @property
    def has_room(self) -> bool:
        return self.batch.has_room

    def add(self, job):
        if job.shared_prefill:
            self._prefill(job.ids)
        cache, cached = self.engine.prefix_cache.take(job.ids)
        slot = _Slot(next(self._numbers), job, self.engine.tokenizer, cache, cached)
        self.slots[slot.number] = slot
        self.batch.add(slot.number, slot.request, slot.sampler, cache, cached)

    def _prefill(self, ids: list[int]) -> None:
        """The prompt of a request's several choices, run once into the prefix cache
        (all but its last token: each choice's row runs that one for its logits)."""
        cache, cached = self.engine.prefix_cache.take(ids)
        if cached >= len(ids) - 1:
            return
        if cache is None:
            cache = make_cache(self.engine.model)
        self.engine.model(mx.array([ids[cached:-1]]), cache, last_only=True)
        mx.eval([(c.keys, c.values) for c in cache])
        self.engine.prefix_cache.put(ids[:-1], cache)

    def digest(self) -> list:
        """Each running row's length and last token: the ranks of a launch compare
        them before each step, so a rank that decided otherwise stops at once."""
        return [[n, len(s.row.result.tokens), s.row.result.tokens[-1:]] for n, s in sorted(self.slots.items()) if s.row]

    def cancelled_now(self) -> set[int]:
        """The slots whose clients have gone, as of now."""
        return {number for number, slot in self.slots.items() if slot.job.cancelled}

    def step(self, cancelled: set[int] | None = None):
        """One step of the batch; `cancelled`: the slots to cut (default: as of now)."""
        self.cancelled = self.cancelled_now() if cancelled is None else cancelled
        for slot in list(self.slots.values()):  # their clients left before they started
            if slot.row is None and slot.number in self.cancelled and self.batch.cancel(slot.number):
                self.slots.pop(slot.number)
                self.engine.cancelled += 1
        done = self.batch.step()
        for row in self.batch.rows:
            slot = self.slots[row.index]
            if slot.row is None:
                slot.row = row
                self.engine.emit(slot.job, "start", {"prompt_tokens": len(slot.job.ids), "cached_tokens": slot.cached})
            self._send(slot)
        for row in done:
            self._end(self.slots.pop(row.index))

    def fail(self, message: str):
        """A step raised: every request of the batch gets the error; start over."""
        for slot in self.slots.values():
            self.engine.emit(slot.job, "error", message)
        self.__init__(self.engine, self.batch_size, self.n_groups)

    def _send(self, slot: _Slot):
        res, job = slot.row.result, slot.job
        while slot.sent < len(res.tokens) and slot.finish is None:
            i = slot.sent
            slot.sent += 1
            piece = slot.text.add(res.tokens[i], last=slot.sent == job.max_tokens)
            event = TokenEvent(
                res.tokens[i], piece, res.strategies[i], res.logprobs[i], res.metrics[i], res.params[i], res.notes[i]
            )
            entry = None
            if job.logprobs:
                with self.engine.tokenizer_lock:
                    entry = chat_logprob(self.engine.tokenizer, event, res.tops[i])
            text, hit = slot.scanner.feed(event.text)
            self.engine.emit(job, "token", record(event), entry, text)
            if hit or slot.number in self.cancelled:
                slot.finish = "stop" if hit else "cancelled"
                self.batch.cancel(slot.number)

    def _end(self, slot: _Slot):
        self._send(slot)
        res = slot.row.result
        if slot.finish == "cancelled":
            self.engine.cancelled += 1
        finish = slot.finish or {"eos": "stop"}.get(res.finish_reason, "length")
        tail = "" if slot.finish == "stop" else slot.scanner.feed(slot.text.flush())[0] + slot.scanner.flush()
        self.engine.emit(slot.job, "end", finish, tail, None)
        self.engine.served += 1

    def _keep_cache(self, row, row_cache):
        """As a row leaves: its prompt and answer go into the prefix cache."""
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
