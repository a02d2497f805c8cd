"""Answers held to a JSON schema: at each step, only the tokens the schema's
grammar allows after the answer so far keep their logits; every sampler then
measures and chooses among those (Entropix's entropy is the entropy of what the
schema leaves open). A logits processor like the penalties (`penalties.py`),
applied wherever they are: each decode step, each branch rollout's path, each
deliberate candidate.

The grammar engine is llguidance (Microsoft's, used by llama.cpp, vLLM and
SGLang): a Rust library with Python wheels for macOS and Linux that needs no
PyTorch and hands back a token bitmask any array library can apply; it compiles
JSON schemas itself. OpenAI's `strict` rules are checked here (`strict_problem`)."""

import json
from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from llguidance import LLMatcher, LLTokenizer

from ..errors import ConfigError

# Matchers kept per constraint, by the answer they have read: a step's rows extend
# their own, a row forked from another starts from the nearest one it shares.
KEPT_MATCHERS = 64
# Between tokens of JSON, llama.cpp's grammar's whitespace: one space, or a new line
# and an indent. Bounded, so that a model unsure of what comes next cannot fill
# the answer with blanks.
JSON_LAYOUT = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})?"}
# The parts of a schema that hold schemas, for finding which one is unsupported.
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "contains")
# What else decides which other keys an object allows (an allOf's parts add theirs).
_OPENING = {"additionalProperties", "patternProperties", "unevaluatedProperties", "allOf"}


class SchemaError(ConfigError):
    """A schema the grammar engine cannot hold an answer to; `path` names the
    part of it (a JSON pointer: "/properties/age")."""

    def __init__(self, path: str, message: str):
        super().__init__(f"the schema at {path or '/'} is not supported: {message}")
        self.path, self.reason = path, message


def grammar_tokenizer(hf_tokenizer, vocabulary: int, eos: list[int]) -> LLTokenizer:
    """The grammar engine's view of a tokenizer (about a second to build: make it
    once per model). `vocabulary`: the model's logits' size."""
    from llguidance.hf import from_tokenizer

    return from_tokenizer(hf_tokenizer, n_vocab=vocabulary, eos_token=sorted(eos))


def _compiled(schema, tokenizer: LLTokenizer) -> tuple[str | None, list[str]]:
    """(the grammar of `schema`, []) or (None, why the engine refuses it)."""
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    except (ValueError, TypeError) as e:
        return None, [str(e)]
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    return (None, list(messages) or ["the grammar engine refused it"]) if failed else (grammar, [])


def _children(schema: dict):
    for key in _SCHEMA_LISTS:
        for i, child in enumerate(schema.get(key) or ()):
            yield f"/{key}/{i}", child
    for key in _SCHEMA_MAPS:
        for name, child in (schema.get(key) or {}).items():
            yield f"/{key}/{name.replace('~', '~0').replace('/', '~1')}", child
    for key in _SCHEMA_VALUES:
        if isinstance(schema.get(key), dict):
            yield f"/{key}", schema[key]


def _where(schema, errors: list[str], tokenizer: LLTokenizer, path: str = "") -> tuple[str, str]:
    """(the deepest part of `schema`, which fails with `errors`, that fails alone, why).
    A part that refers elsewhere ($ref) is judged with its whole schema."""
    if isinstance(schema, dict):
        for sub, child in _children(schema):
            if isinstance(child, dict) and "$ref" not in json.dumps(child):
                failed = _compiled(child, tokenizer)[1]
                if failed:
                    return _where(child, failed, tokenizer, path + sub)
    return path, errors[0]


