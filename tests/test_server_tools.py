"""Tool calls through the server, with the official `openai` SDK, on a tiny
random-weight model whose template knows no tools (the bundled model's case):
the tools described in a system message, a required or named call held to the
tool's parameters, its result taken back, streamed and whole."""

import json

import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer
from serving import app_on_a_port, request

from entropix_mlx.decode.tools import CALL_OPEN, parse_calls, template_messages
from entropix_mlx.server import Engine, PrefixCache

pytestmark = pytest.mark.slow  # a real HTTP server (uvicorn on a port)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client():
    from openai import OpenAI

    model = make_tiny_model(5, max_position_embeddings=4096)  # (a byte per token: the tools take room)
    engine = Engine(make_loaded(model, make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 8192))
    with app_on_a_port(engine) as port:
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0), port


def check_call(call, name="get_weather"):
    assert call.type == "function" and call.function.name == name and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    if name == "get_weather":
        assert set(arguments) == {"city", "celsius"} and isinstance(arguments["celsius"], bool)
    return arguments


@pytest.mark.parametrize("sampler", ["greedy", "entropix"])
def test_a_round_trip_whole(client, sampler):
    client, _ = client
    tools, extra = [WEATHER, TIME], {"sampler": sampler}
    first = client.chat.completions.create(
        model="tiny", messages=ASK, tools=tools, tool_choice="required", max_tokens=300, extra_body=extra
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    check_call(call, call.function.name)
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "degrees": 21}'},
    ]
    final = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=8, extra_body=extra)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.content is not None
    # the tool's result reached the prompt: it is longer than the question's by at least the result
    assert final.usage.prompt_tokens > first.usage.prompt_tokens + len('{"sky": "clear", "degrees": 21}')


def test_a_named_call_streamed_arrives_as_tool_call_deltas(client):
    client, _ = client
    stream = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=300,
        stream=True,
    )
    content, calls, finish = "", {}, None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or ():
                calls.setdefault(d.index, {"name": "", "arguments": "", "id": d.id})
                calls[d.index]["name"] += d.function.name or ""
                calls[d.index]["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and CALL_OPEN not in content and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    arguments = json.loads(calls[0]["arguments"])
    assert set(arguments) == {"city", "celsius"}


def test_tool_choice_none_tells_the_model_of_no_tool_and_auto_reads_no_call_from_plain_text(client):
    client, _ = client
    plain = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=6)
    none = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=6)
    auto = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER], max_tokens=6)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens
    assert auto.choices[0].message.tool_calls is None and auto.choices[0].finish_reason == "length"


DOCS_WEATHER = {  # docs/server.md's example: no additionalProperties
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("sampler", ["greedy", "entropix"])
def test_arguments_without_additional_properties_are_exactly_the_declared_keys(client, sampler):
    client, _ = client
    for city in ("Paris", "Lima", "Oslo"):
        out = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"What is the weather in {city}?"}],
            tools=[DOCS_WEATHER],
            tool_choice="required",
            max_tokens=400,
            extra_body={"sampler": sampler},
        )
        assert out.choices[0].finish_reason == "tool_calls"
        assert set(json.loads(out.choices[0].message.tool_calls[0].function.arguments)) == {"city"}


def test_a_strict_tool_with_an_open_object_is_a_400_naming_its_path(client):
    from openai import BadRequestError

    client, _ = client
    parameters = {**DOCS_WEATHER["function"]["parameters"], "additionalProperties": False}
    parameters["properties"] = {"city": {"type": "object", "properties": {}}}
    tool = {"type": "function", "function": {**DOCS_WEATHER["function"], "parameters": parameters, "strict": True}}
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=ASK, tools=[tool], tool_choice="required")
    assert caught.value.body["param"] == "tools[0].function.parameters.properties.city"


def cut_call(port, max_tokens, stream):
    """(content, tool_calls, finish_reason, the answer's text from its token records)
    of a required call to get_weather cut at `max_tokens`."""
    body = {
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": max_tokens,
        "stream": stream,
        "seed": 0,
    }
    status, data = request(
        port, "POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200
    if not stream:
        choice = json.loads(data)["choices"][0]
        message = choice["message"]
        raw = "".join(r["text"] for r in choice["entropix"])
        return message["content"] or "", message.get("tool_calls") or [], choice["finish_reason"], raw
    chunks = [json.loads(line[6:]) for line in data.decode().split("\n\n") if line.startswith("data: {")]
    choices = [c["choices"][0] for c in chunks]
    content = "".join(c["delta"].get("content") or "" for c in choices)
    raw = "".join(r["text"] for c in choices for r in c["entropix"])
    return content, choices[-1]["delta"].get("tool_calls") or [], choices[-1]["finish_reason"], raw


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_ends_length_with_the_partial_call_never_its_markup(client, stream):
    _, port = client
    partial = 0
    for max_tokens in (6, 20, 48, 64, 80, 100, 120):
        content, calls, finish, raw = cut_call(port, max_tokens, stream)
        assert (raw.startswith(CALL_OPEN) or CALL_OPEN.startswith(raw)) and finish == "length", raw
        assert CALL_OPEN not in content and content == ""
        # a call once its name is whole, its arguments as far as the answer went
        assert len(calls) == ('"get_weather"' in raw)
        for call in calls:
            assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
            arguments = call["function"]["arguments"]
            assert raw.rstrip().endswith(arguments) and (not arguments or '"arguments"' in raw)
            partial += bool(arguments)
    assert partial >= 2  # the cuts that fell inside the arguments


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(client, fields, param):
    _, port = client
    body = json.dumps({"messages": ASK, **fields}).encode()
    status, data = request(port, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    assert status == 400 and json.loads(data)["error"]["param"] == param


def test_calls_are_read_from_the_answers_end_and_a_broken_one_is_no_content():
    text = f'Let me look.\n{CALL_OPEN}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n</tool_call>'
    content, calls, cut = parse_calls(text)
    assert content == "Let me look." and calls[0]["function"]["name"] == "get_weather" and not cut
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    # a call cut short: no markup in the content, the call as far as it went (its name whole) or none
    content, calls, cut = parse_calls(f'Let me look.\n{CALL_OPEN}\n{{"name": "get_weather", "argu')
    assert (content, cut) == ("Let me look.", True) and calls[0]["function"]["arguments"] == ""
    assert parse_calls(f'{CALL_OPEN}\n{{"name": "get_wea') == ("", [], False)
    assert parse_calls(f"A.{CALL_OPEN}\n{{broken}}\n</tool_call>") == ("A.", [], False)
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # a small model left the tags out
    content, calls, _ = parse_calls(bare, ("get_weather",))
    assert content == "" and calls[0]["function"]["name"] == "get_weather"
    assert (
        parse_calls(bare, ("get_time",)) == (bare, [], False)
        and parse_calls('{"city": "Paris"}', ("get_weather",))[1] == []
    )


def test_a_template_without_tools_gets_them_in_the_system_message_and_results_as_user_turns():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "clear"},
    ]
    out = template_messages(messages, [WEATHER], knows=False)
    assert (
        out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.") and "get_weather" in out[0]["content"]
    )
    assert out[2] == {
        "role": "assistant",
        "content": f'{CALL_OPEN}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "Result of get_weather: clear"}
    known = template_messages(messages, [WEATHER], knows=True)
    assert known[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"} and known[3]["role"] == "tool"
