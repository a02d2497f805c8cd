"""Self-consistency and CISC: k sampled answers, then a vote over what they answer.

Self-consistency (Wang et al. 2023) samples k chains of thought and keeps the
answer most of them give. CISC (Taubenfeld et al. 2025, "Confidence Improves
Self-Consistency in LLMs") weights each vote by the model's confidence in its
answer; here the length-normalized sequence probability, one of the paper's
confidence measures: a sample's mean token log-probability c, weighted
softmax(c / confidence_temperature) over the k samples. The vote itself is
answer selection's (selection.py), shared with deliberate.

The k answers share one prefill: the root row draws k first tokens
independently and starts a row for each but its own (`TokenChoice.spawn`), each
continuing on a copy of the root's cache with its own key chain.
"""

from dataclasses import dataclass

import mlx.core as mx

from .samplers import Step, TemperatureSampler, TokenChoice, filtered_logprobs, sanitize_logits
from .selection import SAMPLE_VOTES
from .settings import Settings, at_least, rule, validate


@dataclass(frozen=True)
class VoteConfig(Settings):
    kind = "vote"
    # Selection's one vocabulary (deliberate's selectors): records written before it say vote = majority or confidence.
    renamed = {"vote": "selector"}
    renamed_values = {"selector": {"majority": "vote", "confidence": "confidence_vote"}}

    k: int = 8  # answers sampled per question
    # The usual chain-of-thought sampling settings of self-consistency.
    temperature: float = 0.7
    top_p: float = 0.95
    selector: str = "vote"  # how the samples vote: one each, or "confidence_vote" (CISC's weighted vote)
    confidence_temperature: float = 0.1  # CISC's softmax temperature over the samples' mean log-probabilities

    def __post_init__(self):
        validate(self, RULES)


RULES = {
    "k": at_least(1),
    "temperature": rule(lambda v: v > 0, "must be > 0 (self-consistency samples)"),
    "top_p": rule(lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "selector": rule(lambda v: v in SAMPLE_VOTES, f"choose one of: {', '.join(SAMPLE_VOTES)}"),
    "confidence_temperature": rule(lambda v: v > 0, "must be > 0"),
}

PRESETS = {"self_consistency": VoteConfig(), "cisc": VoteConfig(selector="confidence_vote")}


class SampleSpawner:
    """Temperature and top-p sampling; on the root row (`spawns`), the first
    decision draws k first tokens independently, takes the first and spawns a
    row for each of the others. Its metrics say how many (`spawned`), so the
    caller knows when every answer of the question is in."""

    name = "self_consistency"

    def __init__(self, config: VoteConfig, spawns: bool = True):
        self.config, self.spawns = config, spawns
        self.inner = TemperatureSampler(config.temperature, top_p=config.top_p, metrics=False)
        self.first = True

    def reset(self):
        self.first = True

    def choose(self, step: Step, key: mx.array) -> TokenChoice:
        first, self.first = self.first, False
        if not (first and self.spawns and self.config.k > 1):
            return self.inner.choose(step, key)
        logits, _ = sanitize_logits(step.logits)
        filtered = filtered_logprobs(logits, self.config.temperature, 0, self.config.top_p)
        tokens = mx.random.categorical(filtered, num_samples=self.config.k, key=key)
        logprobs = (logits - mx.logsumexp(logits))[tokens]
        mx.eval(tokens, logprobs)
        tokens, logprobs = tokens.tolist(), logprobs.tolist()
        spawn = [(t, lp, {}, "sample") for t, lp in zip(tokens[1:], logprobs[1:], strict=True)]
        params = dict(self.inner.params)
        return TokenChoice([tokens[0]], "sample", [logprobs[0]], {"spawned": len(spawn)}, params, spawn=spawn)
