"""`deliberate` spending by the answer's confidence, replayed from records: fit the
product's confidence on some train items' greedy chains, then on held-out items whose
staged pool is on record spend more (take `deliberate_staged`'s answer, at its tokens)
on the given share of questions where greedy's answer is least likely right, against a
random gate on the same share (the same seed for every share) and `staged` everywhere.

    python -m research.confidence_gate docs/records/signals_q05 docs/records/dev_q05_staged ...
"""

import argparse
import gzip
import json
import random
from pathlib import Path

import numpy as np

from entropix_mlx.eval.stats import paired_comparison, paired_difference
from entropix_mlx.sampling.confidence import FEATURES, AnswerConfidence

from .confidence_fit import cached_pieces, fitted_table, read_signals, token_features

SHARES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def pool_rows(folders: list[Path]) -> dict[int, dict]:
    """index -> {"greedy": (right, tokens), "staged": (right, tokens spent)}."""
    out = {}
    for folder in folders:
        for part in sorted(folder.glob("items-*.jsonl.gz")):
            with gzip.open(part, "rt") as f:
                for line in f:
                    r = json.loads(line)
                    key = "greedy" if r["sampler"] == "greedy" else "staged"
                    spent = r.get("tokens_spent", r["tokens"])
                    out.setdefault(r["index"], {})[key] = (int(r["correct"]), spent)
    return {i: v for i, v in out.items() if len(v) == 2}


def replay(spend: set[int], rows: dict[int, dict]) -> tuple[dict[int, int], float]:
    right = {i: rows[i]["staged" if i in spend else "greedy"][0] for i in rows}
    tokens = sum(rows[i]["staged" if i in spend else "greedy"][1] for i in rows)
    return right, tokens


def row(name, right, tokens, greedy, greedy_tokens, against=None) -> dict:
    vs = paired_comparison(right, greedy)
    out = {
        "rule": name,
        "accuracy": sum(right.values()) / len(right),
        "x_greedy": tokens / greedy_tokens,
        "vs_greedy": f"{vs['wins']}/{vs['losses']}",
        "p_greedy": vs["p_value"],
        "diff": paired_difference(right, greedy)["difference"],
    }
    if against is not None:
        vr = paired_comparison(right, against)
        out |= {"vs_random": f"{vr['wins']}/{vr['losses']}", "p_random": vr["p_value"]}
    return out


def markdown(result: dict, where: str) -> str:
    """One row a rule (`--json`'s): accuracy, tokens against greedy's, paired against greedy and the random gate."""
    lines = [
        f"| rule ({result['check']} held-out items; the confidence's AUROC there {result['auroc']:.3f}) | accuracy"
        " | tokens × greedy | W/L vs greedy | p | W/L vs random gate, same share | p | records |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        against = f"{r['vs_random']} | {r['p_random']:.3f}" if "vs_random" in r else " | "
        vs = f"{r['vs_greedy']} | {r['p_greedy']:.3f}" if r["rule"] != "greedy" else " | "
        lines.append(f"| {r['rule']} | {r['accuracy']:.1%} | {r['x_greedy']:.2f} | {vs} | {against} | {where} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("signals", type=Path)
    parser.add_argument("pools", type=Path, nargs="+", help="staged eval folders of the held-out items")
    parser.add_argument("--model", default="", help="the chains' model, only if the signals keep no token texts")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    items = read_signals(args.signals)
    pieces = cached_pieces(args.signals / "pieces.json.gz", [], args.model, items)
    rows = pool_rows(args.pools)
    check = sorted(set(rows) & set(items))
    fit = sorted(set(items) - set(check))
    X = np.array([token_features(items[i], pieces[i], False) for i in fit])
    y = np.array([items[i]["meta"]["correct"] for i in fit], dtype=int)
    model = AnswerConfidence.from_table(fitted_table(X, y, f"train items {fit[0]}-{fit[-1]}"))
    confidence = {
        i: model.probability(dict(zip(FEATURES, token_features(items[i], pieces[i], False), strict=True)))
        for i in check
    }
    rows = {i: rows[i] for i in check}
    greedy = {i: rows[i]["greedy"][0] for i in check}
    greedy_tokens = sum(rows[i]["greedy"][1] for i in check)
    order = sorted(check, key=lambda i: confidence[i])
    shuffled = random.Random(0).sample(check, len(check))
    table = [row("greedy", greedy, greedy_tokens, greedy, greedy_tokens)]
    table.append(row("staged everywhere", *replay(set(check), rows), greedy, greedy_tokens))
    for share in SHARES:
        n = round(share * len(check))
        rand, rand_tokens = replay(set(shuffled[:n]), rows)
        table.append(row(f"random gate, share {share:g}", rand, rand_tokens, greedy, greedy_tokens))
        gated, tokens = replay(set(order[:n]), rows)
        table.append(row(f"confidence gate, share {share:g}", gated, tokens, greedy, greedy_tokens, rand))
    from sklearn.metrics import roc_auc_score

    auroc = roc_auc_score([greedy[i] for i in check], [confidence[i] for i in check])
    print(
        f"fit on {len(fit)} items, checked on {len(check)} (greedy {np.mean(list(greedy.values())):.1%}); AUROC {auroc:.3f}"
    )
    for r in table:
        extra = f"  vs random {r['vs_random']} p {r['p_random']:.3f}" if "vs_random" in r else ""
        print(
            f"{r['rule']:30s} {r['accuracy']:.1%}  x{r['x_greedy']:.2f}  vs greedy {r['vs_greedy']} p {r['p_greedy']:.3f}{extra}"
        )
    if args.json:
        result = {"fit": [fit[0], fit[-1], len(fit)], "check": len(check), "auroc": auroc, "rows": table}
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
