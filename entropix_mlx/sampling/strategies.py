"""How each strategy looks: one style per strategy, argmax included, so that a
reader of the terminal or the page can tell each token's origin. Styles are
plain style strings ("default underline"): the terminal hands them to Rich, the
server turns them into CSS.

argmax, the model's own first choice and most of any answer, is the terminal's
own text colour ("default"), so the other decisions stand out. The colours that
share a legend stay apart also for protanopes, deuteranopes and tritanopes
(tests/test_colours.py); the theme's green and yellow, once argmax's and
branch's, nearly merge for the first two."""

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
SPARE_COLORS = ["bright_magenta", "bright_cyan", "bright_yellow", "bright_red", "bright_green", "blue"]

# Which strategies each sampler can produce, for the legend.
SAMPLER_STRATEGIES = {
    "entropix": ["argmax", "think", "branch", "resample", "adaptive"],
    "greedy": ["argmax"],
    "temperature": ["sample", "argmax"],  # temperature 0 is greedy
    "min_p": ["sample", "argmax"],
    "deliberate": ["argmax", "split", "branch"],
}


def strategy_color(strategy: str) -> str:
    if strategy not in STRATEGY_COLORS:
        STRATEGY_COLORS[strategy] = SPARE_COLORS[(len(STRATEGY_COLORS) - 6) % len(SPARE_COLORS)]
    return STRATEGY_COLORS[strategy]


def legend_strategies(name: str, config=None) -> list[str]:
    """The strategies sampler `name` can choose: an Entropix config may switch some
    off (adaptive, the fallback, always stays)."""
    enabled = getattr(config, "strategies", None)
    if name == "entropix" and enabled:
        return [s for s in SAMPLER_STRATEGIES["entropix"] if s in enabled or s == "adaptive"]
    return list(SAMPLER_STRATEGIES.get(name, []))


def sampler_strategies(sampler) -> list[str]:
    """The strategies this sampler instance can choose (its own config decides)."""
    return legend_strategies(sampler.name, getattr(sampler, "config", None))
