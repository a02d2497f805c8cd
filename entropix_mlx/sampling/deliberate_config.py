"""DeliberateConfig: the settings of the `deliberate` sampler, validated, read
from the model card's `[deliberate]` table (or a TOML file with that table or
the fields at top level).

Thresholds are in bits (entropy) and bits squared (varentropy), as in
metrics.py. The card's values are the ones tuned on the built-in dev split
(README, "Deliberate").
"""

import dataclasses
import math
from dataclasses import dataclass, fields

from ..errors import ConfigError

SELECTORS = (
    "greedy",
    "margin",
    "max_margin",
    "logprob",
    "vote",
    "weighted_vote",
    "continuation_logprob",
    "continuation_margin",
)


@dataclass(frozen=True)
class DeliberateConfig:
    # CoT-decoding: the first answer token's `first_alternatives` most likely
    # alternatives to the greedy token each start a branch (0: off).
    first_alternatives: int = 4
    # EAGer-style gating: later, at a position of the greedy answer where the
    # next-token entropy exceeds `branch_entropy` or its varentropy exceeds
    # `branch_varentropy`, the `alternatives` next most likely tokens each start
    # a branch; at most `max_branch_points` such positions per answer.
    branch_entropy: float = 3.3
    branch_varentropy: float = 12.65
    alternatives: int = 1
    max_branch_points: int = 1
    # Ignore alternatives less likely than this (they are rarely the answer).
    min_probability: float = 0.0
    # At most this many branches besides the greedy answer.
    max_branches: int = 5
    # Generated tokens over all candidates stay within budget x the longest
    # candidate: each candidate generates at most as many tokens as the longest
    # one, so at most floor(budget) candidates start.
    budget: float = 6.0
    # How candidates are compared (see deliberate.answer_scores) and by how much
    # another answer must beat the greedy answer's score to replace it.
    selector: str = "margin"
    margin: float = 0.0

    def __post_init__(self):
        validate(self)

    @property
    def max_candidates(self) -> int:
        """The greedy answer plus the branches that the cap and the budget allow."""
        return max(1, min(self.max_branches + 1, math.floor(self.budget)))

    def replace(self, **changes) -> "DeliberateConfig":
        return from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELD_TYPES = {f.name: f.type for f in fields(DeliberateConfig)}


def validate(c: DeliberateConfig) -> None:
    """Raise ConfigError naming the first invalid field."""

    def bad(name, rule):
        raise ConfigError(f"deliberate setting '{name}' = {getattr(c, name)!r} is invalid: {rule}")

    for f in fields(c):
        value = getattr(c, f.name)
        if f.type in (int, "int") and (isinstance(value, bool) or not isinstance(value, int)):
            bad(f.name, "must be a whole number")
        if f.type in (float, "float") and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            bad(f.name, "must be a finite number")
    for name in ("first_alternatives", "alternatives", "max_branch_points", "max_branches"):
        if getattr(c, name) < 0:
            bad(name, "must be >= 0")
    for name in ("branch_entropy", "branch_varentropy"):
        if getattr(c, name) < 0:
            bad(name, "thresholds are entropies (bits) or varentropies (bits^2) and cannot be negative")
    if not 0 <= c.min_probability < 1:
        bad("min_probability", "must be in [0, 1)")
    if c.budget < 1:
        bad("budget", "must be >= 1 (the greedy answer alone is 1)")
    if c.selector not in SELECTORS:
        bad("selector", f"choose one of: {', '.join(SELECTORS)}")
    if c.margin < 0:
        bad("margin", "must be >= 0")


def from_dict(data: dict, source: str = "config") -> DeliberateConfig:
    unknown = [k for k in data if k not in FIELD_TYPES]
    if unknown:
        raise ConfigError(
            f"unknown deliberate setting '{unknown[0]}' in {source}; known settings: {', '.join(FIELD_TYPES)}"
        )
    values = dict(data)
    for name, value in values.items():
        kind = FIELD_TYPES[name]
        if kind in (float, "float") and isinstance(value, int) and not isinstance(value, bool):
            values[name] = float(value)
        elif kind in (int, "int") and isinstance(value, float) and value.is_integer():
            values[name] = int(value)
    return DeliberateConfig(**values)


def load_config(path, base: DeliberateConfig | None = None) -> DeliberateConfig:
    """Fields from a TOML file's `[deliberate]` table (or its top level) over `base`."""
    from .config import read_toml

    data = read_toml(path)
    table = data.get("deliberate", data)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [deliberate] must be a table")
    if "deliberate" not in data:  # a file of top-level fields: ignore other tables (e.g. [sampler])
        table = {k: v for k, v in table.items() if not isinstance(v, dict) and k != "name"}
    return from_dict({**(base or DeliberateConfig()).to_dict(), **table}, source=str(path))


def resolve_deliberate(model_name: str | None = None, config=None, **overrides) -> tuple[DeliberateConfig, str]:
    """The config and where it came from: the model card's [deliberate] table
    (if any) under `config` (a .toml path or a DeliberateConfig), then the
    overrides (None = unset)."""
    from .cards import card_path

    cfg, source = DeliberateConfig(), "defaults"
    if model_name:
        card = card_path(model_name)
        if card.is_file():
            from .config import read_toml

            if "deliberate" in read_toml(card):
                cfg, source = load_config(card), f"model card {card.name}"
    if isinstance(config, DeliberateConfig):
        cfg, source = config, "given config"
    elif config is not None:
        cfg, source = load_config(config, cfg), f"config file {config}"
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        cfg = cfg.replace(**overrides)
        source += " + " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    return cfg, source
