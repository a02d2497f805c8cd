"""The strategy table: Entropix's decision in the table's order, the fallback for a
strategy left out, the margin rule, and what the other readers take from it."""

import numpy as np

from entropix_mlx.eval.calibrate import QUANTILES, thresholds
from entropix_mlx.sampling.config import SamplerConfig
from entropix_mlx.sampling.strategies import (
    ENTROPIX_NAMES,
    FALLBACK,
    STRATEGY_COLORS,
    decide,
    strategy_color,
    threshold_condition,
    unreachable,
)


def state(entropy: float, varentropy: float, config: SamplerConfig, margin: float = 0.0) -> str:
    return decide({"entropy": entropy, "varentropy": varentropy}, config, margin)


def test_the_decision_follows_the_tables_order_and_falls_back_for_a_strategy_left_out():
    c = SamplerConfig()
    assert ENTROPIX_NAMES == ("argmax", "think", "branch", "resample", "adaptive") and FALLBACK == "adaptive"
    assert state(0.05, 0.05, c) == "argmax"
    assert state(4.0, 0.05, c) == "think"  # above medium entropy, varentropy low
    assert state(4.0, 6.0, c) == "branch"  # branch is checked before resample
    assert state(5.5, 6.0, c) == "resample"
    assert state(1.0, 1.0, c) == "adaptive"
    no_think = c.replace(strategies=["argmax", "branch", "resample", "adaptive"])
    assert state(4.0, 0.05, no_think) == "adaptive"


def test_a_clear_top_token_is_argmax_only_when_the_margin_rule_is_on():
    c = SamplerConfig(argmax_margin=3.0)
    assert state(4.0, 6.0, c, margin=3.0) == "argmax"
    assert state(4.0, 6.0, c, margin=2.9) == "branch"
    assert state(4.0, 6.0, SamplerConfig(), margin=50.0) == "branch"  # off by default


def test_calibration_measures_think_varentropy_where_thinks_other_clause_holds():
    assert threshold_condition("think_varentropy") == (("entropy", ">", "medium_entropy"),)
    rng = np.random.default_rng(0)
    samples = {"entropy": rng.uniform(0, 8, 5000), "varentropy": rng.uniform(0, 20, 5000)}
    found = thresholds(samples)
    uncertain = samples["varentropy"][samples["entropy"] > found["medium_entropy"]]
    assert found["think_varentropy"] == round(float(np.quantile(uncertain, QUANTILES["think_varentropy"][1])), 4)
    assert found["think_varentropy"] != round(float(np.quantile(samples["varentropy"], 0.30)), 4)


def test_every_strategy_has_its_own_style_and_an_unknown_one_a_stable_spare():
    assert len(set(STRATEGY_COLORS.values())) == len(STRATEGY_COLORS)
    assert strategy_color("lookahead") == strategy_color("lookahead") not in STRATEGY_COLORS.values()
    assert unreachable(SamplerConfig(think_varentropy=0.0)) == {"think"}
