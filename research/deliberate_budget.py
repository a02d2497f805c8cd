"""Candidate sets, selectors and early stopping compared on one wide dev run of
`deliberate` (docs/deliberate.md, "Per token spent"), without decoding again.

    entropix-mlx eval TASKS --split dev --cot -m MODEL --samplers greedy,deliberate \\
        --config wide.toml --items 0-31 --out DIR          # wide.toml: docs/deliberate.md
    python -m research.deliberate_budget DIR TASKS --cot

Every candidate continues greedily from where it split, so a smaller set is the
same candidates with the others left out, and early stopping is replayed from
when each candidate ended: all rows advance one token per step, so candidate i,
split at s_i with n_i tokens, ends at step n_i. Once the ended candidates' vote
is decided at step T, the others stop there: a candidate still running keeps
T - s_i of its own tokens, one that would split after T never starts.
"""

import argparse
import json
from pathlib import Path

# ruff: noqa: E402  (the imports after enable())
import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

from entropix_mlx.decode.deliberate import stage_decided
from entropix_mlx.eval import load_tasks, score
from entropix_mlx.eval.runner import item_range
from entropix_mlx.eval.sealed import log_offline_scoring
from entropix_mlx.eval.stats import sign_test
from entropix_mlx.sampling.deliberate_config import DeliberateConfig
from entropix_mlx.sampling.selection import VOTE_SELECTORS, Candidate, answer_scores, select


# Which of the wide run's candidates a setting keeps (the greedy answer always):
# first-token alternatives (split 0) in the order of their probability, and
# branches at uncertain positions later in the chain (split > 0).
def first_tokens(n):
    return lambda splits: [i for i, s in enumerate(splits) if s == 0][:n]


def in_chain(splits):
    return [i for i, s in enumerate(splits) if s > 0]


SETS = {
    "first 1": first_tokens(1),
    "first 2 (the card)": first_tokens(2),
    "first 4": first_tokens(4),
    "first 6": first_tokens(6),  # these two: from a cot_decoding run (--sampler cot_decoding), 9 first tokens
    "first 9": first_tokens(9),
    "in-chain only": in_chain,
    "first 2 + in-chain": lambda splits: first_tokens(2)(splits) + in_chain(splits),
    "all": lambda splits: list(range(len(splits))),
}
SELECTORS = [
    ("continuation_margin", 0.1),
    ("max_margin", 0.0),  # CoT-decoding's own rule: the answer span's probability margin
    ("vote", 0.0),
    ("weighted_vote", 0.0),
    ("confidence_vote", 0.0),
    ("lowest_group_vote", 0.0),
]
STOPS = (0.0, 0.6, 0.8, 1.0)


def records(folder, sampler="deliberate"):
    recs = [json.loads(line) for line in open(Path(folder) / "items.jsonl")]
    greedy = {r["index"]: r for r in recs if r["sampler"] == "greedy"}
    return greedy, [r for r in recs if r["sampler"] == sampler]


def candidate(c, k) -> Candidate:
    fields = {key: c[key] for key in Candidate.__dataclass_fields__ if key in c}
    fields.update(row=k, parent=None if k == 0 else 0, tokens=[0] * len(c["logprobs"]), top=[])
    return Candidate(**fields)


def replay(cands: list[Candidate], selector, margin, stop_share, clean, temperature=0.1, window=16):
    """(index chosen, tokens spent) with early stopping at `stop_share` (0: off)."""
    spent = [c.own_tokens for c in cands]
    if stop_share > 0:
        ended = []
        for i in sorted(range(len(cands)), key=lambda i: (len(cands[i].tokens), i)):
            c = cands[i]
            if c.answer is not None and c.flaw(clean) is None:
                ended.append(c)
            votes = answer_scores(ended, selector, temperature, window) if len(ended) >= 2 else {}
            if votes and max(votes.values()) >= stop_share * sum(votes.values()):
                at = len(c.tokens)
                kept = []
                for j, other in enumerate(cands):
                    start = other.split or 0
                    if len(other.tokens) <= at:
                        kept.append(j)
                    elif start < at:
                        spent[j] = at - start
                        kept.append(j)
                        cands[j] = Candidate(**{**other.__dict__, "finish_reason": "stopped"})
                    else:
                        spent[j] = 0
                cands = [cands[j] for j in kept]
                spent = [spent[j] for j in kept]
                break
    chosen, _, _ = select(cands, selector, margin, clean, temperature, window)
    return cands[chosen], sum(spent)


