"""Greedy tokens through entropix-mlx's port: 3 raw prompts x N tokens, one load per (ref, weights)."""

import json
import sys
import time

# ruff: noqa: E402  (enable() must run before mlx.core is first imported)
import entropix_mlx.accel

entropix_mlx.accel.enable()
from entropix_mlx.decode.generate import generate
from entropix_mlx.front.registry import build
from entropix_mlx.model.loading import load

PROMPTS = ["The capital of France is", "Write a haiku about rain.", "def fibonacci(n):"]
ref, w, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
t = time.time()
model, tok = load(ref, weights=w)
print("load", ref, w, round(time.time() - t, 1), "s")
res = {}
for p in PROMPTS:
    ids = tok.encode(p)
    toks = [
        e.token for e in generate(model, tok, ids, build("greedy", metrics=False), max_tokens=n) if hasattr(e, "token")
    ]
    res[p] = {"prompt": ids, "tokens": toks, "text": tok.decode(toks)}
    print(repr(p), ids[:8], toks, repr(tok.decode(toks))[:100])
json.dump(res, open(out, "w"))
