"""Greedy tokens from mlx_lm.load(DIR) on 3 raw prompts x N tokens (stops at EOS). Writes JSON."""

import json
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

PROMPTS = ["The capital of France is", "Write a haiku about rain.", "def fibonacci(n):"]
d, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t = time.time()
model, tok = load(d)
print("load", round(time.time() - t, 1), "s")
res = {}
for p in PROMPTS:
    ids = tok.encode(p)
    toks = []
    for t_, _ in generate_step(mx.array(ids), model, max_tokens=n):
        toks.append(int(t_))
        if int(t_) in tok.eos_token_ids:
            break
    res[p] = {"prompt": ids, "tokens": toks, "text": tok.decode(toks)}
    print(repr(p), ids[:8], toks, repr(tok.decode(toks))[:120])
json.dump(res, open(out, "w"))
