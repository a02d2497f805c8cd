"""`entropix-mlx eval TASKS.jsonl`: accuracy of each sampler, with intervals and
a paired comparison against greedy; `eval --open [PROMPTS.txt]`: open-text
quality (repetition, loops, log-probability, early endings). The table (or, with
--json, one JSON object) goes to stdout; the progress bar goes to stderr."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.decode.registry import SAMPLER_NAMES, make_sampler
from entropix_mlx.distributed import check_same_model, world
from entropix_mlx.errors import ConfigError
from entropix_mlx.model.loading import resolve
from entropix_mlx.sampling.config import resolve_config
from entropix_mlx.sampling.deliberate_config import resolve_deliberate
from entropix_mlx.sampling.settings import read_toml

from .options import ModelOpt, WeightsOpt
from .run import load_model

# entropix_mlx.eval, rich.progress and rich.table are imported in the functions that use
# them: app.py imports every command's module at each start (--help too), and only eval
# needs them.

DEFAULT_OPEN_TOKENS = 64  # = entropix_mlx.eval.DEFAULT_OPEN_TOKENS (not imported: see above)

# Short answers need few tokens, and 8 rows per batch keep both cores of a small
# CPU busy. A chain of thought needs room to reason (GSM8K solutions run to ~100-200
# tokens); open text is judged on its first 64 tokens.
DEFAULT_MAX_TOKENS = 32
COT_MAX_TOKENS = 256
DEFAULT_BATCH_SIZE = 8
DEFAULT_SAMPLERS = "greedy,entropix"


def _samplers(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SAMPLER_NAMES]
    if not names or unknown:
        raise ConfigError(
            f"--samplers {value!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
            f"give a comma-separated list of: {', '.join(SAMPLER_NAMES)}"
        )
    return list(dict.fromkeys(names))


def eval_command(
    tasks: Annotated[
        Path | None,
        typer.Argument(
            help="JSON Lines task file (question, answer, optional choices, prompt, split, category); "
            "with --open, a text file with one prompt per line.",
            show_default=False,
        ),
    ] = None,
    builtin: Annotated[
        bool,
        typer.Option(
            "--builtin",
            help="Use the built-in task file (393 short arithmetic and factual questions, about half dev, half test).",
        ),
    ] = False,
    open_text: Annotated[
        bool,
        typer.Option(
            "--open",
            help="Open-text quality instead of accuracy: each sampler writes for each prompt of "
            "PROMPTS.txt (default: 24 built-in prompts).",
        ),
    ] = False,
    cot: Annotated[
        bool,
        typer.Option(
            "--cot",
            help="Chain of thought: the model reasons step by step and ends with 'Answer: ...'; "
            "the answer is read from its last line. For larger models.",
        ),
    ] = False,
    model: ModelOpt = None,
    samplers: Annotated[
        str,
        typer.Option(
            "--samplers", help=f"Comma-separated, from: {', '.join(SAMPLER_NAMES)}. Greedy always runs (the baseline)."
        ),
    ] = DEFAULT_SAMPLERS,
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            show_default="test",
            help="Items of the dev split (tune on it), the test split (report it) or all. "
            "Items without a split field are test.",
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N items (of the split).")] = None,
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, help="Runs per stochastic sampler, with seeds --seed, --seed+1, ...")
    ] = 1,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**62, help="First run seed.")] = 0,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            min=1,
            show_default=f"{DEFAULT_MAX_TOKENS}; {COT_MAX_TOKENS} with --cot; {DEFAULT_OPEN_TOKENS} with --open",
            help="Most tokens per answer.",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Answers decoded together (results do not depend on it).")
    ] = DEFAULT_BATCH_SIZE,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            show_default="the model card",
            help="Entropix sampler settings: a TOML file or a preset (reference, calibrated). "
            "A TOML file's \\[deliberate] table sets deliberate.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object.")] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory for results.json and items.jsonl; rerunning with the same DIR resumes."),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Draw accuracy with 95% intervals (with --open: repetition against log-probability) to a PNG.",
        ),
    ] = None,
    weights: WeightsOpt = default_weights(),
):
    """Accuracy of each sampler on a task file: 95% Wilson intervals, mean tokens,
    tokens/s, strategy shares, and wins/losses/ties against greedy on the same
    items with an exact sign-test (McNemar) p-value. With --open: repeated
    4-grams, distinct-2, loops, mean log-probability and early endings of free
    writing, against greedy."""
    from entropix_mlx import eval as ev

    names = _samplers(samplers)
    if open_text:
        if "deliberate" in names:  # it picks among whole answers by their task's answer
            raise ConfigError("--samplers deliberate is for task files; --open measures free writing")
        if cot:
            raise ConfigError("--cot is for task files; --open measures free writing (use one of them)")
        if split is not None:
            raise ConfigError("--split selects task file items; --open prompts have no split")
        if builtin and tasks is not None:
            raise ConfigError("give a prompt file or --builtin (or neither, for the built-in prompts)")
    elif builtin == (tasks is not None):
        raise ConfigError("give a task file or --builtin (one of them)")
    split = split or "test"
    if split not in ev.SPLIT_CHOICES:
        raise ConfigError(f"--split {split!r}: give dev, test or all")
    if plot is not None:
        if plot.suffix.lower() != ".png":
            raise ConfigError(f"--plot {plot}: give a file name ending in .png")
        try:  # matplotlib: an optional extra, only for --plot
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot needs matplotlib: pip install 'entropix-mlx[plot]'") from None
    # A TOML file's [deliberate] table sets deliberate; the rest of --config is Entropix's.
    for_deliberate = config is not None and str(config).endswith(".toml") and "deliberate" in read_toml(config)
    if config is not None and "entropix" not in names and not ("deliberate" in names and for_deliberate):
        raise ConfigError(
            "--config sets the entropix sampler (and deliberate, from a [deliberate] table), "
            "which --samplers does not include"
        )
    if open_text:
        path = tasks if tasks is not None else ev.builtin_prompts_path()
        task_list = ev.load_prompts(path)[:limit]
    else:
        path = ev.builtin_tasks_path() if builtin else tasks
        task_list = ev.select_split(ev.load_tasks(path), split)[:limit]
        if not task_list:
            raise ConfigError(f"{Path(path).name} has no {split} items; try --split all")
    if max_tokens is None:
        max_tokens = DEFAULT_OPEN_TOKENS if open_text else COT_MAX_TOKENS if cot else DEFAULT_MAX_TOKENS
    source = resolve(model)
    if "entropix" in names:  # a bad --config fails now, not after the model loads
        resolve_config(source.name, config)
    if "deliberate" in names and for_deliberate:
        resolve_deliberate(source.name, config)
    w = world()  # under mlx.launch: each rank answers a share of the items, rank 0 prints
    check_same_model(w, source.path)
    llm, tokenizer, source = load_model(model, weights, card=bool({"entropix", "deliberate"} & set(names)))

    def factory(name):  # the records hold neither metrics nor greedy's log-probabilities
        return make_sampler(
            name,
            tokenizer=tokenizer,
            model_name=source.name,
            config=config if name == "entropix" or (name == "deliberate" and for_deliberate) else None,
            metrics=False,
            logprobs=False,
        )

    common = dict(
        samplers=names, seeds=seeds, seed=seed, max_tokens=max_tokens, batch_size=batch_size, model_name=source.name
    )
    if open_text:
        cfg = ev.OpenConfig(**common, tasks_name="builtin prompts" if tasks is None else Path(path).name)
        run = ev.run_open
    else:
        cfg = ev.EvalConfig(**common, tasks_name="builtin" if builtin else Path(path).name, split=split, cot=cot)
        run = ev.run_eval
    try:
        if w.root:
            results = _run_with_progress(run, llm, tokenizer, task_list, cfg, out, factory)
        else:
            run(llm, tokenizer, task_list, cfg, out_dir=out, make_sampler=factory)
            return
    except KeyboardInterrupt:
        if not w.root:
            raise
        where = (
            f"; the finished items are in {out}: run the same command again to continue"
            if out
            else "; pass --out DIR to keep finished items and resume"
        )
        print(f"\ninterrupted{where}", file=sys.stderr)
        raise
    if as_json:
        print(json.dumps(results))
    elif open_text:
        print_open_table(results)
    else:
        print_table(results)
    if plot is not None:
        ev.plot(results, plot)
        print(f"plot written to {plot}", file=sys.stderr)


def _run_with_progress(run, llm, tokenizer, task_list, cfg, out, factory):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description:<18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        job = bar.add_task("starting", total=None)
        first = {}

        def progress(done, total, description):
            if not first:
                # Items already done (a resumed run) must not count towards the
                # speed the ETA is computed from: start the bar after them.
                first["done"] = done
                bar.update(job, total=total - done, completed=0, description=description)
            else:
                bar.update(job, completed=done - first["done"], description=description)

        return run(llm, tokenizer, task_list, cfg, out_dir=out, make_sampler=factory, progress=progress)


def _console():
    """stdout's console; when it is a file or a pipe (no terminal width to fit), wide
    enough that table cells do not wrap (rich assumes 80 columns there)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def print_table(results: dict):
    from rich.table import Table

    from entropix_mlx.eval import strategy_text, table_rows

    rows = table_rows(results, strategies=False)
    split = results.get("split", "all")
    where = f"{results['tasks']} ({split} split)" if split != "all" else results["tasks"]
    if results.get("cot"):
        where += ", chain of thought"
    table = Table(
        title=f"{results['model']} on {where}: {results['items']} items, "
        f"at most {results['max_tokens']} tokens per answer"
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
        "tokens: mean per answer. W/L/T: items the sampler got right and greedy wrong / the "
        "reverse / the same; p: exact two-sided sign test (McNemar).",
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


def register(app: typer.Typer):
    app.command("eval")(eval_command)
