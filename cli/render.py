"""How tokens look in the terminal: each strategy in its colour
(entropix_mlx/sampling/strategies.py), the legend, the summary line.

A reader (or a test reading the escape codes) can tell each token's origin by
its colour. Plain output (not a terminal, `--no-color`, or NO_COLOR set) is the
same text without styles.
"""

import json
import sys

from rich.console import Console
from rich.text import Text

from entropix_mlx.sampling.strategies import strategy_color

META_STYLE = "dim"


def make_console(stderr: bool = False, no_color: bool = False) -> Console:
    """A console that writes text as is: no markup, emoji codes, highlighting or
    wrapping (a token must never be split or rewritten). Built per command, so
    that it sees the streams in use at that time (tests swap them)."""
    return Console(
        file=sys.stderr if stderr else sys.stdout,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=True,
        **({"color_system": None} if no_color else {}),
    )


def token_text(text: str, strategy: str) -> Text:
    return Text(text, style=strategy_color(strategy))


def write_token(console: Console, text: str, strategy: str, color: bool):
    """Stream one token: coloured, or exactly as generated (Rich would expand tabs)."""
    if color:
        console.print(token_text(text, strategy), end="")
    else:
        console.file.write(text)
    console.file.flush()


def legend(strategies) -> Text:
    """One line: '■ argmax  ■ think ...', each entry in its strategy's colour."""
    line = Text()
    line.append("strategies: ", style=META_STYLE)  # append: a Text's own style would tint every entry
    for i, name in enumerate(strategies):
        if i:
            line.append("  ")
        line.append(f"■ {name}", style=strategy_color(name))
    return line


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def strategy_counts(counts: dict) -> Text:
    line = Text()
    for i, (name, n) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1])):
        if i:
            line.append(", ", style=META_STYLE)
        line.append(f"{name} {n}", style=strategy_color(name))
    return line


def fields_table(fields: list[dict]) -> Text:
    """A structured answer's values, each with its lowest and mean confidence;
    the least sure first marked, so the guesses stand out."""
    out = Text("fields (lowest / mean confidence of their tokens):", style=META_STYLE)
    width = max((len(f["path"]) for f in fields), default=0)
    for f in fields:
        low, mean = f["min_confidence"], f["mean_confidence"]
        value = json.dumps(f["value"], ensure_ascii=False)
        value = value if len(value) <= 40 else value[:39] + "…"
        out.append(f"\n  {f['path']:<{width}}  {value:<40}  ", style=META_STYLE)
        out.append(f"{low:.2f} / {mean:.2f}", style="bold red" if low < 0.5 else META_STYLE)
    return out


def summary_line(
    summary, prefilled: int | None = None, every_seed: bool = False, confidence: dict | None = None
) -> Text:
    """'42 tokens · prompt 310.2 tok/s · generation 6.9 tok/s · peak 0.31 GB · argmax 30, ... · stopped: eos'.
    `every_seed`: the sampler may sample, but no token of this answer was drawn; `confidence`:
    `LoadedModel.confidence` of the answer."""
    parts = [plural(summary.tokens, "token")]
    if prefilled is not None:
        parts.append(f"prefilled {prefilled}")
    parts += [f"prompt {summary.prompt_tps:.1f} tok/s"] if summary.prompt_tps else []  # deliberate: not measured
    parts += [f"generation {summary.generation_tps:.1f} tok/s", f"peak {summary.peak_memory_gb:.2f} GB"]
    line = Text()
    line.append(" · ".join(parts), style=META_STYLE)
    if summary.strategy_counts:
        line.append(" · ", style=META_STYLE)
        line.append_text(strategy_counts(summary.strategy_counts))
    if getattr(summary, "deliberation", None):  # deliberate: what the branches cost, who won
        d = summary.deliberation
        winner = "the greedy answer" if d["chosen"] == 0 else f"branch {d['chosen']}"
        branches = f"{summary.branches} branch{'' if summary.branches == 1 else 'es'}"
        line.append(
            f" · {branches}, {summary.tokens_spent} tokens spent "
            f"(budget {summary.budget:g}× the longest) · chose {winner}",
            style=META_STYLE,
        )
    if summary.thinking_insertions:
        line.append(f" · {plural(summary.thinking_insertions, 'thinking insertion')}", style=META_STYLE)
    if every_seed:
        line.append(" · no token drawn: every seed gives this answer", style=META_STYLE)
    line.append(f" · stopped: {summary.finish_reason}", style=META_STYLE)
    if confidence is not None:
        line.append(f" · {confidence_text(confidence)}", style=META_STYLE)
    return line


def confidence_text(confidence: dict) -> str:
    """'confidence 0.23 (unsure)', or 'confidence uncalibrated' for a model without a fitted one."""
    if confidence["confidence"] is None:
        return "confidence uncalibrated"
    return f"confidence {confidence['confidence']:.2f} ({confidence['verdict']})"
