"""Settings: the one mechanism behind SamplerConfig and DeliberateConfig.

A config is a frozen dataclass of settings that subclasses `Settings`. Its
module declares each field's rule once, in a table {field: rule}; a rule takes
the value and returns what is wrong with it (None: nothing). Fields annotated
int or float are checked for a whole or finite number before any rule runs, so
a rule may compare freely. Rules between two fields are a short list of checks.

Every error is one line that names the field:
    sampler setting 'top_p' = 1.5 is invalid: must be in (0, 1]

Settings come in layers, each over the one before, and the source line says
which gave them: the defaults (or a preset), the model card's table
(`models/<name>.toml`, `[sampler]` or `[deliberate]`), a TOML file given by the
user, then single values (CLI flags, request fields).
"""

import dataclasses
import math
import tomllib
import typing
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import ClassVar, Self

from ..errors import ConfigError
from .cards import CardDocument, card_file, cards_dir

Rule = Callable[[object], str | None]  # a value -> what is wrong with it, or None
Check = Callable[[object], tuple[str, str] | None]  # settings -> (field, what is wrong), or None


def rule(test: Callable[[object], bool], problem: str) -> Rule:
    """A field's rule: `problem` when `test(value)` is false."""
    return lambda value: None if test(value) else problem


def at_least(low, why: str = "") -> Rule:
    return rule(lambda v: v >= low, f"must be >= {low}" + (f" ({why})" if why else ""))


THRESHOLD = rule(lambda v: v >= 0, "thresholds are entropies (bits) or varentropies (bits^2) and cannot be negative")


def not_above(low: str, high: str) -> Check:
    """A check between two fields: `low` must not exceed `high`."""

    def check(settings):
        if getattr(settings, low) > getattr(settings, high):
            return low, f"must not exceed {high} ({getattr(settings, high)})"
        return None

    return check


def number_problem(kind, value) -> str | None:
    """What is wrong with `value` for a field annotated `kind` (float or int)."""
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "must be a number"
        if not math.isfinite(value):
            return "must be a finite number"
    elif kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be a whole number"
    return None


def validate(settings: "Settings", rules: dict[str, Rule], checks: tuple[Check, ...] = ()) -> None:
    """Raise ConfigError naming the first invalid field: numbers first, then
    the rules in table order, then the checks between fields."""

    def bad(name, problem):
        value = getattr(settings, name)
        raise ConfigError(f"{settings.kind} setting '{name}' = {value!r} is invalid: {problem}")

    for f in fields(settings):
        problem = number_problem(f.type, getattr(settings, f.name))
        if problem:
            bad(f.name, problem)
    for name, field_rule in rules.items():
        problem = field_rule(getattr(settings, name))
        if problem:
            bad(name, problem)
    for check in checks:
        found = check(settings)
        if found:
            bad(*found)


def holds_tuple(kind) -> bool:
    """Whether a field annotated `kind` takes a tuple (TOML gives a list)."""
    return typing.get_origin(kind) is tuple or any(holds_tuple(k) for k in typing.get_args(kind))


def read_toml(path) -> dict:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def _renamed(data: dict, names: dict, values: dict) -> dict:
    """`data` with its keys renamed by `names` and, under a key's new name, its string values by `values`."""
    out = {}
    for key, value in data.items():
        key = names.get(key, key)
        out[key] = values.get(key, {}).get(value, value) if isinstance(value, str) else value
    return out


