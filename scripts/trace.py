"""A behaviour trace for refactors that must not change outputs: `run --json`
records, `eval --out` records and server responses, on the bundled model and a
tiny random-weight GGUF, with timing left out. Two traces of the same outputs
are equal byte for byte.

    python -m scripts.trace OUT.jsonl [--only run,eval,serve]
    cmp before.jsonl after.jsonl

Everything runs as the user runs it (the installed `entropix-mlx` command), with
cards and loaded models in a fresh temporary folder, so a first-use card is
measured the same way each time.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from tests.conftest import TINY_CONFIG
from tests.gguf_writer import write_gguf

# Timing, addresses and ids: everything that differs between two runs of the same outputs.
VARYING = ("tps", "per_second", "seconds", "time", "peak_memory", "elapsed", "path", "commit")
VARYING_KEYS = ("id", "created", "system_fingerprint")
PROMPTS = ["How many legs does a spider have?", "What is 17 + 25? Answer with the number only."]
SAMPLERS = [
    ["--sampler", "greedy"],
    ["--sampler", "entropix"],
    ["--sampler", "entropix", "--reasoning"],
    ["--sampler", "deliberate"],
    ["--sampler", "deliberate", "--budget", "3"],
    ["--sampler", "min_p", "--seed", "3"],
    ["--sampler", "temperature", "--temperature", "0.8", "--top-k", "20"],
    ["--sampler", "entropix", "--temperature", "0"],
    ["--sampler", "greedy", "--repetition-penalty", "1.3", "--presence-penalty", "0.5"],
]


def tiny_gguf(path: Path) -> str:
    # The tests' tiny Llama, with a vocabulary the GGUF writer's tokenizer fills and its own output layer.
    config = {**TINY_CONFIG, "vocab_size": 260, "max_position_embeddings": 256, "tie_word_embeddings": False}
    rng = np.random.default_rng(7)
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    weights = {"model.embed_tokens.weight": rng.normal(0, 1.0, (v, h)), "model.norm.weight": np.ones(h)}
    weights["lm_head.weight"] = rng.normal(0, 0.5, (v, h))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj": (h, h),
            "self_attn.k_proj": (kv, h),
            "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h),
            "mlp.gate_proj": (f, h),
            "mlp.up_proj": (f, h),
            "mlp.down_proj": (h, f),
        }
        for name, shape in shapes.items():
            weights[p + name + ".weight"] = rng.normal(0, 0.3, shape)
        weights[p + "input_layernorm.weight"] = np.ones(h)
        weights[p + "post_attention_layernorm.weight"] = np.ones(h)
    write_gguf(path, config, weights)
    return str(path)


def scrub(value):
    """`value` without the keys that name timing, ids or paths."""
    if isinstance(value, dict):
        return {
            k: scrub(v)
            for k, v in value.items()
            if k not in VARYING_KEYS and not any(word in k.lower() for word in VARYING)
        }
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["entropix-mlx", *args], input=stdin, capture_output=True, text=True, timeout=900)


def trace_run(model: str, emit) -> None:
    for prompt in PROMPTS:
        for options in SAMPLERS:
            done = cli("run", "-m", model, prompt, "--max-tokens", "24", "--json", *options)
            lines = [scrub(json.loads(line)) for line in done.stdout.splitlines() if line.strip()]
            errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
            emit({"run": [model, prompt, options], "code": done.returncode, "records": lines, "errors": errors})


def trace_eval(model: str, folder: Path, emit) -> None:
    out = folder / f"eval-{Path(model).stem}"
    samplers = "greedy,entropix,deliberate,min_p,self_consistency,cisc"
    done = cli("eval", "--builtin", "-m", model, "--samplers", samplers, "--k", "3", "--limit", "6", "--out", str(out))
    records = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()] if out.exists() else []
    records.sort(key=lambda r: (r["sampler"], r["seed"], r["index"]))
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    emit({"eval": model, "code": done.returncode, "items": scrub(records), "results": scrub(results)})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> object:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    if body.get("stream"):
        chunks = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        return status, [scrub(json.loads(c)) if c != "[DONE]" else c for c in chunks]
    return status, scrub(json.loads(text))


REQUESTS = [
    {"sampler": "greedy"},
    {"sampler": "entropix"},
    {"sampler": "entropix", "reasoning": True},
    {"sampler": "deliberate"},
    {"sampler": "min_p", "seed": 5},
    {"temperature": 0.7, "top_p": 0.9, "seed": 1},
    {"sampler": "entropix", "stream": True},
    {"sampler": "greedy", "stream": True, "logprobs": True, "top_logprobs": 2},
    {"sampler": "entropix", "max_tokens": 100000},
    {"sampler": "bogus"},
]


def trace_serve(model: str, emit) -> None:
    port = free_port()
    server = subprocess.Popen(
        ["entropix-mlx", "serve", "-m", model, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        for _ in range(1200):
            if server.poll() is not None:
                raise SystemExit(f"serve stopped: {server.stderr.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        for extra in REQUESTS:
            body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 16, "seed": 0, **extra}
            status, reply = post(port, body)
            emit({"serve": [model, extra], "status": status, "reply": reply})
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default="run,eval,serve")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp, open(args.out, "w") as out:
        folder = Path(tmp)
        os.environ["ENTROPIX_CARDS_DIR"] = str(folder / "cards")
        os.environ["ENTROPIX_LOAD_CACHE_DIR"] = str(folder / "loaded")
        for sub in ("cards", "loaded"):
            (folder / sub).mkdir(mode=0o700)

        def emit(record):
            # The temporary folder's name differs between any two traces: it is written as TMP.
            out.write(json.dumps(record, sort_keys=True).replace(str(folder), "TMP") + "\n")
            out.flush()

        for model in ("smollm2-135m", tiny_gguf(folder / "tiny.gguf")):
            if "run" in parts:
                trace_run(model, emit)
            if "eval" in parts:
                trace_eval(model, folder, emit)
            if "serve" in parts:
                trace_serve(model, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
