"""The options `run` and `chat` share (`serve`, `bench`, `calibrate` and `eval`
take some of them too), their checks, and `check_options`, which refuses
combinations that cannot work before the model loads."""

from pathlib import Path
from typing import Annotated

import typer

from entropix_mlx.accel.weights import WEIGHT_FORMATS
from entropix_mlx.errors import ConfigError
from entropix_mlx.front import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS  # run's and chat's, the library's
from entropix_mlx.front.registry import SAMPLER_NAMES, check_reasoning, read_settings, spec_of
from entropix_mlx.model.loading import DEFAULT_MODEL, resolve
from entropix_mlx.sampling.parameters import PARAMETERS

DEFAULT_SEED = 0  # a fixed default: the same command gives the same answer; pass --seed to vary it


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


def _parameter(name: str):
    """The option's check: the sampling parameter's one rule (sampling/parameters.py)."""

    def check(value):
        problem = PARAMETERS[name].problem(value) if value is not None else None
        if problem:
            raise typer.BadParameter(f"{value} {problem}")
        return value

    return check


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
    typer.Option(
        "--temperature",
        callback=_parameter("temperature"),
        help="Base sampling temperature (>= 0); 0 asks for deterministic answers: greedy answers.",
    ),
]
TopPOpt = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        callback=_parameter("top_p"),
        help="In (0, 1]: keep the most likely tokens up to this probability mass.",
    ),
]
TopKOpt = Annotated[
    int | None, typer.Option("--top-k", callback=_parameter("top_k"), help="Keep the k most likely tokens (0: all).")
]
MinPOpt = Annotated[
    float | None,
    typer.Option(
        "--min-p",
        callback=_parameter("min_p"),
        help="In [0, 1): drop tokens less likely than min_p × the top token's probability.",
    ),
]


def _check_repetition_penalty(value: float | None):
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value} is not above 0; 1 turns it off, e.g. 1.1 discourages repeats")
    return value


PresencePenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--presence-penalty",
        min=-2.0,
        max=2.0,
        help="-2 to 2, OpenAI's: lower the logit of every token the answer already has, by this much.",
    ),
]
FrequencyPenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--frequency-penalty",
        min=-2.0,
        max=2.0,
        help="-2 to 2, OpenAI's: lower a token's logit by this much for each time the answer has it.",
    ),
]
RepetitionPenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--repetition-penalty",
        callback=_check_repetition_penalty,
        help="llama.cpp's (1 = off, e.g. 1.1): divide the logits of the last 64 tokens seen (prompt, then answer).",
    ),
]
NoColorOpt = Annotated[bool, typer.Option("--no-color", help="Plain text, no colours.")]
VerboseOpt = Annotated[
    bool,
    typer.Option("--verbose", help="The header also names the device, the weight format and the BLAS in use."),
]
SureAtOpt = Annotated[
    float | None,
    typer.Option(
        "--sure-at",
        min=0.0,
        max=1.0,
        show_default="the model card's",
        help="The confidence (a probability of being right) below which the answer is flagged unsure.",
    ),
]
BudgetOpt = Annotated[
    float | None,
    typer.Option(
        "--budget",
        min=1.0,
        show_default="the model card's, 6",
        help="deliberate only: generated tokens at most BUDGET x the longest candidate.",
    ),
]
ReasoningOpt = Annotated[
    bool,
    typer.Option(
        "--reasoning",
        help="For a chain of thought: entropix's reasoning profile (the card's \\[reasoning] table, else the "
        "default one) and deliberate's reasoning setting (the card's \\[deliberate_reasoning] table, else the "
        "default one) (docs/sampler.md, Reasoning).",
    ),
]
JsonSchemaOpt = Annotated[
    Path | None,
    typer.Option(
        "--json-schema",
        metavar="FILE",
        help="Hold the answer to the JSON schema in FILE (every sampler chooses among what it allows); "
        "the end lists each value's confidence.",
    ),
]
NoCacheOpt = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Read the GGUF file itself, not its loaded form kept in the user cache (see entropix-mlx cache).",
    ),
]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        callback=_check_weights,
        show_default="auto, or $ENTROPIX_WEIGHTS",
        help="auto: float32 on the CPU (fast with a system OpenBLAS) while it fits in half the memory, "
        "the file's own format on a GPU or above that; "
        "native: the file's format; float32: dequantize once at load.",
    ),
]


def reasoning_hint(spec) -> str:
    """The line that points a chain of thought at the reasoning switch, in the flags that
    work from sampler `spec`; the costs are the sampler-costs table's (docs/results.md)."""
    entropix = "--reasoning" if spec.reasoning and not spec.whole_answers else "--sampler entropix --reasoning"
    deliberate = "--reasoning" if spec.reasoning and spec.whole_answers else "--reasoning --sampler deliberate"
    return (
        f"hint: this looks like a chain of thought; {entropix} sets entropix for one (about greedy's cost), "
        f"{deliberate} sets deliberate for one (about two and a half times greedy's tokens)"
    )


def check_options(
    sampler: str,
    config: str | None,
    model: str | None,
    budget: float | None = None,
    reasoning: bool = False,
    **params,
) -> None:
    """Reject options that would do nothing with `sampler` (a flag typed by hand
    that changes nothing is a slip), before the model loads."""
    spec = spec_of(sampler, SAMPLER_NAMES)
    given = [f"--{k.replace('_', '-')}" for k, v in params.items() if v is not None]
    if not spec.parameters and given:
        raise ConfigError(
            f"{', '.join(given)} has no effect with --sampler {sampler}; drop it or choose another sampler"
        )
    if budget is not None and not spec.budget:
        raise ConfigError(f"--budget sets the deliberate sampler; --sampler {sampler} does not use it")
    check_reasoning(sampler, reasoning)


def check_config(choice, config: str | None, model: str | None, budget=None, reasoning: bool = False) -> None:
    """Read --config and the model's shipped card for the sampler that answers and
    validate every value, so a mistake costs a second, not a model load."""
    spec = spec_of(choice.asked)
    if config is not None:
        if spec.table is None:
            raise ConfigError(f"--config sets the entropix sampler; --sampler {choice.asked} does not use it")
        if config not in spec.presets and not Path(config).is_file():
            if not spec.presets:
                raise ConfigError(
                    f"--config {config} is not a file; for --sampler {choice.asked} give a .toml file with a "
                    f"[{spec.table}] table"
                )
            what = "is a directory" if Path(config).is_dir() else "does not exist"
            raise ConfigError(
                f"--config {config} {what}; give a sampler .toml file or a preset ({', '.join(spec.presets)})"
            )
    if choice.spec.table is not None:  # the card's table, a --config file's, then the options
        read_settings(
            choice.name, resolve(model).name, config, choice.reasons(reasoning), **choice.params, budget=budget
        )
