"""Which model of an answer's confidence to fit, on the signals `chain_signals` kept
(docs/confidence.md has the selection rule): every candidate's out-of-fold AUROC, ECE,
Brier score and accuracy at half coverage, on repeated stratified folds.

    python -m research.confidence_fit docs/records/signals_q05 [--json OUT]
"""

import argparse
import json
from pathlib import Path

import numpy as np

POSITIONS = ("last", "answer", "mean")
COMPONENTS = 32
FOLDS, REPEATS = 5, 4


def read_signals(folder: Path) -> dict[int, dict]:
    items = {}
    for part in sorted(folder.glob("part-*.npz")):
        with np.load(part) as z:
            for key in z.files:
                index, name = key.split("/", 1)
                items.setdefault(int(index), {})[name] = z[key]
    for item in items.values():
        item["meta"] = json.loads(bytes(item["meta"]).decode())
    return items


def window_min(x: np.ndarray, width: int) -> float:
    if len(x) <= width:
        return float(x.mean())
    c = np.concatenate([[0.0], np.cumsum(x)])
    return float(((c[width:] - c[:-width]) / width).min())


def token_features(item: dict) -> list[float]:
    lp = item["logprob"].astype(np.float64)
    h = item["entropy"].astype(np.float64)
    v = item["varentropy"].astype(np.float64)
    m = item["margin"].astype(np.float64)
    end = int(item["answer_end"])
    span = slice(max(0, end - 2), end + 1)
    return [
        np.log(len(lp)),
        float(item["meta"]["finish"] == "length"),
        lp.mean(),
        lp.min(),
        h.mean(),
        np.quantile(h, 0.9),
        h.max(),
        v.mean(),
        v.max(),
        (h > 1).mean(),
        (lp < -1).mean(),
        window_min(lp, 16),
        lp[-32:].mean(),
        h[-32:].mean(),
        lp[span].min(),
        h[span].max(),
        m[span].min(),
    ]


def candidates(items: dict) -> dict[str, tuple[np.ndarray, bool]]:
    """name -> (inputs, whether the last block is a hidden state to reduce)."""
    order = sorted(items)
    tokens = np.array([token_features(items[i]) for i in order])
    layers = sorted({int(k.split("_")[1]) for k in items[order[0]] if k.startswith("last_")})
    out = {"tokens": (tokens, 0)}
    for pos in POSITIONS:
        for layer in layers:
            hidden = np.array([items[i][f"{pos}_{layer}"].astype(np.float32) for i in order])
            out[f"hidden:{pos}@{layer}"] = (hidden, hidden.shape[1])
            out[f"tokens + hidden:{pos}@{layer}"] = (np.hstack([tokens, hidden]), hidden.shape[1])
    return out


def make_model(hidden_width: int):
    from sklearn.compose import ColumnTransformer
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def columns(X):
        n = X.shape[1]
        blocks = []
        if n > hidden_width:
            blocks.append(("tokens", StandardScaler(), list(range(n - hidden_width))))
        if hidden_width:
            reduce = make_pipeline(StandardScaler(), PCA(COMPONENTS, random_state=0), StandardScaler())
            blocks.append(("hidden", reduce, list(range(n - hidden_width, n))))
        return ColumnTransformer(blocks)

    class Model:
        def fit(self, X, y):
            self.pipe = make_pipeline(columns(X), LogisticRegressionCV(Cs=8, cv=4, max_iter=2000))
            self.pipe.fit(X, y)
            return self

        def predict(self, X):
            return self.pipe.predict_proba(X)[:, 1]

    return Model()


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    edges = np.minimum((p * bins).astype(int), bins - 1)
    return float(
        sum(
            abs(p[edges == b].mean() - y[edges == b].mean()) * (edges == b).mean()
            for b in range(bins)
            if (edges == b).any()
        )
    )


def accuracy_at(p: np.ndarray, y: np.ndarray, coverage: float = 0.5) -> float:
    keep = np.argsort(-p, kind="stable")[: max(1, int(round(coverage * len(p))))]
    return float(y[keep].mean())


def out_of_fold(X, y, hidden_width, seed) -> np.ndarray:
    from sklearn.model_selection import StratifiedKFold

    p = np.zeros(len(y))
    for train, test in StratifiedKFold(FOLDS, shuffle=True, random_state=seed).split(X, y):
        p[test] = make_model(hidden_width).fit(X[train], y[train]).predict(X[test])
    return p


def evaluate(X, y, hidden_width) -> dict:
    from sklearn.metrics import brier_score_loss, roc_auc_score

    rows = []
    for seed in range(REPEATS):
        p = out_of_fold(X, y, hidden_width, seed)
        rows.append((roc_auc_score(y, p), ece(p, y), brier_score_loss(y, p), accuracy_at(p, y)))
    auroc, e, brier, half = np.mean(rows, axis=0)
    return {
        "auroc": auroc,
        "auroc_sd": float(np.std([r[0] for r in rows])),
        "ece": e,
        "brier": brier,
        "acc_at_50": half,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", help="comma-separated candidate names")
    args = parser.parse_args()
    items = read_signals(args.folder)
    y = np.array([items[i]["meta"]["correct"] for i in sorted(items)], dtype=int)
    print(f"{len(y)} items, {y.mean():.1%} right")
    results = {}
    for name, (X, width) in candidates(items).items():
        if args.only and name not in args.only.split(","):
            continue
        results[name] = evaluate(X, y, width)
        r = results[name]
        print(
            f"{name:28s} AUROC {r['auroc']:.3f} ±{r['auroc_sd']:.3f}  ECE {r['ece']:.3f}  Brier {r['brier']:.3f}  acc@50% {r['acc_at_50']:.3f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(
            json.dumps({"items": len(y), "right": int(y.sum()), "candidates": results}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
