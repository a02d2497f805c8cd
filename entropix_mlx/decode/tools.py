"""Tool calls: the tools rendered through the model's chat template, the calls
read back from the answer.

A call is written as Qwen 2.5's and Hermes' templates write it (mlx-lm's
`json_tools` format): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
A template that knows no tools (the bundled model's) gets them described in a
system message that asks for that same format; a tool's result then comes back
to it as a user message. When a call is required, or one tool is named, the
answer is held to a grammar of exactly such a call, its arguments to the tool's
parameter schema (`call_grammar`)."""

import json
import re
import uuid

from ..sampling.constraint import JSON_LAYOUT, closed

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# A call cut short once its name is whole (the layout `call_grammar` holds it to).
_CUT = re.compile(r'\s*\{\s*"name"\s*:\s*"(?P<name>[^"\\]+)"(?:.*?"arguments"\s*:(?P<arguments>.*))?', re.S)


def knows_tools(tokenizer) -> bool:
    """Whether the model's chat template renders tools itself."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template and CALL_OPEN in template


def _described(tools: list[dict]) -> str:
    lines = [
        "You can call functions. To call one, reply with nothing but:",
        f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": {{<its arguments as JSON>}}}}\n{CALL_CLOSE}',
        "The functions, as JSON schemas:",
    ]
    return "\n".join(lines + [json.dumps(t["function"], ensure_ascii=False) for t in tools])


def _call_text(call: dict) -> str:
    function = call["function"]
    arguments = json.loads(function["arguments"]) if isinstance(function["arguments"], str) else function["arguments"]
    return f"{CALL_OPEN}\n{json.dumps({'name': function['name'], 'arguments': arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


def template_messages(messages: list[dict], tools: list[dict] | None, knows: bool) -> list[dict]:
    """`messages` (OpenAI's: assistant `tool_calls`, `tool` results) as the chat
    template takes them: with a template that knows tools, each call's arguments
    as an object; without one, the tools in the system message, calls as their
    text, results as user messages."""
    if knows:
        out = []
        for m in messages:
            if m.get("tool_calls"):
                calls = [
                    {
                        "type": "function",
                        "id": c.get("id"),
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": json.loads(c["function"]["arguments"]),
                        },
                    }
                    for c in m["tool_calls"]
                ]
                m = {**m, "tool_calls": calls}
            out.append(m)
        return out
    names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out = []
    for m in messages:
        if m["role"] == "tool":
            name = names.get(m.get("tool_call_id"), "the function")
            out.append({"role": "user", "content": f"Result of {name}: {m['content']}"})
        elif m.get("tool_calls"):
            text = "\n".join(_call_text(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + text).strip()})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + _described(tools)}
        else:
            out.insert(0, {"role": "system", "content": _described(tools)})
    return out


def tag_start(text: str, tag: str) -> int:
    """How many of `text`'s last characters are the start of `tag` (a tag streamed in part)."""
    return next((k for k in range(len(tag) - 1, 0, -1) if text.endswith(tag[:k])), 0)


def _as_call(name: str, arguments: str) -> dict:
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _read_call(call) -> dict | None:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    return _as_call(call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False))


def _cut_call(body: str) -> dict | None:
    """The call whose text `body` was cut short, its arguments as far as they went
    (as OpenAI's are when max_tokens cuts one), or None if its name was not whole."""
    match = _CUT.match(body)
    if match is None:
        return None
    return _as_call(match["name"], (match["arguments"] or "").strip())


def parse_calls(text: str, names=()) -> tuple[str, list[dict], bool]:
    """(the text before the first call, OpenAI's `tool_calls`, whether the last one
    was cut short) of an answer. The call markup is never content: a call whose JSON
    does not parse is dropped, one cut short is kept with its arguments so far. An
    answer that is nothing but a call's JSON, naming one of the tools `names`, is
    that call too (small models often leave the tags out)."""
    at = text.find(CALL_OPEN)
    if at < 0:
        try:
            call = json.loads(text)
        except json.JSONDecodeError:
            return text, [], False
        known = isinstance(call, dict) and call.get("name") in names and isinstance(call.get("arguments", {}), dict)
        return ("", [_read_call(call)], False) if known else (text, [], False)
    content, calls, rest = text[:at].rstrip(), [], text[at:]
    while rest.startswith(CALL_OPEN):
        end = rest.find(CALL_CLOSE)
        body = rest[len(CALL_OPEN) : end if end >= 0 else len(rest)]
        if end < 0:  # the answer ends inside the call, perhaps inside its closing tag
            body = body[: len(body) - tag_start(body, CALL_CLOSE)]
        try:
            call = _read_call(json.loads(body))
        except json.JSONDecodeError:
            cut = _cut_call(body) if end < 0 else None
            return content, calls + [cut] if cut else calls, cut is not None
        calls += [call] if call else []
        rest = rest[end + len(CALL_CLOSE) :].lstrip() if end >= 0 else ""
    return content, calls, False


def call_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON schema of one call: of the tool `name`, else of any of `tools`."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": closed(f.get("parameters") or {"type": "object"}),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in chosen
    ]
    return (
        {**options[0], "x-guidance": JSON_LAYOUT}
        if len(options) == 1
        else {"anyOf": options, "x-guidance": JSON_LAYOUT}
    )


def marker_tokens(tokenizer) -> tuple[int | None, int | None]:
    """The ids of a vocabulary's own `<tool_call>` and `</tool_call>` tokens (Qwen's),
    or None: the grammar engine reads such an added token as one unit, never as its text."""
    added = tokenizer.added_tokens_encoder  # (mlx-lm's wrapper hands it on from the HF tokenizer)
    return added.get(CALL_OPEN), added.get(CALL_CLOSE)


def call_grammar(tools: list[dict], name: str | None = None, markers: tuple = (None, None)) -> str:
    """A grammar (llguidance's Lark) of exactly one call, in the template's layout;
    `markers`: the vocabulary's own tokens for the call's tags (`marker_tokens`)."""
    schema = json.dumps(call_schema(tools, name))
    tag_open, tag_close = (
        f"<[{t}]>" if t is not None else json.dumps(text)
        for t, text in zip(markers, (CALL_OPEN, CALL_CLOSE), strict=True)
    )
    return f'start: {tag_open} "\\n" call "\\n" {tag_close}\ncall: %json {schema}\n'
