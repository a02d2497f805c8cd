"""How each strategy looks: one style per strategy, argmax included, so that a
reader of the terminal or the page can tell each token's origin. Styles are
plain style strings ("default underline"): the terminal hands them to Rich, the
server turns them into CSS.

argmax, the model's own first choice and most of any answer, is the terminal's
own text colour ("default"), so the other decisions stand out. The colours that
share a legend stay apart also for protanopes, deuteranopes and tritanopes
(tests/test_colours.py); the theme's green and yellow, once argmax's and
branch's, nearly merge for the first two."""

import math
import zlib

# The stable strategy names of the samplers (entropix: the first five; baselines: argmax, sample).
STRATEGY_COLORS = {
    "argmax": "default",
    "think": "magenta",
    "branch": "yellow",
    "resample": "red",
    "adaptive": "bright_blue",
    "sample": "cyan",
    "split": "default underline",  # deliberate: a greedy token where branches split off (marked)
}
# For strategies a future sampler may add: still one distinct colour each.
SPARE_COLORS = ("bright_magenta", "bright_cyan", "bright_yellow", "bright_red", "bright_green", "blue")


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
    entropix.decide): think below a varentropy of 0 or less (none is negative);
    resample, which takes the high-varentropy steps that branch leaves, those at
    or above high_entropy, when that is the most a `vocabulary` allows."""
    out = set()
    if config.think_varentropy <= 0:
        out.add("think")
    if "branch" in config.strategies and vocabulary and config.high_entropy >= max_entropy(vocabulary):
        out.add("resample")
    return out
