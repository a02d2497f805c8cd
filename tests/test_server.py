"""`entropix-mlx serve` end to end: the real server (a subprocess, started by its
CLI on a free local port with the bundled model, once for this module), spoken
to with the official `openai` client and, for the error paths, raw HTTP."""

import http.client
import json
import socket
import threading
import time

import openai  # the test extra: the official client, as users would point it at the server
import pytest
from serving import KEY, get, request, running_server

METRICS = ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength")
ENTROPIX_STRATEGIES = {"argmax", "think", "branch", "resample", "adaptive"}
MODEL = "smollm2-135m"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # --strict-model: the model refuses other names (the default serves any name: test_server_tiny.py)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with running_server(log, "--api-key", KEY, "--strict-model", "--alias", "chat-model") as s:
        yield s


def post(port, path, body, key=KEY):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    status, data = request(port, "POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(), headers)
    return status, json.loads(data)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=120)


def chat(client, text, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **kwargs)


def check_record(record, strategies):
    assert record["strategy"] in strategies
    assert isinstance(record["token"], int) and isinstance(record["text"], str)
    for name in METRICS:
        # a token a branch rollout chose has its own entropy and varentropy; no attention scores there
        unknown = record.get("rollout_step") and name not in ("entropy", "varentropy")
        assert record[name] is None if unknown else isinstance(record[name], float), name


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL, "chat-model"]  # the server's --alias
    status, health = get(server[1], "/health")  # open without the key: it shows no model output
    assert status == 200 and health["status"] == "ok" and health["model"] == MODEL


def test_chat_not_streamed_greedy_with_logprobs(client):
    r = chat(
        client,
        "What is the capital of France?",
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        extra_body={"sampler": "greedy"},
    )
    choice = r.choices[0]
    records = choice.model_extra["entropix"]
    assert len(records) == r.usage.completion_tokens == 6 and choice.finish_reason == "length"
    assert "".join(rec["text"] for rec in records) == choice.message.content
    content = choice.logprobs.content
    assert len(content) == 6
    for rec, entry in zip(records, content, strict=False):
        check_record(rec, {"argmax"})
        assert len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy picks the most likely token: the first alternative, with the record's logprob.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(rec["logprob"]) == pytest.approx(tops[0])
        assert bytes(entry.bytes).decode() == entry.token


def test_chat_streamed_entropix_matches_not_streamed(client):
    stream = chat(
        client, "Tell me about cats.", max_tokens=8, seed=7, stream=True, stream_options={"include_usage": True}
    )
    text, records, finish, usage = "", [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        text += chunk.choices[0].delta.content or ""
        records += chunk.choices[0].model_extra["entropix"]
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length" and usage.completion_tokens == len(records) == 8
    assert text == "".join(rec["text"] for rec in records)
    for rec in records:
        check_record(rec, ENTROPIX_STRATEGIES)
    # The same seed without streaming: the same tokens (entropix is the default sampler).
    again = chat(client, "Tell me about cats.", max_tokens=8, seed=7)
    assert [rec["token"] for rec in again.choices[0].model_extra["entropix"]] == [rec["token"] for rec in records]
    assert again.choices[0].message.content == text


def test_a_later_sampler_is_reachable_and_ignores_sampling_parameters(client):
    # deliberate takes no temperature; front-ends send one anyway, so it is ignored, not refused.
    r = chat(client, "What is 2+3?", max_tokens=6, temperature=0.7, extra_body={"sampler": "deliberate"})
    records = r.choices[0].model_extra["entropix"]
    assert records and {rec["strategy"] for rec in records} <= {"argmax", "split", "branch"}
    assert r.choices[0].message.content == "".join(rec["text"] for rec in records)


def test_temperature_zero_means_greedy_with_a_warning(client):
    # Front-ends send 0 for deterministic answers; Entropix needs a temperature, so
    # the request is answered greedily (as other servers do) rather than refused.
    zero = chat(client, "Tell me about cats.", max_tokens=6, temperature=0)
    greedy = chat(client, "Tell me about cats.", max_tokens=6, extra_body={"sampler": "greedy"})
    assert zero.choices[0].message.content == greedy.choices[0].message.content
    assert {rec["strategy"] for rec in zero.choices[0].model_extra["entropix"]} == {"argmax"}
    assert any("temperature 0" in w for w in zero.model_extra["warnings"])


def test_stop_strings(client):
    r = chat(client, "Count from 1 to 10.", max_tokens=16, stop=["3"], extra_body={"sampler": "greedy"})
    full = chat(client, "Count from 1 to 10.", max_tokens=16, extra_body={"sampler": "greedy"})
    assert "3" in full.choices[0].message.content  # so the stop string really cut something
    content = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and "3" not in content
    assert full.choices[0].message.content.startswith(content) and "2" in content
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in chat(
            client, "Count from 1 to 10.", max_tokens=16, stop="3", stream=True, extra_body={"sampler": "greedy"}
        )
    )
    assert streamed == content


