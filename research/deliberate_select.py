"""The clean-ending rule and the 2025 selectors on stored dev candidates
(docs/deliberate.md, "Degenerate answers and the 2025 selectors").

    entropix-mlx eval --builtin --split dev --samplers greedy,deliberate --out DIR
    python -m research.deliberate_select certainty DIR     # self-certainty: one pass per candidate
    python -m research.deliberate_select table DIR
    python -m research.deliberate_select table DIR --tasks ../shared/data/gsm8k_test.jsonl --cot
"""

import argparse
import json
import math
from pathlib import Path

# ruff: noqa: E402  (the imports after enable())
import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

from entropix_mlx.eval import builtin_tasks_path, load_tasks, score
from entropix_mlx.eval.runner import item_range
from entropix_mlx.eval.sealed import log_offline_scoring
from entropix_mlx.eval.stats import sign_test
from entropix_mlx.sampling.selection import Candidate, select


def records(folder):
    recs = [json.loads(line) for line in open(Path(folder) / "items.jsonl")]
    greedy = {r["index"]: r["correct"] for r in recs if r["sampler"] == "greedy"}
    return greedy, [r for r in recs if r["sampler"] == "deliberate"]


def candidates(r, tasks, cot=False):
    """(Candidate, right) for each stored candidate of a deliberate record."""
    out = []
    for k, c in enumerate(r["candidates"]):
        fields = {key: c[key] for key in Candidate.__dataclass_fields__ if key in c}
        fields.update(row=k, parent=None if k == 0 else 0, tokens=[0] * len(c["logprobs"]))
        out.append((Candidate(**fields), score(c["text"], tasks[r["index"]], cot)[1]))
    return out


def certainty(folder):
    """Self-certainty (Kang et al. 2025) of every candidate: per token, KL(uniform || p)
    in nats, from one teacher-forced pass over prompt + the candidate's text."""
    import mlx.core as mx

    from entropix_mlx import load
    from entropix_mlx.front import encode_prompt

    tasks = {t.index: t for t in load_tasks(builtin_tasks_path())}
    model, tokenizer = load()
    vocabulary = model.args.vocab_size
    _, items = records(folder)
    with open(Path(folder) / "certainty.jsonl", "w") as out:
        for r in items:
            prompt = encode_prompt(tokenizer, [{"role": "user", "content": tasks[r["index"]].prompt_text()}])
            texts = [tokenizer.encode(c["text"], add_special_tokens=False) for c in r["candidates"]]
            width = max(1, max(len(t) for t in texts))
            logits, _ = model(mx.array([prompt + t + [0] * (width - len(t)) for t in texts]))
            logits = logits[:, len(prompt) - 1 : len(prompt) - 1 + width].astype(mx.float32)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            kl = (-math.log(vocabulary) - mx.mean(logprobs, axis=-1)).tolist()
            out.write(json.dumps({"index": r["index"], "kl": [kl[k][: len(t)] for k, t in enumerate(texts)]}) + "\n")


def lowest_group(values, window):
    if len(values) <= window:
        return sum(values) / len(values) if values else -math.inf
    return min(sum(values[i : i + window]) / window for i in range(len(values) - window + 1))


def by_value(value, margin, vote=False, rule="loop_or_length"):
    """A chooser: among the clean candidates, the best `value(i, candidate)` (or the
    answer with the best sum of exp(value), `vote`), kept only if it beats the
    greedy answer's by more than `margin`."""

    def choose(cs, item):
        pool = [i for i, c in enumerate(cs) if c.flaw(rule) is None] or list(range(len(cs)))
        v = {i: value(i, cs[i], item) for i in pool}
        if vote:
            per = {}
            for i in pool:
                if cs[i].answer is not None:
                    per[cs[i].answer] = per.get(cs[i].answer, 0.0) + math.exp(v[i])
            if not per:
                return 0 if 0 in pool else max(pool, key=v.get)
            best = max(per, key=per.get)
            if 0 in pool and (best == cs[0].answer or per[best] - per.get(cs[0].answer, 0.0) <= margin):
                return 0
            return max((i for i in pool if cs[i].answer == best), key=v.get)
        best = max(pool, key=v.get)
        return 0 if 0 in pool and v[best] - v[0] <= margin else best

    return choose


