"""The k most likely next tokens at each decision: the server's top_logprobs, and eval's records."""

import mlx.core as mx

from .samplers import TwoPhaseSampler, plans_in_two_phases


def _top(logits: mx.array, k: int):
    """The k most likely tokens under the model (natural log, before temperature
    or filtering: the distribution of `TokenEvent.logprob`), lazily."""
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs)
    k = min(k, logprobs.shape[-1])
    ids = mx.argpartition(-logprobs, k - 1)[:k]
    return ids, logprobs[ids]


def _pairs(ids, values) -> list:
    return sorted(zip(ids.tolist(), values.tolist(), strict=True), key=lambda p: -p[1])


class Recorder:
    """Wraps a sampler: each choice carries `top`, its first token's k most
    likely alternatives (the rest of a several-token choice, a branch rollout
    or a thinking insertion, has none)."""

    def __init__(self, sampler, k: int):
        self.sampler, self.k = sampler, k
        self.name = getattr(sampler, "name", "sampler")

    def reset(self):
        self.sampler.reset()

    def choose(self, step, key):
        choice = self.sampler.choose(step, key)
        choice.top = _pairs(*_top(step.logits, self.k))
        return choice


class TwoPhaseRecorder(TwoPhaseSampler):
    """A `Recorder` for a two-phase sampler: the alternatives are computed in its
    plan, so the batch still decides every row in one host sync."""

    def __init__(self, sampler, k: int):
        self.sampler, self.k = sampler, k
        self.name = getattr(sampler, "name", "sampler")

    def reset(self):
        self.sampler.reset()

    def plan(self, step, key):
        return {"plan": self.sampler.plan(step, key), "top": _top(step.logits, self.k)}

    def finish(self, step, plan):
        choice = self.sampler.finish(step, plan["plan"])
        choice.top = _pairs(*plan["top"])
        return choice


KEPT_ALTERNATIVES = 3  # eval's records: the most likely tokens kept per generated token


def recording(sampler, k: int):
    """`sampler` with its choices' alternatives recorded (itself when k is 0)."""
    if not k:
        return sampler
    return TwoPhaseRecorder(sampler, k) if plans_in_two_phases(sampler) else Recorder(sampler, k)
