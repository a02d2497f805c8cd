"""SamplerConfig: every knob of the Entropix sampler, validated, loadable from TOML.

Thresholds are in bits (entropy) and bits squared (varentropy), the units of
`metrics.py`. Presets:

- "reference": the reference implementation's version 1 (thresholds hand-tuned
  for Llama-3.2-1B's 128k vocabulary; they do not transfer to other models).
- "calibrated": "reference" with the thresholds and thinking text from the
  model's card (`models/<name>.toml`, written by `entropix-mlx calibrate`).

A TOML file holds the same field names, either at top level or in a
`[sampler]` table (model cards use the table).

The reasoning profile: [sampler] settings are tuned on short answers; a chain
of thought restates numbers and headers on purpose and runs for hundreds of
tokens, where one derailing draw costs the answer. `reasoning=True` lays the
card's `[reasoning]` table (or, without one, REASONING) over [sampler].
"""

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .cards import CardDocument, card_file
from .parameters import PARAMETERS
from .settings import THRESHOLD, Settings, at_least, card_table, layered, not_above, read_toml, rule, validate
from .strategies import ENTROPIX_NAMES

BRANCH_SELECTS = ("logprob", "confidence", "path_confidence")
# The selects that roll out the likeliest tokens and compare how sure the model is of each path.
CONFIDENCE_SELECTS = ("confidence", "path_confidence")


BRANCH_ROLLOUTS = ("greedy", "scored")
REPETITION_SCOPES = ("answer", "loops")


@dataclass(frozen=True)
class SamplerConfig(Settings):
    kind = "sampler"
    # Entropix's repetition score is in bits; `repetition_penalty` is llama.cpp's
    # divisor of the logits (a request parameter, penalties.py).
    renamed = {"repetition_penalty": "repetition_bits"}

    # Base sampling parameters (reference v1).
    temperature: float = 0.666
    top_p: float = 0.90
    top_k: int = 27
    min_p: float = 0.03

    # Decision thresholds: the states of strategies.STRATEGY_TABLE read them.
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
    # handled by the fallback (adaptive), which is always available.
    strategies: tuple[str, ...] = ENTROPIX_NAMES

    # Which layers' attention metrics feed the sampler: "all" (mean over every
    # layer, the default: one layer alone is noisy), "last" (the reference's
    # choice), or a list of layer indices (mean over them).
    attention_layers: str | tuple[int, ...] = "all"

    # Adaptive: draw this many candidates (distinct random keys) and keep the
    # best-scored one. Every strategy chooses by that score: log-probability
    # (bits) minus repetition_bits per repetition unit, i.e. each
    # earlier occurrence in the answer of the n-gram (length repetition_ngram)
    # the token would complete, plus each token by which the longest repeated
    # span exceeds n (entropix.repeat_counts).
    adaptive_samples: int = 5
    adaptive_top_k_max: int = 100
    adaptive_max_temperature: float = 1.5  # the reference has no cap (see entropix.py)
    # Resample draws at T * (2 + 0.5 * attention varentropy), and never below this
    # temperature: the reference's floor, hot enough to leave a rut.
    resample_temperature: float = 2.0
    repetition_bits: float = 2.0
    repetition_ngram: int = 3
    # Which repeats the score charges: "answer", every earlier occurrence in the
    # answer; "loops", only a copy that runs back to back from its source (a
    # loop under way), so code's restated names and test lines go free.
    repetition_scope: str = "answer"

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
    #                more than branch_keep_margin;
    #   "path_confidence" as "confidence", with the candidate's own probability
    #                counted as the path's first certainty: after a short answer the
    #                rest of the path (a word's second piece, the end of the turn) is
    #                sure whatever the answer was.
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

    @property
    def loops_only(self) -> bool:
        """Whether the score charges loops only (`repetition_scope`)."""
        return self.repetition_scope == "loops"

    def __post_init__(self):
        validate(self, RULES, CHECKS)


THRESHOLDS = ("low_entropy", "low_varentropy", "medium_entropy", "high_entropy", "high_varentropy", "think_varentropy")


def strategies_problem(value) -> str | None:
    if not isinstance(value, (tuple, list)) or not all(isinstance(s, str) for s in value):
        return f"must be a list of names from: {', '.join(ENTROPIX_NAMES)}"
    unknown = [s for s in value if s not in ENTROPIX_NAMES]
    if unknown:
        return f"unknown strategy '{unknown[0]}'; choose from: {', '.join(ENTROPIX_NAMES)}"
    return None


