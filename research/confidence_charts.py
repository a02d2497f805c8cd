"""The answer confidence's reliability diagram and risk-coverage curve, from a
`confidence_fit --json` record (the run-time candidate's out-of-fold predictions).

    python -m research.confidence_charts docs/records/confidence_q05/candidates.json docs/confidence_q05.png
"""

import argparse
import json
from pathlib import Path

import numpy as np

CANDIDATE = "tokens (run time)"


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> list[tuple[float, float, int]]:
    """(mean confidence, share right, answers) per equal-width bin that has answers."""
    at = np.minimum((p * bins).astype(int), bins - 1)
    return [
        (float(p[at == b].mean()), float(y[at == b].mean()), int((at == b).sum()))
        for b in range(bins)
        if (at == b).any()
    ]


def risk_coverage(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Answering the surest first: (coverage, error rate among those answered)."""
    order = np.argsort(-p, kind="stable")
    wrong = np.cumsum(1 - y[order])
    n = np.arange(1, len(p) + 1)
    return n / len(p), wrong / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(args.record.read_text())
    p, y = np.array(data["candidates"][CANDIDATE]["out_of_fold"]), np.array(data["y"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2))
    rows = reliability(p, y)
    a.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
    a.scatter([r[0] for r in rows], [r[1] for r in rows], s=[10 + 3 * r[2] for r in rows])
    a.set(xlabel="confidence (out of fold)", ylabel="share right", title="reliability (10 bins, area: answers)")
    coverage, risk = risk_coverage(p, y)
    b.plot(coverage, risk)
    b.axhline(1 - y.mean(), color="grey", lw=1, ls="--", label="answering everything")
    b.axhline(0.15, color="red", lw=1, ls=":", label="15% error")
    b.set(xlabel="coverage (answers kept, surest first)", ylabel="error rate among them", title="risk against coverage")
    b.legend()
    fig.suptitle(f"{args.record.parent.name}: {len(y)} greedy answers, {CANDIDATE}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
