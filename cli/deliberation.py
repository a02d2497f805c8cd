"""How `--sampler deliberate` shows its work in the terminal: one line per
candidate as it finishes (its number, where it split off, its length, the start
of its text), on stderr, before the chosen answer is printed in colour. A
branch's number is the one the summary and --json give it (its place in
`Deliberation.candidates`: the greedy answer is 0, branches by row), not the
order in which candidates happened to finish."""

from rich.table import Table
from rich.text import Text

from entropix_mlx.sampling.selection import short_answer
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
            # One request per deliberation here: its rows are numbered 0 (greedy), 1, 2, ...
            line.append(f"branch {result.row}", style=strategy_color("branch") if color else "")
            line.append(f" at token {result.split} ({first!r} instead)", style=render.META_STYLE)
        ending = {"eos": "", "stopped": " (stopped early: the vote was decided)"}.get(
            result.finish_reason, f" (stopped: {result.finish_reason})"
        )
        line.append(f" · {own} tokens{ending} · {_snippet(tokenizer.decode(result.tokens))!r}", style=render.META_STYLE)
        console.print(line)

    return show


def deliberation_table(deliberation: dict, color: bool) -> Table:
    """Why `deliberate` chose: each candidate's answer, confidence, score (a vote's
    share), how it ended and why it did not compete, then the rule that picked the winner."""
    table = Table(box=None, pad_edge=False, caption=f"rule: {deliberation['reason']}", caption_justify="left")
    for column in ("candidate", "answer", "confidence", "score", "tokens", "ended"):
        table.add_column(column, justify="left" if column in ("candidate", "answer", "ended") else "right")
    for i, row in enumerate(deliberation.get("table", [])):
        chosen = i == deliberation["chosen"]
        ended = {"eos": "on its own", "stopped": "stopped early: the vote was decided"}.get(row["ended"], row["ended"])
        if row["left_out"] and row["ended"] != "stopped":
            ended += f" (left out: {row['left_out']})"
        score = "" if row["score"] is None else f"{row['score']:.3f}"
        name = row["candidate"] + (" (chosen)" if chosen else "")
        style = ("bold" if chosen else "") if color else ""
        table.add_row(
            name, short_answer(row["answer"]), f"{row['confidence']:.3f}", score, str(row["tokens"]), ended, style=style
        )
    return table
