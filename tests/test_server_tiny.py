"""The server app in this process on a tiny random-weight model (milliseconds
per token): CORS when asked for, many simultaneous streams, a stream whose
client goes away while it waits in the queue."""

import json
import socket
import threading
import time

import pytest
import uvicorn
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer
from serving import free_port, get, request

from entropix_mlx.server import Engine, PrefixCache
from entropix_mlx.server.app import create_app

# A real HTTP server (uvicorn on a port), if on a tiny model.
pytestmark = pytest.mark.slow

ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def tiny_server():
    engine = Engine(make_loaded(make_tiny_model(), make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 4096))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, allow_origins=[ORIGIN]), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port, engine
    server.should_exit = True
    thread.join(timeout=10)


def stream(port, path, body) -> list[dict]:
    status, data = request(
        port, "POST", path, json.dumps({**body, "stream": True}).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200
    events = [line[6:] for line in data.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_cors_allows_only_the_given_origin(tiny_server):
    port, _ = tiny_server
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    import http.client

    for origin, allowed in ((ORIGIN, True), ("http://evil.example", False)):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("OPTIONS", "/v1/chat/completions", headers={**preflight, "Origin": origin})
        r = conn.getresponse()
        r.read()
        assert (r.getheader("access-control-allow-origin") == origin) == allowed


def test_sixteen_simultaneous_streams_each_get_their_own_tokens(tiny_server):
    port, _ = tiny_server
    # The tiny model repeats its prompt's last character: each prompt ends in its own.
    prompts = [f"question {chr(ord('a') + i)}" for i in range(16)]

    def tokens(prompt, out):
        chunks = stream(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "sampler": "greedy"})
        out[prompt] = [r["token"] for c in chunks for r in (c["choices"][0]["entropix"] if c["choices"] else [])]

    alone, together = {}, {}
    for p in prompts:
        tokens(p, alone)
    threads = [threading.Thread(target=tokens, args=(p, together)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone and len({tuple(v) for v in alone.values()}) == 16


def test_a_request_whose_client_leaves_while_queued_is_never_run(tiny_server):
    port, engine = tiny_server
    before = get(port, "/health")[1]
    long = json.dumps(
        {"messages": [{"role": "user", "content": "long"}], "max_tokens": 400, "sampler": "greedy", "stream": True}
    ).encode()
    first = socket.create_connection(("127.0.0.1", port))
    first.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(long)}\r\n\r\n".encode()
        + long
    )
    first.recv(1)  # the first is running ...
    second = socket.create_connection(("127.0.0.1", port))
    second.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(long)}\r\n\r\n".encode()
        + long
    )
    second.recv(1)  # ... the second has its headers: it is queued
    second.close()
    first.close()
    deadline = time.monotonic() + 60  # a safety net, not a timing assertion
    while get(port, "/health")[1]["cancelled"] < before["cancelled"] + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = get(port, "/health")[1]
    assert after["cancelled"] == before["cancelled"] + 2 and not after["busy"]


def test_unknown_paths_and_methods_get_an_openai_error(tiny_server):
    port, _ = tiny_server
    for method, path, status in (("GET", "/v1/chat/completions", 405), ("POST", "/v1/nothing", 404)):
        got, data = request(port, method, path, b"{}", {"Content-Type": "application/json"})
        assert got == status and set(json.loads(data)["error"]) == {"message", "type", "param", "code"}


def test_penalties_reach_every_sampler_also_under_a_schema(tiny_server):
    """The tiny model repeats its prompt's last character under greedy decoding;
    with a strong repetition penalty no sampler repeats a token, batched
    (per-step samplers) or alone (deliberate), and a JSON schema's mask comes
    after the penalties."""
    port, _ = tiny_server

    def tokens(**fields):
        body = {"prompt": "question q", "max_tokens": 12, "seed": 1, **fields}
        chunks = stream(port, "/v1/completions", body)
        return [r["token"] for c in chunks for r in (c["choices"][0]["entropix"] if c["choices"] else [])]

    plain = tokens(sampler="greedy")
    assert len(set(plain)) < len(plain)
    for sampler in ("greedy", "entropix", "min_p", "temperature", "deliberate"):
        out = tokens(sampler=sampler, repetition_penalty=50.0)
        assert len(out) == len(set(out)) and len(out) > 1, (sampler, out)
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "array", "items": {"type": "integer"}}}}
    out = tokens(sampler="greedy", repetition_penalty=50.0, response_format=schema, max_tokens=8)
    assert len(out) == len(set(out)) and out[0] == ord("[") + 3  # the tiny tokenizer: bytes after 3 specials


def test_the_one_model_answers_whatever_name_a_request_gives(tiny_server):
    port, _ = tiny_server
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "model": "gpt-4"}
    status, data = request(port, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200 and json.loads(data)["model"] == "tiny"  # the answer says which model it is
    status, listing = get(port, "/v1/models")
    assert [m["id"] for m in listing["data"]] == ["tiny"] and listing["entropix"] == {
        "serves": "tiny",
        "any_name": True,
    }


def test_strict_model_refuses_other_names_and_takes_its_aliases():
    from starlette.testclient import TestClient

    engine = Engine(make_loaded(make_tiny_model(), make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 4096))
    client = TestClient(create_app(engine, strict_model=True, aliases=("chat-model",)))
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for name, status in (("gpt-4", 404), ("/etc/passwd", 404), ("chat-model", 200), ("tiny", 200)):
        r = client.post("/v1/chat/completions", json={**body, "model": name})
        assert r.status_code == status, (name, r.text)
        if status == 404:
            assert r.json()["error"]["param"] == "model" and "tiny" in r.json()["error"]["message"]
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny", "chat-model"]
    engine.close()
