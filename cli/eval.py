"""`entropix-mlx eval TASKS.jsonl`: accuracy of each sampler, with intervals and
a paired comparison against greedy; `eval --open [PROMPTS.txt]`: open-text
quality (repetition, loops, log-probability, early endings). The table (or, with
--json, one JSON object) goes to stdout; the progress bar goes to stderr."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.distributed import check_same_model, world
from entropix_mlx.errors import ConfigError
from entropix_mlx.front import fit
from entropix_mlx.front.registry import (
    BASELINE,
    DEFAULT_SAMPLER,
    EVAL_SAMPLER_NAMES,
    check_reasoning,
    config_sets,
    read_settings,
    spec_of,
)
from entropix_mlx.model.loading import resolve

from .eval_progress import run_with_progress
from .eval_tables import print_open_table, print_table
from .flags import flagged
from .options import ModelOpt, NoCacheOpt, WeightsOpt

# entropix_mlx.eval, rich.progress and rich.table are imported in the functions that use
# them: app.py imports every command's module at each start (--help too), and only eval
# needs them.

DEFAULT_OPEN_TOKENS = 64  # = entropix_mlx.eval.DEFAULT_OPEN_TOKENS (not imported: see above)

# Short answers need few tokens, and 8 rows per batch keep both cores of a small
# CPU busy. A chain of thought needs room to finish: a limit that cuts the baseline
# off measures the limit, not the sampler (small instruct models write 250-650
# tokens for a GSM8K solution); open text is judged on its first 64 tokens.
DEFAULT_MAX_TOKENS = 32
COT_MAX_TOKENS = 768
DEFAULT_BATCH_SIZE = 8
DEFAULT_SAMPLERS = f"{BASELINE},{DEFAULT_SAMPLER}"


def _samplers(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in EVAL_SAMPLER_NAMES]
    if not names or unknown:
        raise ConfigError(
            f"--samplers {value!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
            f"give a comma-separated list of: {', '.join(EVAL_SAMPLER_NAMES)}"
        )
    return list(dict.fromkeys(names))


def _budgets(value: str | None) -> int | list[int] | None:
    """--max-tokens: one limit, or a comma-separated list of them (every sampler runs at each)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ConfigError(f"--max-tokens {value!r}: give a whole number of at least 1, or a list such as 512,1024")
    budgets = list(dict.fromkeys(int(p) for p in parts))
    return budgets[0] if len(budgets) == 1 else budgets


def _item_range(value: str | None, count: int) -> slice:
    """--items A-B: the split's items at positions A to B (from 0, both included)."""
    if value is None:
        return slice(None)
    first, dash, last = value.partition("-")
    if not (first.strip().isdigit() and (not dash or last.strip().isdigit())):
        raise ConfigError(f"--items {value!r}: give positions such as 200-499 (from 0, both included) or one, 7")
    a, b = int(first), int(last) if dash else int(first)
    if b < a or a >= count:
        raise ConfigError(f"--items {value!r}: the split has {count} items (positions 0-{count - 1})")
    return slice(a, b + 1)


