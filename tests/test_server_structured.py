"""Structured answers from the server (response_format), through the official
`openai` SDK and raw HTTP, on a tiny random-weight model: whatever it would have
said, the answer parses under the schema."""

import json

import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer
from pydantic import BaseModel, Field
from serving import app_on_a_port, request

from entropix_mlx.server import Engine, PrefixCache

pytestmark = pytest.mark.slow  # a real HTTP server (uvicorn on a port)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)
    member: bool


@pytest.fixture(scope="module")
def port():
    engine = Engine(make_loaded(make_tiny_model(5), make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 4096))
    with app_on_a_port(engine) as port:
        yield port


def post(port, body) -> tuple[int, dict]:
    status, data = request(
        port, "POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return status, json.loads(data)


MESSAGES = [{"role": "user", "content": "Ada, 36, is a member. As JSON."}]


@pytest.mark.parametrize("sampler", ["greedy", "entropix", "deliberate"])
def test_the_sdks_parse_returns_a_valid_object_with_every_sampler(port, sampler):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    completion = client.chat.completions.parse(
        model="tiny", messages=MESSAGES, response_format=Person, max_tokens=400, extra_body={"sampler": sampler}
    )
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and completion.choices[0].finish_reason == "stop"


def test_a_streamed_json_object_parses_and_its_end_names_each_values_confidence(port):
    status, data = request(
        port,
        "POST",
        "/v1/chat/completions",
        json.dumps(
            {"messages": MESSAGES, "response_format": {"type": "json_object"}, "stream": True, "max_tokens": 400}
        ).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200
    chunks = [json.loads(line[6:]) for line in data.decode().split("\n\n") if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert isinstance(json.loads(text), dict)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "stop" and "entropix_fields" in last
    assert all("entropix_fields" not in c["choices"][0] for c in chunks[:-1])


def test_each_fields_confidence_is_in_the_answer_and_they_differ(port):
    body = {
        "messages": MESSAGES,
        "max_tokens": 400,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": Person.model_json_schema()},
        },
    }
    status, out = post(port, body)
    assert status == 200, out
    choice = out["choices"][0]
    value = json.loads(choice["message"]["content"])
    fields = {f["path"]: f for f in choice["entropix_fields"]}
    assert set(fields) == {"/name", "/age", "/member"} and {f["path"][1:]: f["value"] for f in fields.values()} == value
    for f in fields.values():
        assert 0 < f["min_confidence"] <= f["mean_confidence"] <= 1
        first, last = f["tokens"]
        assert 0 <= first <= last < len(choice["entropix"])
    assert len({f["mean_confidence"] for f in fields.values()}) > 1


def test_an_unsupported_schema_is_a_400_naming_its_part(port):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(?=x)y"}}}
    status, out = post(
        port, {"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    )
    assert status == 400
    assert out["error"]["param"] == "response_format.json_schema.schema.properties.code"
    assert "look-around" in out["error"]["message"] and out["error"]["code"] == "unsupported_schema"


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": "object"}}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "response_format.json_schema.strict"),
        ({"type": "yaml"}, "response_format"),
    ],
)
def test_a_malformed_response_format_is_a_400(port, response_format, param):
    status, out = post(port, {"messages": MESSAGES, "response_format": response_format})
    assert status == 400 and out["error"]["param"] == param


def test_an_answer_cut_off_inside_the_schema_ends_with_length_and_the_partial_text(port):
    schema = {"name": "person", "schema": Person.model_json_schema()}
    body = {"messages": MESSAGES, "max_tokens": 5, "response_format": {"type": "json_schema", "json_schema": schema}}
    status, out = post(port, body)
    assert status == 200
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"].startswith("{")
    assert out["usage"]["completion_tokens"] == 5


def test_n_choices_come_from_one_prefill_each_with_its_own_seed(port):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    # (the tiny model's next token is nearly certain: the penalty makes its choices differ)
    messages = [{"role": "user", "content": "Tell me something new about the moon and the tides."}]
    out = client.chat.completions.create(
        model="tiny",
        messages=messages,
        n=3,
        max_tokens=12,
        seed=7,
        temperature=2.0,
        extra_body={"sampler": "temperature", "repetition_penalty": 50.0},
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.message.content for c in out.choices]
    assert len(set(texts)) == 3 and out.usage.completion_tokens == 36
    # Choice i is what seed 7 + i alone answers; the prompt ran once for the three.
    alone = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=12,
        seed=8,
        temperature=2.0,
        extra_body={"sampler": "temperature", "repetition_penalty": 50.0},
    )
    assert alone.choices[0].message.content == texts[1]
    assert alone.usage.prompt_tokens_details.cached_tokens == alone.usage.prompt_tokens - 1
    streamed = client.chat.completions.create(
        model="tiny",
        messages=messages,
        n=3,
        max_tokens=12,
        seed=7,
        stream=True,
        temperature=2.0,
        extra_body={"sampler": "temperature", "repetition_penalty": 50.0},
    )
    got = ["", "", ""]
    for chunk in streamed:
        for c in chunk.choices:
            got[c.index] += c.delta.content or ""
    assert got == texts


def test_n_choices_say_when_they_are_one_answer(port):
    body = {"messages": MESSAGES, "n": 3, "max_tokens": 6, "seed": 7}
    status, out = post(port, {**body, "sampler": "greedy"})
    assert status == 200 and len({c["message"]["content"] for c in out["choices"]}) == 1
    assert out["deterministic"] is True
    assert "the greedy sampler never samples: its 3 choices are the same answer" in out["warnings"]
    status, out = post(port, {**body, "sampler": "temperature", "temperature": 2.0, "repetition_penalty": 50.0})
    assert status == 200 and out["deterministic"] is False and out["warnings"] == []
    # Entropix: other seeds and, after the first, other branch paths; a choice that is still another's says so.
    status, out = post(port, {**body, "sampler": "entropix", "max_tokens": 12})
    texts = [c["message"]["content"] for c in out["choices"]]
    same = [w for w in out["warnings"] if "'s answer: no token drawn or branch taken set them apart" in w]
    assert status == 200 and len(same) == 3 - len(set(texts))


def test_n_choices_of_deliberate_are_its_candidates_chosen_first(port):
    body = {"messages": MESSAGES, "n": 3, "max_tokens": 16, "sampler": "deliberate"}
    status, out = post(port, body)
    assert status == 200, out
    choices = out["choices"]
    assert [c["index"] for c in choices] == list(range(len(choices))) and 2 <= len(choices) <= 3
    rows = [c["entropix_candidate"] for c in choices]
    assert all({"answer", "confidence", "score", "ended"} <= set(r) for r in rows)
    assert len({c["message"]["content"] for c in choices}) == len(choices)
    alone = post(port, {**body, "n": 1})[1]["choices"]
    assert alone[0]["message"]["content"] == choices[0]["message"]["content"]


def test_a_deliberate_answer_ends_with_its_table_and_rule_line_whole_or_streamed(port):
    body = {"messages": MESSAGES, "max_tokens": 8, "sampler": "deliberate"}
    status, out = post(port, body)
    assert status == 200, out
    d = out["choices"][0]["entropix_deliberation"]
    assert set(d) == {"chosen", "reason", "table"} and len(d["table"]) > 1 and d["reason"]
    winner = d["table"][d["chosen"]]["candidate"]
    assert f"{winner} won: " in d["reason"] if d["chosen"] else d["reason"].startswith(("greedy answer kept", "no "))
    status, data = request(
        port,
        "POST",
        "/v1/chat/completions",
        json.dumps({**body, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )
    chunks = [json.loads(line[6:]) for line in data.decode().split("\n\n") if line.startswith("data: {")]
    ends = [c["choices"][0] for c in chunks if "entropix_deliberation" in c["choices"][0]]
    assert len(ends) == 1 and ends[0]["finish_reason"] and ends[0]["entropix_deliberation"] == d
    greedy = post(port, {**body, "sampler": "greedy"})[1]["choices"][0]
    assert "entropix_deliberation" not in greedy


def test_n_above_the_batch_is_a_400(port):
    status, out = post(port, {"messages": MESSAGES, "n": 9})
    assert status == 400 and out["error"]["param"] == "n"


def test_a_strict_schema_with_an_open_object_is_a_400_naming_its_path_and_a_closed_one_gives_only_its_keys(port):
    from openai import BadRequestError, OpenAI

    class Home(BaseModel):
        city: str = Field(max_length=10)

    class Resident(Person):
        home: Home

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    schema = Resident.model_json_schema()  # pydantic's: its objects say nothing of other keys
    strict = {"type": "json_schema", "json_schema": {"name": "resident", "schema": schema, "strict": True}}
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=strict)
    assert caught.value.body["param"] == "response_format.json_schema.schema"
    assert "additionalProperties" in caught.value.body["message"]
    schema["additionalProperties"] = False
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=strict)
    assert caught.value.body["param"] == "response_format.json_schema.schema.$defs.Home"
    schema["$defs"]["Home"]["additionalProperties"] = False
    for seed in range(3):
        out = client.chat.completions.create(
            model="tiny", messages=MESSAGES, response_format=strict, max_tokens=400, seed=seed
        )
        value = json.loads(out.choices[0].message.content)
        assert set(value) == {"name", "age", "member", "home"} and set(value["home"]) == {"city"}
