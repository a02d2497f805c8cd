"""Run by tests/test_distributed.py under `mlx.launch -n 2`: the tiny model,
whole and tensor-parallel (`model.sharding`), over a prefill and 20 decode
steps. Rank 0 prints one JSON line: the largest logit and metric differences,
both models' greedy and entropix tokens, and the layers' weight bytes."""

# ruff: noqa: E402
import entropix_mlx.accel

entropix_mlx.accel.enable()

import json

import mlx.core as mx
from conftest import make_tiny_model, make_tiny_tokenizer
from mlx.utils import tree_flatten

from entropix_mlx.decode.generate import generate
from entropix_mlx.distributed import world
from entropix_mlx.front.registry import build
from entropix_mlx.model.cache import make_cache
from entropix_mlx.model.sharding import shard
from entropix_mlx.sampling.metrics import step_metrics

STEPS = 20
PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


def layer_bytes(model) -> int:
    return sum(v.nbytes for k, v in tree_flatten(model.parameters()) if ".layers." in k)


def trace(model):
    """Logits and the six metrics of a prefill and STEPS greedy decode steps."""
    cache, tokens, out = make_cache(model), mx.array([PROMPT]), []
    for _ in range(STEPS + 1):
        logits, scores = model(tokens, cache, last_only=True)
        logits = logits[0, -1].astype(mx.float32)
        metrics = step_metrics(logits, [s[0] for s in scores])
        mx.eval(logits, metrics)
        out.append((logits, {k: v.item() for k, v in metrics.items()}))
        tokens = mx.argmax(logits).reshape(1, 1)
    return out


def entropix_events(model, tokenizer):
    return list(generate(model, tokenizer, PROMPT, build("entropix", tokenizer=tokenizer), STEPS, seed=7))


def answer(model, tokenizer, name):
    sampler = build(name, tokenizer=tokenizer)
    return [e.token for e in generate(model, tokenizer, PROMPT, sampler, max_tokens=STEPS, seed=7)]


def flatter_model():
    """The tiny model with its embeddings scaled back down: flatter distributions,
    so that entropix samples and branches instead of taking the argmax every time."""
    model = make_tiny_model()
    model.model.embed_tokens.weight = model.model.embed_tokens.weight / 4
    mx.eval(model.parameters())
    return model


w = world()
tokenizer = make_tiny_tokenizer()
whole, parted = flatter_model(), flatter_model()
whole_bytes = layer_bytes(whole)
shard(parted, w.group)
a, b = trace(whole), trace(parted)
result = {
    "logits": max(mx.abs(x - y).max().item() for (x, _), (y, _) in zip(a, b, strict=True)),
    "metrics": max(abs(m[k] - n[k]) for (_, m), (_, n) in zip(a, b, strict=True) for k in m),
    "greedy": [answer(whole, tokenizer, "greedy"), answer(parted, tokenizer, "greedy")],
    "entropix": [answer(whole, tokenizer, "entropix"), answer(parted, tokenizer, "entropix")],
    "layer_bytes": [whole_bytes, layer_bytes(parted)],
    "heads": parted.layers[0].self_attn.n_heads,
    "strategies": sorted({e.strategy for e in entropix_events(parted, tokenizer)}),
}
if w.root:
    print(json.dumps(result), flush=True)