def staged(cands: list[Candidate], first: int, selector, clean, temperature=0.1, window=16):
    """Candidates started one stage after another: the greedy answer and `first`
    alternatives; the rest start only when those did not all end cleanly with one
    answer. (index chosen, tokens spent)."""
    opening = cands[: 1 + first]
    if stage_decided(opening, DeliberateConfig(clean_first=clean)):
        cands = opening
    chosen, _, _ = select(cands, selector, 0.0, clean, temperature, window)
    return cands[chosen], sum(c.own_tokens for c in cands)


def table(folder, tasks_file, cot, sampler="deliberate", clean="loop_or_length"):
    tasks = {t.index: t for t in load_tasks(tasks_file)}
    greedy, items = records(folder, sampler)
    items = [r for r in items if r["index"] in greedy]
    log_offline_scoring(
        folder,
        tasks_file,
        ["greedy", sampler],
        item_range([r["index"] for r in items]),
        "research/deliberate_budget.py",
    )
    right_of = {}
    for r in items:
        for k, c in enumerate(r["candidates"]):
            right_of[(r["index"], k)] = score(c["text"], tasks[r["index"]], cot)[1]
    base = [greedy[r["index"]]["correct"] for r in items]
    base_tokens = sum(greedy[r["index"]]["tokens"] for r in items) / len(items)
    print(f"{len(items)} items; greedy {100 * sum(base) / len(items):.1f}%, {base_tokens:.0f} tokens an answer")
    print(f"{'candidates':20} {'selector':24} {'stop':>5} {'acc':>6} {'W/L':>6} {'p':>6} {'tokens':>7} {'x greedy':>8}")
    widest = max(sum(c["split"] == 0 for c in r["candidates"]) for r in items)
    for set_name, pick in SETS.items():
        if set_name.startswith("first ") and int(set_name.split()[1]) > max(widest, 1):
            continue  # the run has no such candidates: the row would repeat a narrower one
        for selector, margin in SELECTORS:
            for stop in STOPS if selector in VOTE_SELECTORS else (0.0,):
                right, tokens = [], 0
                for r in items:
                    cs = [candidate(c, k) for k, c in enumerate(r["candidates"])]
                    keep = [0] + [1 + i for i in pick([c.split for c in cs[1:]])]
                    chosen, spent = replay([cs[i] for i in keep], selector, margin, stop, clean)
                    right.append(right_of[(r["index"], chosen.row)])
                    tokens += spent
                row(
                    f"{set_name:20} {selector + f' d{margin}':24} {stop:5.1f}",
                    right,
                    base,
                    tokens / len(items),
                    base_tokens,
                )
    for first, rest in ((1, 2), (1, 4), (2, 4)):
        for selector in ("confidence_vote", "lowest_group_vote"):
            right, tokens = [], 0
            for r in items:
                cs = [candidate(c, k) for k, c in enumerate(r["candidates"])]
                keep = [0] + [1 + i for i in first_tokens(4)([c.split for c in cs[1:]])][:rest]
                chosen, spent = staged([cs[i] for i in keep], first, selector, clean)
                right.append(right_of[(r["index"], chosen.row)])
                tokens += spent
            name = f"staged {first}, then {rest}"
            row(f"{name:20} {selector + ' d0.0':24} {'':5}", right, base, tokens / len(items), base_tokens)


def row(label, right, base, mean, base_tokens):
    w = sum(a and not b for a, b in zip(right, base, strict=True))
    lost = sum(b and not a for a, b in zip(right, base, strict=True))
    print(
        f"{label} {100 * sum(right) / len(right):6.1f} "
        f"{w:>2}/{lost:<3} {sign_test(w, lost):6.3f} {mean:7.0f} {mean / base_tokens:8.2f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("tasks", help="the eval's task file")
    parser.add_argument("--cot", action="store_true", help="the eval ran with --cot")
    parser.add_argument("--sampler", default="deliberate", help="the wide run's sampler name in the folder")
    parser.add_argument("--clean-first", default="loop_or_length", help="which candidates lose to a clean one")
    args = parser.parse_args()
    table(args.folder, args.tasks, args.cot, args.sampler, args.clean_first)
