"""Which model of an answer's confidence to fit, on the signals `chain_signals` kept
(docs/confidence.md has the selection rule): every candidate's out-of-fold AUROC, ECE,
Brier score and accuracy at half coverage, on repeated stratified folds.

    python -m research.confidence_fit docs/records/signals_q05 [--json OUT] [--table OUT.toml]
"""

import argparse
import json
from pathlib import Path

import numpy as np

from entropix_mlx.sampling.confidence import FEATURES, answer_end, chain_features

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


def pieces_of(folders: list[Path], tokenizer) -> dict[int, list[str]]:
    """Each greedy chain's token texts, from its records (the runtime reads its answer's end from them)."""
    from .chain_signals import greedy_records

    return {r["index"]: [tokenizer.decode([t[0][0]]) for t in r["top"]] for r in greedy_records(folders)}


def cached_pieces(path: Path, folders: list[Path], model: str, needed) -> dict[int, list[str]]:
    """`pieces_of`, kept beside the signals (loading a model only for its tokenizer is slow)."""
    import gzip

    if path.exists():
        with gzip.open(path, "rt") as f:
            pieces = {int(k): v for k, v in json.load(f).items()}
        if set(needed) <= set(pieces):
            return pieces
    import entropix_mlx

    pieces = pieces_of(folders, entropix_mlx.load_model(model).tokenizer)
    with gzip.open(path, "wt") as f:
        json.dump(pieces, f)
    return pieces


def token_features(item: dict, pieces: list[str], margin: bool) -> list[float]:
    """The product's features of the chain (sampling/confidence.py), and with `margin`
    the answer span's top-2 margin, which the product does not see at run time."""
    end = answer_end(pieces)
    f = chain_features(item["logprob"], item["entropy"], item["varentropy"], end, item["meta"]["finish"] == "length")
    values = [f[name] for name in FEATURES]
    if margin:
        values.append(float(item["margin"][max(0, end - 2) : end + 1].astype(np.float64).min()))
    return values


