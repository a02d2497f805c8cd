"""eval's tables on the terminal: accuracy with its cost and the paired
comparison, or open-text quality (Rich)."""

from rich.console import Console


def _console():
    """stdout's console; when it is a file or a pipe (no terminal width to fit), wide
    enough that table cells do not wrap (rich assumes 80 columns there)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _range(results: dict) -> str:
    """Which items, when they are one run of the file's lines (a split's items are
    scattered over the file: their lines would read as a puzzle, "0-1, 3, 5-9")."""
    items = results.get("item_range", "")
    return f" ({items})" if items and "," not in items else ""


def print_table(results: dict):
    from rich.table import Table

    from entropix_mlx.eval import strategy_text, table_rows

    rows = table_rows(results, strategies=False)
    split = results.get("split", "all")
    where = f"{results['tasks']} ({split} split)" if split != "all" else results["tasks"]
    if results.get("cot"):
        where += ", chain of thought"
    budget = results["max_tokens"]
    budget = " or ".join(map(str, budget)) if isinstance(budget, list) else budget
    table = Table(
        title=f"{results['model']} on {where}: {results['items']} items{_range(results)}, "
        f"at most {budget} tokens per answer"
    )
    for column in rows[0]:
        table.add_column(
            column, justify="left" if column == "sampler" else "right", no_wrap=column in ("sampler", "tok/s", "p")
        )
    for r in rows:
        table.add_row(*r.values())
    console = _console()
    console.print(table)
    for name, summary in results["samplers"].items():
        text = strategy_text(name, summary)
        if text:
            console.print(f"{name} tokens by strategy: {text}")
    for name, summary in results["samplers"].items():
        if summary.get("categories"):
            shares = ", ".join(f"{c} {100 * v['accuracy']:.0f}% of {v['n']}" for c, v in summary["categories"].items())
            console.print(f"{name} by category: {shares}")
    console.print(
        "gen tokens: generated per answer, every candidate counted; s/answer: wall seconds; cut off: "
        "answers the token limit ended; no answer: nothing to read. W/L/T: items the sampler got right "
        "and greedy (at the same budget) wrong / the reverse / the same; diff: accuracy difference in "
        "points with its 95% interval; p: exact two-sided sign test (McNemar); p Holm: adjusted over the rows.",
        style="dim",
    )
    scorings = results.get("scorings", [])
    if len(scorings) > 1:
        console.print(
            f"these items have been scored {len(scorings)} times (the log is scoring_log.jsonl in the --out "
            f"directory); the first: {scorings[0]['time']}",
            style="dim",
        )


def print_open_table(results: dict):
    from rich.table import Table

    from entropix_mlx.eval import open_table_rows

    rows = open_table_rows(results)
    table = Table(
        title=f"{results['model']}: open text on {results['prompts']}, {results['items']} prompts, "
        f"at most {results['max_tokens']} tokens"
    )
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "sampler" else "right", no_wrap=column == "sampler")
    for r in rows:
        table.add_row(*r.values())
    console = _console()
    console.print(table)
    console.print(
        f"rep-4: share of 4-grams already seen earlier in the same output (lower: less repetition); "
        f"distinct-2: distinct bigrams / bigrams; loop: longest back-to-back repeated span, in tokens; "
        f"mean logprob: nats per token under the model (higher: more coherent); early: ended before "
        f"{results['early_tokens']} tokens. W/L/T: prompts with less / more / equal repetition than "
        f"greedy; p: exact two-sided sign test.",
        style="dim",
    )
