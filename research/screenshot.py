"""Regenerate docs/run.svg: `entropix-mlx run` on the bundled model, rendered by
the CLI's own render functions into a recording Rich console.

    python -m research.screenshot
"""

from pathlib import Path

# ruff: noqa: E402  (the imports after enable())
import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

from entropix_mlx.cli import render
from entropix_mlx.cli.run import build_sampler, header, load_model, prompt_tokens
from rich.console import Console

from entropix_mlx.decode.generate import generate
from entropix_mlx.front.registry import sampler_legend

PROMPT = "Why is the sky blue?"
SEED = 0

llm, tokenizer, source = load_model(None)
sampler = build_sampler("entropix", tokenizer, source.name)
console = Console(
    record=True, width=100, force_terminal=True, color_system="standard", markup=False, emoji=False, highlight=False
)
console.print(f'$ entropix-mlx run "{PROMPT}" --max-tokens 60')
console.print(header(source, sampler, SEED), style=render.META_STYLE)
console.print(render.legend(sampler_legend(sampler)))
generation = generate(
    llm, tokenizer, prompt_tokens(tokenizer, PROMPT, None, raw=False), sampler, max_tokens=60, seed=SEED
)
answer = render.Text()
for event in generation:
    answer.append_text(render.token_text(event.text, event.strategy))
console.print(answer)
console.print(render.summary_line(generation.summary()))
console.save_svg(str(Path(__file__).resolve().parents[1] / "docs" / "run.svg"), title="entropix-mlx run")
