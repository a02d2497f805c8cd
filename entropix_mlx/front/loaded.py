"""The front door: a loaded model with its card, and what every caller does with
it (the CLI, the server, eval, the Python API): build a sampler by name, prepare
a request, decode it.

`choose` resolves what a request asks for (the sampler that answers and the
sampling parameters it takes, with notes on what changed) once per request;
`LoadedModel.prepare` then builds that sampler with the model's card, clamps the
answer to the context (`fit`) and makes the penalties. Prompts are encoded here
too (`encode_prompt`), and a model meets its card here (`LoadedModel.bind`)."""

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..decode.chat import Conversation
from ..decode.forced import forced_signals
from ..decode.generate import generate
from ..decode.prompt import encode_chat, encode_raw
from ..decode.tools import knows_tools, template_messages
from ..errors import ConfigError, ContextOverflowError
from ..model.cache import cache_length
from ..model.loading import ModelSource
from ..sampling.cards import CardDocument
from ..sampling.confidence import AnswerConfidence, answer_end, chain_features
from ..sampling.constraint import Chain, Constraint, grammar_tokenizer, json_grammar, lark_grammar
from ..sampling.parameters import check_parameters
from ..sampling.penalties import make_penalties
from ..sampling.samplers import Sampler
from ..sampling.settings import card_data, read_toml
from .registry import SAMPLER_NAMES, SamplerSpec, build, check_reasoning, spec_of


@dataclass(frozen=True)
class ModelCard:
    """Where a model's settings come from, bound to it at load."""

    name: str  # the model's name, as cards are named (a GGUF file's stem, a directory's name)
    path: Path | None  # its card; None: no card could be read or written, defaults run
    kind: str  # "shipped", "user" (measured on an earlier first use), "measured" (now), "none"
    tokenizer: object = field(repr=False, default=None)  # the thinking text is in the model's tokens

    @cached_property
    def ref(self):
        """What the settings resolvers read: the card file, read once, else the name
        (its shipped card, if any)."""
        if self.path is None or not Path(self.path).is_file():
            return self.name
        return CardDocument(Path(self.path), read_toml(self.path))


@dataclass(frozen=True)
class SamplerChoice:
    """What a request asked for, resolved: the sampler that answers, the sampling
    parameters it takes, and a note for each thing that changed."""

    asked: str
    name: str
    params: dict
    notes: tuple[str, ...] = ()

    @property
    def spec(self) -> SamplerSpec:
        return spec_of(self.name)

    def reasons(self, reasoning: bool) -> bool:
        """Whether the answering sampler reasons when `reasoning` is asked: an error
        for a sampler with no reasoning setting (`check_reasoning`); off only where
        temperature 0 handed the answer to greedy (its note says so)."""
        check_reasoning(self.asked, reasoning)
        return reasoning and self.spec.reasoning


def choose(sampler: str, params: dict | None = None, names: tuple[str, ...] = SAMPLER_NAMES) -> SamplerChoice:
    """Sampler `sampler` among `names` with sampling `params` (None values unset),
    each checked against its range. Parameters a sampler does not take are left
    out with a note; temperature 0 hands the answer to greedy with a note."""
    spec = spec_of(sampler, names)
    given = check_parameters(params or {})
    if given and not spec.parameters:
        note = f"{', '.join(given)} ignored: the {sampler} sampler takes no sampling parameters"
        return SamplerChoice(sampler, sampler, {}, (note,))
    if given.get("temperature") == 0:
        note = "temperature 0 asks for deterministic answers: the greedy sampler answered"
        return SamplerChoice(sampler, "greedy", {}, (note,))
    return SamplerChoice(sampler, sampler, given, ())


def encode_prompt(tokenizer, messages: list[dict] | None = None, text: str | None = None, tools=None) -> list[int]:
    """Token ids of chat `messages` (the model's chat template, with OpenAI's
    `tools` if given: decode/tools.py) or of `text` as is: every prompt of the
    product is encoded here."""
    if messages is None:
        return encode_raw(tokenizer, text)
    knows = knows_tools(tokenizer)
    if tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        messages = template_messages(messages, tools, knows)
    try:
        return encode_chat(tokenizer, messages, tools=tools if knows else None)
    except ValueError as e:  # transformers: no chat template
        raise ConfigError(f"this model has no chat template ({e})") from None


def fit(model, prompt_length: int, max_tokens: int | None = None) -> tuple[int, int]:
    """(the answer's token limit, the room): what `model`'s context leaves after
    a prompt of `prompt_length` tokens (0 or less: nothing), and `max_tokens`
    within it (None: all of it). Every request is fitted to the context here."""
    room = model.args.max_position_embeddings - prompt_length
    return (room if max_tokens is None else min(max_tokens, room)), room


@dataclass
class Prepared:
    """One request, ready to decode."""

    ids: list[int]
    sampler: Sampler
    max_tokens: int  # within the context
    seed: int = 0
    penalties: object = None
    room: int = 0  # what the context leaves after the prompt
    clamped: bool = False  # the asked max_tokens did not fit: a "length" finish is "context"
    notes: list[str] = field(default_factory=list)

    def finish(self, reason: str) -> str:
        return "context" if reason == "length" and self.clamped else reason


