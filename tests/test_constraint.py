"""Answers held to a JSON schema (sampling/constraint.py): every sampler's answer
parses and validates, a schema the engine cannot hold names its part, and each
value's confidence (decode/fields.py)."""

import json
import math

import mlx.core as mx
import pytest
from conftest import make_tiny_model

from entropix_mlx.decode.fields import json_fields, leaves
from entropix_mlx.decode.tools import CALL_OPEN, call_grammar
from entropix_mlx.front import LoadedModel, ModelCard, choose
from entropix_mlx.sampling.constraint import SchemaError, strict_problem

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny_loaded(tiny_tokenizer):
    model = make_tiny_model(5, max_position_embeddings=512)
    return LoadedModel(model, tiny_tokenizer, None, ModelCard("tiny", None, "none"))


def answer(loaded, sampler, schema, max_tokens=400, seed=0):
    ids = loaded.encode([{"role": "user", "content": "a person, as JSON"}])
    prepared = loaded.prepare(ids, choose(sampler), max_tokens, seed, json_schema=schema)
    generation = loaded.generate(prepared)
    events = list(generation)
    return "".join(e.text for e in events), events, generation.finish_reason


def valid_person(value) -> bool:
    return (
        set(value) == {"name", "age", "ok"}
        and isinstance(value["name"], str)
        and len(value["name"]) <= 12
        and isinstance(value["age"], int)
        and isinstance(value["ok"], bool)
    )


@pytest.mark.parametrize("sampler", ["greedy", "entropix", "temperature", "min_p", "deliberate"])
def test_every_samplers_answer_is_json_valid_under_the_schema(tiny_loaded, sampler):
    for seed in (0, 1):
        text, events, finish = answer(tiny_loaded, sampler, PERSON, seed=seed)
        assert finish == "eos", text
        assert valid_person(json.loads(text)), text
        assert all(e.logprob > -math.inf for e in events)


def test_a_random_model_left_alone_writes_no_json(tiny_loaded):
    ids = tiny_loaded.encode([{"role": "user", "content": "a person, as JSON"}])
    events = list(tiny_loaded.generate(tiny_loaded.prepare(ids, choose("greedy"), 40)))
    with pytest.raises(ValueError):
        json.loads("".join(e.text for e in events))


def test_entropix_measures_only_what_the_schema_leaves_open(tiny_loaded):
    # Where the schema allows one token (the '{' that opens the answer), the model's
    # distribution over what is left has no entropy: the step is argmax.
    text, events, _ = answer(tiny_loaded, "entropix", PERSON)
    assert text.startswith("{") and events[0].strategy == "argmax"
    assert events[0].metrics["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert not any(e.text == " ..." for e in events)  # no thinking text is inserted into JSON


def test_an_answer_cut_off_inside_the_schema_ends_with_length_and_the_partial_text(tiny_loaded):
    text, events, finish = answer(tiny_loaded, "greedy", PERSON, max_tokens=6)
    assert finish == "length" and len(events) == 6 and text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_json_object_holds_any_object(tiny_loaded):
    text, _, finish = answer(tiny_loaded, "entropix", {"type": "object"}, max_tokens=200)
    assert finish == "eos" and isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        ({"type": "object", "properties": {"x": {"type": "strin"}}}, "/properties/x", "strin"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "array", "items": {"type": "string", "pattern": "(?<=a)b"}}},
            },
            "/properties/a/items",
            "look-around",
        ),
        ([1, 2], "", "a schema is an object"),
    ],
)
def test_a_schema_the_engine_cannot_hold_names_its_part(tiny_loaded, schema, path, words):
    with pytest.raises(SchemaError) as caught:
        tiny_loaded.constraint(schema)
    assert caught.value.path == path and words in str(caught.value)
    assert str(caught.value).startswith(f"the schema at {path or '/'} is not supported")


def test_leaves_are_found_with_their_spans_and_a_cut_off_value_is_left_out():
    text = '{"name": "Ada", "tags": ["x", 2], "a/b": {"c": null}, "age": 3'
    found = leaves(text)
    assert [(p, v) for p, _, _, v in found] == [("/name", "Ada"), ("/tags/0", "x"), ("/tags/1", 2), ("/a~1b/c", None)]
    assert all(text[s:e] == json.dumps(v) for _, s, e, v in found)


