"""Strategy colours for the page: the terminal's own (cli/render.py), as the
hex values of the theme `docs/run.svg` is drawn with, so a token looks the same
in the terminal recording and on the page. A terminal style may add more than a
colour (e.g. "green underline"): underline, bold and italic carry over as CSS."""

from rich.style import Style
from rich.terminal_theme import SVG_EXPORT_THEME

from ..cli import render

DECORATIONS = ("underline", "bold", "italic")


def _style(name: str) -> Style:
    return Style.parse(name)


def css_color(style: str) -> str:
    color = _style(style).color
    return (color.get_truecolor(SVG_EXPORT_THEME) if color is not None else SVG_EXPORT_THEME.foreground_color).hex


def page_info(sampler_names, entropix_config=None) -> dict:
    """Colours (and decorations) of every known strategy, a few spares for
    strategies a future sampler adds, and each sampler's legend (Entropix's: the
    strategies the served card leaves on, as in the terminal)."""
    styles = {name: render.strategy_color(name) for name in list(render.STRATEGY_COLORS)}
    decorations = {name: [d for d in DECORATIONS if getattr(_style(s), d)] for name, s in styles.items()}
    return {
        "colors": {name: css_color(s) for name, s in styles.items()},
        "decorations": {name: d for name, d in decorations.items() if d},
        "spare_colors": [css_color(c) for c in render.SPARE_COLORS],
        "legends": {name: render.legend_strategies(name, entropix_config) for name in sampler_names},
        "background": SVG_EXPORT_THEME.background_color.hex,
    }
