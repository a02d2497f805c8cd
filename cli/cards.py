"""A model without a card gets one on its first use (entropix_mlx/eval/usercard.py):
a progress bar while it is measured, then one line saying where it went."""

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from entropix_mlx.eval.usercard import ensure_card

from . import render


def ensure_model_card(llm, tokenizer, source, no_color: bool = False):
    """The model's card (`usercard.CardStatus`), measured now with a progress bar on stderr if it has none."""
    console = render.make_console(stderr=True, no_color=no_color)
    bar: dict = {}

    def progress(i, n):
        if not bar:
            console.print(
                f"{source.name} has no card yet: measuring it once ({n} tokens of short answers to built-in "
                "prompts, seconds to a minute); later starts reuse it",
                style=render.META_STYLE,
            )
            bar["p"] = Progress(
                TextColumn("measuring"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tokens"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=True,
                disable=not console.is_terminal,  # a bar drawn into a pipe is noise: the line after says it all
            )
            bar["p"].start()
            bar["task"] = bar["p"].add_task("", total=n)
        bar["p"].update(bar["task"], completed=i)

    try:
        status = ensure_card(llm, tokenizer, source, progress=progress, warn=lambda line: console.print(line))
    finally:
        if bar:
            bar["p"].stop()
    if status.note:
        console.print(status.note, style=render.META_STYLE)
    return status
