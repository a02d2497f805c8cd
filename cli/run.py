"""`entropix-mlx run PROMPT`: one answer, streamed, each token coloured by the
strategy that chose it.

stdout carries the answer only (or, with --json, only JSON Lines); the header,
legend and summary go to stderr, so `run ... > answer.txt` keeps just the text.
"""

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import mlx.core as mx
import typer

from entropix_mlx.accel import weights as backend
from entropix_mlx.accel.weights import WEIGHT_FORMATS, default_weights
from entropix_mlx.decode.events import plain
from entropix_mlx.decode.generate import generate
from entropix_mlx.decode.prompt import encode_chat, encode_raw
from entropix_mlx.errors import ConfigError, ContextOverflowError
from entropix_mlx.files import write_atomic
from entropix_mlx.model.loading import DEFAULT_MODEL, load, resolve
from entropix_mlx.sampling.config import PRESETS, resolve_config
from entropix_mlx.sampling.registry import SAMPLER_NAMES, make_sampler
from entropix_mlx.sampling.strategies import sampler_strategies

from . import render
from .deliberation import deliberation_progress
from .signals import deferred, exit_code

DEFAULT_SEED = 0  # a fixed default: the same command gives the same answer; pass --seed to vary it

# Loaded models, by (resolved path, --weights): tests and the chat command reuse them in-process.
_MODELS: dict[tuple[str, str], tuple] = {}


def load_model(ref: str | None, weights: str = "auto"):
    """(model, tokenizer, source), loaded once per process."""
    key = (str(resolve(ref).path), weights)
    if key not in _MODELS:
        _MODELS[key] = load(ref, return_source=True, weights=weights)
        warm_up_compiler()
    return _MODELS[key]


@mx.compile
def _fused(x):
    return x * 2 + 1


def warm_up_compiler():
    """MLX's CPU backend checks for its compiler with C's system("g++ --version")
    at the first compiled kernel of a process, and system() ignores SIGINT while
    it runs: a Ctrl-C in that moment, the start of the first prefill, was lost.
    One tiny compiled kernel now moves that moment into the model load."""
    mx.eval(_fused(mx.array([1.0])))


def _check_weights(value: str) -> str:
    if value not in WEIGHT_FORMATS:
        raise typer.BadParameter(f"'{value}' is not a weight format; choose one of: {', '.join(WEIGHT_FORMATS)}")
    return value


def _check_sampler(name: str) -> str:
    if name not in SAMPLER_NAMES:
        raise typer.BadParameter(f"'{name}' is not a sampler; choose one of: {', '.join(SAMPLER_NAMES)}")
    return name


def _check_seed(value: int) -> int:
    if not 0 <= value < 2**63:
        raise typer.BadParameter(f"{value} is not a seed; use a whole number from 0 to 2**63-1")
    return value


def _check_max_tokens(value: int) -> int:
    # 0 is refused rather than answered with nothing: it is almost always a slip.
    if value < 1:
        raise typer.BadParameter(f"{value} tokens would give no answer; use 1 or more, e.g. --max-tokens 64")
    return value


def _check_top_p(value: float | None):
    if value is not None and not 0 < value <= 1:
        raise typer.BadParameter(f"{value} is not in (0, 1]; e.g. 0.9")
    return value


def _check_min_p(value: float | None):
    if value is not None and not 0 <= value < 1:
        raise typer.BadParameter(f"{value} is not in [0, 1); e.g. 0.05")
    return value


# Options shared with `chat`.
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        show_default=DEFAULT_MODEL,
        help="Bundled alias, .gguf file, Hugging Face model directory or repo id.",
    ),
]
SamplerOpt = Annotated[
    str, typer.Option("--sampler", callback=_check_sampler, help=f"One of: {', '.join(SAMPLER_NAMES)}.")
]
MaxTokensOpt = Annotated[
    int,
    typer.Option(
        "--max-tokens",
        callback=_check_max_tokens,
        help="Most tokens to generate per answer (1 or more; the context's end also stops it).",
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed", callback=_check_seed, help="Random seed; fixed by default, so the same command gives the same answer."
    ),
]
SystemOpt = Annotated[str | None, typer.Option("--system", help="System prompt.")]
ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        show_default="the model card",
        help="Entropix sampler settings: a TOML file (over the model card) or a preset (reference, calibrated).",
    ),
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option("--temperature", min=0.0, help="Base sampling temperature (0 = greedy for the baselines)."),
]
TopPOpt = Annotated[
    float | None,
    typer.Option(
        "--top-p", callback=_check_top_p, help="In (0, 1]: keep the most likely tokens up to this probability mass."
    ),
]
TopKOpt = Annotated[int | None, typer.Option("--top-k", min=0, help="Keep the k most likely tokens (0: all).")]
MinPOpt = Annotated[
    float | None,
    typer.Option(
        "--min-p",
        callback=_check_min_p,
        help="In [0, 1): drop tokens less likely than min_p × the top token's probability.",
    ),
]
NoColorOpt = Annotated[bool, typer.Option("--no-color", help="Plain text, no colours.")]
BudgetOpt = Annotated[
    float | None,
    typer.Option(
        "--budget",
        min=1.0,
        show_default="the model card's, 6",
        help="deliberate only: generated tokens at most BUDGET x the longest candidate.",
    ),
]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        callback=_check_weights,
        show_default="auto, or $ENTROPIX_WEIGHTS",
        help="auto: float32 on the CPU (fast with a system OpenBLAS), the file's own format on a GPU; "
        "native: the file's format; float32: dequantize once at load.",
    ),
]


