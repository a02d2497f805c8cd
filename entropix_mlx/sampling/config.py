"""SamplerConfig: every knob of the Entropix sampler, validated, loadable from TOML.

Thresholds are in bits (entropy) and bits squared (varentropy), the units of
`metrics.py`. Presets:

- "reference": the reference implementation's version 1 (thresholds hand-tuned
  for Llama-3.2-1B's 128k vocabulary; they do not transfer to other models).
- "calibrated": "reference" with the thresholds and thinking text from the
  model's card (`models/<name>.toml`, written by `entropix-mlx calibrate`).

A TOML file holds the same field names, either at top level or in a
`[sampler]` table (model cards use the table).
"""

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import ConfigError

STRATEGIES = ("argmax", "think", "branch", "resample", "adaptive")


BRANCH_SELECTS = ("logprob", "confidence")


BRANCH_ROLLOUTS = ("greedy", "scored")


@dataclass(frozen=True)
class SamplerConfig:
    # Base sampling parameters (reference v1).
    temperature: float = 0.666
    top_p: float = 0.90
    top_k: int = 27
    min_p: float = 0.03

    # Decision thresholds, checked in this order (see entropix.decide):
    #   argmax   H < low_entropy and V < low_varentropy, or a top-1 margin >= argmax_margin
    #   think    H > medium_entropy and V < think_varentropy
    #   branch   H < high_entropy and V > high_varentropy
    #   resample H > medium_entropy and V > high_varentropy (so H >= high_entropy after branch)
    #   adaptive everything else
    low_entropy: float = 0.1
    low_varentropy: float = 0.1
    medium_entropy: float = 3.0
    high_entropy: float = 5.0
    high_varentropy: float = 5.0
    # The reference uses low_varentropy for think too (0.1). A real model's
    # varentropy is never that low when its entropy is high (on SmolLM2 no
    # step is), so "think" could never fire; calibration sets this one apart.
    think_varentropy: float = 0.1

    # Argmax also when the best-scored token is at least this many bits
    # likelier than the second (log2 p1 - log2 p2), whatever H and V say:
    # the answer-critical case of one clear winner on a long tail. 0 = off
    # (the reference has no such rule).
    argmax_margin: float = 0.0

    # Which strategies may be chosen; a state whose strategy is left out is
    # handled by "adaptive", which is always available.
    strategies: tuple[str, ...] = STRATEGIES

    # Which layers' attention metrics feed the sampler: "all" (mean over every
    # layer, the default: one layer alone is noisy), "last" (the reference's
    # choice), or a list of layer indices (mean over them).
    attention_layers: str | tuple[int, ...] = "all"

    # Adaptive: draw this many candidates (distinct random keys) and keep the
    # best-scored one. Every strategy chooses by that score: log-probability
    # (bits) minus repetition_penalty (bits) per repetition unit, i.e. each
    # earlier occurrence in the answer of the n-gram (length repetition_ngram)
    # the token would complete, plus each token by which the longest repeated
    # span exceeds n (entropix.repeat_counts).
    adaptive_samples: int = 5
    adaptive_top_k_max: int = 100
    adaptive_max_temperature: float = 1.5  # the reference has no cap (see entropix.py)
    repetition_penalty: float = 2.0
    repetition_ngram: int = 3

    # Branch: fork the KV cache, roll out this many candidate first tokens for
    # branch_rollout_tokens tokens each (greedy after the first) and keep the
    # path with the best score (total log-probability minus the repetition
    # penalty over the path).
    branch_candidates: int = 3
    branch_rollout_tokens: int = 2
    # How branch picks its candidates and its path:
    #   "logprob"    (the reference) candidates drawn at the branch temperature,
    #                the path with the best score above wins;
    #   "confidence" the branch_candidates most likely tokens (by score), and the
    #                path whose greedy continuation the model is surest of wins:
    #                the mean top-1 minus top-2 probability over the rollout after
    #                the candidate (CoT-decoding's answer confidence, Wang & Zhou
    #                2024), paths with fewer repetition units first. The most
    #                likely candidate keeps its place unless another beats it by
    #                more than branch_keep_margin.
    branch_select: str = "logprob"
    branch_keep_margin: float = 0.0
    # How a rollout continues after its candidate:
    #   "greedy" (the reference) the most likely token of the model;
    #   "scored" the best-scored token (log-probability minus the repetition
    #            penalty), the rule argmax steps follow: a path that would start
    #            to copy the answer moves on instead of being cut there.
    branch_rollout: str = "greedy"
    # The rows are compared over their first branch_decide_tokens tokens (the
    # candidate and what follows it); then only the winner rolls on, alone, to
    # branch_rollout_tokens. 0: compared over the whole rollout (the reference).
    # A branch of n rows costs about n passes per token handed out without it,
    # 1 + (n - 1) * decide / rollout with it: on a CPU with quantized weights a
    # row costs a full pass, so this is what keeps a long look-ahead affordable.
    branch_decide_tokens: int = 0

    # Think: the text inserted when the model hesitates (from the model card),
    # at most max_thinking_insertions times per answer, never twice in a row.
    thinking_text: str = " ..."
    max_thinking_insertions: int = 3

    def __post_init__(self):
        validate(self)

    @classmethod
    def from_toml(cls, path, base: "SamplerConfig | None" = None) -> "SamplerConfig":
        """Fields from a TOML file over `base` (default: the reference preset).
        To layer a file over the model's card, pass its path to make_sampler."""
        return load_toml(path, base)

    @classmethod
    def preset(cls, name: str, model_name: str | None = None) -> "SamplerConfig":
        return resolve_config(model_name, name)[0]

    def replace(self, **changes) -> "SamplerConfig":
        return from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["strategies"] = list(d["strategies"])
        if not isinstance(d["attention_layers"], str):
            d["attention_layers"] = list(d["attention_layers"])
        return d


