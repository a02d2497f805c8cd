"""Checks against a running server, with the official openai SDK:
parse() with a pydantic model under greedy, entropix and deliberate, a tool-call round trip
(auto and required, whole; named, streamed) and n = 3.

    entropix-mlx serve -m MODEL --port 8765 &  python scripts/sdk_check.py 8765
"""

import sys
import time
import urllib.request

from openai import OpenAI
from pydantic import BaseModel

port = int(sys.argv[1])
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        break
    except Exception:
        time.sleep(1)
c = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)


class Person(BaseModel):
    name: str
    age: int
    city: str


out = {}
for sampler in () if len(sys.argv) > 2 else ("greedy", "entropix", "deliberate"):
    r = c.chat.completions.parse(
        model="q",
        messages=[{"role": "user", "content": "Ada Lovelace, 36, lives in London. As JSON."}],
        response_format=Person,
        max_tokens=80,
        extra_body={"sampler": sampler},
    )
    out[sampler] = {
        "parsed": r.choices[0].message.parsed.model_dump(),
        "fields": r.choices[0].model_extra.get("entropix_fields"),
    }
    print(
        sampler, out[sampler]["parsed"], [(f["path"], f["min_confidence"]) for f in out[sampler]["fields"]], flush=True
    )
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
for stream in (False, True):
    if stream:
        calls = {}
        for ch in c.chat.completions.create(
            model="q",
            messages=msgs,
            tools=tools,
            max_tokens=80,
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ):
            for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                calls[d.index]["name"] += d.function.name or ""
                calls[d.index]["arguments"] += d.function.arguments or ""
        call = calls[0]
        print("streamed call", call, flush=True)
        call_obj = {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
    else:
        r = c.chat.completions.create(model="q", messages=msgs, tools=tools, max_tokens=80)
        print(
            "auto:",
            r.choices[0].finish_reason,
            r.choices[0].message.tool_calls,
            repr(r.choices[0].message.content),
            flush=True,
        )
        r = c.chat.completions.create(model="q", messages=msgs, tools=tools, max_tokens=80, tool_choice="required")
        print("required:", r.choices[0].finish_reason, r.choices[0].message.tool_calls, flush=True)
        call_obj = r.choices[0].message.tool_calls[0].model_dump()
    m2 = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call_obj]},
        {"role": "tool", "tool_call_id": call_obj["id"], "content": '{"sky": "clear", "celsius": 21}'},
    ]
    f = c.chat.completions.create(model="q", messages=m2, tools=tools, max_tokens=40)
    print("final:", f.choices[0].finish_reason, repr(f.choices[0].message.content), flush=True)
n3 = c.chat.completions.create(
    model="q", messages=msgs, n=3, max_tokens=12, temperature=1.0, extra_body={"sampler": "temperature"}
)
print("n=3:", [ch.message.content for ch in n3.choices])
