"""How `--sampler deliberate` shows its work in the terminal: one line per
candidate as it finishes (where it split off, its length, the start of its
text), on stderr, before the chosen answer is printed in colour."""

from rich.text import Text

from entropix_mlx.sampling.strategies import strategy_color

from . import render


def _snippet(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def deliberation_progress(console, tokenizer, color: bool):
    """A callback for `DeliberateGeneration.on_row`: prints each finished row."""
    state = {"done": 0, "tokens": 0}

    def show(result):
        state["done"] += 1
        own = len(result.tokens) - (result.split or 0)
        state["tokens"] += own
        line = Text()
        line.append(f"[{state['done']} done · {state['tokens']} tokens] ", style=render.META_STYLE)
        if result.parent is None:
            line.append("greedy", style=strategy_color("argmax") if color else "")
        else:
            first = tokenizer.decode(result.tokens[result.split : result.split + 1])
            line.append(f"branch at token {result.split}", style=strategy_color("branch") if color else "")
            line.append(f" ({first!r} instead)", style=render.META_STYLE)
        line.append(f" · {own} tokens · {_snippet(tokenizer.decode(result.tokens))!r}", style=render.META_STYLE)
        console.print(line)

    return show