FIELD_TYPES = {f.name: f.type for f in fields(SamplerConfig)}


THRESHOLDS = ("low_entropy", "low_varentropy", "medium_entropy", "high_entropy", "high_varentropy", "think_varentropy")


def _number(name, value, integer=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"sampler setting '{name}' must be a number, got {value!r}")
    if integer and not isinstance(value, int):
        if float(value).is_integer():
            return int(value)
        raise ConfigError(f"sampler setting '{name}' must be a whole number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"sampler setting '{name}' must be finite, got {value!r}")
    return value


def validate(c: SamplerConfig) -> None:
    """Raise ConfigError naming the first invalid field."""

    def bad(name, rule):
        raise ConfigError(f"sampler setting '{name}' = {getattr(c, name)!r} is invalid: {rule}")

    for f in fields(c):
        if f.type in (float, "float"):
            _number(f.name, getattr(c, f.name))
        elif f.type in (int, "int"):
            value = getattr(c, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                bad(f.name, "must be a whole number")
    if c.temperature <= 0:
        bad("temperature", "must be > 0 (use the greedy sampler for temperature 0)")
    if not 0 < c.top_p <= 1:
        bad("top_p", "must be in (0, 1]")
    if c.top_k < 0:
        bad("top_k", "must be >= 0 (0 turns top-k off)")
    if not 0 <= c.min_p < 1:
        bad("min_p", "must be in [0, 1)")
    for name in THRESHOLDS:
        if getattr(c, name) < 0:
            bad(name, "thresholds are entropies (bits) or varentropies (bits^2) and cannot be negative")
    if c.low_entropy > c.medium_entropy:
        bad("low_entropy", f"must not exceed medium_entropy ({c.medium_entropy})")
    if c.medium_entropy > c.high_entropy:
        bad("medium_entropy", f"must not exceed high_entropy ({c.high_entropy})")
    if c.low_varentropy > c.high_varentropy:
        bad("low_varentropy", f"must not exceed high_varentropy ({c.high_varentropy})")
    if isinstance(c.strategies, str) or not all(isinstance(s, str) for s in c.strategies):
        bad("strategies", f"must be a list of names from: {', '.join(STRATEGIES)}")
    unknown = [s for s in c.strategies if s not in STRATEGIES]
    if unknown:
        bad("strategies", f"unknown strategy '{unknown[0]}'; choose from: {', '.join(STRATEGIES)}")
    layers = c.attention_layers
    if isinstance(layers, str):
        if layers not in ("all", "last"):
            bad("attention_layers", 'must be "all", "last" or a list of layer indices')
    elif not layers or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        bad("attention_layers", 'must be "all", "last" or a non-empty list of layer indices')
    if c.argmax_margin < 0:
        bad("argmax_margin", "must be >= 0 (bits; 0 turns the rule off)")
    if c.adaptive_samples < 1:
        bad("adaptive_samples", "must be >= 1")
    if c.adaptive_top_k_max < 1:
        bad("adaptive_top_k_max", "must be >= 1")
    if c.adaptive_max_temperature <= 0:
        bad("adaptive_max_temperature", "must be > 0")
    if c.repetition_penalty < 0:
        bad("repetition_penalty", "must be >= 0 (bits)")
    if c.repetition_ngram < 1:
        bad("repetition_ngram", "must be >= 1")
    if c.branch_candidates < 1:
        bad("branch_candidates", "must be >= 1")
    if c.branch_rollout_tokens < 1:
        bad("branch_rollout_tokens", "must be >= 1")
    if c.branch_select not in BRANCH_SELECTS:
        bad("branch_select", f"must be one of: {', '.join(BRANCH_SELECTS)}")
    if c.branch_rollout not in BRANCH_ROLLOUTS:
        bad("branch_rollout", f"must be one of: {', '.join(BRANCH_ROLLOUTS)}")
    if c.branch_decide_tokens < 0:
        bad("branch_decide_tokens", "must be >= 0 (0: compare over the whole rollout)")
    if c.branch_keep_margin < 0:
        bad("branch_keep_margin", "must be >= 0 (a probability margin)")
    if not isinstance(c.thinking_text, str) or not c.thinking_text:
        bad("thinking_text", "must be a non-empty string")
    if c.max_thinking_insertions < 0:
        bad("max_thinking_insertions", "must be >= 0")


def from_dict(data: dict, source: str = "config") -> SamplerConfig:
    """Build a config from plain values (TOML tables, CLI overrides); unknown
    keys are an error, so a typo does not go silently unused."""
    unknown = [k for k in data if k not in FIELD_TYPES]
    if unknown:
        raise ConfigError(
            f"unknown sampler setting '{unknown[0]}' in {source}; known settings: {', '.join(FIELD_TYPES)}"
        )
    values = dict(data)
    for name in ("strategies", "attention_layers"):
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    for name, value in values.items():
        kind = FIELD_TYPES[name]
        if kind in (float, "float"):
            values[name] = float(_number(name, value))
        elif kind in (int, "int"):
            values[name] = _number(name, value, integer=True)
    return SamplerConfig(**values)


def read_toml(path) -> dict:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def load_toml(path, base: SamplerConfig | None = None) -> SamplerConfig:
    """Read a SamplerConfig from TOML: fields at top level or in `[sampler]`;
    fields not given keep `base`'s values (default: the reference preset)."""
    data = read_toml(path)
    table = data["sampler"] if "sampler" in data else data
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [sampler] must be a table")
    table = {k: v for k, v in table.items() if not isinstance(v, dict)}  # other tables: card metadata
    base = base or SamplerConfig()
    return from_dict({**base.to_dict(), **table}, source=str(path))


PRESETS = ("reference", "calibrated")


def card_config(model_name: str) -> tuple[SamplerConfig, str] | None:
    """The calibrated config from the model's card, or None without a card."""
    from .cards import card_path

    path = card_path(model_name)
    if not path.is_file():
        return None
    return load_toml(path), f"model card {path.name} (calibrated)"


def resolve_config(model_name: str | None = None, config=None, **overrides) -> tuple[SamplerConfig, str]:
    """The sampler's config and a one-line note of where it came from.

    `config`: None (the model's card if it has one, else the reference preset),
    a preset name, a path to a TOML file (its fields override the default), or
    a SamplerConfig. `overrides`: field values applied last (None = unset).
    """
    card = card_config(model_name) if model_name else None
    if config is None:
        cfg, source = card or (SamplerConfig(), "preset reference (no model card; run `entropix-mlx calibrate`)")
    elif isinstance(config, SamplerConfig):
        cfg, source = config, "given config"
    elif config == "reference":
        cfg, source = SamplerConfig(), "preset reference"
    elif config == "calibrated":
        if card is None:
            raise ConfigError(
                f"model '{model_name}' has no calibrated card; "
                f"run `entropix-mlx calibrate --model {model_name or 'MODEL'}` first"
            )
        cfg, source = card
    elif isinstance(config, Path) or str(config).endswith(".toml") or Path(str(config)).is_file():
        base = card[0] if card else SamplerConfig()
        cfg, source = load_toml(config, base), f"config file {config}"
    else:
        raise ConfigError(f"unknown sampler config '{config}'; use a preset ({', '.join(PRESETS)}) or a .toml file")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        cfg = cfg.replace(**overrides)
        source += " + " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    return cfg, source
