"""The tensor-parallel figures of docs/distributed.md: weight bytes per rank and
greedy decode speed of the bundled model, whole (`python -m research.distributed_figures`)
or split across N ranks (`mlx.launch -n 3 -- python -m research.distributed_figures`).
Rank 0 prints one JSON line."""

# ruff: noqa: E402
import entropix_mlx.accel

entropix_mlx.accel.enable()

import json
import time

import mlx.core as mx
from mlx.utils import tree_flatten

from entropix_mlx import load
from entropix_mlx.decode.generate import generate
from entropix_mlx.distributed import world
from entropix_mlx.front import encode_prompt
from entropix_mlx.front.registry import build
from entropix_mlx.model.sharding import shard

TOKENS = 48

w = world()
model, tokenizer = load()
if w.size > 1:
    shard(model, w.group)
params = tree_flatten(model.parameters())
layers = sum(v.nbytes for k, v in params if ".layers." in k)
total = sum(v.nbytes for _, v in params)
prompt = encode_prompt(tokenizer, [{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
sampler = build("greedy", tokenizer=tokenizer)
for _ in generate(model, tokenizer, prompt, sampler, max_tokens=4):  # warm-up: compiled kernels
    pass
generation = generate(model, tokenizer, prompt, sampler, max_tokens=TOKENS)
events = []
for event in generation:
    if not events:
        start = time.perf_counter()  # after the prefill and the first token
    events.append(event)
seconds = time.perf_counter() - start
if w.root:
    print(
        json.dumps(
            {
                "ranks": w.size,
                "layer_weight_bytes_per_rank": layers,
                "weight_bytes_per_rank": total,
                "decode_tokens_per_second": round((len(events) - 1) / seconds, 2),
                "tokens": [e.token for e in events],
                "device": str(mx.default_device()),
            }
        )
    )
