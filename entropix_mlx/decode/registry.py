"""Samplers by name, for the CLI, eval, bench and the server: the per-step
samplers, and `deliberate`, a decoder of its own (`Deliberator`)."""

from ..errors import ConfigError
from ..sampling.config import resolve_config
from ..sampling.deliberate_config import COT_DECODING, resolve_deliberate
from ..sampling.entropix import EntropixSampler
from ..sampling.samplers import GreedySampler, MinPSampler, Sampler, TemperatureSampler
from ..sampling.voting import PRESETS as VOTE_PRESETS
from .deliberate import Deliberator
from .voting import Voter

BASELINES = {"greedy": GreedySampler, "temperature": TemperatureSampler, "min_p": MinPSampler}


SAMPLER_NAMES = ("entropix", *BASELINES, "deliberate")
# Baselines that vote over k sampled answers: for eval, which compares whole answers.
VOTE_NAMES = tuple(VOTE_PRESETS)
# deliberate's earlier rule and other budgets, for comparison in eval: the card's [deliberate]
# table with these fields replaced (docs/deliberate.md, "Per token spent"). The budgets vote
# by confidence over the greedy answer and 1 or 4 first-token alternatives; no early stop,
# which saves nothing with two candidates and cost the wide set answers on dev. The staged
# one starts the last 3 of the wide set only when the first two disagree. Their answers are
# chains of thought, which repeat numbers on purpose: only an answer cut off by the limit
# loses to one that ended (`length`).
_FIRST_TOKEN_VOTE = dict(
    max_branch_points=0, selector="confidence_vote", margin=0.0, clean_first="length", stop_share=0.0
)
DELIBERATE_RULES = {
    "deliberate_margin": dict(selector="continuation_margin", margin=0.1, stop_share=0.0),
    "deliberate_narrow": dict(first_alternatives=1, **_FIRST_TOKEN_VOTE),
    "deliberate_wide": dict(first_alternatives=4, **_FIRST_TOKEN_VOTE),
    "deliberate_staged": dict(first_alternatives=4, first_stage=1, **_FIRST_TOKEN_VOTE),
}
# The names that read the card's [deliberate] table.
DELIBERATE_NAMES = ("deliberate", *DELIBERATE_RULES)
EVAL_SAMPLER_NAMES = (*SAMPLER_NAMES, *VOTE_NAMES, "cot_decoding", *DELIBERATE_RULES)


def make_sampler(
    name: str = "greedy",
    tokenizer=None,
    model_name: str | None = None,
    config=None,
    reasoning: bool = False,
    **overrides,
) -> Sampler:
    """Build a sampler by name.

    Baselines take `overrides` temperature, top_p, top_k, min_p and `metrics`
    (False: skip the metrics); greedy also `logprobs` (False: skip them too).
    "entropix" takes `config` (None: the model's card if `model_name` has one,
    else the reference preset; a preset name; a .toml path; or a SamplerConfig)
    and any SamplerConfig field as an override; it needs the tokenizer to
    resolve its thinking text; `reasoning` lays the reasoning profile over its
    card (config.reasoning_profile; the other samplers have none). None values
    are ignored.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if reasoning and name != "entropix":
        raise ConfigError(f"the reasoning profile is the entropix sampler's; the {name} sampler has none")
    logprobs = overrides.pop("logprobs", True)  # only greedy can do without: the others sample with them
    if name in VOTE_NAMES:  # k sampled answers and a vote; overrides such as k
        overrides.pop("metrics", None)
        return Voter(
            name, VOTE_PRESETS[name].replace(**overrides), "preset" if not overrides else "preset and overrides"
        )
    if name == "cot_decoding":  # deliberate's CoT-decoding preset, whatever the card says
        overrides.pop("metrics", None)
        decoder = Deliberator(COT_DECODING.replace(**overrides), "the cot_decoding preset")
        decoder.name = name
        return decoder
    if name in DELIBERATE_NAMES:  # settings from [deliberate], overrides such as budget
        overrides.pop("metrics", None)
        cfg, source = resolve_deliberate(model_name, config, **{**DELIBERATE_RULES.get(name, {}), **overrides})
        decoder = Deliberator(cfg, source)
        decoder.name = name
        return decoder
    if name == "entropix":
        overrides.pop("metrics", None)  # Entropix always needs its metrics
        cfg, source = resolve_config(model_name, config, reasoning, **overrides)
        return EntropixSampler(cfg, tokenizer, source)
    if name == "greedy":
        return GreedySampler(overrides.get("metrics", True), logprobs)
    if name in BASELINES:
        try:
            return BASELINES[name](**overrides)
        except TypeError:
            known = "temperature, top_p, top_k, min_p, metrics"
            raise ConfigError(f"sampler '{name}' takes only {known}; got {', '.join(overrides)}") from None
    raise ConfigError(f"unknown sampler '{name}'; choose one of: {', '.join(EVAL_SAMPLER_NAMES)}")
