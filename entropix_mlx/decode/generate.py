"""The decode loop: prefill, then one sampler decision and one forward pass per step.

`generate(...)` returns a `Generation`: iterate it for `TokenEvent`s as they are
produced; `summary()` is valid at any time, also after an interruption (Ctrl-C
raised inside the loop still leaves the counts of what was yielded).
"""

import time
from collections import Counter
from typing import Protocol, runtime_checkable

import mlx.core as mx

from ..errors import ConfigError
from ..model.cache import make_cache
from ..sampling.samplers import Sampler, Step
from .engine import generate_batch
from .events import Summary, TextStream, TokenEvent
from .prefill import prefill
from .rows import DEFAULT_MAX_TOKENS


class Generation:
    def __init__(
        self,
        model,
        tokenizer,
        prompt_tokens: list[int],
        sampler: Sampler,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        seed: int = 0,
        cache=None,
        penalties=None,
    ):
        if len(prompt_tokens) == 0:  # the next token's logits need at least one position
            raise ConfigError("the prompt has no tokens; give some text")
        self.model, self.tokenizer, self.sampler = model, tokenizer, sampler
        self.prompt_tokens = list(prompt_tokens)
        self.max_tokens, self.seed, self.penalties = max_tokens, seed, penalties
        self.cache = cache if cache is not None else make_cache(model)
        self.tokens: list[int] = []  # every token of the answer, in order
        self.events: list[TokenEvent] = []
        self.finish_reason = "running"
        self.thinking_insertions = 0
        self._prompt_time = self._gen_time = 0.0
        self._gen_start = None

    def __iter__(self):
        if self.max_tokens <= 0:  # nothing asked for: no prefill either
            self.finish_reason = "length"
            return
        model, cache, eos = self.model, self.cache, self.tokenizer.eos_token_ids
        self.sampler.reset()
        text = TextStream(self.tokenizer)
        key = mx.random.key(self.seed)
        mx.reset_peak_memory()

        start = time.perf_counter()
        logits, scores = prefill(model, self.prompt_tokens, cache)
        # The scores too, even for a sampler that ignores them: left pending, they
        # would still read the cache's key buffer, so the next step's write could
        # not update it in place and would copy it (+6 MB on the bundled model).
        mx.eval(logits, scores)
        self._gen_start = time.perf_counter()
        self._prompt_time = self._gen_start - start

        while len(self.tokens) < self.max_tokens:
            key, step_key = mx.random.split(key)
            step_logits = logits[0, -1]
            if self.penalties is not None:
                step_logits = self.penalties.apply(step_logits, self.tokens)
            step = Step(step_logits, [s[0] for s in scores], self.tokens, model, cache, self.penalties)
            choice = self.sampler.choose(step, step_key)
            tokens = choice.tokens[: self.max_tokens - len(self.tokens)]
            self.thinking_insertions += choice.inserted
            if not (len(self.tokens) + len(tokens) >= self.max_tokens or any(t in eos for t in tokens)):
                # Start the next forward pass before handing the tokens out (as
                # mlx-lm does): it computes while the caller prints and while
                # the next step's sampler graph is built.
                if choice.advanced is not None:
                    self.cache, logits, scores = choice.advanced
                    cache = self.cache
                else:
                    logits, scores = model(mx.array([tokens]), cache)
                mx.async_eval(logits, scores)
            for i, (token, logprob) in enumerate(zip(tokens, choice.logprobs, strict=False)):
                if token in eos:
                    self.finish_reason = "eos"
                    self._gen_time = time.perf_counter() - self._gen_start
                    return
                self.tokens.append(token)
                piece = text.add(token, last=len(self.tokens) == self.max_tokens)
                top = choice.top if i == 0 else []  # alternatives where the sampler chose
                event = TokenEvent(
                    token, piece, choice.strategy, logprob, choice.metrics_at(i), choice.params, choice.note, top
                )
                self.events.append(event)
                self._gen_time = time.perf_counter() - self._gen_start
                yield event
            if len(self.tokens) >= self.max_tokens:
                break
        self.finish_reason = "length"

    def summary(self) -> Summary:
        finish = self.finish_reason
        strategies = Counter(e.strategy for e in self.events)
        gen_time = self._gen_time
        return Summary(
            # The tokens handed out as events: one an interrupt caught between
            # joining the answer and becoming an event was never shown.
            tokens=len(self.events),
            prompt_tokens=len(self.prompt_tokens),
            strategy_counts=dict(strategies),
            thinking_insertions=self.thinking_insertions,
            prompt_tps=len(self.prompt_tokens) / self._prompt_time if self._prompt_time else 0.0,
            generation_tps=len(self.tokens) / gen_time if gen_time else 0.0,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            finish_reason=finish,
        )


@runtime_checkable
class Decoder(Protocol):
    """Whatever answers prompts: `generate` one answer as a stream of events,
    `answer_rows` many at once for `eval` (yielding `(index, RowResult, seconds)`
    as answers complete). A per-step sampler becomes one through `StepDecoder`;
    `deliberate` is one of its own (decode/deliberate.py)."""

    name: str

    def generate(
        self, model, tokenizer, prompt_tokens, max_tokens=DEFAULT_MAX_TOKENS, seed=0, cache=None, penalties=None
    ): ...

    def answer_rows(self, model, tokenizer, requests, batch_size=8, prefix=None, answer_of=None): ...


class StepDecoder:
    """A per-step sampler as a decoder: one answer through `Generation`, many
    through the batch engine with one sampler per slot from `make_sampler`."""

    def __init__(self, sampler: Sampler, make_sampler=None):
        self.sampler, self.name = sampler, getattr(sampler, "name", "sampler")
        self.make_sampler = make_sampler  # one sampler per batch slot: they keep per-answer state

    def generate(
        self, model, tokenizer, prompt_tokens, max_tokens=DEFAULT_MAX_TOKENS, seed=0, cache=None, penalties=None
    ) -> Generation:
        return Generation(model, tokenizer, prompt_tokens, self.sampler, max_tokens, seed, cache, penalties)

    def answer_rows(self, model, tokenizer, requests, batch_size=8, prefix=None, answer_of=None):
        if self.make_sampler is None:
            raise ValueError("answer_rows needs make_sampler: batch slots cannot share one sampler")
        return generate_batch(model, tokenizer, requests, self.make_sampler, batch_size, prefix=prefix)


def as_decoder(sampler, make_sampler=None) -> Decoder:
    """`sampler` itself when it decodes whole answers, else its `StepDecoder`."""
    return sampler if isinstance(sampler, Decoder) else StepDecoder(sampler, make_sampler)


def generate(
    model, tokenizer, prompt_tokens, sampler, max_tokens=DEFAULT_MAX_TOKENS, seed=0, cache=None, penalties=None
):
    """One answer to `prompt_tokens` (after what `cache` holds): iterate it for
    `TokenEvent`s; `summary()` at any time. `penalties` (sampling/penalties.py)
    change the logits before the sampler sees them."""
    return as_decoder(sampler).generate(model, tokenizer, prompt_tokens, max_tokens, seed, cache, penalties)
