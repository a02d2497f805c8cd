"""Paired comparisons between rows of different `eval --out` folders over the same
items (docs/evaluation.md, the equal-cost table): W/L/T, the exact p and the
difference's interval, as `eval` gives them between the rows of one folder.

    python -m research.pairs TASKS --cot DIR:ROW DIR:ROW [DIR:ROW ...]

ROW is a sampler in its folder, or a vote row such as "self_consistency k=4" or
"cisc k=4", recomputed from the stored samples as `eval` does. Every row after
the first is compared with the first, on the first row's items (seed 0).
"""

import argparse
import json
from pathlib import Path

from entropix_mlx.eval import load_tasks
from entropix_mlx.eval.runner import item_range
from entropix_mlx.eval.sealed import log_offline_scoring
from entropix_mlx.eval.summary import compare, rescored, split_label, vote_k, vote_records


def row_records(spec: str, tasks: dict, cot: bool) -> dict[int, dict]:
    """{item index: the row's record, scored by this code's extractor}."""
    folder, _, row = spec.partition(":")
    name = split_label(row)[0]
    k = vote_k(name)
    source = "self_consistency" if k else name  # both vote rows come from one run's samples
    settings = json.loads((Path(folder) / "config.json").read_text())["samplers"].get(source, {})
    out = {}
    for line in open(Path(folder) / "items.jsonl"):
        r = json.loads(line)
        if r["sampler"] != source or r["seed"] != 0 or r["index"] not in tasks:
            continue
        task = tasks[r["index"]]
        if k:
            out[r["index"]] = vote_records(r, task, cot, [k], settings)[name]
        else:
            out[r["index"]] = rescored(r, task, cot)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks")
    parser.add_argument("rows", nargs="+", help="DIR:ROW")
    parser.add_argument("--cot", action="store_true", help="the evals ran with --cot")
    args = parser.parse_args()
    tasks = {t.index: t for t in load_tasks(args.tasks)}
    first = row_records(args.rows[0], tasks, args.cot)
    tasks = {i: tasks[i] for i in first}
    for folder in dict.fromkeys(spec.partition(":")[0] for spec in args.rows):
        rows = [spec.partition(":")[2] for spec in args.rows if spec.partition(":")[0] == folder]
        log_offline_scoring(folder, args.tasks, rows, item_range(list(tasks)), "research/pairs.py")

    def tokens(records):
        return sum(r.get("tokens_spent", r["tokens"]) for r in records.values()) / len(records)

    print("| row | its tokens | against | their tokens | W/L/T | diff [95% CI] | p |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for spec in args.rows[1:]:
        other = row_records(spec, tasks, args.cot)
        if other.keys() != first.keys():
            raise SystemExit(f"{spec} has {len(other)} of the {len(first)} items")
        c = compare(
            {i: float(r["correct"]) for i, r in first.items()}, {i: float(r["correct"]) for i, r in other.items()}
        )
        low, high = c["difference_ci95"]
        print(
            f"| {args.rows[0].partition(':')[2]} | {tokens(first):.1f} | {spec.partition(':')[2]} | {tokens(other):.1f} "
            f"| {c['wins']}/{c['losses']}/{c['ties']} | {100 * c['difference']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] "
            f"| {c['p_value']:.3f} |"
        )


if __name__ == "__main__":
    main()