def test_two_turns_reuse_the_prompt_cache(client):
    first = [{"role": "user", "content": "My name is Ada. Please remember it."}]
    r1 = client.chat.completions.create(model=MODEL, messages=first, max_tokens=6, extra_body={"sampler": "greedy"})
    second = first + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "What is my name?"},
    ]
    r2 = client.chat.completions.create(model=MODEL, messages=second, max_tokens=6, extra_body={"sampler": "greedy"})
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # The whole first prompt is a prefix of the second: it is not prefilled again.
    assert r1.usage.prompt_tokens <= cached < r2.usage.prompt_tokens


def test_the_sdks_parse_gives_an_object_on_the_bundled_model_and_n_gives_three(client):
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    ask = [{"role": "user", "content": "Name one city in France, as JSON."}]
    for sampler in ("entropix", "deliberate"):
        out = client.chat.completions.parse(
            model=MODEL, messages=ask, response_format=City, max_tokens=64, extra_body={"sampler": sampler}
        )
        assert isinstance(out.choices[0].message.parsed, City), sampler
    three = client.chat.completions.create(model=MODEL, messages=ask, n=3, max_tokens=6, seed=1, temperature=1.0)
    assert [c.index for c in three.choices] == [0, 1, 2]


def test_the_docs_tool_call_on_the_bundled_model_has_exactly_the_declared_keys_and_a_cut_one_no_markup(client):
    tools = [  # docs/server.md's example: its parameters do not say additionalProperties
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city now.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    asks = ("the weather in Paris?", "Is it raining in Tokyo?", "A coat in Berlin today?", "How hot is Cairo?", "Lima?")
    for text in asks:
        out = chat(client, text, tools=tools, tool_choice="required", max_tokens=400, seed=0)
        assert json.loads(out.choices[0].message.tool_calls[0].function.arguments).keys() == {"city"}, text
    for stream in (False, True):
        out = chat(client, asks[0], tools=tools, tool_choice="required", max_tokens=24, seed=0, stream=stream)
        chunks = list(out) if stream else [out]
        content = "".join((c.choices[0].delta if stream else c.choices[0].message).content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "length" and "<tool_call>" not in content and content == ""


def test_n_entropix_choices_differ_on_open_prompts(client):
    # The bundled card branches by confidence and rarely draws a token: its choices differ at their branches.
    for prompt in ("Write a haiku about rain.", "Give me three ideas for a rainy day at home."):
        r = chat(client, prompt, n=3, max_tokens=24, seed=3)
        texts = [c.message.content for c in r.choices]
        assert len(set(texts)) == 3 and r.model_extra["warnings"] == [], (texts, r.model_extra["warnings"])


def test_completions_endpoint(client):
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, logprobs=2, extra_body={"sampler": "greedy"}
    )
    choice = r.choices[0]
    assert len(choice.model_extra["entropix"]) == 4 == len(choice.logprobs.tokens)
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    assert choice.text == "".join(rec["text"] for rec in choice.model_extra["entropix"])


def test_max_tokens_clamped_to_the_context_with_the_reason(server):
    status, r = post(
        server[1],
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 10**6,
            "sampler": "greedy",
            "stop": [" ", "\n", "!", ","],
        },
    )
    assert status == 200
    assert any("clamped" in w and "8192" in w for w in r["warnings"])


