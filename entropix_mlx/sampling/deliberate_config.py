"""DeliberateConfig: the settings of the `deliberate` sampler, validated, read
from the model card's `[deliberate]` table (or a TOML file with that table or
the fields at top level).

Thresholds are in bits (entropy) and bits squared (varentropy), as in
metrics.py. The card's values are the ones tuned on the built-in dev split
(README, "Deliberate").
"""

import functools
import math
import tomllib
from dataclasses import dataclass
from importlib import resources

from .gate import SIGNALS
from .selection import SELECTORS as SELECTOR_SCORES
from .selection import VOTE_SELECTORS
from .settings import THRESHOLD, Settings, at_least, card_data, card_table, layered, rule, validate

SELECTORS = tuple(SELECTOR_SCORES)

CLEAN_RULES = ("off", "loop", "loop_or_length", "length")

GATES = ("logits", "attention")


@dataclass(frozen=True)
class DeliberateConfig(Settings):
    kind = "deliberate"

    # CoT-decoding: the first answer token's `first_alternatives` most likely
    # alternatives to the greedy token each start a branch (0: off).
    first_alternatives: int = 4
    # EAGer-style gating: later, at a position of the greedy answer where the
    # next-token entropy exceeds `branch_entropy` or its varentropy exceeds
    # `branch_varentropy`, the `alternatives` next most likely tokens each start
    # a branch; at most `max_branch_points` such positions per answer.
    branch_entropy: float = 3.3
    branch_varentropy: float = 12.65
    # Or (`branch_gate = "attention"`) where the heads are unsure instead: the
    # attention entropy (bits, mean over heads and layers) exceeds
    # `branch_attn_entropy` or the heads' disagreement exceeds `branch_agreement`
    # (metrics.attention_metrics).
    branch_gate: str = "logits"
    branch_attn_entropy: float = 2.6
    branch_agreement: float = 0.0148
    alternatives: int = 1
    max_branch_points: int = 1
    # At least this many tokens between two such positions, so that the branches
    # leave the chain at different steps of its reasoning, not at one spike (0: any).
    branch_spacing: int = 0
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
    # Which answers are degenerate and lose to any that ended cleanly, whatever
    # their score: "loop" (a back-to-back repeat of LOOP_ALERT tokens or more),
    # "loop_or_length" (also one cut off by the length limit, which at short
    # budgets is often a right answer still explaining itself), "off".
    clean_first: str = "loop"
    # The vote selectors' weights (selection.vote_weight): exp(confidence /
    # vote_temperature), the confidence of lowest_group_vote over group_tokens tokens.
    vote_temperature: float = 0.1
    group_tokens: int = 16
    # Stop early (CGES-style): once two or more candidates have ended cleanly and
    # one answer holds stop_share of their vote (a vote selector's weights), the
    # other rows stop and the vote is taken among those that ended. 0: off.
    stop_share: float = 0.0
    # Start candidates in two stages: the greedy answer and this many first-token
    # alternatives first; the other alternatives start (from the prompt again)
    # only if those did not all end cleanly on one answer. 0: all at once.
    first_stage: int = 0
    # Gated (docs/gated-deliberate.md): the greedy chain runs alone first; its answer
    # stands when its `gate_signal` (gate.SIGNALS; "": off) is >= `gate_threshold`
    # and it ended before the limit. Otherwise `gate_first_alternatives` first-token
    # alternatives and `gate_branches` branches inside the chain (where the branch_*
    # thresholds would branch, in order) start from the prompt, in two stages with
    # `gate_staged` (the rest only if the first `first_stage` of them, 0: half, disagree
    # with greedy). first_alternatives, max_branch_points and stop_share are not read.
    gate_signal: str = ""
    gate_threshold: float = 0.0
    gate_first_alternatives: int = 0
    gate_branches: int = 0
    gate_staged: bool = False
    # DeepConf online: a gated candidate stops at its first `group_tokens` window whose
    # mean log-probability is below the greedy chain's lowest; it does not vote.
    running_stop: bool = False

    def __post_init__(self):
        validate(self, RULES, CHECKS)

    @property
    def max_candidates(self) -> int:
        """The greedy answer plus the branches that the cap and the budget allow."""
        return max(1, min(self.max_branches + 1, math.floor(self.budget)))


