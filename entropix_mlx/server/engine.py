"""The server's model owner: one worker thread runs every generation.

Requests are queued (`Engine.submit`); the worker admits them into the batch
engine (batched.py, streaming per row) as slots free up, and hands each token
to its request's asyncio queue as soon as it is produced. Only this thread
touches the model, the detokenizers and the prefix cache, so requests share no
mutable state and outputs cannot mix. A decoder that runs its own batches over
whole answers (`deliberate`) runs alone, between batches.

A job is cancelled (its client went away) by setting `cancelled`; the worker
cuts its row at the next step, and skips a job cancelled while queued.
"""

import asyncio
import queue
import random
import threading
from collections import deque
from dataclasses import dataclass, field

from ..decode.generate import Decoder, as_decoder
from ..errors import ContextOverflowError, EntropixError
from .batched import BatchRunner
from .prefix_cache import PrefixCache
from .responses import chat_logprob, record
from .stops import StopScanner


@dataclass
class Job:
    ids: list[int]  # prompt token ids, template applied
    sampler: object
    max_tokens: int
    seed: int
    logprobs: bool = False  # an OpenAI logprobs entry per token
    top_logprobs: int = 0  # alternatives per token (0: none computed)
    stop: list[str] = field(default_factory=list)
    penalties: object = None  # sampling/penalties.py, bound to this prompt (None: off)
    cancelled: bool = False
    # One of a request's several choices: its prompt is run once for all of them
    # (the first to join puts it in the prefix cache, the others start from there).
    shared_prefill: bool = False
    # How the sampler and penalties were asked for (name, overrides, penalties):
    # what the other ranks rebuild them from under a launcher (lockstep.py).
    recipe: dict | None = None
    # Filled by `submit`: where the worker's events go.
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None


