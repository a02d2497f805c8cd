"""How the `deliberate` settings were tuned (README, "Deliberate"): deliberate the
built-in dev items once with the widest setting, store every candidate, then
compare every selector and candidate set offline on that file.

    python -m research.deliberate_dev generate /tmp/dev.jsonl [--limit N]
    python -m research.deliberate_dev table /tmp/dev.jsonl
"""

import argparse
import json

# ruff: noqa: E402  (the imports after enable())
import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

from entropix_mlx.decode.deliberate import deliberate_batch
from entropix_mlx.sampling.deliberate_config import SELECTORS, DeliberateConfig
from entropix_mlx.sampling.selection import Candidate, select

WIDEST = DeliberateConfig(
    first_alternatives=4,
    max_branch_points=1,
    alternatives=1,
    max_branches=5,
    budget=6,
    branch_entropy=3.3035,
    branch_varentropy=12.6547,
)
GRID = {
    "greedy": [0],
    "margin": [0, 0.1, 0.2, 0.3, 0.5],
    "max_margin": [0, 0.1, 0.2, 0.3, 0.5],
    "logprob": [0, 0.1, 0.2, 0.3, 0.5],
    "vote": [0, 1, 2],
    "weighted_vote": [0, 0.1, 0.2, 0.4],
    "continuation_logprob": [0, 0.1, 0.2, 0.3, 0.5],
    "continuation_margin": [0, 0.1, 0.2, 0.3, 0.5],
}
SETS = [(2, False), (3, False), (4, False), (4, True)]  # first-token alternatives kept, gated branch kept


def generate(path, limit, split="dev", max_tokens=32, batch_size=8):
    from entropix_mlx import load
    from entropix_mlx.decode.rows import Request
    from entropix_mlx.eval import builtin_tasks_path, load_tasks, score, select_split
    from entropix_mlx.front import encode_prompt

    tasks = select_split(load_tasks(builtin_tasks_path()), split)[:limit]
    model, tokenizer = load()
    requests = [
        Request(encode_prompt(tokenizer, [{"role": "user", "content": t.prompt_text()}]), 0, max_tokens) for t in tasks
    ]
    with open(path, "w") as f:
        for i, d, seconds in deliberate_batch(
            model, tokenizer, requests, WIDEST, lambda i, text: score(text, tasks[i])[0], batch_size=batch_size
        ):
            candidates = [{**c.to_dict(), "correct": score(c.text, tasks[i])[1]} for c in d.candidates]
            f.write(
                json.dumps(
                    {
                        "index": tasks[i].index,
                        "category": tasks[i].category,
                        "seconds": seconds,
                        "candidates": candidates,
                    }
                )
                + "\n"
            )


def candidates_of(item, k, gated):
    out, firsts = [], 0
    for c in item["candidates"]:
        if c["split"] == 0:
            firsts += 1
            if firsts > k:
                continue
        elif c["split"] is not None and not gated:
            continue
        fields = {key: c[key] for key in Candidate.__dataclass_fields__ if key in c}
        out.append((Candidate(**fields), c["correct"]))
    return out


def accuracy(items, selector, margin, k, gated):
    right = 0
    for item in items:
        pairs = candidates_of(item, k, gated)
        chosen = select([c for c, _ in pairs], selector, margin)[0]
        right += pairs[chosen][1]
    return 100 * right / len(items)


def table(path):
    items = [json.loads(line) for line in open(path)]
    greedy = 100 * sum(item["candidates"][0]["correct"] for item in items) / len(items)
    print(f"{len(items)} items, greedy {greedy:.1f}%")
    for k, gated in SETS:
        oracle = 100 * sum(any(ok for _, ok in candidates_of(it, k, gated)) for it in items) / len(items)
        print(
            f"-- {k} first-token alternatives{' + 1 gated branch' if gated else ''}: some candidate right {oracle:.1f}%"
        )
        for selector in SELECTORS:
            cells = " ".join(f"{m:g}:{accuracy(items, selector, m, k, gated):.1f}" for m in GRID[selector])
            print(f"   {selector:22s} {cells}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["generate", "table"])
    parser.add_argument("path")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    generate(args.path, args.limit) if args.command == "generate" else table(args.path)
