"""research/confidence_fit.py: the sure threshold, and a fitted table that the product's
AnswerConfidence reads back to the fit's own probabilities."""

import numpy as np
import pytest

from entropix_mlx.sampling.confidence import FEATURES, AnswerConfidence
from research import confidence_fit


def test_the_sure_threshold_is_the_lowest_with_few_enough_errors():
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05])
    y = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 0])
    t, error, share = confidence_fit.sure_threshold(p, y, risk=0.2, least=0.1)
    assert (t, error, share) == pytest.approx((0.5, 0.2, 0.5))  # at 0.4: 2 of 6 wrong
    t, error, share = confidence_fit.sure_threshold(p, y, risk=0.0, least=0.1)
    assert (t, error, share) == pytest.approx((0.7, 0.0, 0.3))


def test_a_fitted_table_gives_the_product_the_fits_probabilities():
    from sklearn.linear_model import LogisticRegressionCV

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, len(FEATURES))) * 3 + 1
    y = (X[:, 2] - X[:, 4] + rng.normal(size=200) > 0).astype(int)
    table = confidence_fit.fitted_table(X, y, "synthetic")
    model = AnswerConfidence.from_table(table)
    mean, scale = X.mean(axis=0), X.std(axis=0)
    fit = LogisticRegressionCV(Cs=8, cv=4, max_iter=2000).fit((X - mean) / scale, y)
    expected = fit.predict_proba((X[:5] - mean) / scale)[:, 1]
    got = [model.probability(dict(zip(FEATURES, row, strict=True))) for row in X[:5]]
    assert got == pytest.approx(expected, abs=1e-4)
    assert 0 <= table["sure_error"] <= 0.15 and table["sure_share"] >= 0.1


def test_the_gate_replay_takes_staged_where_it_spends():
    from research.confidence_gate import replay

    rows = {1: {"greedy": (0, 100), "staged": (1, 300)}, 2: {"greedy": (1, 80), "staged": (0, 200)}}
    assert replay({1}, rows) == ({1: 1, 2: 1}, 380)
    assert replay(set(), rows) == ({1: 0, 2: 1}, 180)
    assert replay({1, 2}, rows) == ({1: 1, 2: 0}, 500)


def test_reliability_and_risk_coverage_by_hand():
    from research.confidence_charts import reliability, risk_coverage

    p = np.array([0.95, 0.9, 0.15, 0.1])
    y = np.array([1, 0, 0, 0])
    rows = reliability(p, y)  # 0.1 and 0.15 share a bin
    assert [r[2] for r in rows] == [2, 2] and [r[1] for r in rows] == [0.0, 0.5]
    assert [r[0] for r in rows] == pytest.approx([0.125, 0.925])
    coverage, risk = risk_coverage(p, y)
    assert coverage.tolist() == [0.25, 0.5, 0.75, 1.0] and risk.tolist() == pytest.approx([0, 0.5, 2 / 3, 0.75])
