"""Strategy colours for the page: the terminal's own (cli/render.py), as the
hex values of the theme `docs/run.svg` is drawn with, so a token looks the same
in the terminal recording and on the page."""

from rich.color import Color
from rich.terminal_theme import SVG_EXPORT_THEME

from ..cli import render


def css_color(strategy: str) -> str:
    return Color.parse(render.strategy_color(strategy)).get_truecolor(SVG_EXPORT_THEME).hex


def page_info(sampler_names) -> dict:
    """Colours of every known strategy, a few spares for strategies a future
    sampler adds, and each sampler's legend."""
    strategies = {name: css_color(name) for name in list(render.STRATEGY_COLORS)}
    spares = [Color.parse(c).get_truecolor(SVG_EXPORT_THEME).hex for c in render.SPARE_COLORS]
    legends = {name: render.SAMPLER_STRATEGIES.get(name, []) for name in sampler_names}
    return {"colors": strategies, "spare_colors": spares, "legends": legends,
            "background": SVG_EXPORT_THEME.background_color.hex}