def closed(schema):
    """`schema` with each object that lists its properties and says nothing of
    others allowing no others, as llama.cpp's grammars read a missing
    `additionalProperties`: a model held to an open object invents keys. The parts
    of an `allOf` (whose properties add up) and of a `not` stay as they are."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SCHEMA_LISTS and isinstance(value, list):
            value = [closed(c) if key != "allOf" else c for c in value]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            value = {name: closed(c) for name, c in value.items()}
        elif key in _SCHEMA_VALUES and key != "not" and isinstance(value, dict):
            value = closed(value)
        out[key] = value
    if "properties" in out and not _OPENING.intersection(out):
        out["additionalProperties"] = False
    return out


def _is_object(schema) -> bool:
    kind = schema.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in schema


def strict_problem(schema, path: str = "") -> tuple[str, str] | None:
    """(where, what) of the first part of `schema` that breaks OpenAI's strict
    rules (the root an object; every object's properties all required and no
    other key allowed), or None."""
    if not path and not (isinstance(schema, dict) and _is_object(schema)):
        return "", "the root of a strict schema must be an object schema"
    if not isinstance(schema, dict):
        return None
    if _is_object(schema):
        if schema.get("additionalProperties") is not False:
            return path, 'an object in a strict schema must say "additionalProperties": false'
        missing = [name for name in schema.get("properties") or {} if name not in (schema.get("required") or ())]
        if missing:
            return path, (
                f"a strict schema requires every property, and {missing[0]!r} is not in 'required' "
                '(to leave it optional, make its type nullable: ["string", "null"])'
            )
    for sub, child in _children(schema):
        problem = strict_problem(child, path + sub)
        if problem:
            return problem
    return None


def json_grammar(schema, tokenizer: LLTokenizer) -> str:
    """The grammar for answers that are JSON values valid under `schema` (a JSON
    schema as a dict; {"type": "object"}: any object), its objects `closed`.
    Raises SchemaError."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("", f"a schema is an object, got {json.dumps(schema)[:60]}")
    schema = closed(schema)
    grammar, errors = _compiled(schema, tokenizer)
    if errors:
        raise SchemaError(*_where(schema, errors, tokenizer))
    return grammar


def lark_grammar(lark: str, tokenizer: LLTokenizer) -> str:
    """A grammar in llguidance's Lark (where `%json {schema}` holds a part to a
    JSON schema), checked. Raises SchemaError."""
    grammar = LLMatcher.grammar_from_lark(lark)
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if failed:
        raise SchemaError("", messages[0] if messages else "the grammar engine refused it")
    return grammar


@dataclass
class Constraint:
    """The tokens `grammar` allows after each answer, as a logits processor."""

    grammar: str
    tokenizer: LLTokenizer
    vocabulary: int
    constrains = True

    def __post_init__(self):
        self._start = LLMatcher(self.tokenizer, self.grammar)  # has read nothing; never dropped
        self._matchers: OrderedDict[tuple, LLMatcher] = OrderedDict()

    def after(self, prompt) -> "Constraint":
        return self  # the grammar holds the answer alone

    def matcher(self, answer) -> LLMatcher:
        """The matcher that has read `answer` (the tokens so far)."""
        key = tuple(answer)
        if not key:
            return self._start
        found = self._matchers.get(key)
        if found is not None:
            self._matchers.move_to_end(key)
            return found
        start = next((n for n in range(len(key) - 1, 0, -1) if key[:n] in self._matchers), 0)
        matcher = (self._matchers[key[:start]] if start else self._start).deep_copy()
        for token in key[start:]:
            if not matcher.consume_token(token):  # a token it never allowed: only an end is left
                break
        self._matchers[key] = matcher
        while len(self._matchers) > KEPT_MATCHERS:
            self._matchers.popitem(last=False)
        return matcher

    def allowed(self, answer) -> np.ndarray:
        """(vocabulary,) bool: the tokens the grammar allows after `answer`."""
        matcher = self.matcher(answer)
        if matcher.is_error():
            allowed = np.zeros(self.vocabulary, dtype=bool)
            allowed[list(self.tokenizer.eos_tokens)] = True
            return allowed
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.vocabulary].astype(bool)

    def apply(self, logits: mx.array, generated: list[int]) -> mx.array:
        allowed = mx.array(self.allowed(generated))
        return mx.where(allowed[: logits.shape[-1]], logits.astype(mx.float32), -mx.inf)


@dataclass(frozen=True)
class Chain:
    """Two logits processors, one after the other (the penalties, then the constraint)."""

    first: object
    then: object

    @property
    def constrains(self) -> bool:
        return self.first.constrains or self.then.constrains

    def after(self, prompt) -> "Chain":
        return Chain(self.first.after(prompt), self.then.after(prompt))

    def apply(self, logits: mx.array, generated: list[int]) -> mx.array:
        return self.then.apply(self.first.apply(logits, generated), generated)


def constrained(processor) -> bool:
    """Whether a step's logits processor holds the answer to a grammar (then no
    sampler may add tokens of its own, such as a thinking text)."""
    return processor is not None and processor.constrains