def check_options(
    sampler: str, config: str | None, model: str | None, budget: float | None = None, **overrides
) -> str | None:
    """Reject settings that cannot work before the model loads, so a mistake
    costs a second, not a model load. Returns --config for make_sampler."""
    given = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None]
    if sampler in ("greedy", "deliberate") and given:
        raise ConfigError(
            f"{', '.join(given)} has no effect with --sampler {sampler}; drop it or choose another sampler"
        )
    if budget is not None and sampler != "deliberate":
        raise ConfigError(f"--budget sets the deliberate sampler; --sampler {sampler} does not use it")
    if sampler == "deliberate":  # the card's [deliberate] table, a --config file's, then --budget
        from entropix_mlx.sampling.deliberate_config import resolve_deliberate

        if config is not None and not Path(config).is_file():
            raise ConfigError(
                f"--config {config} is not a file; for --sampler deliberate give a .toml file with a [deliberate] table"
            )
        resolve_deliberate(resolve(model).name, config, budget=budget)
        return config
    if config is not None:
        if sampler != "entropix":
            raise ConfigError(f"--config sets the entropix sampler; --sampler {sampler} does not use it")
        if config not in PRESETS and not Path(config).is_file():
            what = "is a directory" if Path(config).is_dir() else "does not exist"
            raise ConfigError(f"--config {config} {what}; give a sampler .toml file or a preset ({', '.join(PRESETS)})")
    if sampler == "entropix":  # reads the card and the file, validates every value
        resolve_config(resolve(model).name, config, **overrides)
    return config


def build_sampler(name, tokenizer, model_name, config=None, **overrides):
    if name == "greedy":
        overrides = {}
    if name != "deliberate":
        overrides.pop("budget", None)
    elif overrides:  # deliberate takes no sampling parameters (check_options refused them)
        overrides = {"budget": overrides.get("budget")}
    return make_sampler(
        name,
        tokenizer=tokenizer,
        model_name=model_name,
        config=config if name in ("entropix", "deliberate") else None,
        **overrides,
    )


def header(source, sampler, seed: int, model=None) -> str:
    parts = [source.name] + ([backend.describe(model)] if model is not None else []) + [f"sampler {sampler.name}"]
    config_source = getattr(sampler, "config_source", None)  # entropix: card, preset or file
    if config_source:
        parts.append(config_source)
    parts.append(f"seed {seed}")
    return " · ".join(parts)


def read_prompt(prompt: str) -> str:
    """The prompt text; '-' reads standard input, which must be UTF-8 text."""
    if prompt == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"standard input is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                "convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
        prompt = prompt.removeprefix("\ufeff").rstrip("\r\n")  # a BOM and the final newline are not the prompt
        if "\x00" in prompt:
            raise ConfigError("standard input contains NUL bytes, so it is binary data, not a prompt; pass text")
    if not prompt.strip():
        raise ConfigError("the prompt is empty; pass some text, or '-' to read it from standard input")
    return prompt


