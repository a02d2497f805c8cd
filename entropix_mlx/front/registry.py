"""Each sampler described once: how it is built, what it takes, what it can
show and how it answers. The CLI, the server, eval, the legend and the docs
read this table; nothing else compares sampler names.

`build(name, ...)` makes one. `card` is where the model's settings are read
from: a card file (the model's own, bound by `load`), a model name (its shipped
card, if any) or None (the defaults)."""

from collections.abc import Callable
from dataclasses import dataclass

from ..decode.deliberate import Deliberator
from ..decode.voting import Voter
from ..errors import ConfigError
from ..sampling.answers import chain_of_thought_answer, default_answer
from ..sampling.config import CONFIDENCE_SELECTS, PRESETS, SamplerConfig, resolve_config
from ..sampling.deliberate_config import COT_DECODING, FIRST_TOKEN_VOTE, STAGED, DeliberateConfig, resolve_deliberate
from ..sampling.entropix import EntropixSampler
from ..sampling.parameters import PARAMETERS
from ..sampling.samplers import GreedySampler, MinPSampler, Sampler, TemperatureSampler
from ..sampling.settings import read_toml
from ..sampling.strategies import ENTROPIX_NAMES, FALLBACK, unreachable
from ..sampling.voting import PRESETS as VOTE_PRESETS
from ..sampling.voting import VoteConfig


@dataclass(frozen=True)
class SamplerSpec:
    name: str
    make: Callable[..., Sampler]  # (spec, card, config, reasoning, tokenizer, overrides) -> Sampler
    settings: type | None = None  # its settings class (a card table), if it has one
    resolve: Callable | None = None  # (card, config, reasoning, **overrides) -> (settings, source), if it reads a card
    parameters: tuple[str, ...] = ()  # the sampling parameters a request may set for it
    strategies: tuple[str, ...] = ("argmax",)  # what its tokens can be coloured as, legend order
    deterministic: bool = False  # the same answer for every seed
    whole_answers: bool = False  # it chooses among whole answers (task files, not open text)
    reads_card: bool = False  # its settings come from the model's card (and a config file)
    reasoning: bool = False  # it has a reasoning profile
    budget: bool = False  # it takes a token budget
    everywhere: bool = True  # run, chat and serve name it (else eval only: it answers only once all its samples are in)
    rule: dict | None = None  # a deliberate rule: the card's [deliberate] with these fields replaced
    preset: object = None  # a fixed preset its settings start from
    presets: tuple[str, ...] = ()  # names a config may give instead of a file
    votes: bool = False  # it votes over k samples

    @property
    def table(self) -> str | None:
        """The table of a card (and of a config file) its settings are read from; None: it reads none."""
        return self.settings.kind if self.reads_card else None


def _entropix(spec, card, config, reasoning, tokenizer, overrides):
    overrides.pop("metrics", None)  # Entropix always needs its metrics
    cfg, source = spec.resolve(card, config, reasoning, **overrides)
    return EntropixSampler(cfg, tokenizer, source)


def _greedy(spec, card, config, reasoning, tokenizer, overrides):
    return GreedySampler(overrides.get("metrics", True), overrides.get("logprobs", True))


def _baseline(cls):
    def make(spec, card, config, reasoning, tokenizer, overrides):
        overrides.pop("logprobs", None)  # they sample with them
        try:
            return cls(**overrides)
        except TypeError:
            known = ", ".join([*PARAMETERS, "metrics"])
            raise ConfigError(f"sampler '{spec.name}' takes only {known}; got {', '.join(overrides)}") from None

    return make


def _whole_answer_settings(overrides: dict) -> dict:
    """The overrides a whole-answer decoder takes: its rows record their own metrics
    and log-probabilities, whatever a per-step caller asks of a sampler."""
    return {k: v for k, v in overrides.items() if k not in ("metrics", "logprobs")}


def _deliberate(spec, card, config, reasoning, tokenizer, overrides):
    overrides = _whole_answer_settings(overrides)
    if spec.preset is not None:  # whatever the card says
        return Deliberator(spec.preset.replace(**overrides), f"the {spec.name} preset", spec.name)
    cfg, source = spec.resolve(card, config, reasoning, **{**(spec.rule or {}), **overrides})
    # A chain of thought's candidates are grouped by the number eval's chain-of-thought
    # scoring reads, so that the vote here is the vote of eval's row (its figures).
    return Deliberator(cfg, source, spec.name, chain_of_thought_answer if reasoning else default_answer)


