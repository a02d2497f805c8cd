"""Strategy colours for the page: the terminal's own (sampling/strategies.py), as
the hex values of the theme `docs/run.svg` is drawn with (Rich's SVG export
theme), so a token looks the same in the terminal recording and on the page. A
style may add more than a colour (e.g. "default underline"): underline, bold and
italic carry over as CSS; "default" is the theme's text colour."""

from ..front.registry import legend
from ..sampling.strategies import SPARE_COLORS, STRATEGY_COLORS, STRATEGY_TABLE, strategy_color

DECORATIONS = ("underline", "bold", "italic")
# The theme's 16 terminal colours, by their style names.
THEME_COLORS = {
    "black": "#4b4e55",
    "red": "#cc555a",
    "green": "#98a84b",
    "yellow": "#d0b344",
    "blue": "#608ab1",
    "magenta": "#98729f",
    "cyan": "#68a0b3",
    "white": "#c5c8c6",
    "bright_black": "#9a9b99",
    "bright_red": "#ff2627",
    "bright_green": "#00823d",
    "bright_yellow": "#d08442",
    "bright_blue": "#1984e9",
    "bright_magenta": "#ff2c7a",
    "bright_cyan": "#398280",
    "bright_white": "#fdfdc5",
}
THEME_FOREGROUND = "#c5c8c6"
THEME_BACKGROUND = "#292929"


def css_color(style: str) -> str:
    colors = [word for word in style.split() if word not in DECORATIONS]
    return THEME_COLORS[colors[0]] if colors and colors[0] != "default" else THEME_FOREGROUND


def page_info(sampler_names, entropix_config=None, vocabulary: int | None = None) -> dict:
    """Colours (and decorations) of every known strategy, a few spares for
    strategies a future sampler adds, and each sampler's legend (Entropix's: the
    strategies the served card leaves on and gives steps to, as in the terminal)."""
    styles = {name: strategy_color(name) for name in STRATEGY_COLORS}
    decorations = {name: [d for d in DECORATIONS if d in s.split()] for name, s in styles.items()}
    return {
        "colors": {name: css_color(s) for name, s in styles.items()},
        "decorations": {name: d for name, d in decorations.items() if d},
        "spare_colors": [css_color(c) for c in SPARE_COLORS],
        "legends": {name: legend(name, entropix_config, vocabulary) for name in sampler_names},
        "meanings": {s.name: s.meaning for s in STRATEGY_TABLE},
        "background": THEME_BACKGROUND,
    }
