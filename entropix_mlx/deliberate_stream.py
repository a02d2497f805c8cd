"""`deliberate` behind the `Generation` interface, so `run`, `chat` and the
server use it like any sampler: iterating first deliberates (every branch to
the end, `on_row` reporting each finished candidate), then yields the chosen
answer's tokens as `TokenEvent`s.

Strategies of the yielded tokens: "split" where the greedy answer spawned
branches, "branch" for a branch's first own token, "argmax" otherwise.
"""

import time
from collections import Counter
from dataclasses import dataclass

import mlx.core as mx

from .batch import Request
from .deliberate import Deliberation, deliberate_batch, token_strategies
from .errors import ConfigError
from .generate import Summary, TokenEvent


@dataclass
class DeliberateSummary(Summary):
    branches: int = 0           # candidates besides the greedy answer
    tokens_spent: int = 0       # generated over all candidates
    budget: float = 0.0
    deliberation: dict | None = None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["winner"] = (self.deliberation or {}).get("chosen")
        return d


class DeliberateGeneration:
    """Same use as `generate.Generation`. A given `cache` holding the start of
    the conversation (chat) is the branches' shared prefix: it is read, never
    written, so it still holds only that start afterwards."""

    def __init__(self, model, tokenizer, prompt_tokens: list[int], sampler, max_tokens: int = 256,
                 seed: int = 0, cache=None):
        if len(prompt_tokens) == 0:
            raise ConfigError("the prompt has no tokens; give some text")
        self.model, self.tokenizer, self.sampler = model, tokenizer, sampler
        self.config = sampler.config
        self.prompt_tokens, self.max_tokens, self.seed = list(prompt_tokens), max_tokens, seed
        self.cache = cache
        self.tokens: list[int] = []
        self.events: list[TokenEvent] = []
        self.finish_reason = "running"
        self.deliberation: Deliberation | None = None
        self.on_row = None          # called with each finished row's RowResult (progress display)
        self._prompt_time = self._gen_time = 0.0
        self._spent = 0

    def __iter__(self):
        if self.max_tokens <= 0:
            self.finish_reason = "length"
            return
        mx.reset_peak_memory()
        start = time.perf_counter()
        held = self.cache[0].offset if self.cache else 0
        # Tokens of a prefix already in the cache are never run again; only
        # their number matters, so stand-ins take their place in the prompt.
        prompt = [0] * held + self.prompt_tokens
        prefix = prompt[:-1] if held == 0 else prompt[:held]
        request = Request(prompt, self.seed, self.max_tokens)

        def seen(index, result):
            self._spent += len(result.tokens) - (result.split or 0)
            self._gen_time = time.perf_counter() - start
            if self.on_row:
                self.on_row(result)

        for _, deliberation, _ in deliberate_batch(self.model, self.tokenizer, [request], self.config,
                                                   prefix=prefix, prefix_cache=self.cache if held else None,
                                                   on_row=seen):
            self.deliberation = deliberation
        self._gen_time = time.perf_counter() - start
        yield from self._replay()

    def _replay(self):
        """The chosen candidate's tokens as events, with the strategy that explains each."""
        d = self.deliberation
        winner = d.winner
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
        for i, (token, strategy) in enumerate(zip(winner.tokens, token_strategies(d))):
            detokenizer.add_token(token)
            if i == len(winner.tokens) - 1:
                detokenizer.finalize()
            metrics = {"margin": winner.margins[i]} if i < len(winner.margins) else {}
            event = TokenEvent(token, detokenizer.last_segment, strategy, winner.logprobs[i], metrics,
                               {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0})
            self.tokens.append(token)
            self.events.append(event)
            yield event
        self.finish_reason = winner.finish_reason

    def summary(self) -> DeliberateSummary:
        d = self.deliberation
        spent = d.tokens_spent if d else self._spent
        return DeliberateSummary(
            tokens=len(self.events), prompt_tokens=len(self.prompt_tokens),   # as Generation.summary
            strategy_counts=dict(Counter(e.strategy for e in self.events)), thinking_insertions=0,
            prompt_tps=0.0, generation_tps=spent / self._gen_time if self._gen_time else 0.0,
            peak_memory_gb=mx.get_peak_memory() / 1e9, finish_reason=self.finish_reason,
            branches=len(d.candidates) - 1 if d else 0, tokens_spent=spent, budget=self.config.budget,
            deliberation=d.to_dict() if d else None)
