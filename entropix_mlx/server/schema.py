"""Request validation for the OpenAI-compatible endpoints.

Every field the server honours is checked here and turned into `Params`; a bad
value raises `APIError`, which the app sends as OpenAI's error object (400,
`param` naming the field). Fields we do not know are ignored, as OpenAI does.
"""

import json
import math
import re
from dataclasses import dataclass, field

from ..front import DEFAULT_SAMPLER
from ..sampling.constraint import strict_problem
from ..sampling.parameters import PARAMETERS

MAX_STOPS = 4  # OpenAI's limit
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat
MAX_CHOICES = 8  # the batch's rows


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> APIError:
    return APIError(400, message, param, code="invalid_value")


@dataclass
class Params:
    messages: list[dict] | None = None  # chat
    prompt: str | None = None  # completions
    sampler: str = DEFAULT_SAMPLER
    max_tokens: int | None = None
    seed: int | None = None
    overrides: dict = field(default_factory=dict)  # temperature, top_p, top_k, min_p (None: unset)
    penalties: dict = field(default_factory=dict)  # presence, frequency, repetition (None: unset)
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    reasoning: bool = False  # entropix's reasoning profile (sampling/config.py)
    json_schema: dict | bool | None = None  # response_format's schema (None: plain text)
    n: int = 1  # choices
    sure_at: float | None = None  # the confidence below which an answer is flagged unsure (None: the card's)
    tools: list | None = None  # the tools the model is told of (None: none, or tool_choice "none")
    tool_call: str | None = None  # "required", a tool's name (that call only), None: the model decides
    no_calls: bool = False  # tool_choice "none" with tools: call markup written anyway is no content


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body, name, low=None, high=None, low_open=False, high_open=False):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(name, f"'{name}' must be a number, got {v!r}")
    if low is not None and (v < low or (low_open and v == low)):
        raise bad(name, f"'{name}' must be {'>' if low_open else '>='} {low}, got {v}")
    if high is not None and (v > high or (high_open and v == high)):
        raise bad(name, f"'{name}' must be {'<' if high_open else '<='} {high}, got {v}")
    return float(v)


def _parameter(body, name):
    """A sampling parameter, checked by its one rule (sampling/parameters.py)."""
    v = body.get(name)
    if v is None:
        return None
    problem = PARAMETERS[name].problem(v)
    if problem or (isinstance(v, float) and not math.isfinite(v)):
        raise bad(name, f"'{name}' {problem or 'must be a finite number'}, got {v!r}")
    return v


def _integer(body, name, low=None, high=None):
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise bad(name, f"'{name}' must be an integer, got {v!r}")
    if low is not None and v < low:
        raise bad(name, f"'{name}' must be >= {low}, got {v}")
    if high is not None and v > high:
        raise bad(name, f"'{name}' must be <= {high}, got {v}")
    return v


def _boolean(body, name, default=False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"'{name}' must be true or false, got {v!r}")
    return v


def _content(message: dict, i: int) -> str:
    """A message's text: a string, or OpenAI's list of parts (text parts only)."""
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content", "only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content", f"must be a string or a list of text parts, got {content!r}")


