"""Wall time, generated tokens and peak memory of one answer as `run` makes it
(docs/deliberate.md, "Time and memory"): greedy, the card's deliberate and
deliberate_staged, one question at a time, chain of thought.

    python -m research.deliberate_cost MODEL TASKS [--items 6] [--max-tokens 768]

Peak memory is MLX's, from the start of each answer: the weights plus every
row's KV cache (a branch's rows share the prompt's cache until they split).
"""

import argparse
import json
import time

# ruff: noqa: E402  (the imports after enable())
import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

import mlx.core as mx

import entropix_mlx
from entropix_mlx.api import prompt_ids
from entropix_mlx.eval import load_tasks
from entropix_mlx.front.registry import SAMPLERS


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("tasks")
    parser.add_argument("--items", type=int, default=6, help="the first N items of the file")
    parser.add_argument("--max-tokens", type=int, default=768)
    args = parser.parse_args()
    model, tokenizer = entropix_mlx.load(args.model)
    tasks = load_tasks(args.tasks)[: args.items]
    samplers = {
        "greedy": entropix_mlx.make_sampler("greedy", model=model),
        "deliberate": entropix_mlx.make_sampler("deliberate", model=model),
        "deliberate_staged": entropix_mlx.make_sampler("deliberate", model=model, **SAMPLERS["deliberate_staged"].rule),
    }
    mx.eval(model.parameters())
    weights = mx.get_active_memory()
    for name, sampler in samplers.items():
        wall = spent = candidates = peak = 0.0
        for task in tasks:
            ids = prompt_ids(tokenizer, task.prompt_text(cot=True))
            start = time.perf_counter()
            if name == "greedy":
                *_, last = entropix_mlx.stream_generate(model, tokenizer, ids, sampler, max_tokens=args.max_tokens)
                spent, candidates, peak = spent + last.generation_tokens, candidates + 1, max(peak, last.peak_memory)
            else:
                generation = sampler.generate(model, tokenizer, ids, args.max_tokens)
                for _ in generation:
                    pass
                s = generation.summary()
                spent, candidates = spent + s.tokens_spent, candidates + s.branches + 1
                peak = max(peak, s.peak_memory_gb)
            wall += time.perf_counter() - start
        n = len(tasks)
        row = dict(sampler=name, items=n, wall_s=wall / n, tokens=spent / n, candidates=candidates / n)
        row |= dict(peak_gb=peak, above_weights_gb=peak - weights / 1e9)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


if __name__ == "__main__":
    main()