class Settings:
    """The base of a frozen dataclass of settings. `kind` names them in errors
    ("sampler setting ...") and is their table in a TOML file ([sampler])."""

    kind: ClassVar[str]
    # A setting's earlier name -> its name now, and a setting's earlier values -> its
    # values now: cards, config files and records written before a rename still read.
    renamed: ClassVar[dict[str, str]] = {}
    renamed_values: ClassVar[dict[str, dict[str, str]]] = {}

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> Self:
        """Settings from plain values (TOML tables, CLI overrides); unknown keys
        are an error, so a typo does not go silently unused. Whole numbers
        become floats and whole floats ints where the field says so; every
        other value is checked as given."""
        kinds = {f.name: f.type for f in fields(cls)}
        values = cls.current_names(data)
        unknown = [k for k in values if k not in kinds]
        if unknown:
            raise ConfigError(
                f"unknown {cls.kind} setting '{unknown[0]}' in {source}; known settings: {', '.join(kinds)}"
            )
        for name, value in values.items():
            kind = kinds[name]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                values[name] = float(value)
            elif kind is int and isinstance(value, float) and value.is_integer():
                values[name] = int(value)
            elif isinstance(value, list) and holds_tuple(kind):
                values[name] = tuple(value)
        return cls(**values)

    @classmethod
    def current_names(cls, data: dict) -> dict:
        """`data` with earlier names of settings, and earlier values, replaced by
        their names now (a later key wins, as it would under one name)."""
        return _renamed(data, cls.renamed, cls.renamed_values)

    @classmethod
    def earlier_names(cls, data: dict) -> dict:
        """`data` (names now) as written before the renames: what a hash logged then was taken of."""
        names = {now: old for old, now in cls.renamed.items()}
        values = {names.get(k, k): {now: old for old, now in m.items()} for k, m in cls.renamed_values.items()}
        return _renamed(data, names, values)

    @classmethod
    def from_toml(cls, path, base: Self | None = None) -> Self:
        """The fields of a TOML file over `base` (default: the defaults). The
        fields are in the file's [kind] table or, without one, at top level;
        other tables (card metadata, the other config's table) and a card's
        top-level `name` are not settings."""
        return cls.from_document(read_toml(path), path, base)

    @classmethod
    def from_document(cls, data: dict, path, base: Self | None = None) -> Self:
        table = data.get(cls.kind, data)
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: [{cls.kind}] must be a table")
        top_level = cls.kind not in data
        values = {k: v for k, v in table.items() if not isinstance(v, dict) and not (top_level and k == "name")}
        return cls.from_dict({**(base or cls()).to_dict(), **values}, source=str(path))

    def replace(self, **changes) -> Self:
        return self.from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict:
        """Plain values, tuples as lists (as TOML and JSON have them)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def card_data(card) -> tuple[Path | None, dict]:
    """(the file of `card`, its tables): a card file, a model name (its shipped
    card) or a CardDocument, read once; (None, {}) when there is none."""
    path = card_file(card)
    if path is None:
        return None, {}
    return path, card.data if isinstance(card, CardDocument) else read_toml(path)


def card_table(cls: type[Settings], card) -> tuple[Settings, str] | None:
    """The [kind] table of `card` (a card file, or a model name: its shipped card)
    over the defaults and its source, or None when there is no card or no such table."""
    path, data = card_data(card)
    if cls.kind not in data:
        return None
    return cls.from_document(data, path), card_label(path, data)


def card_label(path: Path, data: dict) -> str:
    """Where settings came from, in the header's words: a card shipped with the
    package, or one measured on the model's first use (and when)."""
    if path.parent == cards_dir():
        return f"shipped card {path.name}"
    date = data.get("calibration", {}).get("date", "an earlier run")
    return f"card measured on first use ({date}): {path.name}"


def layered(under: tuple[Settings, str], config=None, overrides: dict | None = None) -> tuple[Settings, str]:
    """Settings and the one line saying where they came from: `under` (the
    defaults, a preset or the card's table, with its source), then `config`
    (settings of the same class, which replace it, or a TOML file read over
    it), then `overrides` (field values; None = unset), named in the line."""
    settings, source = under
    if isinstance(config, type(settings)):
        settings, source = config, "given config"
    elif config is not None:
        settings, source = type(settings).from_toml(config, settings), f"config file {config}"
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if overrides:
        settings = settings.replace(**overrides)
        source += " + " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    return settings, source
