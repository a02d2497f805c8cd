"""A multi-turn conversation that keeps its KV cache between turns.

Each turn templates the whole history (chat templates may render earlier
messages differently once more follow, so we never guess at the new tokens),
compares the result with the token ids the cache already holds, trims the cache
back to their common prefix and prefills only the rest. In the usual case that
is the end of the previous answer plus the new user message.

    conversation = Conversation(loaded, system="Be brief.")  # loaded: front.LoadedModel
    turn = conversation.ask("My name is Ada.", sampler, max_tokens=64)
    for event in turn:          # TokenEvents, as they are generated
        ...
    conversation.finish(turn)   # records the answer; also after Ctrl-C
"""

from collections import Counter
from dataclasses import dataclass, field

from ..errors import ConfigError, ContextOverflowError
from ..model.cache import cache_length, make_cache
from .events import TokenEvent
from .generate import Generation
from .rows import DEFAULT_MAX_TOKENS


@dataclass
class Turn:
    user: str
    prompt_tokens: list[int]  # the whole templated history, up to the assistant's header
    prefilled: int  # how many of them this turn actually ran through the model
    generation: Generation
    sampler: str = ""  # the name of the sampler that answered this turn
    seed: int = 0  # the seed it answered with
    answer: str = ""
    finish_reason: str = "running"
    prepared: object = field(default=None, repr=False)  # the request the front door made of it

    def __iter__(self):
        return iter(self.generation)

    @property
    def events(self) -> list[TokenEvent]:
        return self.generation.events


@dataclass
class Conversation:
    loaded: object  # the front door (front.LoadedModel): it encodes and prepares each turn
    system: str | None = None
    turns: list[Turn] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        self.reset()

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def reset(self):
        """Forget every turn (the system prompt stays)."""
        self.turns = []
        self.cache = make_cache(self.model)
        self.cached_tokens: list[int] = []  # the ids whose keys/values the cache holds, in order
        self._open: Turn | None = None

    @property
    def context_size(self) -> int:
        return self.loaded.context

    @property
    def messages(self) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        history = [
            m
            for t in self.turns
            for m in ({"role": "user", "content": t.user}, {"role": "assistant", "content": t.answer})
        ]
        return system + history

    @property
    def strategy_counts(self) -> dict:
        counts = Counter(e.strategy for t in self.turns for e in t.events)
        return dict(counts)

    @property
    def last_prefilled(self) -> int:
        return self.turns[-1].prefilled if self.turns else 0

    def template(self, user: str) -> list[int]:
        """Token ids of the history plus `user`, ending with the assistant's header."""
        messages = self.messages + [{"role": "user", "content": user}]
        try:  # special-token text typed by the user (e.g. "<|im_end|>") stays text
            return self.loaded.encode(messages)
        except ConfigError as e:
            raise ConfigError(f"{e}; chat needs an instruction-tuned model") from None

    def ask(
        self, user: str, sampler, max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, penalties: dict | None = None
    ) -> Turn:
        """Start a turn, prepared by the front door (`LoadedModel.prepare`: the
        answer kept within the context, `penalties` over the whole conversation):
        trim the cache to what still matches, return the Turn to iterate.

        Raises ContextOverflowError, before touching the cache, when the history
        plus the new message no longer fits the context."""
        if self._open is not None:
            self.finish(self._open)
        ids = self.template(user)
        try:
            prepared = self.loaded.prepare(ids, sampler, max_tokens, seed, penalties)
        except ContextOverflowError:
            raise ContextOverflowError(
                f"the conversation needs {len(ids)} tokens but the model's context holds "
                f"{self.context_size}; /reset to start a new conversation"
            ) from None
        keep = common_prefix_length(self.cached_tokens, ids)
        keep = min(keep, len(ids) - 1)  # at least one token must run, to get the next logits
        self._truncate(keep)
        generation = self.loaded.generate(prepared, self.cache)
        self._open = Turn(user, ids, len(ids) - keep, generation, getattr(sampler, "name", ""), seed, prepared=prepared)
        return self._open

    def finish(self, turn: Turn, interrupted: bool = False) -> Turn:
        """Record the (possibly partial) answer and what the cache now holds."""
        if turn is not self._open:
            return turn
        generation = turn.generation
        if interrupted:
            generation.finish_reason = "interrupted"
        generation.finish_reason = turn.prepared.finish(generation.finish_reason)  # stopped by the context: "context"
        turn.finish_reason = generation.finish_reason
        turn.answer = self.tokenizer.decode(generation.tokens)
        self.cache = generation.cache  # a branch rollout may have swapped the cache
        self.cached_tokens = turn.prompt_tokens + generation.tokens
        # An interrupt can land between one layer's cache write and the next, or
        # between a write's offset bump and its data: drop one more position then.
        self._truncate(min(c.offset for c in self.cache) - (1 if interrupted else 0))
        self.turns.append(turn)
        self._open = None
        return turn

    def recover(self):
        """After an interrupt anywhere (also inside `ask`, e.g. halfway through
        trimming the layers): close the open turn, or re-align every layer and
        the cached ids on the shortest layer, minus one position for safety."""
        if self._open is not None:
            self.finish(self._open, interrupted=True)
        else:
            self._truncate(min(c.offset for c in self.cache) - 1)

    def reply(self, user: str, sampler, max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0) -> Turn:
        """Ask and run to the end."""
        turn = self.ask(user, sampler, max_tokens, seed)
        try:
            for _ in turn:
                pass
        finally:
            self.finish(turn)
        return turn

    def _truncate(self, n: int):
        """Keep the first n cached positions in every layer."""
        n = max(0, min(n, len(self.cached_tokens)))
        for layer in self.cache:
            layer.trim(layer.offset - n)
        self.cached_tokens = self.cached_tokens[:n]
        assert cache_length(self.cache) == n

    def transcript(self) -> dict:
        """The conversation as JSON-ready data, with the strategy of every answer token."""
        return {
            "system": self.system,
            "turns": [
                {
                    "user": t.user,
                    "assistant": t.answer,
                    "sampler": t.sampler,
                    "seed": t.seed,
                    "finish_reason": t.finish_reason,
                    "prefilled_tokens": t.prefilled,
                    # deliberate: each candidate, its answer, confidence and weight, and the rule that chose
                    **({"deliberation": d.to_dict()} if (d := getattr(t.generation, "deliberation", None)) else {}),
                    "tokens": [
                        {"token": e.token, "text": e.text, "strategy": e.strategy, "logprob": e.logprob}
                        for e in t.events
                    ],
                }
                for t in self.turns
            ],
        }


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
