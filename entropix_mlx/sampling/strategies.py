"""The strategies, in one table: each one's name, style and meaning and, for
Entropix's, the state of the metrics that takes it. The decision (`decide`), the
sampler's plan, the legends and calibration read it.

One style per strategy, argmax included, so that a reader of the terminal or the
page can tell each token's origin. Styles are plain style strings ("default
underline"): the terminal hands them to Rich, the server turns them into CSS.
argmax, the model's own first choice and most of any answer, is the terminal's
own text colour ("default"), so the other decisions stand out. The colours that
share a legend stay apart also for protanopes, deuteranopes and tritanopes
(tests/test_colours.py); the theme's green and yellow, once argmax's and
branch's, nearly merge for the first two."""

import math
import operator
import zlib
from dataclasses import dataclass

COMPARE = {"<": operator.lt, ">": operator.gt}


@dataclass(frozen=True)
class Strategy:
    """One strategy: its name, its style, and, for Entropix's, the state it
    takes. `when`: clauses (metric, "<" or ">", threshold field), all of which
    hold in its state; `or_margin`: a field that, when above 0, also gives the
    state to a step whose top-1 margin (bits) is at least it. Entropix checks its
    states top to bottom (`decide`): the first that holds wins, and one that
    holds no clause is the fallback."""

    name: str
    color: str
    meaning: str
    when: tuple[tuple[str, str, str], ...] | None = None  # None: not one of Entropix's states
    or_margin: str | None = None

    def holds(self, metrics: dict, config, margin: float = 0.0) -> bool:
        if self.or_margin and getattr(config, self.or_margin) > 0 and margin >= getattr(config, self.or_margin):
            return True
        return all(COMPARE[op](metrics[m], getattr(config, field)) for m, op, field in self.when)


STRATEGY_TABLE = (
    Strategy(
        "argmax",
        "default",
        "the likeliest token",
        (("entropy", "<", "low_entropy"), ("varentropy", "<", "low_varentropy")),
        or_margin="argmax_margin",
    ),
    Strategy(
        "think",
        "magenta",
        "a pause inserted, or a token at a raised temperature",
        (("entropy", ">", "medium_entropy"), ("varentropy", "<", "think_varentropy")),
    ),
    Strategy(
        "branch",
        "yellow",
        "candidates rolled out a few tokens, the best path kept",
        (("entropy", "<", "high_entropy"), ("varentropy", ">", "high_varentropy")),
    ),
    Strategy(
        "resample",
        "red",
        "a token at a high temperature",
        (("entropy", ">", "medium_entropy"), ("varentropy", ">", "high_varentropy")),
    ),
    Strategy("adaptive", "bright_blue", "the best of a few tokens drawn at a temperature from the metrics", ()),
    Strategy("sample", "cyan", "a token drawn at the sampler's temperature"),
    Strategy("split", "default underline", "deliberate: a greedy token where branches split off"),
)
ENTROPIX_STRATEGIES = tuple(s for s in STRATEGY_TABLE if s.when is not None)
ENTROPIX_NAMES = tuple(s.name for s in ENTROPIX_STRATEGIES)
FALLBACK = next(s.name for s in ENTROPIX_STRATEGIES if not s.when)
STRATEGY_COLORS = {s.name: s.color for s in STRATEGY_TABLE}
# For strategies a future sampler may add: still one distinct colour each.
SPARE_COLORS = ("bright_magenta", "bright_cyan", "bright_yellow", "bright_red", "bright_green", "blue")


def decide(metrics: dict, config, margin: float = 0.0) -> str:
    """Entropix's strategy for a step with these metrics (entropy, varentropy):
    the first state of the table that holds; a state whose strategy the config
    leaves out falls through to the fallback."""
    state = next(s.name for s in ENTROPIX_STRATEGIES if s.holds(metrics, config, margin))
    return state if state in config.strategies else FALLBACK


def threshold_condition(field: str) -> tuple[tuple[str, str, str], ...]:
    """The other clauses of the state whose clauses read threshold `field`:
    where that threshold decides (calibration measures it among those steps)."""
    for s in ENTROPIX_STRATEGIES:
        fields = [f for _, _, f in s.when]
        if field in fields:
            return tuple(c for c in s.when if c[2] != field)
    return ()


def strategy_color(strategy: str) -> str:
    """Its style; a strategy without one gets a spare colour picked by its name,
    so it is the same in every process and on every page."""
    if strategy in STRATEGY_COLORS:
        return STRATEGY_COLORS[strategy]
    return SPARE_COLORS[zlib.crc32(strategy.encode()) % len(SPARE_COLORS)]


def max_entropy(vocabulary: int) -> float:
    """The largest entropy (bits) a distribution over `vocabulary` tokens can
    have, log2 of it, rounded down to a card's 4 decimals."""
    return math.floor(math.log2(vocabulary) * 1e4) / 1e4


def unreachable(config, vocabulary: int | None = None) -> set[str]:
    """Entropix strategies that `config`'s thresholds leave no step to (see
    `decide`): think below a varentropy of 0 or less (none is negative);
    resample, which takes the high-varentropy steps that branch leaves, those at
    or above high_entropy, when that is the most a `vocabulary` allows."""
    out = set()
    if config.think_varentropy <= 0:
        out.add("think")
    if "branch" in config.strategies and vocabulary and config.high_entropy >= max_entropy(vocabulary):
        out.add("resample")
    return out
