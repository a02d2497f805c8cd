"""The summary of an accuracy eval: accuracy and what it cost, per row.

A row is a sampler at a budget (`name`, or `name@budget` when the eval ran
several budgets). Every row reports cost with every candidate counted:
generated tokens per answer (deliberate's branches, all k samples of a vote),
prompt tokens prefilled, wall seconds per answer, the share of answers cut off
by the limit and the share with no answer to read, and accuracy on finished
and cut-off answers apart. A vote run (self_consistency, cisc) becomes one row
per vote rule and k' <= k: its first k' samples voted by majority
("self_consistency k=4") or by confidence ("cisc k=4"), recomputed from the
stored samples; plus, for each other row, the k' whose tokens come closest.

Each row is paired with greedy at its budget (W/L/T, exact p, the difference's
95% interval, Holm's adjustment over the rows), and every two rows with each
other under `pairs`. Answers are scored again from their stored text, so a
result directory always reads with the extractor of the code that reads it.
"""

import statistics
from collections import Counter

from ..front.registry import BASELINE
from ..sampling.selection import SAMPLE_VOTES, vote
from ..sampling.voting import PRESETS as VOTE_PRESETS
from .scoring import score
from .stats import holm, paired_comparison, paired_difference, wilson_interval

CUT_OFF_WARNING = 0.05  # above this share of greedy answers cut off, the limit decides the comparison
VOTE_NAME = {preset.selector: name for name, preset in VOTE_PRESETS.items()}  # self_consistency, cisc


def mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def split_label(label: str) -> tuple[str, int | None]:
    """("cisc k=4", 768) from "cisc k=4@768"; (label, None) without a budget."""
    name, at, budget = label.rpartition("@")
    return (name, int(budget)) if at and budget.isdigit() else (label, None)


def vote_k(name: str) -> int | None:
    """4 from "self_consistency k=4" or "cisc k=4"; None for any other row."""
    method, sep, k = name.partition(" k=")
    return int(k) if sep and method in VOTE_NAME.values() and k.isdigit() else None


def with_budget(name: str, budget: int | None) -> str:
    return f"{name}@{budget}" if budget is not None else name


def rescored(record: dict, task, cot: bool) -> dict:
    if "output" not in record:
        return record
    extracted, correct = score(record["output"], task, cot=cot)
    return {**record, "extracted": extracted, "correct": correct}


def vote_records(record: dict, task, cot: bool, ks, config: dict) -> dict[str, dict]:
    """{row name: record} of one vote record's first k' samples, for each k'
    in `ks` and each vote rule."""
    samples = []
    for s in record["samples"]:  # each sample scored once, with this code's extractor
        answer, correct = score(s["text"], task, cot=cot)
        samples.append({**s, "answer": answer, "correct": correct})
    out = {}
    for k in ks:
        first = samples[:k]
        spent = sum(s["tokens"] for s in first)
        share = spent / max(1, record.get("tokens_spent", spent))
        for selector in SAMPLE_VOTES:
            chosen, _ = vote(
                [s["answer"] for s in first],
                [s["mean_logprob"] for s in first],
                selector,
                config.get("confidence_temperature", 0.1),
            )
            w = first[chosen]
            out[f"{VOTE_NAME[selector]} k={k}"] = {
                **record,
                "output": w["text"],
                "extracted": w["answer"],
                "correct": w["correct"],
                "tokens": w["tokens"],
                "tokens_spent": spent,
                "finish_reason": w["finish_reason"],
                "candidates_cut_off": sum(s["finish_reason"] == "length" for s in first) / len(first),
                "seconds": record["seconds"] * share,  # the run's time, shared out by tokens
                "strategies": {"sample": w["tokens"]},
            }
    return out


def row_table(records: dict, tasks: list, config, settings: dict) -> dict[str, list[tuple[int, list[dict]]]]:
    """{row: [(seed, its records in task order)]}, vote runs expanded."""
    table: dict[str, list[tuple[int, list[dict]]]] = {}
    for label, seed in config.runs():
        name, budget = split_label(label)
        recs = [rescored(records[(label, seed, t.index)], t, config.cot) for t in tasks]
        if not any("samples" in r for r in recs):
            table.setdefault(label, []).append((seed, recs))
            continue
        k = min(len(r["samples"]) for r in recs)
        expanded = [
            vote_records(r, t, config.cot, range(1, k + 1), settings.get(name, {}))
            for r, t in zip(recs, tasks, strict=True)
        ]
        for row in expanded[0]:
            table.setdefault(with_budget(row, budget), []).append((seed, [e[row] for e in expanded]))
    return table


def matched_vote_rows(table: dict, summaries: dict) -> set[str]:
    """The vote rows to report: k' a power of two or k, and for each other row
    the k' whose mean generated tokens come closest to that row's."""
    keep = set()
    ks = {r: k for r in table if (k := vote_k(split_label(r)[0]))}
    vote_rows = set(ks)
    for r in vote_rows:
        k = ks[r]
        if k & (k - 1) == 0 or k == max(ks.values()):
            keep.add(r)
    for other, s in summaries.items():
        if other in vote_rows or split_label(other)[0] == BASELINE:
            continue
        budget = split_label(other)[1]
        for method in VOTE_NAME.values():
            rows = [r for r in vote_rows if split_label(r)[1] == budget and split_label(r)[0].startswith(method)]
            if rows:
                best = min(rows, key=lambda r: abs(summaries[r]["tokens_generated"] - s["tokens_generated"]))
                keep.add(best)
                summaries[best].setdefault("matches", []).append(other)
    return keep


