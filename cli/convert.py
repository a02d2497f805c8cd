"""`entropix-mlx convert MODEL OUTDIR`: a GGUF file as an MLX directory for mlx-lm."""

import typer

from entropix_mlx.errors import ModelLoadError
from entropix_mlx.model.convert import convert as convert_model
from entropix_mlx.model.loading import resolve


def convert(
    model: str = typer.Argument(..., metavar="MODEL", help="A .gguf file or the bundled alias."),
    outdir: str = typer.Argument(
        ..., metavar="OUTDIR", help="The folder to write (config.json, model.safetensors, tokenizer)."
    ),
    weights: str = typer.Option(
        "native", "--weights", help="native: the file's quantization, as MLX quantization; float32: dequantized."
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUTDIR if it exists."),
):
    """Write an MLX model directory that mlx_lm.load opens (and entropix-mlx loads back)."""
    source = resolve(model)
    if source.kind not in ("bundled", "gguf"):
        raise ModelLoadError(f"{model} is already a model directory or repo id; mlx_lm.load opens it as it is")
    path = convert_model(source.path, outdir, weights=weights, overwrite=force)
    print(f"wrote {path} (open it with mlx_lm.load('{path}') or entropix-mlx run --model {path} 'your prompt')")


def register(app: typer.Typer):
    app.command()(convert)
