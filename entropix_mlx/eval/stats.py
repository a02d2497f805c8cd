"""Statistics: Wilson intervals, the exact sign test and the paired comparison
against greedy, all in exact or closed form (no SciPy).

Accuracy has a 95% Wilson score interval; for stochastic samplers the mean and
standard deviation over the seeds' runs. The paired comparison against greedy works
per item on any per-item value (share of correct runs, or an open-text metric):
wins / losses / ties count items where the sampler is better / worse / equal,
and the p-value is the exact two-sided sign test on wins vs losses (with one seed
and 0/1 values this is the exact McNemar test). Between any two samplers
the same comparison holds, with the per-item difference's 95% interval
(`paired_difference`); p-values of several rows are adjusted with Holm's
method (`holm`).
"""

import math
from fractions import Fraction

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal distribution


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (successes may be a mean, not an
    integer). n = 0 gives (0, 1): nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At p = 0 or 1 one end is exactly 0 or 1; say so rather than 1e-17 off.
    lo = 0.0 if successes <= 0 else max(0.0, center - half)
    hi = 1.0 if successes >= n else min(1.0, center + half)
    return lo, hi


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided binomial (sign / McNemar) test of wins vs losses under
    p = 1/2; ties do not count. Computed with integers, so it is exact."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, float(Fraction(2 * tail, 2**n)))


def paired_comparison(sampler: dict[int, float], greedy: dict[int, float], higher_is_better: bool = True) -> dict:
    """Per item (index -> value, e.g. the share of correct runs): wins, losses,
    ties, p-value. A win is a higher value, or a lower one when `higher_is_better`
    is False (e.g. a share of repeated n-grams)."""
    items = sorted(set(sampler) & set(greedy))
    sign = 1 if higher_is_better else -1
    wins = sum(sign * (sampler[i] - greedy[i]) > 0 for i in items)
    losses = sum(sign * (sampler[i] - greedy[i]) < 0 for i in items)
    return {"wins": wins, "losses": losses, "ties": len(items) - wins - losses, "p_value": sign_test(wins, losses)}


def paired_difference(a: dict[int, float], b: dict[int, float], z: float = Z95) -> dict:
    """Mean per-item difference a - b (e.g. of accuracy: items right) over the
    items both have, with a 95% interval from the normal approximation to the
    per-item differences (for 0/1 values, the Wald interval of a paired
    difference of proportions). Several seeds enter as each item's share of
    correct runs, so the interval counts items, not runs."""
    items = sorted(set(a) & set(b))
    n = len(items)
    if n == 0:
        return {"difference": 0.0, "ci95": [0.0, 0.0], "n": 0}
    d = [a[i] - b[i] for i in items]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(var / n)
    return {"difference": mean, "ci95": [mean - half, mean + half], "n": n}


def holm(p_values: dict) -> dict:
    """Holm's step-down adjustment of several p-values ({name: p} -> {name:
    adjusted p}): it keeps the chance of any false discovery among them at the
    nominal level, whichever are true."""
    order = sorted(p_values, key=lambda k: p_values[k])
    m, running, out = len(order), 0.0, {}
    for rank, key in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[key]))
        out[key] = running
    return out