def _vote(spec, card, config, reasoning, tokenizer, overrides):
    overrides = _whole_answer_settings(overrides)
    source = "preset" if not overrides else "preset and overrides"
    return Voter(spec.name, spec.preset.replace(**overrides), source)


SAMPLING = tuple(PARAMETERS)
# deliberate's earlier rule and other budgets, for comparison in eval: the card's [deliberate]
# table with these fields replaced (docs/deliberate.md, "Per token spent"). The budgets vote
# by confidence over the greedy answer and 1 or 4 first-token alternatives; no early stop,
# which saves nothing with two candidates and cost the wide set answers on dev. The staged
# one starts the last 3 of the wide set only when the first two disagree. Their answers are
# chains of thought, which repeat numbers on purpose: only an answer cut off by the limit
# loses to one that ended (`length`).
_DELIBERATE = dict(
    make=_deliberate,
    settings=DeliberateConfig,
    resolve=resolve_deliberate,
    strategies=("argmax", "split", "branch"),
    deterministic=True,
    whole_answers=True,
    reads_card=True,
)
_VOTE = dict(make=_vote, settings=VoteConfig, strategies=("sample",), whole_answers=True, everywhere=False, votes=True)

SAMPLERS = {
    s.name: s
    for s in (
        SamplerSpec(
            "entropix",
            _entropix,
            SamplerConfig,
            resolve_config,
            SAMPLING,
            ENTROPIX_NAMES,
            reads_card=True,
            reasoning=True,
            presets=PRESETS,
        ),
        SamplerSpec("greedy", _greedy, deterministic=True),
        SamplerSpec("temperature", _baseline(TemperatureSampler), parameters=SAMPLING, strategies=("sample", "argmax")),
        SamplerSpec("min_p", _baseline(MinPSampler), parameters=SAMPLING, strategies=("sample", "argmax")),
        SamplerSpec("deliberate", **_DELIBERATE, budget=True, reasoning=True),
        *(SamplerSpec(name, **_VOTE, preset=preset) for name, preset in VOTE_PRESETS.items()),
        SamplerSpec("cot_decoding", **{**_DELIBERATE, "reads_card": False}, preset=COT_DECODING),
        *(
            SamplerSpec(name, **_DELIBERATE, rule=rule)
            for name, rule in {
                "deliberate_margin": dict(selector="continuation_margin", margin=0.1, stop_share=0.0),
                "deliberate_narrow": dict(first_alternatives=1, **FIRST_TOKEN_VOTE),
                "deliberate_wide": dict(first_alternatives=4, **FIRST_TOKEN_VOTE),
                "deliberate_staged": STAGED,
            }.items()
        ),
    )
}
# What every other sampler is compared with, item by item (it runs once: it never samples).
BASELINE = "greedy"
# What answers when a caller names no sampler: run, chat, the server and the Python API.
DEFAULT_SAMPLER = "entropix"
# The names run, chat and serve take (every eval preset that can answer one prompt); eval takes every name.
SAMPLER_NAMES = tuple(n for n, s in SAMPLERS.items() if s.everywhere)
EVAL_SAMPLER_NAMES = tuple(SAMPLERS)


def spec_of(name: str, names: tuple[str, ...] = EVAL_SAMPLER_NAMES) -> SamplerSpec:
    """The sampler `name` among `names`, or a one-line error that lists them."""
    if name not in names:
        raise ConfigError(f"unknown sampler '{name}'; choose one of: {', '.join(names)}")
    return SAMPLERS[name]


def names_where(**facts) -> tuple[str, ...]:
    """The samplers whose spec has these facts, e.g. `names_where(whole_answers=True)`."""
    return tuple(n for n, s in SAMPLERS.items() if all(getattr(s, k) == v for k, v in facts.items()))


REASONING_NAMES = names_where(reasoning=True)


