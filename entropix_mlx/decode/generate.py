"""The decode loop: prefill, then one sampler decision and one forward pass per step.

`generate(...)` returns a `Generation`: iterate it for `TokenEvent`s as they are
produced; `summary()` is valid at any time, also after an interruption (Ctrl-C
raised inside the loop still leaves the counts of what was yielded).
"""

import time
from collections import Counter

import mlx.core as mx

from ..errors import ConfigError
from ..model.cache import make_cache
from ..sampling.samplers import Sampler, Step
from .events import Summary, TokenEvent

PREFILL_CHUNK = 2048


# Prompts up to this many tokens run in one pass. Each pass reads every weight
# once (0.54 GB at float32 for the bundled model), so for a short prompt the
# split below (the body, then the last token alone) costs a second pass: on
# the CPU backend that doubled the prefill time of an eval item or a chat turn.
# Up to this length the pending last-row scores hold at most ~18 MB of queries.
SINGLE_PASS_TOKENS = 256


def prefill(model, tokens: list[int], cache):
    """Run the prompt through the model; returns the last position's (logits, scores).

    A short prompt runs in one pass (logits of the last position only). A
    longer one goes as in mlx-lm: every token but the last only fills the
    cache, in chunks so peak memory stays bounded (only the cache is evaluated;
    MLX is lazy, so those positions' logits and attention scores are never
    computed), then the last token runs alone for the logits and scores. In one
    pass, the pending last-row scores would hold every layer's full query block
    until the end.
    """
    if len(tokens) <= SINGLE_PASS_TOKENS:
        return model(mx.array([tokens]), cache, last_only=True)
    for start in range(0, len(tokens) - 1, PREFILL_CHUNK):
        chunk = tokens[start : min(start + PREFILL_CHUNK, len(tokens) - 1)]
        model(mx.array([chunk]), cache, last_only=True)
        mx.eval([(c.keys, c.values) for c in cache])
    return model(mx.array([tokens[-1:]]), cache)


class Generation:
    def __init__(
        self,
        model,
        tokenizer,
        prompt_tokens: list[int],
        sampler: Sampler,
        max_tokens: int = 256,
        seed: int = 0,
        cache=None,
    ):
        if len(prompt_tokens) == 0:  # the next token's logits need at least one position
            raise ConfigError("the prompt has no tokens; give some text")
        self.model, self.tokenizer, self.sampler = model, tokenizer, sampler
        self.prompt_tokens = list(prompt_tokens)
        self.max_tokens, self.seed = max_tokens, seed
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
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
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
            step = Step(logits[0, -1], [s[0] for s in scores], self.tokens, model, cache)
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
            for token, logprob in zip(tokens, choice.logprobs, strict=False):
                if token in eos:
                    self.finish_reason = "eos"
                    self._gen_time = time.perf_counter() - self._gen_start
                    return
                detokenizer.add_token(token)
                self.tokens.append(token)
                if len(self.tokens) == self.max_tokens:
                    detokenizer.finalize()  # the last token: flush held-back bytes
                event = TokenEvent(
                    token,
                    detokenizer.last_segment,
                    choice.strategy,
                    logprob,
                    choice.metrics,
                    choice.params,
                    choice.note,
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


def generate(model, tokenizer, prompt_tokens, sampler, max_tokens=256, seed=0, cache=None) -> Generation:
    if getattr(sampler, "deliberates", False):  # branches over whole answers: see deliberate.py
        from .deliberate import DeliberateGeneration

        return DeliberateGeneration(model, tokenizer, prompt_tokens, sampler, max_tokens, seed, cache)
    return Generation(model, tokenizer, prompt_tokens, sampler, max_tokens, seed, cache)