def row_summary(runs: list[tuple[int, list[dict]]], indices: list[int], tasks: list) -> dict:
    run_stats = []
    for seed, recs in runs:
        k, n = sum(r["correct"] for r in recs), len(recs)
        tokens, seconds = sum(r["tokens"] for r in recs), sum(r["seconds"] for r in recs)
        run_stats.append(
            {
                "seed": seed,
                "correct": k,
                "n": n,
                "accuracy": k / n,
                "ci95": list(wilson_interval(k, n)),
                "mean_tokens": tokens / n,
                "tokens_per_second": tokens / seconds if seconds else 0.0,
            }
        )
    accuracies = [r["accuracy"] for r in run_stats]
    all_recs = [r for _, recs in runs for r in recs]
    strategies = Counter()
    for r in all_recs:
        strategies.update(r["strategies"])
    n_tokens = sum(strategies.values())
    seconds = sum(r["seconds"] for r in all_recs)
    spent = [r.get("tokens_spent", r["tokens"]) for r in all_recs]
    cut = [r for r in all_recs if r.get("finish_reason") == "length"]
    finished = [r for r in all_recs if r.get("finish_reason") != "length"]
    mean_acc = statistics.fmean(accuracies)
    entry = {
        "runs": run_stats,
        "n": len(indices),
        "seeds": len(runs),
        "accuracy": mean_acc,
        "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
        "accuracy_range": [min(accuracies), max(accuracies)],
        "ci95": list(wilson_interval(mean_acc * len(indices), len(indices))),
        "mean_tokens": statistics.fmean(r["tokens"] for r in all_recs),
        "tokens_generated": statistics.fmean(spent),
        "prompt_tokens": mean([r.get("prompt_tokens") for r in all_recs]),
        "seconds_per_answer": seconds / len(all_recs),
        "cut_off": len(cut) / len(all_recs),
        "no_answer": sum(r.get("extracted") is None for r in all_recs) / len(all_recs),
        "accuracy_finished": mean([r["correct"] for r in finished]) if finished else None,
        "accuracy_cut_off": mean([r["correct"] for r in cut]) if cut else None,
        "tokens_per_second": sum(spent) / seconds if seconds else 0.0,
        "strategy_share": {s: c / n_tokens for s, c in strategies.most_common()} if n_tokens else {},
        "thinking_insertions": sum(r.get("thinking_insertions", 0) for r in all_recs),
    }
    if any("candidates_cut_off" in r for r in all_recs):
        entry["candidates_cut_off"] = mean([r.get("candidates_cut_off") for r in all_recs])
    elif any("candidates" in r for r in all_recs):
        cands = [c for r in all_recs for c in r.get("candidates", [])]
        entry["candidates_cut_off"] = mean([c["finish_reason"] == "length" for c in cands]) if cands else 0.0
    shares, categories = share_correct(runs, indices), {}
    for t in tasks:
        if t.category is not None:
            categories.setdefault(t.category, []).append(shares[t.index])
    if categories:
        entry["categories"] = {c: {"n": len(v), "accuracy": statistics.fmean(v)} for c, v in sorted(categories.items())}
    return entry


def share_correct(runs, indices) -> dict[int, float]:
    return {i: sum(recs[k]["correct"] for _, recs in runs) / len(runs) for k, i in enumerate(indices)}


def compare(a: dict[int, float], b: dict[int, float]) -> dict:
    """W/L/T and the exact p of a against b, with the difference and its interval."""
    out = paired_comparison(a, b)
    diff = paired_difference(a, b)
    return {**out, "difference": diff["difference"], "difference_ci95": diff["ci95"]}


def summarize_rows(records: dict, tasks: list, config, settings: dict | None = None) -> tuple[dict, dict, list]:
    """({row: summary}, {"a vs b": comparison}, warnings)."""
    indices = [t.index for t in tasks]
    table = row_table(records, tasks, config, settings or {})
    summaries = {row: row_summary(runs, indices, tasks) for row, runs in table.items()}
    keep = matched_vote_rows(table, summaries)
    order = [r for r in table if r in keep or vote_k(split_label(r)[0]) is None]
    summaries = {r: summaries[r] for r in order}
    shares = {r: share_correct(table[r], indices) for r in order}
    for row, s in summaries.items():
        base = with_budget("greedy", split_label(row)[1])
        if row != base and base in shares:
            s["vs_greedy"] = compare(shares[row], shares[base])
    adjusted = holm({r: s["vs_greedy"]["p_value"] for r, s in summaries.items() if "vs_greedy" in s})
    for r, p in adjusted.items():
        summaries[r]["vs_greedy"]["p_holm"] = p
    pairs = {f"{a} vs {b}": compare(shares[a], shares[b]) for i, a in enumerate(order) for b in order[i + 1 :]}
    warnings = []
    for row, s in summaries.items():
        if split_label(row)[0] == BASELINE and s["cut_off"] > CUT_OFF_WARNING:
            warnings.append(
                f"{row} was cut off by the token limit on {100 * s['cut_off']:.0f}% of items (more than "
                f"{100 * CUT_OFF_WARNING:.0f}%): the comparison measures the budget, not the sampler; "
                "raise max_tokens"
            )
    return summaries, pairs, warnings