def table(folder, tasks_file=None, cot=False):
    tasks = {t.index: t for t in load_tasks(tasks_file or builtin_tasks_path())}
    greedy, items = records(folder)
    where = tasks_file or builtin_tasks_path()
    log_offline_scoring(
        folder,
        where,
        ["greedy", "deliberate"],
        item_range([r["index"] for r in items]),
        "research/deliberate_select.py",
    )
    kl_file = Path(folder) / "certainty.jsonl"
    kl = {json.loads(line)["index"]: json.loads(line)["kl"] for line in open(kl_file)} if kl_file.exists() else {}
    prepared = [(r, candidates(r, tasks, cot)) for r in items]

    def show(name, choose, only=None):
        rows = [(r, cs) for r, cs in prepared if only is None or r["index"] in only]
        right = [cs[choose([c for c, _ in cs], r)][1] for r, cs in rows]
        base = [greedy[r["index"]] for r, _ in rows]
        w = sum(a and not b for a, b in zip(right, base, strict=True))
        lost = sum(b and not a for a, b in zip(right, base, strict=True))
        print(
            f"{name:62} {100 * sum(right) / len(rows):5.1f}  W/L {w}/{lost}  p {sign_test(w, lost):.3f}  n {len(rows)}"
        )

    print(f"{len(items)} items; greedy {100 * sum(greedy.values()) / len(greedy):.1f}%")
    for rule in ("off", "loop", "loop_or_length"):
        for selector, margin in (("continuation_margin", 0.1), ("continuation_margin", 0.0)):
            show(
                f"{selector} d{margin} clean_first={rule}",
                lambda cs, r, s=selector, m=margin, ru=rule: select(cs, s, m, ru)[0],
            )
    for selector, margin in (("continuation_logprob", 0.1), ("logprob", 0.0)):
        show(
            f"{selector} d{margin} loop_or_length",
            lambda cs, r, s=selector, m=margin: select(cs, s, m, "loop_or_length")[0],
        )
    after_first = lambda c: c.logprobs[1:] if len(c.logprobs) > 1 else c.logprobs  # noqa: E731
    for window in (4, 8, 16):
        for margin in (0.0, 0.1, 0.3):
            value = lambda i, c, r, w=window: lowest_group(after_first(c), w)  # noqa: E731
            show(f"DeepConf lowest group w{window} d{margin}", lambda cs, r, v=value, m=margin: by_value(v, m)(cs, r))
    for window in (4, 8):
        for margin in (0.0, 0.2):
            value = lambda i, c, r, w=window: lowest_group(after_first(c), w)  # noqa: E731
            show(
                f"DeepConf weighted vote w{window} d{margin}",
                lambda cs, r, v=value, m=margin: by_value(v, m, True)(cs, r),
            )
    if kl:

        def certainty_of(i, c, r, skip):
            values = kl[r["index"]][i]
            values = values[1:] if skip and len(values) > 1 else values
            return sum(values) / len(values) if values else -math.inf

        for skip in (False, True):
            for margin in (0.0, 0.1, 0.3, 1.0):
                value = lambda i, c, r, s=skip: certainty_of(i, c, r, s)  # noqa: E731
                show(
                    f"self-certainty {'after the first token' if skip else 'all tokens'} d{margin}",
                    lambda cs, r, v=value, m=margin: by_value(v, m)(cs, r),
                    only=kl,
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["certainty", "table"])
    parser.add_argument("folder")
    parser.add_argument("--tasks", help="the eval's task file (default: the built-in tasks)")
    parser.add_argument("--cot", action="store_true", help="the eval ran with --cot")
    args = parser.parse_args()
    certainty(args.folder) if args.step == "certainty" else table(args.folder, args.tasks, args.cot)