class Engine:
    def __init__(
        self,
        loaded,
        prefix_cache: PrefixCache | None = None,
        batch_size: int = 8,
        lockstep=None,
        worker: bool = True,
    ):
        self.loaded = loaded  # the front door: samplers and requests are prepared through it
        self.model, self.tokenizer, self.name = loaded.model, loaded.tokenizer, loaded.name
        # Under a launcher with a split model: every operation on the model is
        # shared with the other ranks before it runs (lockstep.py). None: one process.
        self.lockstep = lockstep
        self.batch_size = batch_size
        self._waiting: deque = deque()
        self.context = loaded.context
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="entropix-engine", daemon=True)
        # The Hugging Face tokenizer is not safe to use from two threads at once
        # (encoding with split_special_tokens flips a flag on the shared backend):
        # the app encodes prompts and the worker decodes logprob tokens under this.
        self.tokenizer_lock = threading.Lock()
        self.busy = False
        self.served = 0  # jobs run (to the end or stopped)
        self.cancelled = 0  # jobs stopped early because their client went away
        if worker:  # the other ranks of a launch replay rank 0's operations instead (lockstep.follow)
            self._thread.start()

    @property
    def waiting(self) -> int:
        return self._queue.qsize() + len(self._waiting)

    def submit(self, job: Job) -> Job:
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        self._queue.put(job)
        return job

    def close(self, wait: bool = False):
        """Stop the worker after the step it is in (and wait for it with `wait`)."""
        self._queue.put(None)
        if wait:
            self._thread.join(timeout=30)

    def emit(self, job: Job, *event):
        """Hand an event to the request's handler (on the event loop's thread)."""
        if job.loop is None:  # a job another rank's client sent: nobody here to hand it to
            return
        job.loop.call_soon_threadsafe(job.events.put_nowait, event)

    def _work(self):
        runner = BatchRunner(self, self.batch_size)
        self._waiting = waiting = deque()
        while True:
            if not self._collect(runner, waiting):  # close()
                self._share({"stop": True})
                return
            added = self._admit(runner, waiting)
            self.busy = not runner.idle
            if runner.idle:
                continue
            # What the step does depends on the cancellations seen now, not on a
            # client leaving mid-step: every rank must cut the same rows.
            cancelled = runner.cancelled_now()
            step = {"add": [job_recipe(job) for job in added], "cancel": sorted(cancelled)}
            if self.lockstep is not None:
                step["digest"] = runner.digest()
            self._share(step)
            try:
                runner.step(cancelled)
            except ContextOverflowError as e:  # a branch rollout looked past the end of the context
                runner.fail(str(e))
            except Exception as e:  # a bug: those requests fail, the server goes on
                runner.fail(f"internal error: {type(e).__name__}: {e}")
            self.busy = not runner.idle

    def _collect(self, runner, waiting: deque) -> bool:
        """Move queued jobs to `waiting`, blocking only when nothing is being
        decoded; False once close() asked to stop."""
        if runner.idle and not waiting:
            try:
                waiting.append(self._queue.get(timeout=self.lockstep and self.lockstep.beat))
            except queue.Empty:  # a launch with nothing to do: the other ranks rest a beat
                self._share({"idle": True})
                return True
        while True:
            try:
                waiting.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return not any(job is None for job in waiting)

    def _admit(self, runner, waiting: deque) -> list:
        """Waiting jobs into the batch while it has room (a cancelled one is
        dropped, a whole-answer decoder runs alone between batches); the jobs added."""
        added = []
        while waiting:
            job = waiting[0]
            if job.cancelled:  # its client left while it waited
                waiting.popleft()
                self.cancelled += 1
                continue
            if isinstance(job.sampler, Decoder):
                # A decoder that runs its own batches over whole answers: alone, between batches.
                if not runner.idle:
                    break
                waiting.popleft()
                self._share({"alone": job_recipe(job)})
                self.run_alone(job)
                continue
            if not runner.has_room:
                break
            added.append(waiting.popleft())
            runner.add(added[-1])
        return added

    def _share(self, message):
        """Rank 0's `message` on every rank (itself in one process)."""
        return message if self.lockstep is None else self.lockstep.share(message)

    def run_alone(self, job: Job):
        self.busy = True
        try:
            self._run(job)
        except EntropixError as e:  # e.g. a config the sampler rejects mid-way
            self.emit(job, "error", str(e))
        except Exception as e:  # a bug: report it to this client, keep serving the others
            self.emit(job, "error", f"internal error: {type(e).__name__}: {e}")
        finally:
            self.busy = False
            self.served += 1

    def _run(self, job: Job):
        """One request alone, through its decoder's own generation (for decoders
        that compare whole answers: they record no per-step alternatives)."""
        cache, cached = self.prefix_cache.take(job.ids)
        decoder = as_decoder(job.sampler)
        generation = decoder.generate(
            self.model, self.tokenizer, job.ids[cached:], job.max_tokens, job.seed, cache, penalties=job.penalties
        )
        self.emit(job, "start", {"prompt_tokens": len(job.ids), "cached_tokens": cached})
        scanner = StopScanner(job.stop)
        finish = None
        try:
            for event in generation:
                entry = None
                if job.logprobs:
                    with self.tokenizer_lock:
                        entry = chat_logprob(self.tokenizer, event, event.top)
                text, hit = scanner.feed(event.text)
                self.emit(job, "token", record(event), entry, text)
                if hit:
                    finish = "stop"
                    break
                if self._share(job.cancelled):
                    finish = "cancelled"
                    self.cancelled += 1
                    break
        except ContextOverflowError:  # a branch rollout looked past the end of the context
            finish = "length"
        if finish is None:
            finish = {"eos": "stop"}.get(generation.finish_reason, "length")
        tail = scanner.flush() if finish != "stop" else ""
        # The cache now holds the prompt and (nearly) every answer token: keep it
        # for the next turn of this conversation.
        if generation.cache is not None:  # None: a sampler that kept no cache of its own (deliberate)
            self.prefix_cache.put(job.ids + generation.tokens, generation.cache)
        self.emit(job, "end", finish, tail, generation.summary())


def job_recipe(job: Job) -> dict | None:
    """What another rank needs to run `job` as this one does (None: one process)."""
    if job.recipe is None:
        return None
    fields = ("ids", "max_tokens", "seed", "logprobs", "top_logprobs", "stop", "shared_prefill")
    # which of the request's choices (Entropix takes other branch paths after the first)
    choice = {"path_choice": getattr(job.sampler, "path_choice", 0)}
    return {**job.recipe, **{name: getattr(job, name) for name in fields}, **choice}


def random_seed() -> int:
    return random.SystemRandom().randrange(2**63)
