"""Measure `entropix-mlx serve` with 1 and with 8 concurrent streaming clients
(the README's figures): each client asks its own question, greedy, a fixed
number of tokens; rounds alternate between the two settings so that other load
on the machine hits both alike.

    python -m research.server_throughput [--tokens 32] [--rounds 2] [--sampler greedy]
"""

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import openai

from tests.serving import running_server  # noqa: E402

TOPICS = ["cats", "dogs", "rain", "snow", "the sea", "bread", "music", "trees"]


def ask(client, topic, tokens, sampler, out):
    start = time.perf_counter()
    first, n = None, 0
    stream = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": f"Tell me about {topic}."}],
        max_tokens=tokens,
        stream=True,
        extra_body={"sampler": sampler},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].model_extra.get("entropix"):
            first = first or time.perf_counter() - start
            n += len(chunk.choices[0].model_extra["entropix"])
    out.append((n, first, time.perf_counter() - start))


def run(url, clients, tokens, sampler):
    """8 requests in all: one client asking them in turn, or 8 clients at once."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    results, start = [], time.perf_counter()
    if clients == 1:
        for topic in TOPICS:
            ask(client, topic, tokens, sampler, results)
    else:
        threads = [threading.Thread(target=ask, args=(client, t, tokens, sampler, results)) for t in TOPICS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - start
    total = sum(n for n, _, _ in results)
    return {
        "tok/s": total / wall,
        "ttft": statistics.median(f for _, f, _ in results),
        "latency": statistics.median(d for _, _, d in results),
        "tokens": total,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sampler", default="greedy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp) / "serve.log") as (url, _):
        run(url, 1, 4, args.sampler)  # warm-up: first-request costs stay out of the figures
        for r in range(args.rounds):
            for clients in (1, 8) if r % 2 == 0 else (8, 1):
                m = run(url, clients, args.tokens, args.sampler)
                print(
                    f"round {r + 1} · {clients} client(s) · {m['tokens']} tokens · {m['tok/s']:.2f} tok/s · "
                    f"median time to first token {m['ttft']:.2f} s · median request {m['latency']:.2f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
