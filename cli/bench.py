"""`entropix-mlx bench`: entropix-mlx against mlx-lm on the same model, in one run."""

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.distributed import world

from .loaded import quiet_unless_root
from .options import ModelOpt, WeightsOpt
from .run import read_schema

# entropix_mlx.eval and rich.table are imported in the functions that use them: app.py
# imports every command's module at each start (--help too), and only bench needs them.

# Defaults keep a run to a few minutes on a 2-core CPU with the bundled model:
# 3 variants x 2 repeats x (64 + 128) tokens. docs/speed.md's figures use
# --gen-tokens 256.
DEFAULT_PROMPT_TOKENS = 64
DEFAULT_GEN_TOKENS = 128
DEFAULT_REPEATS = 2
PROFILE_STEPS = 16


def bench(
    ctx: typer.Context,
    model: ModelOpt = None,
    prompt_tokens: Annotated[
        int, typer.Option("--prompt-tokens", min=1, help="Prompt length, tokens.")
    ] = DEFAULT_PROMPT_TOKENS,
    gen_tokens: Annotated[
        int, typer.Option("--gen-tokens", min=2, help="Tokens generated per run.")
    ] = DEFAULT_GEN_TOKENS,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Runs per variant (medians are reported).")
    ] = DEFAULT_REPEATS,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout instead of a table.")] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile", help=f"Also time the parts of one Entropix decode step (over {PROFILE_STEPS} steps)."
        ),
    ] = False,
    weights: WeightsOpt = default_weights(),
    contended: Annotated[
        bool,
        typer.Option(
            "--contended",
            help="Run beside a busy neighbour: a NumPy matrix-product loop per core, started and ended by the bench.",
        ),
    ] = False,
    json_schema: Annotated[
        Path | None,
        typer.Option(
            "--json-schema",
            metavar="FILE",
            help="Also time Entropix with the answer held to the JSON schema in FILE, against Entropix alone.",
        ),
    ] = None,
):
    """Prefill and decode speed and peak memory: mlx-lm's own generation, our
    engine with the greedy sampler, our engine with the Entropix sampler."""
    from entropix_mlx.eval import bench as benchmark
    from entropix_mlx.eval import profile as profiling

    def progress(message: str):
        if sys.stderr.isatty():
            print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)

    w = world()  # under mlx.launch: both models split across the ranks, rank 0 prints
    schema = read_schema(json_schema)
    loaded = ctx.obj.load(model, weights, tensor_parallel=True)  # sharded under mlx.launch
    ours, tokenizer, source = loaded.model, loaded.tokenizer, loaded.source
    theirs = benchmark.mlx_lm_model(source, w.group if w.size > 1 else None)
    quiet_unless_root(w)
    constraint = None
    if schema is not None:
        loaded.constraint(schema)  # a schema it cannot hold stops here, in one line
        constraint = functools.partial(loaded.constraint, schema)
    result = benchmark.bench(
        ours,
        theirs,
        tokenizer,
        source.name,
        prompt_tokens,
        gen_tokens,
        repeats,
        progress=progress,
        contended=contended,
        constraint=constraint,
        sampler=loaded.sampler,
    )
    if profile:
        progress("profile")
        result["profile"] = profiling.profile(ours, theirs, tokenizer, source.name, prompt_tokens, PROFILE_STEPS)
    progress("")
    if w.size > 1:
        result["ranks"] = w.size
    if as_json:
        print(json.dumps(result))
    else:
        print_tables(result)


def print_tables(result: dict):
    from rich.table import Table

    console = Console()
    paths = result.get("paths")
    if paths:
        console.print(f"mlx_lm: {paths['mlx_lm']}\nentropix: {paths['entropix']}")
    machine = result.get("machine")
    if machine:
        before, after = machine["load_average"]
        beside = " · beside a NumPy product loop on every core" if machine["contended"] else ""
        console.print(
            f"{machine['cores']} cores · {machine['threads']} threads a product · "
            f"load average {before:.2f} before, {after:.2f} after{beside}"
        )
    split = f", split across {result['ranks']} ranks (rank 0's memory)" if "ranks" in result else ""
    table = Table(
        title=f"{result['model']}: {result['prompt_tokens']} prompt tokens, {result['gen_tokens']} "
        f"generated, medians of {result['mlx_lm']['runs']} runs{split}"
    )
    for column in ("", "prefill tok/s", "first token s", "decode tok/s", "peak GB"):
        table.add_column(column, justify="right" if column else "left")
    for name in ("mlx_lm", "entropix_greedy", "entropix", "entropix_schema"):
        if name not in result:
            continue
        r = result[name]
        table.add_row(
            name,
            f"{r['prefill_tps']:.1f}",
            f"{r['first_token_s']:.2f}",
            f"{r['decode_tps']:.2f}",
            f"{r['peak_memory_gb']:.3f}",
        )
    ratios = result["ratios"]
    table.add_section()
    table.add_row(
        "entropix / mlx_lm",
        f"{ratios['prefill']:.2f}",
        f"{ratios['first_token']:.2f}× sooner",
        f"{ratios['decode']:.2f}",
        f"{ratios['memory']:.2f}",
    )
    table.add_row("entropix_greedy / mlx_lm", "", "", f"{ratios['decode_greedy']:.2f}", "")
    if "decode_schema" in ratios:
        table.add_row("entropix_schema / entropix", "", "", f"{ratios['decode_schema']:.2f}", "")
    console.print(table)
    counts = result["entropix"].get("strategy_counts", {})
    if counts:
        console.print("entropix strategies: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))

    if "profile" in result:
        p = result["profile"]
        steps = Table(title=f"one decode step, ms, over {p['steps']} steps")
        for column in ("part", "median", "mean"):
            steps.add_column(column, justify="left" if column == "part" else "right")
        labels = {
            "model": "model forward",
            "metrics": "metrics",
            "candidates": "candidates, sampling",
            "decision": "decision, rollouts",
            "mlx_lm_model": "mlx-lm forward + argmax",
        }
        for part, label in labels.items():
            steps.add_row(label, f"{p['step_ms'][part]:.1f}", f"{p['step_ms_mean'][part]:.1f}")
        console.print(steps)
        console.print("profiled strategies: " + ", ".join(f"{k} {v}" for k, v in sorted(p["strategy_counts"].items())))


def register(app: typer.Typer):
    app.command()(bench)
