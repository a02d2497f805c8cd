"""Independent reference: transformers (PyTorch, float32) loads the GGUF itself (its own
dequantization) and decodes greedily from the same prompt ids as ours."""

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

gguf, ours_json, n, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
t = time.time()
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
print("load", round(time.time() - t, 1), "s")
torch.set_num_threads(2)
res = {}
for p, r in json.load(open(ours_json)).items():
    ids = torch.tensor([r["prompt"]])
    with torch.no_grad():
        o = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    toks = o[0, ids.shape[1] :].tolist()
    res[p] = {"prompt": r["prompt"], "tokens": toks}
    print(repr(p), toks)
json.dump(res, open(out, "w"))