def layers_problem(value) -> str | None:
    if isinstance(value, str):
        return None if value in ("all", "last") else 'must be "all", "last" or a list of layer indices'
    indices = isinstance(value, (tuple, list)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    return None if indices and value else 'must be "all", "last" or a non-empty list of layer indices'


# In the order they are checked: an error names the first invalid field.
RULES = {
    # the request parameters' rules (parameters.py), but a sampler's base temperature is never 0
    "temperature": rule(lambda v: v > 0, "must be > 0 (temperature 0 is the greedy sampler)"),
    "top_p": PARAMETERS["top_p"].problem,
    "top_k": PARAMETERS["top_k"].problem,
    "min_p": PARAMETERS["min_p"].problem,
    **dict.fromkeys(THRESHOLDS, THRESHOLD),
    "strategies": strategies_problem,
    "attention_layers": layers_problem,
    "argmax_margin": at_least(0, "bits; 0 turns the rule off"),
    "adaptive_samples": at_least(1),
    "adaptive_top_k_max": at_least(1),
    "adaptive_max_temperature": rule(lambda v: v > 0, "must be > 0"),
    "resample_temperature": rule(lambda v: v > 0, "must be > 0"),
    "repetition_bits": at_least(0, "bits"),
    "repetition_ngram": at_least(1),
    "repetition_scope": rule(lambda v: v in REPETITION_SCOPES, f"must be one of: {', '.join(REPETITION_SCOPES)}"),
    "branch_candidates": at_least(1),
    "branch_rollout_tokens": at_least(1),
    "branch_select": rule(lambda v: v in BRANCH_SELECTS, f"must be one of: {', '.join(BRANCH_SELECTS)}"),
    "branch_rollout": rule(lambda v: v in BRANCH_ROLLOUTS, f"must be one of: {', '.join(BRANCH_ROLLOUTS)}"),
    "branch_decide_tokens": at_least(0, "0: compare over the whole rollout"),
    "branch_keep_margin": at_least(0, "a probability margin"),
    "thinking_text": rule(lambda v: isinstance(v, str) and v != "", "must be a non-empty string"),
    "max_thinking_insertions": at_least(0),
}


CHECKS = (
    not_above("low_entropy", "medium_entropy"),
    not_above("medium_entropy", "high_entropy"),
    not_above("low_varentropy", "high_varentropy"),
)


def load_toml(path, base: SamplerConfig | None = None) -> SamplerConfig:
    """Read a SamplerConfig from TOML: fields at top level or in `[sampler]`;
    fields not given keep `base`'s values (default: the reference preset).
    To layer a file over the model's card, pass its path to make_sampler."""
    return SamplerConfig.from_toml(path, base)


PRESETS = ("reference", "calibrated")

# The default reasoning profile, chosen on GSM8K train items (docs/sampler.md,
# "Reasoning"): a card's [reasoning] table replaces it.
REASONING = {"repetition_bits": 0.0, "adaptive_max_temperature": 0.7}


def resolve_config(card=None, config=None, reasoning: bool = False, **overrides) -> tuple[SamplerConfig, str]:
    """The sampler's config and a one-line note of where it came from.

    `card`: the model's card (a file, or a model name: its shipped card).
    `config`: None (the card's [sampler] table if it has one, else the reference preset),
    a preset name, a path to a TOML file (its fields override the default), or
    a SamplerConfig. `reasoning`: the reasoning profile (`reasoning_profile`)
    over those. `overrides`: field values applied last (None = unset).
    """
    table = card_table(SamplerConfig, card)
    if config == "reference":
        settings = SamplerConfig(), "preset reference"
    elif config == "calibrated":
        if table is None:
            raise ConfigError(
                f"model '{card if isinstance(card, str) else 'in use'}' has no calibrated card; "
                "measure one first (`entropix-mlx calibrate`, or entropix_mlx.load, which measures it on first use)"
            )
        settings = table
    else:
        if config is not None and not isinstance(config, SamplerConfig):
            if not (isinstance(config, Path) or str(config).endswith(".toml") or Path(str(config)).is_file()):
                raise ConfigError(
                    f"unknown sampler config '{config}'; use a preset ({', '.join(PRESETS)}) or a .toml file"
                )
        default = SamplerConfig(), "preset reference (no model card; run `entropix-mlx calibrate`)"
        settings = layered(table or default, config)
    if reasoning:
        settings = _with_profile(settings, card, config)
    return layered(settings, None, overrides)


def reasoning_profile(card=None, config=None) -> tuple[dict, str]:
    """The [sampler] settings a chain of thought changes, and where they come
    from: the [reasoning] table of the TOML file `config`, else of the model's
    card, else REASONING."""
    files = [Path(config)] if isinstance(config, (str, Path)) and str(config).endswith(".toml") else []
    files += [card_file(card)] if card_file(card) else []
    for path in files:
        if path.is_file():
            held = isinstance(card, CardDocument) and path == card.path
            table = (card.data if held else read_toml(path)).get("reasoning")
            if table is not None:
                if not isinstance(table, dict):
                    raise ConfigError(f"config file {path}: [reasoning] must be a table")
                return table, f"[reasoning] of {path.name}"
    return dict(REASONING), "the default reasoning profile"


def _with_profile(under: tuple[SamplerConfig, str], card, config) -> tuple[SamplerConfig, str]:
    settings, source = under
    table, where = reasoning_profile(card, config)
    return SamplerConfig.from_dict({**settings.to_dict(), **table}, source=where), f"{source} + {where}"
