"""`entropix-mlx calibrate [--model M] [--out FILE]`: measure the model's metrics
on built-in prompts and write its thresholds to its model card."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from entropix_mlx.loading import DEFAULT_MODEL


def calibrate(
    model: Annotated[str | None, typer.Option(
        "--model", "-m", show_default=DEFAULT_MODEL,
        help="Bundled alias, .gguf file, Hugging Face model directory or repo id.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", dir_okay=False, help="Card to write (default: models/<name>.toml).")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens generated per prompt.")] = 24,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Random seed of the sampled answers.")] = 0,
):
    """Calibrate the Entropix thresholds for a model (a few minutes on CPU)."""
    from entropix_mlx.calibrate import PROMPTS, QUANTILES, calibrate as run_calibration
    from entropix_mlx.loading import load

    llm, tokenizer, source = load(model, return_source=True)

    def progress(i, n):
        print(f"\rprompt {i + 1}/{n}", end="", file=sys.stderr, flush=True)

    try:
        path, found, samples = run_calibration(llm, tokenizer, source.name, out, PROMPTS, max_tokens, seed,
                                               progress=progress)
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the card is written to a temporary file and renamed,
        from entropix_mlx.cards import card_path   # so it is either the old one or the new one, whole
        print(f"\ninterrupted: {out or card_path(source.name)} was not changed", file=sys.stderr)
        raise
    print(f"\r{len(samples['entropy'])} steps over {len(PROMPTS)} prompts", file=sys.stderr)
    for name, value in found.items():
        metric, q = QUANTILES[name]
        unit = "bits" if metric == "entropy" else "bits^2"
        print(f"  {name:16} {value:8.4f} {unit:6}  ({metric} quantile {q:g})")
    print(f"wrote {path}")


def register(app: typer.Typer):
    app.command()(calibrate)
