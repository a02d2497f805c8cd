"""The server's parts without HTTP: stop strings over streamed text, the
prompt-prefix cache, request validation, tool calls read from an answer. Tiny
models only: milliseconds."""

import mlx.core as mx
import pytest
from conftest import SHELF, make_tiny_model
from hypothesis import given
from hypothesis import strategies as st

from entropix_mlx.front.registry import SAMPLER_NAMES
from entropix_mlx.model.cache import make_cache
from entropix_mlx.server.prefix_cache import PrefixCache
from entropix_mlx.server.responses import Answer
from entropix_mlx.server.schema import APIError, parse
from entropix_mlx.server.stops import StopScanner


@given(
    st.lists(st.text("ab\n", max_size=4), max_size=12), st.lists(st.text("ab\n", min_size=1, max_size=3), max_size=3)
)
def test_stop_scanner_sends_exactly_the_text_before_the_first_stop(pieces, stops):
    scanner, sent, hit = StopScanner(stops), "", False
    for piece in pieces:
        out, hit = scanner.feed(piece)
        sent += out
        if hit:
            break
    if not hit:
        sent += scanner.flush()
    # Generation stops at the first token after which some stop string is in the
    # text; the answer is what precedes the earliest stop in that text (a longer
    # stop that could still start earlier is not waited for: the text may end).
    text, first = "", None
    for piece in pieces:
        text += piece
        found = [i for i in (text.find(s) for s in stops) if i >= 0]
        if found:
            first = min(found)
            break
    assert hit == (first is not None)
    assert sent == (text if first is None else text[:first])


def test_stop_scanner_holds_back_a_possible_start_of_a_stop():
    scanner = StopScanner(["END"])
    assert scanner.feed("the E") == ("the ", False)
    assert scanner.feed("N") == ("", False)
    assert scanner.feed("ding") == ("ENding", False)


def fill(model, ids):
    cache = make_cache(model)
    model(mx.array([ids]), cache)
    mx.eval([c.keys for c in cache])
    return cache


def test_prefix_cache_gives_the_longest_common_prefix_and_leaves_the_entry_intact():
    model = make_tiny_model()
    pc = PrefixCache(max_entries=4, max_tokens=1000)
    a = [5, 6, 7, 8, 9, 10]
    pc.put(a, fill(model, a))
    keys_before = [mx.array(c.keys[..., :6, :]) for c in pc._entries[0][1]]
    cache, n = pc.take([5, 6, 7, 20, 21])
    assert n == 3 and all(c.offset == 3 for c in cache)
    model(mx.array([[20, 21]]), cache)  # the request writes past the shared prefix
    mx.eval([c.keys for c in cache])
    for before, layer in zip(keys_before, pc._entries[0][1], strict=False):
        assert mx.array_equal(before, layer.keys[..., :6, :])
    # The same prompt again: all but one token (the next logits need one position to run).
    assert pc.take(a)[1] == len(a) - 1
    assert pc.take([99, 5, 6]) == (None, 0)


def test_prefix_cache_is_bounded_and_drops_superseded_entries():
    model = make_tiny_model()
    pc = PrefixCache(max_entries=2, max_tokens=12)
    pc.put([1, 2, 3], fill(model, [1, 2, 3]))
    pc.put([1, 2, 3, 4, 5], fill(model, [1, 2, 3, 4, 5]))  # a follow-up turn: replaces its prefix
    assert len(pc) == 1 and pc.tokens == 5
    pc.put([1, 2], fill(model, [1, 2]))  # already held: not stored twice
    assert len(pc) == 1 and pc.tokens == 5
    pc.put([7, 8, 9], fill(model, [7, 8, 9]))
    pc.put([10, 11, 12, 13], fill(model, [10, 11, 12, 13]))  # three entries > 2: the oldest goes
    assert len(pc) == 2 and pc.take([1, 2, 3, 4, 5, 6])[1] == 0
    pc.put([20] * 6, fill(model, [20] * 6))  # 4 + 6 + 3 > 12 tokens: evict down to the bound
    assert pc.tokens <= 12 and pc.take([20] * 7)[1] == 6
    pc.put(list(range(13)), fill(model, list(range(13))))  # alone over the bound: not kept
    assert pc.take(list(range(14)))[1] == 0