def eval_command(
    ctx: typer.Context,
    tasks: Annotated[
        Path | None,
        typer.Argument(
            metavar="TASKS",
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
    reasoning: Annotated[
        bool | None,
        typer.Option(
            "--reasoning/--no-reasoning",
            show_default="with --cot",
            help="Entropix's reasoning profile and deliberate's reasoning setting, as for run --reasoning.",
        ),
    ] = None,
    model: ModelOpt = None,
    samplers: Annotated[
        str,
        typer.Option(
            "--samplers",
            help=f"Comma-separated, from: {', '.join(EVAL_SAMPLER_NAMES)}. Greedy always runs (the baseline). "
            "self_consistency and cisc vote over --k sampled answers; cot_decoding is deliberate's CoT-decoding preset; "
            "deliberate_margin is deliberate with its earlier rule (continuation margin 0.1, no early stop); "
            "deliberate_narrow and deliberate_wide vote by confidence over greedy and 1 or 4 first-token alternatives; "
            "deliberate_staged starts the wide set's last 3 only when the first two disagree.",
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
    items: Annotated[
        str | None,
        typer.Option("--items", help="Only the split's items at positions A-B (from 0, both included), e.g. 200-499."),
    ] = None,
    k: Annotated[
        int,
        typer.Option(
            "--k",
            min=1,
            help="Answers sampled per question by self_consistency and cisc; the results also show each "
            "k' up to it, and the k' that spends about as many tokens as each other sampler.",
        ),
    ] = 8,
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, help="Runs per stochastic sampler, with seeds --seed, --seed+1, ...")
    ] = 1,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**62, help="First run seed.")] = 0,
    max_tokens: Annotated[
        str | None,
        typer.Option(
            "--max-tokens",
            show_default=f"{DEFAULT_MAX_TOKENS}; {COT_MAX_TOKENS} with --cot; {DEFAULT_OPEN_TOKENS} with --open",
            help="Most tokens per answer; a list (512,1024) runs every sampler at each budget, paired item by item.",
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
            help="Draw accuracy with 95% intervals against generated tokens per answer, the vote baselines as "
            "curves over k (with --open: repetition against log-probability) to a PNG.",
        ),
    ] = None,
    weights: WeightsOpt = default_weights(),
    no_cache: NoCacheOpt = False,
    rescore_sealed: Annotated[
        bool,
        typer.Option(
            "--rescore-sealed",
            help="Score a sealed task file with a configuration other than the one its log holds for a sampler "
            "name (the log says so).",
        ),
    ] = False,
):
    """Accuracy of each sampler on a task file: 95% Wilson intervals, mean tokens,
    tokens/s, strategy shares, and wins/losses/ties against greedy on the same
    items with an exact sign-test (McNemar) p-value. With --open: repeated
    4-grams, distinct-2, loops, mean log-probability and early endings of free
    writing, against greedy."""
    from entropix_mlx import eval as ev

    names = _samplers(samplers)
    max_tokens = _budgets(max_tokens)
    split = _check_mode(open_text, names, max_tokens, items, cot, split, builtin, tasks)
    _check_plot(plot)
    configured = _configured(config, names)
    task_list, path = _task_list(open_text, tasks, builtin, split, items, limit)
    cot_default = max_tokens is None and cot
    if max_tokens is None:
        max_tokens = DEFAULT_OPEN_TOKENS if open_text else COT_MAX_TOKENS if cot else DEFAULT_MAX_TOKENS
    source = resolve(model)
    check_reasoning(names, bool(reasoning))
    reasoning = cot if reasoning is None else reasoning
    for name in names:  # a bad --config or card fails now, not after the model loads
        read_settings(name, source.name, config if name in configured else None, reasoning and spec_of(name).reasoning)
    w = world()  # under mlx.launch: each rank answers a share of the items, rank 0 prints
    check_same_model(w, source.path)
    card = any(spec_of(n).reads_card for n in names)
    loaded = ctx.obj.load(model, weights, card=card, cache=not no_cache)
    llm, tokenizer, source = loaded.model, loaded.tokenizer, loaded.source
    if cot_default:
        max_tokens = _room_to_reason(loaded, task_list, max_tokens)

    def factory(name):  # the records hold each token's log-probability, never its metrics
        spec = spec_of(name)
        return loaded.sampler(
            name,
            config=config if name in configured else None,
            reasoning=reasoning and spec.reasoning,
            metrics=False,
            k=k if spec.votes else None,
        )

    common = dict(
        samplers=names, seeds=seeds, seed=seed, max_tokens=max_tokens, batch_size=batch_size, model_name=source.name
    )
    if open_text:
        cfg = ev.OpenConfig(**common, tasks_name="builtin prompts" if tasks is None else Path(path).name)
        run = ev.run_open
    else:
        from entropix_mlx.eval.sealed import SealedFile, is_sealed

        sealed = SealedFile(path, out) if not builtin and is_sealed(path) else None
        cfg = ev.EvalConfig(
            **common,
            tasks_name="builtin" if builtin else Path(path).name,
            split=split,
            cot=cot,
            sealed=sealed,
            rescore_sealed=rescore_sealed,
        )
        run = ev.run_eval
    if not w.root:
        run(llm, tokenizer, task_list, cfg, out_dir=out, make_sampler=factory)
        return
    try:
        results = run_with_progress(run, llm, tokenizer, task_list, cfg, out, factory)
    except KeyboardInterrupt:
        where = (
            f"; the finished items are in {out}: run the same command again to continue"
            if out
            else "; pass --out DIR to keep finished items and resume"
        )
        print(f"\ninterrupted{where}", file=sys.stderr)
        raise
    _report(results, as_json, open_text, plot)