def _messages(body) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", "each message must be an object with 'role' and 'content'")
        role = m.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"messages[{i}].role", f"role must be system, user, assistant or tool, got {role!r}")
        message = {"role": role, "content": _content(m, i)}
        if role == "assistant" and m.get("tool_calls") is not None:
            message["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if role == "tool":
            message["tool_call_id"] = m.get("tool_call_id")
        out.append(message)
    if out[-1]["role"] == "assistant":
        raise bad("messages", "the last message must not be the assistant's: there is nothing to answer")
    return out


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's earlier calls, as OpenAI sends them back."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad(where, "'tool_calls' must be a list of {id, type, function: {name, arguments}} objects")
    out = []
    for j, c in enumerate(calls):
        function = c.get("function") if isinstance(c, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(f"{where}[{j}]", "each call needs a 'function' with a 'name'")
        arguments = function.get("arguments", "{}")
        try:
            json.loads(arguments) if isinstance(arguments, str) else None
        except json.JSONDecodeError:
            raise bad(f"{where}[{j}].function.arguments", "'arguments' must be a JSON object as a string") from None
        if not isinstance(arguments, (str, dict)):
            raise bad(f"{where}[{j}].function.arguments", "'arguments' must be a JSON object as a string")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        out.append(
            {"id": c.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}
        )
    return out


def in_schema(param: str, pointer: str) -> str:
    """The request field of the part `pointer` (a JSON pointer) of the schema at `param`."""
    return param + pointer.replace("/", ".")


def _check_strict(spec: dict, where: str, key: str, what: str) -> None:
    """`spec` (at the request field `where`) with `strict` true: its schema (`key`)
    must keep OpenAI's strict rules."""
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad(f"{where}.strict", f"'strict' must be true or false, got {strict!r}")
    problem = strict_problem(spec[key]) if strict and key in spec else None
    if problem:
        pointer, message = problem
        raise bad(
            in_schema(f"{where}.{key}", pointer),
            f"invalid strict schema for {what} at {pointer or '/'}: {message}; or leave 'strict' out",
        )


def _tools(body) -> tuple[list[dict] | None, str | None, bool]:
    """(the tools, the call asked for: None for "auto", "required" or a tool's
    name, whether call markup is dropped: "none")."""
    tools = body.get("tools")
    if tools is None:
        return None, None, False
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list of {type: function, function: {name, description, parameters}}")
    out = []
    for i, t in enumerate(tools):
        function = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise bad(f"tools[{i}]", "each tool must be {type: function, function: {name, ...}} with a name")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise bad(f"tools[{i}].function.parameters", "a tool's parameters must be a JSON schema of an object")
        _check_strict(function, f"tools[{i}].function", "parameters", f"function '{function['name']}'")
        out.append({"type": "function", "function": {**function, "parameters": parameters}})
    choice = body.get("tool_choice", "auto")
    names = [t["function"]["name"] for t in out]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise bad("tool_choice", f"'tool_choice' names no tool of the request: {json.dumps(choice)[:80]}")
        return out, name, False
    if choice not in ("auto", "none", "required"):
        raise bad("tool_choice", f"'tool_choice' must be auto, none, required or a function, got {choice!r}")
    none = choice == "none"
    return (None if none else out), (choice if choice == "required" else None), none


def _prompt(body) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad("prompt", "'prompt' must be a non-empty string (one prompt per request)")
    return prompt


def _stop(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > MAX_STOPS:
        raise bad("stop", f"'stop' must be a string or a list of at most {MAX_STOPS} strings")
    return stop


ANY_OBJECT = {"type": "object"}


def _response_format(body) -> dict | None:
    """The JSON schema answers are held to (None: plain text). OpenAI's shapes:
    {"type": "json_object"}, any JSON object; {"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}. The grammar holds every answer to the schema,
    strict or not, its objects closed (sampling/constraint.py); a strict one must
    also keep OpenAI's strict rules."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", ANY_OBJECT), (dict, bool)):
            raise bad(
                "response_format.json_schema",
                "'response_format.json_schema' must be an object with a 'schema' object "
                '(and optionally a \'name\' and \'strict\'), e.g. {"name": "person", "schema": {"type": "object"}}',
            )
        _check_strict(spec, "response_format.json_schema", "schema", f"response_format '{spec.get('name', '')}'")
        return spec.get("schema", ANY_OBJECT)
    raise bad("response_format", f"'response_format' must be of type text, json_object or json_schema, got {fmt!r}")


def parse(body, chat: bool, sampler_names) -> Params:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", None)
    p = Params()
    if chat:
        p.messages = _messages(body)
    else:
        p.prompt = _prompt(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"'model' must be a string, got {model!r}")
    p.model = model
    sampler = body.get("sampler", DEFAULT_SAMPLER)
    if sampler not in sampler_names:
        raise bad("sampler", f"'sampler' must be one of {', '.join(sampler_names)}, got {sampler!r}")
    p.sampler = sampler
    p.reasoning = _boolean(body, "reasoning")
    p.json_schema = _response_format(body)
    if chat:
        p.tools, p.tool_call, p.no_calls = _tools(body)
        if p.tool_call and p.json_schema is not None:
            raise bad("tool_choice", "a required tool call and a response_format both hold the answer: ask for one")
    p.n = _integer(body, "n", 1, MAX_CHOICES) or 1
    limit = _integer(body, "max_completion_tokens", 1)
    p.max_tokens = limit if limit is not None else _integer(body, "max_tokens", 1)
    p.seed = _integer(body, "seed", 0, 2**63 - 1)
    p.sure_at = _number(body, "sure_at", 0, 1)
    p.overrides = {name: _parameter(body, name) for name in PARAMETERS}
    p.penalties = {
        "presence": _number(body, "presence_penalty", -2, 2),
        "frequency": _number(body, "frequency_penalty", -2, 2),
        "repetition": _number(body, "repetition_penalty", 0, low_open=True),
    }
    p.stop = _stop(body)
    if chat:
        p.logprobs = _boolean(body, "logprobs")
        top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if top and not p.logprobs:
            raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        p.top_logprobs = top or 0
    else:  # completions: logprobs is the number of alternatives
        top = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        p.logprobs, p.top_logprobs = top is not None, top or 0
    p.stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad("stream_options", "'stream_options' must be an object")
        p.include_usage = _boolean(options, "include_usage")
    return p


_SETTING = re.compile(r"'(\w+)'")


def config_error(message: str, overrides: dict) -> APIError:
    """A sampler's ConfigError as a 400 naming the request field it came from."""
    match = _SETTING.search(message)
    name = match.group(1) if match and match.group(1) in overrides else "sampler"
    return bad(name, message)