# In the order they are checked: an error names the first invalid field.
RULES = {
    "first_alternatives": at_least(0),
    "alternatives": at_least(0),
    "max_branch_points": at_least(0),
    "branch_spacing": at_least(0),
    "max_branches": at_least(0),
    "branch_entropy": THRESHOLD,
    "branch_varentropy": THRESHOLD,
    "branch_gate": rule(lambda v: v in GATES, f"choose one of: {', '.join(GATES)}"),
    "branch_attn_entropy": THRESHOLD,
    "branch_agreement": THRESHOLD,
    "min_probability": rule(lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "budget": at_least(1, "the greedy answer alone is 1"),
    "selector": rule(lambda v: v in SELECTORS, f"choose one of: {', '.join(SELECTORS)}"),
    "margin": at_least(0),
    "clean_first": rule(lambda v: v in CLEAN_RULES, f"choose one of: {', '.join(CLEAN_RULES)}"),
    "vote_temperature": rule(lambda v: v > 0, "must be > 0"),
    "group_tokens": at_least(1),
    "stop_share": rule(lambda v: 0 <= v <= 1, "must be in [0, 1] (0: off)"),
    "first_stage": at_least(0),
    "gate_signal": rule(lambda v: v == "" or v in SIGNALS, f"choose one of: {', '.join(SIGNALS)} (or empty: off)"),
    "gate_first_alternatives": at_least(0),
    "gate_branches": at_least(0),
}


def _stop_needs_a_vote(settings):
    if settings.stop_share > 0 and settings.selector not in VOTE_SELECTORS:
        return "stop_share", f"stops on a vote: choose a vote selector ({', '.join(VOTE_SELECTORS)})"
    return None


def _running_stop_needs_a_gate(settings):
    if settings.running_stop and not settings.gate_signal:
        return "running_stop", "stops the gate's candidates: set gate_signal"
    return None


CHECKS = (_stop_needs_a_vote, _running_stop_needs_a_gate)


# A vote by confidence over the greedy answer and first-token alternatives, no later
# branching and no early stop; only an answer cut off by the limit loses to one that
# ended (chains of thought repeat numbers on purpose). The staged rule starts the last 3
# of 4 alternatives only when the greedy answer and the first disagree: the baseline an
# uncertainty-gated rule must beat (docs/gated-deliberate.md).
FIRST_TOKEN_VOTE = dict(
    max_branch_points=0, selector="confidence_vote", margin=0.0, clean_first="length", stop_share=0.0
)
STAGED = dict(first_alternatives=4, first_stage=1, **FIRST_TOKEN_VOTE)
REASONING_TABLE = "deliberate_reasoning"
# In entropix_mlx/data: the setting chosen on the dev pool and frozen before the sealed scoring
# (docs/gated-deliberate.md), written by research/gated_replay.py --freeze. It names every field,
# so no card's [deliberate] changes what was scored.
REASONING_FILE = "deliberate_reasoning.toml"


@functools.cache
def shipped_reasoning() -> dict:
    """What a chain of thought runs with `reasoning` when the card has no [deliberate_reasoning]."""
    return tomllib.loads((resources.files("entropix_mlx.data") / REASONING_FILE).read_text())[REASONING_TABLE]


# CoT-decoding (Wang & Zhou 2024) as a preset: the top 10 first tokens (the
# greedy one and 9 alternatives), each continued greedily, no later branching;
# the answer with the largest answer-span margin p(top1) - p(top2) is kept.
COT_DECODING = DeliberateConfig(
    first_alternatives=9, max_branch_points=0, max_branches=9, budget=10.0, selector="max_margin", clean_first="off"
)


def resolve_deliberate(card=None, config=None, reasoning: bool = False, **overrides) -> tuple[DeliberateConfig, str]:
    """The config and where it came from: the [deliberate] table of `card` (a card
    file, or a model name: its shipped card), if any, under `config` (a .toml path
    or a DeliberateConfig), then the overrides (None = unset). `reasoning` (without
    a `config`, which is then the setting): the card's [deliberate_reasoning] table
    over its [deliberate], else shipped_reasoning()."""
    table = card_table(DeliberateConfig, card)
    settings = table or (DeliberateConfig(), "defaults")
    if reasoning and config is None:
        path, data = card_data(card)
        fields, where = data.get(REASONING_TABLE), f"[{REASONING_TABLE}] of {path.name if path else ''}"
        if fields is None:
            fields, where = shipped_reasoning(), "the default reasoning setting"
        settings = (settings[0].replace(**fields), f"{settings[1]} + {where}")
    return layered(settings, config, overrides)