def candidates(items: dict, pieces: dict) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (inputs, the width of the hidden state at their end, to reduce)."""
    order = sorted(items)
    runtime = np.array([token_features(items[i], pieces[i], False) for i in order])
    tokens = np.array([token_features(items[i], pieces[i], True) for i in order])
    layers = sorted({int(k.split("_")[1]) for k in items[order[0]] if k.startswith("last_")})
    out = {"tokens": (tokens, 0), "tokens (run time)": (runtime, 0)}
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

    rows, first = [], None
    for seed in range(REPEATS):
        p = out_of_fold(X, y, hidden_width, seed)
        first = p if first is None else first
        rows.append((roc_auc_score(y, p), ece(p, y), brier_score_loss(y, p), accuracy_at(p, y)))
    auroc, e, brier, half = np.mean(rows, axis=0)
    return {
        "auroc": auroc,
        "auroc_sd": float(np.std([r[0] for r in rows])),
        "out_of_fold": [round(float(x), 4) for x in first],  # the first shuffle's, for the charts
        "ece": e,
        "brier": brier,
        "acc_at_50": half,
    }


def sure_threshold(p: np.ndarray, y: np.ndarray, risk: float = 0.15, least: float = 0.1) -> tuple[float, float, float]:
    """(threshold, error rate at or above it, share there): the lowest threshold whose
    answers above it are wrong at most `risk` of the time, over at least `least` of them
    (else the one with the fewest errors)."""
    best = None
    for t in sorted(set(np.round(p, 4))):
        sure = p >= t
        if sure.mean() < least:
            break
        error = 1 - y[sure].mean()
        if error <= risk:
            return float(t), float(error), float(sure.mean())
        if best is None or error < best[1]:
            best = (float(t), float(error), float(sure.mean()))
    return best


def fitted_table(X: np.ndarray, y: np.ndarray, fitted_on: str) -> dict:
    """The product's `[confidence]` table: a logistic fit on all items, its threshold
    from out-of-fold predictions of the same fit."""
    import datetime

    from sklearn.linear_model import LogisticRegressionCV

    p = out_of_fold(X, y, 0, seed=0)
    threshold, error, share = sure_threshold(p, y)
    mean, scale = X.mean(axis=0), X.std(axis=0) + 1e-9
    fit = LogisticRegressionCV(Cs=8, cv=4, max_iter=2000).fit((X - mean) / scale, y)
    return {
        "features": list(FEATURES),
        "mean": [round(float(x), 6) for x in mean],
        "scale": [round(float(x), 6) for x in scale],
        "weights": [round(float(x), 6) for x in fit.coef_[0]],
        "bias": round(float(fit.intercept_[0]), 6),
        "threshold": threshold,
        "fitted_on": fitted_on,
        "date": datetime.date.today().isoformat(),
        "sure_error": round(error, 4),
        "sure_share": round(share, 4),
    }


def markdown(results: dict, where: str) -> str:
    """One row a candidate: its out-of-fold figures on the items (`--json`'s)."""
    lines = [
        f"| candidate ({results['items']} items, {results['right']} right) | AUROC (sd over shuffles) | ECE | Brier"
        " | accuracy at 50% coverage | records |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results["candidates"].items():
        lines.append(
            f"| {name} | {r['auroc']:.3f} ({r['auroc_sd']:.3f}) | {r['ece']:.3f} | {r['brier']:.3f}"
            f" | {r['acc_at_50']:.1%} | {where} |"
        )
    return "\n".join(lines)


def applied(table_path: Path, items: dict, pieces: dict) -> dict:
    """A card's fitted `[confidence]` table read on other items: its figures there."""
    from sklearn.metrics import brier_score_loss, roc_auc_score

    from entropix_mlx.sampling.confidence import AnswerConfidence
    from entropix_mlx.sampling.settings import read_toml

    model = AnswerConfidence.from_table(read_toml(table_path)["confidence"])
    order = sorted(items)
    y = np.array([items[i]["meta"]["correct"] for i in order], dtype=int)
    p = np.array(
        [model.probability(dict(zip(FEATURES, token_features(items[i], pieces[i], False), strict=True))) for i in order]
    )
    sure = p >= model.threshold
    return {
        "items": len(y),
        "right": int(y.sum()),
        "candidates": {
            f"{table_path.name} [confidence], as fitted": {
                "auroc": float(roc_auc_score(y, p)),
                "auroc_sd": 0.0,
                "ece": ece(p, y),
                "brier": float(brier_score_loss(y, p)),
                "acc_at_50": accuracy_at(p, y),
                "sure_error": float(1 - y[sure].mean()) if sure.any() else None,
                "sure_share": float(sure.mean()),
            }
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--model", help="the chains' model (for its tokenizer), unless FOLDER keeps their texts")
    parser.add_argument("--records", type=Path, nargs="*", default=[], help="the eval folders of the chains, likewise")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", help="comma-separated candidate names")
    parser.add_argument("--table", type=Path, help="write the run-time features' fitted [confidence] table here (TOML)")
    parser.add_argument("--fitted-on", default="", help="what the table says it was fitted on")
    parser.add_argument("--apply", type=Path, help="a card: read its fitted table on FOLDER's items instead of fitting")
    args = parser.parse_args()
    items = read_signals(args.folder)
    pieces = cached_pieces(args.folder / "pieces.json.gz", args.records, args.model, items)
    if args.apply:
        results = applied(args.apply, items, pieces)
        print(json.dumps(results, indent=1))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
        return 0
    y = np.array([items[i]["meta"]["correct"] for i in sorted(items)], dtype=int)
    print(f"{len(y)} items, {y.mean():.1%} right")
    results = {}
    for name, (X, width) in candidates(items, pieces).items():
        if args.only and name not in args.only.split(","):
            continue
        results[name] = evaluate(X, y, width)
        r = results[name]
        print(
            f"{name:28s} AUROC {r['auroc']:.3f} ±{r['auroc_sd']:.3f}  ECE {r['ece']:.3f}  Brier {r['brier']:.3f}  acc@50% {r['acc_at_50']:.3f}",
            flush=True,
        )
    if args.table:
        X = candidates(items, pieces)["tokens (run time)"][0]
        table = fitted_table(X, y, args.fitted_on or f"{len(y)} greedy answers ({args.folder})")
        lines = ["[confidence]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
        args.table.write_text("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(
            json.dumps({"items": len(y), "right": int(y.sum()), "y": y.tolist(), "candidates": results}) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
