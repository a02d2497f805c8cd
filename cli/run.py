"""`entropix-mlx run PROMPT`: one answer, streamed."""

import typer

from entropix_mlx import load
from entropix_mlx.generate import generate
from entropix_mlx.samplers import GreedySampler


def run(prompt: str = typer.Argument(..., help="The prompt."),
        model: str = typer.Option(None, "--model", "-m", help="Alias, .gguf path, directory or repo id."),
        max_tokens: int = typer.Option(256, "--max-tokens")):
    """Answer PROMPT on the chosen model."""
    llm, tokenizer = load(model)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    generation = generate(llm, tokenizer, ids, GreedySampler(), max_tokens=max_tokens)
    for event in generation:
        print(event.text, end="", flush=True)
    print()


def register(app: typer.Typer):
    app.command()(run)