def prompt_tokens(tokenizer, prompt: str, system: str | None, raw: bool) -> list[int]:
    """--raw: the text as is, control tokens written in it parsed. Otherwise the
    chat template, with `<|im_end|>` and the like in the user's text kept as text."""
    if raw:
        return encode_raw(tokenizer, prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    try:
        return encode_chat(tokenizer, messages)
    except ValueError:  # transformers: no chat template
        raise ConfigError("this model has no chat template; use --raw to send the prompt as is") from None


def json_line(record: dict) -> str:
    return json.dumps(plain(record), allow_nan=False) + "\n"


def silence_stdout():
    """After the reader of our stdout went away (`| head -1`): point stdout at
    /dev/null so the interpreter's final flush cannot raise (Python docs, 'Note
    on SIGPIPE')."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from standard input.")],
    model: ModelOpt = None,
    sampler: SamplerOpt = "entropix",
    max_tokens: MaxTokensOpt = 256,
    seed: SeedOpt = DEFAULT_SEED,
    system: SystemOpt = None,
    config: ConfigOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    json_lines: Annotated[
        bool, typer.Option("--json", help='JSON Lines on stdout: one object per token, then {"summary": ...}.')
    ] = False,
    no_color: NoColorOpt = False,
    weights: WeightsOpt = default_weights(),
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Also write the answer as a self-contained HTML page (the server page's export)."),
    ] = None,
    budget: BudgetOpt = None,
):
    """Answer PROMPT, streaming each token in the colour of the strategy that chose it."""
    overrides = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    config = check_options(sampler, config, model, budget, **overrides)
    if sampler == "deliberate":
        overrides = {"budget": budget}
        if html is not None:
            raise ConfigError("--html records one token stream; --sampler deliberate does not support it yet")
    if raw and system is not None:
        raise ConfigError("--system needs the chat template; drop --raw or --system")
    if html is not None and (html.is_dir() or not html.parent.is_dir()):
        raise ConfigError(
            f"--html {html}: {'is a directory' if html.is_dir() else 'its folder does not exist'}; "
            "give a file name in an existing folder"
        )
    text = read_prompt(prompt)
    llm, tokenizer, source = load_model(model, weights)
    chooser = build_sampler(sampler, tokenizer, source.name, config, **overrides)
    recorder = None
    if html is not None:  # records each token's top alternatives for the page's hover details
        from entropix_mlx.server.export import AnswerRecorder

        recorder = AnswerRecorder(chooser, tokenizer)
        chooser = recorder.sampler
    ids = prompt_tokens(tokenizer, text, system, raw)
    context = llm.args.max_position_embeddings
    if len(ids) >= context:
        raise ContextOverflowError(
            f"the prompt has {len(ids)} tokens but the model's context holds {context}; shorten it"
        )
    room = context - len(ids)

    out = render.make_console(no_color=no_color)
    color = not no_color and out.is_terminal and not out.no_color
    if not color:
        out = render.make_console(no_color=True)
    err = render.make_console(stderr=True, no_color=not color)
    if max_tokens > room:  # stop at the end of the context rather than overflow it mid-answer
        err.print(
            f"warning: --max-tokens {max_tokens} is more than the context leaves after the prompt; "
            f"the answer stops after {room} tokens",
            style=render.META_STYLE,
        )
    generation = generate(llm, tokenizer, ids, chooser, max_tokens=min(max_tokens, room), seed=seed)

    def show(event):
        if recorder is not None:
            recorder.add(event)
        if json_lines:
            sys.stdout.write(json_line(event.to_dict()))
            sys.stdout.flush()
        else:
            render.write_token(out, event.text, event.strategy, color)

    code, shown = 0, 0
    try:
        try:
            if not json_lines:
                err.print(header(source, chooser, seed, llm), style=render.META_STYLE)
                if color:
                    err.print(render.legend(sampler_strategies(chooser)))
                if hasattr(generation, "on_row"):  # deliberate: show the branches as they finish
                    generation.on_row = deliberation_progress(err, tokenizer, color)
            for event in generation:
                with deferred():
                    show(event)
                    shown += 1
        except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM, in prefill or decode
            generation.finish_reason = "interrupted"
            code = exit_code(interrupt)
            # A token the signal caught between being generated and being shown is
            # shown now: the summary counts it, and nothing generated is lost.
            for event in generation.events[shown:]:
                show(event)
        except ContextOverflowError:  # a branch rollout looked past the end of the context
            generation.finish_reason = "context"
        if generation.finish_reason == "length" and max_tokens > room:
            generation.finish_reason = "context"
        summary = generation.summary()
        if json_lines:
            sys.stdout.write(json_line({"summary": summary.to_dict()}))
        else:
            out.print()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        raise typer.Exit(0) from None
    if not json_lines:
        err.print(render.summary_line(summary))
    if recorder is not None:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        write_atomic(html, recorder.html(source.name, seed, messages, render.summary_line(summary).plain))
    raise typer.Exit(code)


def register(app: typer.Typer):
    app.command()(run)