def test_a_zero_token_bound_turns_the_prefix_cache_off():
    model = make_tiny_model()
    pc = PrefixCache(max_entries=0, max_tokens=0)
    pc.put([1, 2, 3], fill(model, [1, 2, 3]))
    assert len(pc) == 0


def chat_body(**fields):
    return {"messages": [{"role": "user", "content": "Hi"}], **fields}


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1}, "min_p"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": 9}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stream_options": []}, "stream_options"),
        ({"model": 3}, "model"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ],
)
def test_invalid_fields_are_named(fields, param):
    with pytest.raises(APIError) as e:
        parse(chat_body(**fields), True, SAMPLER_NAMES)
    assert e.value.status == 400 and e.value.param == param


def test_valid_requests_parse():
    p = parse(
        chat_body(
            max_completion_tokens=5,
            max_tokens=9,
            stop="x",
            logprobs=True,
            top_logprobs=2,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
            sampler="greedy",
            whatever={"ignored": True},
        ),
        True,
        SAMPLER_NAMES,
    )
    assert (p.max_tokens, p.stop, p.top_logprobs, p.seed, p.sampler, p.include_usage) == (
        5,
        ["x"],
        2,
        3,
        "greedy",
        True,
    )
    parts = parse(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "Hi"},
            ]
        },
        True,
        SAMPLER_NAMES,
    )
    assert parts.messages[0] == {"role": "system", "content": "ab"}
    completion = parse({"prompt": ["Once"], "logprobs": 2}, False, SAMPLER_NAMES)
    assert (completion.prompt, completion.logprobs, completion.top_logprobs) == ("Once", True, 2)


def run_cli(args, capsys):
    from entropix_mlx.cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(args, shelf=SHELF)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--port", "0"], "is not a port"),
        (["--port", "70000"], "is not a port"),
        (["--api-key", " "], "--api-key is empty"),
        (["--batch-size", "0"], "--batch-size"),
        (["--max-body", "10"], "--max-body"),
    ],
)
def test_serve_rejects_bad_options_in_one_line_before_loading(args, message, capsys):
    code, err = run_cli(["serve", *args], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_only_loopback_hosts_count_as_local():
    from entropix_mlx.cli.serve import _is_loopback

    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("192.168.1.2") and not _is_loopback("example.com")


def test_serve_says_in_one_line_when_the_port_is_taken(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, err = run_cli(["serve", "--port", str(taken.getsockname()[1])], capsys)
    assert code == 2 and err.startswith("error: cannot listen on 127.0.0.1:") and len(err.splitlines()) == 1


def test_page_colours_are_the_terminal_recordings():
    """The page's hex colours are what Rich draws docs/run.svg with for the same
    styles, decorations included; an unknown strategy gets a spare, as in the terminal."""
    from rich.style import Style
    from rich.terminal_theme import SVG_EXPORT_THEME

    from entropix_mlx.sampling.strategies import SPARE_COLORS, STRATEGY_COLORS
    from entropix_mlx.server.strategies import DECORATIONS, THEME_COLORS, css_color, page_info

    def rich_hex(style):
        color = Style.parse(style).color
        return (color.get_truecolor(SVG_EXPORT_THEME) if color else SVG_EXPORT_THEME.foreground_color).hex

    for style in [*STRATEGY_COLORS.values(), *SPARE_COLORS, *THEME_COLORS, "bold", "green bold italic", "default"]:
        assert css_color(style) == rich_hex(style), style
    info = page_info(["entropix", "greedy", "deliberate", "no-such-sampler"])
    assert info["background"] == SVG_EXPORT_THEME.background_color.hex
    # argmax is the text colour (rich's "default"); split is argmax underlined.
    assert info["colors"]["argmax"] == "#c5c8c6" and info["colors"]["split"] == info["colors"]["argmax"]
    assert info["decorations"] == {
        name: [d for d in DECORATIONS if getattr(Style.parse(s), d)]
        for name, s in STRATEGY_COLORS.items()
        if any(getattr(Style.parse(s), d) for d in DECORATIONS)
    }
    assert info["decorations"]["split"] == ["underline"]
    assert info["spare_colors"] == [rich_hex(c) for c in SPARE_COLORS]
    assert info["legends"]["greedy"] == ["argmax"] and info["legends"]["no-such-sampler"] == []
    assert info["legends"]["deliberate"] == ["argmax", "split", "branch"]


OPEN_ADDRESS = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "required": ["name", "address"],
    "additionalProperties": False,
}


def strict_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def strict_tool(parameters):
    return [{"type": "function", "function": {"name": "save", "parameters": parameters, "strict": True}}]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"response_format": strict_format(OPEN_ADDRESS)},
            "response_format.json_schema.schema.properties.address",
            "additionalProperties",
        ),
        (
            {"response_format": strict_format({**OPEN_ADDRESS, "required": ["address"]})},
            "response_format.json_schema.schema",
            "'name' is not in 'required'",
        ),
        ({"tools": strict_tool(OPEN_ADDRESS)}, "tools[0].function.parameters.properties.address", "function 'save'"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]},
            "tools[0].function.strict",
            "true or false",
        ),
    ],
)
def test_a_strict_schema_that_breaks_openais_rules_is_a_400_naming_its_path(fields, param, words):
    with pytest.raises(APIError) as e:
        parse(chat_body(**fields), True, SAMPLER_NAMES)
    assert e.value.status == 400 and e.value.param == param and words in e.value.message