def test_eight_concurrent_streaming_clients_get_their_own_answers(server):
    topics = ["cats", "dogs", "rain", "snow", "the sea", "bread", "music", "trees"]

    def answer(topic):
        c = openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=300)
        chunks = chat(
            c, f"Write one sentence about {topic}.", max_tokens=4, stream=True, extra_body={"sampler": "greedy"}
        )
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    alone = {t: answer(t) for t in topics}
    assert len(set(alone.values())) > 1  # different questions, different answers: mixing would show
    together, errors = {}, []

    def worker(topic):
        try:
            together[topic] = answer(topic)
        except Exception as e:  # reported below, with the topic
            errors.append((topic, e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert together == alone


def test_a_client_killed_mid_stream_stops_its_generation(server):
    port = server[1]
    before = get(port, "/health")[1]["cancelled"]
    sock = socket.create_connection(("127.0.0.1", port))
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 4000,
            "sampler": "greedy",
            "stream": True,
        }
    ).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while received.count(b"data: ") < 3:  # the role chunk and two tokens
        received += sock.recv(4096)
    sock.close()
    deadline = time.monotonic() + 120  # a safety net, not a timing assertion
    while get(port, "/health")[1]["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.2)
    health = get(port, "/health")[1]
    assert health["cancelled"] == before + 1 and not health["busy"]
    status, r = post(
        port,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "sampler": "greedy"},
    )
    assert status == 200 and r["usage"]["completion_tokens"] == 2


BAD = [
    (b"{not json", 400, None),
    ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "ten"}, 400, "max_tokens"),
    ({"messages": "Hi"}, 400, "messages"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "Hi"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "Hi"}], "top_p": 0}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "Hi"}], "seed": 1.5}, 400, "seed"),
    ({"messages": [{"role": "user", "content": "Hi"}], "stop": [1, 2]}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "Hi"}], "sampler": "nope"}, 400, "sampler"),
    ({"messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}, 400, "stream"),
    ({"messages": [{"role": "user", "content": "Hi"}], "model": "/etc/passwd"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "Hi"}], "model": "HuggingFaceTB/SmolLM2-360M-Instruct"}, 404, "model"),
]


def idle_health(base, seconds=60.0):
    """/health once no request of an earlier test is still running or queued
    (a stopped stream's row ends at the next step, which may take a while)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        health = get(base, "/health")[1]
        if (not health["busy"] and not health["waiting"]) or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


@pytest.mark.parametrize("body,status,param", BAD, ids=[str(b[2]) for b in BAD])
def test_bad_requests_get_an_openai_error_and_run_nothing(server, body, status, param):
    before = idle_health(server[1])
    got, r = post(server[1], "/v1/chat/completions", body)
    assert got == status
    assert set(r["error"]) == {"message", "type", "param", "code"} and r["error"]["param"] == param
    after = get(server[1], "/health")[1]
    assert after["served"] == before["served"] and after["status"] == "ok"


def test_unknown_fields_are_ignored(client):
    r = chat(client, "Hi", max_tokens=2, extra_body={"sampler": "greedy", "frobnicate": {"x": 1}}, user="someone")
    assert r.usage.completion_tokens == 2


def test_oversized_body_gets_413(server):
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 1_100_000}]}).encode()
    status, r = post(server[1], "/v1/chat/completions", big)
    assert status == 413 and r["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_api_key_is_enforced(server, key):
    status, r = post(server[1], "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, key=key)
    assert status == 401 and r["error"]["code"] == "invalid_api_key"
    bad_client = openai.OpenAI(base_url=server[0] + "/v1", api_key=key or "x", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_client.models.list()


def test_cors_is_off_by_default(server):
    conn = http.client.HTTPConnection("127.0.0.1", server[1], timeout=30)
    conn.request("GET", "/health", headers={"Origin": "http://evil.example"})
    r = conn.getresponse()
    r.read()
    assert r.getheader("access-control-allow-origin") is None


def test_sigterm_ends_a_server_that_decoded_on_parallel_streams_cleanly(tmp_path):
    """Native weights on the CPU split the batch over one MLX stream per core; the
    worker thread that used them must end before the interpreter, or the process
    aborts at exit ("terminate called without an active exception")."""
    log = tmp_path / "serve.log"
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "sampler": "greedy"})
    with running_server(log, "--weights", "native", "--api-key", KEY) as (_, port):
        for _ in range(2):
            status, _ = request(
                port,
                "POST",
                "/v1/chat/completions",
                body,
                {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
            )
            assert status == 200
    text = log.read_text()
    assert "Finished server process" in text and "terminate called" not in text