def check_reasoning(names: str | tuple[str, ...] | list[str], reasoning: bool) -> None:
    """The one rule for `reasoning`, in the CLI, the Python API and the server alike:
    asked of a sampler with no reasoning setting, it is an error (ConfigError),
    never dropped. `names`: the sampler asked for, or eval's list, where it sets
    those that have one and is an error only when none has."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if reasoning and not any(SAMPLERS[n].reasoning for n in names):
        which = f"the {names[0]} sampler has no" if len(names) == 1 else f"none of {', '.join(names)} has a"
        raise ConfigError(
            f"{which} reasoning setting; drop reasoning or choose {' or '.join(REASONING_NAMES)}, which have one"
        )


def config_sets(name: str, config) -> bool:
    """Whether `config` (a preset's name or a TOML file) sets sampler `name`: entropix
    reads any (a file's top level or its [sampler] table), the others that read a card
    only a file with their table."""
    spec = SAMPLERS[name]
    if config is None or spec.table is None:
        return False
    if spec.table == SamplerConfig.kind:
        return True
    return str(config).endswith(".toml") and spec.table in read_toml(config)


def read_settings(name: str, card=None, config=None, reasoning: bool = False, **overrides):
    """`(settings, source)`: what sampler `name` reads from `card` under `config` and
    `overrides` (None values unset), without building it, so that a mistake in a card
    or a config file fails before a model loads; None for one that reads no card."""
    spec = spec_of(name)
    check_reasoning(name, reasoning)
    if spec.table is None:
        return None
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return spec.resolve(card, config, reasoning, **{**(spec.rule or {}), **overrides})


def build(name: str, tokenizer=None, card=None, config=None, reasoning: bool = False, **overrides) -> Sampler:
    """Sampler `name` with the settings of `card` under `config` (the samplers that
    read the card: a .toml file, or for entropix a preset name or a SamplerConfig)
    and `overrides` (None values are ignored): sampling parameters, `metrics`
    (False: a baseline skips them), `logprobs` (greedy only), `budget`, `k`, or
    any field of the sampler's settings. `reasoning`: entropix's reasoning profile;
    deliberate's reasoning setting, its candidates' answers read as a chain of
    thought's (`answers.chain_of_thought_answer`, with a config file too);
    `tokenizer`: the model's (entropix's thinking text is in its tokens)."""
    spec = spec_of(name)
    check_reasoning(name, reasoning)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return spec.make(spec, card, config if spec.reads_card else None, reasoning, tokenizer, overrides)


def legend(name: str, config=None, vocabulary: int | None = None) -> list[str]:
    """The strategies sampler `name` can choose: an Entropix config may switch some
    off, or leave them no step (`strategies.unreachable`; adaptive, the fallback, always stays)."""
    spec = SAMPLERS.get(name)
    if spec is None:
        return []
    enabled = getattr(config, "strategies", None)
    if isinstance(config, SamplerConfig) and enabled:
        never = unreachable(config, vocabulary)
        return [s for s in spec.strategies if (s in enabled and s not in never) or s == FALLBACK]
    return list(spec.strategies)


def sampler_legend(sampler, vocabulary: int | None = None) -> list[str]:
    """The strategies this sampler instance can choose (its own config decides)."""
    return legend(sampler.name, getattr(sampler, "config", None), vocabulary)


def spec_for(sampler) -> SamplerSpec | None:
    """The spec of a sampler instance (None for one made outside the registry)."""
    return SAMPLERS.get(getattr(sampler, "name", None))


def deterministic(sampler) -> bool:
    """Whether the sampler's answer is the same for every seed: greedy and
    deliberate never sample, nor does a baseline at temperature 0. Entropix
    always may: its fallback, adaptive, draws candidates."""
    spec = spec_for(sampler)
    if spec is not None and spec.deterministic:
        return True
    return getattr(sampler, "params", {}).get("temperature") == 0


def seeded_strategies(sampler, vocabulary: int | None = None) -> tuple[str, ...]:
    """The strategies this sampler can choose whose tokens the seed draws:
    none for a deterministic one; a baseline's `sample`; Entropix's sampled ones
    its config leaves a step (a branch by confidence takes the likeliest tokens,
    argmax the best: neither draws)."""
    if deterministic(sampler):
        return ()
    config = getattr(sampler, "config", None)
    if not isinstance(config, SamplerConfig):
        return ("sample",)
    drawn = ("think", "resample", "adaptive") + (() if config.branch_select in CONFIDENCE_SELECTS else ("branch",))
    return tuple(s for s in sampler_legend(sampler, vocabulary) if s in drawn)


def same_for_every_seed(sampler, strategies) -> bool:
    """Whether an answer whose tokens took `strategies` is the one every seed
    gives: the sampler never samples, or no token was drawn. (Entropix decides
    each step from the model's metrics; a seed only draws the tokens of its
    sampled strategies, so an answer without them is every seed's.)"""
    seeded = set(seeded_strategies(sampler))
    return not seeded.intersection(strategies)