def test_each_fields_confidence_comes_from_the_tokens_it_spans():
    pieces = ['{"', "name", '":', ' "', "Ada", '",', ' "', "age", '":', " 3", "6", "}"]
    logprobs = [0.0] * len(pieces)
    logprobs[4], logprobs[9], logprobs[10] = math.log(0.5), math.log(0.9), math.log(0.3)
    fields = {f["path"]: f for f in json_fields(pieces, logprobs)}
    assert fields["/name"]["value"] == "Ada" and fields["/name"]["tokens"] == [3, 5]
    assert fields["/name"]["min_confidence"] == 0.5
    assert fields["/age"]["value"] == 36 and fields["/age"]["tokens"] == [9, 10]
    assert fields["/age"]["min_confidence"] == 0.3 and fields["/age"]["mean_confidence"] == pytest.approx(0.6)


def test_the_mask_keeps_the_allowed_tokens_logits_and_rules_out_the_rest(tiny_loaded):
    constraint = tiny_loaded.constraint(PERSON)
    logits = mx.arange(tiny_loaded.model.args.vocab_size).astype(mx.float32)
    masked = constraint.apply(logits, [])
    allowed = [i for i, v in enumerate(masked.tolist()) if v > -math.inf]
    assert [tiny_loaded.tokenizer.decode([i]) for i in allowed] == ["{"]
    assert masked[allowed[0]].item() == logits[allowed[0]].item()
    # A row forked from an earlier answer starts from the matcher that read its prefix.
    brace = allowed[0]
    after = constraint.allowed([brace])
    assert not after[brace] and constraint.allowed([]).tolist() == [i == brace for i in range(len(after))]


def allows(constraint, tokenizer, text: str, char: str) -> bool:
    """Whether `constraint` lets `char` follow the answer `text`."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return bool(constraint.allowed(ids)[tokenizer.encode(char, add_special_tokens=False)[0]])


A = {"a": {"type": "integer"}}


@pytest.mark.parametrize(
    ("schema", "text", "comma"),
    [
        ({"type": "object", "properties": A}, '{"a": 1', False),
        ({"type": "object", "properties": {"o": {"type": "object", "properties": A}}}, '{"o": {"a": 1', False),
        ({"$defs": {"D": {"properties": A}}, "type": "array", "items": {"$ref": "#/$defs/D"}}, '[{"a": 1', False),
        ({"type": "object", "properties": {**A, "b": {"type": "string"}}}, '{"a": 1', True),  # b stays optional
        ({"type": "object", "properties": A, "additionalProperties": True}, '{"a": 1', True),
        ({"type": "object", "properties": A, "additionalProperties": {"type": "integer"}}, '{"a": 1', True),
        ({"type": "object"}, '{"a": 1', True),  # an object that lists nothing: any object
    ],
)
def test_an_object_that_lists_its_properties_allows_no_other_key_unless_it_says_so(tiny_loaded, schema, text, comma):
    constraint = tiny_loaded.constraint(schema)
    assert allows(constraint, tiny_loaded.tokenizer, text, "}")
    assert allows(constraint, tiny_loaded.tokenizer, text, ",") == comma


def test_a_tools_arguments_without_additional_properties_allow_no_other_key(tiny_loaded):
    weather = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    constraint = tiny_loaded.constraint(lark=call_grammar([{"type": "function", "function": weather}]))
    text = f'{CALL_OPEN}\n{{"name": "get_weather", "arguments": {{"city": "Paris"'
    assert allows(constraint, tiny_loaded.tokenizer, text, "}")
    assert not allows(constraint, tiny_loaded.tokenizer, text, ",")


CLOSED = {"type": "object", "properties": A, "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        ({"type": "object", "properties": A, "required": ["a"]}, "", '"additionalProperties": false'),
        ({**CLOSED, "required": []}, "", "'a' is not in 'required'"),
        ({**CLOSED, "properties": {"a": {"type": "object"}}}, "/properties/a", '"additionalProperties": false'),
        (
            {**CLOSED, "properties": {"a": {"type": "array", "items": {"properties": A}}}},
            "/properties/a/items",
            "false",
        ),
        ({**CLOSED, "$defs": {"D": {**CLOSED, "additionalProperties": True}}}, "/$defs/D", "false"),
        ({"anyOf": [CLOSED]}, "", "the root of a strict schema must be an object"),
        ({"type": "array", "items": CLOSED}, "", "the root of a strict schema must be an object"),
    ],
)
def test_a_strict_schema_that_breaks_openais_rules_names_where(schema, path, words):
    where, message = strict_problem(schema)
    assert where == path and words in message


def test_a_closed_strict_schema_keeps_openais_rules():
    nullable = {"type": ["string", "null"]}
    schema = {**CLOSED, "properties": {**A, "n": nullable, "o": CLOSED}, "required": ["a", "n", "o"]}
    assert strict_problem(schema) is None and strict_problem(CLOSED) is None