def test_a_non_strict_schema_is_taken_as_given():
    loose = {"type": "json_schema", "json_schema": {"schema": OPEN_ADDRESS}}
    assert parse(chat_body(response_format=loose), True, SAMPLER_NAMES).json_schema == OPEN_ADDRESS


def test_tool_choice_none_tells_of_no_tool_and_drops_call_markup():
    tools = strict_tool({"type": "object", "properties": {}, "additionalProperties": False})
    none = parse(chat_body(tools=tools, tool_choice="none"), True, SAMPLER_NAMES)
    auto = parse(chat_body(tools=tools), True, SAMPLER_NAMES)
    assert (none.tools, none.no_calls) == (None, True) and (len(auto.tools), auto.no_calls) == (1, False)


def streamed(answer, pieces, finish) -> tuple[str, dict]:
    """(the content streamed, the last chunk's choice) of an answer written in
    `pieces`, as the server's stream relays it."""
    content = ""
    for piece in pieces:
        answer.text += piece
        content += answer.content_delta()
    answer.finish_reason = finish
    last = answer.chunk(answer.content_delta(), [], None, finish)["choices"][0]
    return content + last["delta"].get("content", ""), last


CUT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'


@pytest.mark.parametrize(
    ("text", "finish", "calls", "content", "tools", "no_calls"),
    [
        # cut by max_tokens: the partial call, finish length
        (CUT, "length", [("get_weather", '{"city": "Pa')], "", ("get_weather",), False),
        ("Let me see. " + CUT, "length", [("get_weather", '{"city": "Pa')], "Let me see.", ("get_weather",), False),
        ('<tool_call>\n{"name": "get_w', "length", [], "", ("get_weather",), False),  # its name unfinished: no call
        ("Let me see. <tool_", "length", [], "Let me see.", ("get_weather",), False),  # cut inside the tag
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool',
            "length",
            [("get_weather", "{}")],
            "",
            ("get_weather",),
            False,
        ),
        ("<tool_call>\n{not json}\n</tool_call>", "stop", [], "", ("get_weather",), False),  # broken: dropped
        # tool_choice none: markup written anyway is no content and no call
        ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', "stop", [], "Sure.", (), True),
        ('{"name": "get_weather", "arguments": {}}', "stop", [], '{"name": "get_weather", "arguments": {}}', (), True),
    ],
)
def test_call_markup_is_never_content_whole_or_streamed(text, finish, calls, content, tools, no_calls):
    whole, stream = Answer("chat", "m", 0, []), Answer("chat", "m", 0, [])
    for answer in (whole, stream):
        answer.tools, answer.no_calls = tools, no_calls
    whole.text, whole.finish_reason = text, finish
    message = whole.whole(False)["choices"][0]
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]  # a few characters a token
    streamed_content, last = streamed(stream, pieces, finish)
    cut = bool(calls) and finish == "length" and not text.endswith("</tool")
    expected_finish = finish if (cut or not calls) else "tool_calls"
    for got_content, got_calls, got_finish in (
        (message["message"]["content"], message["message"].get("tool_calls") or [], message["finish_reason"]),
        (streamed_content, last["delta"].get("tool_calls") or [], last["finish_reason"]),
    ):
        # (streamed, a blank before a call has gone out before the call began)
        assert "<tool_call>" not in (got_content or "") and (got_content or "").rstrip() == content
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
        assert got_finish == expected_finish