def _check_mode(open_text, names, max_tokens, items, cot, split, builtin, tasks) -> str:
    """Refuse what the mode (accuracy on a task file, or --open) cannot do; the split to run."""
    if open_text:
        whole = [n for n in names if spec_of(n).whole_answers]
        if whole:  # they pick among whole answers by their task's answer
            raise ConfigError(f"--samplers {whole[0]} is for task files; --open measures free writing")
        refused = [
            (isinstance(max_tokens, list), "--max-tokens takes one limit with --open"),
            (items is not None, "--items selects task file items; use --limit with --open"),
            (cot, "--cot is for task files; --open measures free writing (use one of them)"),
            (split is not None, "--split selects task file items; --open prompts have no split"),
            (builtin and tasks is not None, "give a prompt file or --builtin (or neither, for the built-in prompts)"),
        ]
        for wrong, message in refused:
            if wrong:
                raise ConfigError(message)
    elif builtin == (tasks is not None):
        raise ConfigError("give a task file or --builtin (one of them)")
    from entropix_mlx.eval.tasks import SPLIT_CHOICES

    split = split or "test"
    if split not in SPLIT_CHOICES:
        raise ConfigError(f"--split {split!r}: give dev, test or all")
    return split


def _check_plot(plot: Path | None) -> None:
    if plot is None:
        return
    if plot.suffix.lower() != ".png":
        raise ConfigError(f"--plot {plot}: give a file name ending in .png")
    try:  # matplotlib: an optional extra, only for --plot
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'entropix-mlx[plot]'") from None


def _configured(config: str | None, names: list[str]) -> list[str]:
    """The samplers of `names` that --config sets (the registry says which); one must run."""
    configured = [n for n in names if config_sets(n, config)]
    if config is not None and not configured:
        raise ConfigError(
            "--config sets the entropix sampler (and deliberate, from a [deliberate] table), "
            "which --samplers does not include"
        )
    return configured


def _task_list(open_text, tasks, builtin, split, items, limit) -> tuple[list, Path]:
    """The items (or prompts) to run, and the file they come from."""
    from entropix_mlx import eval as ev

    if open_text:
        path = tasks if tasks is not None else ev.builtin_prompts_path()
        return ev.load_prompts(path)[:limit], path
    path = ev.builtin_tasks_path() if builtin else tasks
    task_list = ev.select_split(ev.load_tasks(path), split)
    task_list = task_list[_item_range(items, len(task_list))][:limit]
    if not task_list:
        raise ConfigError(f"{Path(path).name} has no {split} items; try --split all")
    return task_list, path


def _room_to_reason(loaded, task_list, max_tokens: int) -> int:
    """The default chain-of-thought budget, within what a small model's context leaves."""
    longest = max(len(loaded.encode([{"role": "user", "content": t.prompt_text(True)}])) for t in task_list)
    return max(1, fit(loaded.model, longest, max_tokens)[0])


def _report(results: dict, as_json: bool, open_text: bool, plot: Path | None) -> None:
    from entropix_mlx import eval as ev

    if as_json:
        print(json.dumps(results))
    elif open_text:
        print_open_table(results)
    else:
        print_table(results)
    for warning in results.get("warnings", []):
        print(f"warning: {flagged(warning, ('max_tokens',))}", file=sys.stderr)
    if plot is not None:
        ev.plot(results, plot)
        print(f"plot written to {plot}", file=sys.stderr)


def register(app: typer.Typer):
    app.command("eval")(eval_command)