@dataclass
class LoadedModel:
    """A model, its tokenizer, where it came from and its card."""

    model: object
    tokenizer: object
    source: ModelSource
    card: ModelCard

    @classmethod
    def bind(cls, model, tokenizer, source, card: Path | None = None, kind: str = "none", name: str | None = None):
        """`model` with its card at `card` (of `kind`, see `ModelCard`; None: none,
        the defaults run), named `name` (default: the source's name)."""
        return cls(model, tokenizer, source, ModelCard(name or source.name, card, kind, tokenizer))

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def context(self) -> int:
        return self.model.args.max_position_embeddings

    def sampler(self, name: str, config=None, reasoning: bool = False, **overrides) -> Sampler:
        """Sampler `name` with this model's card (see `registry.build`)."""
        return build(name, self.tokenizer, self.card.ref, config, reasoning, **overrides)

    def encode(self, messages: list[dict] | None = None, text: str | None = None, tools=None) -> list[int]:
        """Token ids of chat `messages` or of `text` (see `encode_prompt`)."""
        return encode_prompt(self.tokenizer, messages, text, tools)

    def prepare(
        self,
        ids: list[int],
        choice: SamplerChoice | Sampler,
        max_tokens: int | None = None,
        seed: int = 0,
        penalties: dict | None = None,
        config=None,
        reasoning: bool = False,
        json_schema=None,
        grammar: str | None = None,
        path_choice: int = 0,
        **settings,
    ) -> Prepared:
        """The request for prompt `ids`: the chosen sampler with the card's settings
        under `config` and `settings` (for deliberate `budget`, for eval `metrics`,
        `k`), or a sampler already made; the answer kept within the context (None:
        all the context leaves); the penalties (presence, frequency, repetition)
        over the prompt too; with `json_schema`, answers held to it (SchemaError
        for one the grammar engine cannot hold), or with `grammar` (llguidance's Lark).
        `path_choice`: which of a request's n choices this is; a sampler that
        chooses among its own paths (Entropix's branches) takes others after the first."""
        limit, room = fit(self.model, len(ids), max_tokens)
        if room <= 0:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the model's context holds {self.context}; shorten it"
            )
        if isinstance(choice, SamplerChoice):
            reasoning = choice.reasons(reasoning)
            sampler, notes = self.sampler(choice.name, config, reasoning, **choice.params, **settings), choice.notes
        else:
            sampler, notes = choice, ()
        if path_choice and hasattr(sampler, "pick_path"):
            sampler.path_choice = path_choice
            sampler.reset()
        processor = make_penalties(**(penalties or {}), prompt=ids)
        if json_schema is not None or grammar is not None:
            constraint = self.constraint(json_schema, grammar)
            processor = constraint if processor is None else Chain(processor, constraint)
        return Prepared(
            list(ids),
            sampler,
            limit,
            seed,
            processor,
            room,
            max_tokens is not None and max_tokens > room,
            list(notes),
        )

    @cached_property
    def grammar_tokenizer(self):
        """The grammar engine's view of the tokenizer, made on the first constrained request."""
        return grammar_tokenizer(self.tokenizer._tokenizer, self.model.args.vocab_size, self.tokenizer.eos_token_ids)

    def constraint(self, json_schema=None, lark: str | None = None) -> Constraint:
        """Answers held to `json_schema` (a dict; {"type": "object"}: any JSON
        object), or to the grammar `lark` (llguidance's Lark)."""
        tokenizer = self.grammar_tokenizer
        grammar = lark_grammar(lark, tokenizer) if lark is not None else json_grammar(json_schema, tokenizer)
        return Constraint(grammar, tokenizer, self.model.args.vocab_size)

    def penalties(self, presence=None, frequency=None, repetition=None, prompt=()):
        """The penalties asked for over `prompt` (None: off): what `prepare` makes
        of its `penalties` (chat's /save records them)."""
        return make_penalties(presence, frequency, repetition, prompt=prompt)

    def generate(self, prepared: Prepared, cache=None):
        """A `Generation` of the prepared request (iterate it for token events).
        `cache` may hold the prompt's first tokens (a conversation's earlier
        turns): only the rest is prefilled."""
        p, start = prepared, 0 if cache is None else cache_length(cache)
        return generate(self.model, self.tokenizer, p.ids[start:], p.sampler, p.max_tokens, p.seed, cache, p.penalties)

    def conversation(self, system: str | None = None) -> Conversation:
        """A conversation with this model that keeps its KV cache between turns,
        each turn prepared here (decode/chat.py)."""
        return Conversation(self, system)

    def forced(self, prompt: list[int], answer: list[int], hidden_at: tuple[int, ...] = ()) -> dict:
        """What the model thought at each token of `answer` after `prompt`, in one
        pass (`decode.forced.forced_signals`)."""
        return forced_signals(self.model, prompt, answer, hidden_at)

    @cached_property
    def answer_confidence(self) -> AnswerConfidence | None:
        """The card's fitted `[confidence]` table, or None: this model is uncalibrated."""
        table = card_data(self.card.ref)[1].get("confidence")
        if not table:
            return None
        try:
            return AnswerConfidence.from_table(table)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"the card's [confidence] table is not valid ({e}); run calibrate again") from None

    def confidence(self, records: list[dict], finish_reason: str, sure_at: float | None = None) -> dict:
        """How likely an answer is right, from its token records (`TokenEvent.to_dict()`
        or the server's): {"confidence": P, "verdict": ..., "threshold": ...}, or
        {"confidence": None, "verdict": "uncalibrated"} without a fitted table. `sure_at`:
        the threshold the user set, over the card's."""
        model = self.answer_confidence
        scored = [r for r in records if isinstance(r.get("entropy"), (int, float))]
        if model is None or not scored:
            return {"confidence": None, "verdict": "uncalibrated"}
        values = chain_features(
            [r["logprob"] for r in scored],
            [r["entropy"] for r in scored],
            [r["varentropy"] for r in scored],
            answer_end([r["text"] for r in scored]),
            finish_reason in ("length", "context"),
        )
        p = model.probability(values)
        threshold = model.threshold if sure_at is None else sure_at
        return {"confidence": round(p, 4), "verdict": model.verdict(p, threshold), "threshold": threshold}
