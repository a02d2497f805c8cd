"""The sampler protocol and the baseline samplers (greedy, temperature, min_p).

A sampler looks at one decoding step (`Step`) and returns a `TokenChoice`: the tokens
to append (usually one; a thinking insertion or an accepted branch may give
several), the strategy that chose them and the parameters actually used.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from ..accel.cpu_math import logsumexp
from .config import SamplerConfig
from .metrics import METRIC_NAMES, step_metrics

# The parameters a greedy choice reports (as the sampling parameters that would pick it).
GREEDY_PARAMS = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0}


@dataclass
class Step:
    logits: mx.array  # (vocab,) next-token logits
    scores: list[mx.array]  # per layer, (heads, visible keys) pre-softmax attention scores
    tokens: list[int]  # tokens generated so far in this answer
    model: Any = None  # for samplers that roll out branches
    cache: Any = None  # the KV cache after the last token (fork before writing)
    # Already applied to `logits`; a sampler that runs the model further applies
    # them along its own paths (Entropix's branch rollouts).
    penalties: Any = None


@dataclass
class TokenChoice:
    """What a sampler chose at one step: the token(s) to append and how it chose them."""

    tokens: list[int]
    strategy: str
    logprobs: list[float]  # log p (nats) of each token under the model
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, float] = field(default_factory=dict)  # temperature, top_k, top_p, min_p
    # Set by samplers that already ran the model over `tokens` (branch rollouts):
    # (cache, logits, scores) after the last of them, so the loop need not redo it.
    advanced: tuple | None = None
    inserted: bool = False  # the tokens are an inserted thinking text, not sampled
    # Per token of a several-token choice, when they differ: a branch rollout's later
    # tokens carry the entropy and varentropy of their own step (None: `metrics` for all).
    token_metrics: list | None = None
    note: str = ""  # what the sampler had to repair, e.g. NaN logits ("" when nothing)
    # Alternatives to this (one-token) choice, each to start a row of its own at
    # this position in batched generation: (token, logprob, metrics[, strategy of its
    # first token, "branch" if not given]). See decode/group.py.
    spawn: list = field(default_factory=list)
    # The k most likely next tokens where this choice was made, (token, logprob)
    # pairs, filled only when a recorder asks (the server's top_logprobs).
    top: list = field(default_factory=list)
    # The row ends after this choice, with this finish reason ("": it goes on).
    last: str = ""

    def metrics_at(self, i: int) -> dict:
        """The metrics of the choice's i-th token."""
        return self.token_metrics[i] if self.token_metrics and i < len(self.token_metrics) else self.metrics


class Sampler(Protocol):
    """`choose` is all a sampler needs. A sampler may also split it in two, so
    that the batch engine (decode/group.py) evaluates every row's decision graph in one host sync rather
    than one per row: `plan(step, key)` builds the decision's lazy arrays and
    `finish(step, plan)` turns them, evaluated, into a `TokenChoice` (it may still
    run the model, as Entropix's branch rollouts do). Then `choose` must equal
    `finish(step, eval(plan(step, key)))`."""

    name: str

    def reset(self) -> None:
        """Forget per-answer state (e.g. how many thinking tokens were inserted)."""

    def choose(self, step: Step, key: mx.array) -> TokenChoice: ...


class TwoPhaseSampler:
    """Base of the samplers that plan and finish (see `Sampler`): `choose` is
    the two phases with one host sync between them."""

    def choose(self, step: Step, key: mx.array) -> TokenChoice:
        plan = self.plan(step, key)
        mx.eval(plan)  # the step's one host sync
        return self.finish(step, plan)


def plans_in_two_phases(sampler) -> bool:
    """True when `choose` is exactly plan-then-finish. A subclass that
    overrides `choose`, or a wrapper that forwards unknown attributes (the
    server's Recorder), keeps its own `choose`."""
    owner = next((k for k in type(sampler).__mro__ if "choose" in vars(k)), None)
    return owner is TwoPhaseSampler


def choose_together(samplers: list, steps: list[Step], keys: list[mx.array]) -> list[TokenChoice]:
    """Every row's decision, with one host sync for all the two-phase samplers
    (see `Sampler`); each row's own graph, key and state, so each choice equals
    what `choose` alone gives."""
    two_phase = [plans_in_two_phases(s) for s in samplers]
    # Rows that only take the argmax (eval's greedy) share one stacked argmax:
    # a handful of ops for the batch instead of a handful per row.
    argmax_rows = [
        i
        for i, (s, tp) in enumerate(zip(samplers, two_phase, strict=False))
        if tp and isinstance(s, GreedySampler) and not s.logprobs
    ]
    if len(argmax_rows) < 2:  # one row plans on its own, as before
        argmax_rows = []
    stacked = GreedySampler.plan_rows([steps[i] for i in argmax_rows]) if argmax_rows else None
    plans = [
        s.plan(step, key) if tp and i not in argmax_rows else None
        for i, (s, step, key, tp) in enumerate(zip(samplers, steps, keys, two_phase, strict=False))
    ]
    mx.eval([p for p in plans if p is not None], stacked)
    if stacked is not None:
        for i, token, check in zip(argmax_rows, stacked["token"].tolist(), stacked["check"].tolist(), strict=False):
            plans[i] = {"token": token, "check": check}
    return [
        s.finish(step, plan) if tp else s.choose(step, key)
        for s, step, key, plan, tp in zip(samplers, steps, keys, plans, two_phase, strict=False)
    ]


def filtered_logprobs(
    logits: mx.array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> mx.array:
    """Log-probabilities after temperature, top-k, top-p and min-p; removed tokens
    get -inf. mlx-lm's helpers keep the most likely tokens (top-p sorts so that
    the cut keeps the head of the distribution, unlike the reference)."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    logprobs = logprobs[None]
    if 0 < top_k < logprobs.shape[-1]:
        logprobs = apply_top_k(logprobs, top_k)
    if 0 < top_p < 1.0:
        logprobs = nucleus(logprobs, top_p)
    if min_p > 0.0:
        logprobs = apply_min_p(logprobs, min_p)
    scaled = logprobs[0] / temperature
    return scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)


# A nucleus almost always lies among the few hundred likeliest tokens, and a full
# sort of a 150k-token vocabulary is most of a sampled step on a CPU.
NUCLEUS_HEAD = 1024


def nucleus(logprobs: mx.array, top_p: float) -> mx.array:
    """mlx-lm's `apply_top_p` for one row (1, vocab), sorting only the
    NUCLEUS_HEAD likeliest tokens when they hold the top_p mass (then the cut
    falls among them and the result is the same); otherwise the full sort."""
    if logprobs.shape[-1] <= 4 * NUCLEUS_HEAD:
        return apply_top_p(logprobs, top_p)
    head = mx.sort(mx.topk(logprobs, NUCLEUS_HEAD, axis=-1), axis=-1)
    probs = mx.exp(head)
    wanted = top_p * mx.exp(mx.logsumexp(logprobs, axis=-1, keepdims=True))
    if (probs.sum() < wanted).item():
        return apply_top_p(logprobs, top_p)
    mass_above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
    dropped = (mass_above >= wanted).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(head, dropped, axis=-1)
    return mx.where(logprobs < threshold, -mx.inf, logprobs)


# What `sanitize_logits` found, by code (evaluated with the step's one host sync).
LOGIT_NOTES = ("", "NaN logits ignored", "+inf logits: sampled among them only", "no finite logits: sampled uniformly")


@mx.compile  # a dozen element-wise passes over the vocabulary fused: 0.34 -> 0.19 ms a row on the CPU
def sanitize_logits(logits: mx.array) -> tuple[mx.array, mx.array]:
    """Logits every filter and metric can handle, and a code into LOGIT_NOTES.

    NaN entries are dropped (-inf); +inf entries mean "certain", so they share
    all the probability; when nothing finite is left the choice is uniform.
    Lazy and element-wise: it adds no host sync."""
    logits = logits.astype(mx.float32)
    nan, pos_inf = mx.isnan(logits), logits == mx.inf
    any_nan, any_pos_inf = mx.any(nan), mx.any(pos_inf)
    clean = mx.where(nan, -mx.inf, logits)
    clean = mx.where(any_pos_inf, mx.where(pos_inf, 0.0, -mx.inf), clean)
    nothing_left = mx.all(clean == -mx.inf)
    clean = mx.where(nothing_left, mx.zeros_like(clean), clean)
    code = mx.where(nothing_left, 3, mx.where(any_pos_inf, 2, mx.where(any_nan, 1, 0)))
    return clean, code


def _logprob(logits: mx.array, token: mx.array) -> mx.array:
    return logits[token] - logsumexp(logits)


def _baseline_metrics(logits: mx.array, step: Step, enabled: bool) -> dict:
    # Lazy: evaluated together with the token (one host sync per step).
    return step_metrics(logits, step.scores) if enabled else {}


def _plan(token: mx.array, logprob: mx.array, metrics: dict, code: mx.array) -> dict:
    stacked = mx.stack([metrics[n] for n in METRIC_NAMES]) if metrics else None
    return {"token": token, "logprob": logprob, "metrics": stacked, "code": code}


def _finish(plan: dict) -> tuple[int, float, dict, str]:
    metrics = dict(zip(METRIC_NAMES, plan["metrics"].tolist(), strict=False)) if plan["metrics"] is not None else {}
    return plan["token"].item(), plan["logprob"].item(), metrics, LOGIT_NOTES[plan["code"].item()]


class GreedySampler(TwoPhaseSampler):
    """The most likely token. `metrics=False` skips the six Entropix metrics
    (to time the bare engine); `logprobs=False` also skips the token's
    log-probability (None in the TokenChoice), for callers that never read it (eval's
    accuracy runs): a greedy decision is then an argmax, not the three passes
    over the vocabulary of a log-sum-exp."""

    name = "greedy"

    def __init__(self, metrics: bool = True, logprobs: bool = True):
        self.metrics = metrics
        self.logprobs = logprobs or metrics

    def reset(self):
        pass

    def plan(self, step: Step, key: mx.array) -> dict:
        if not self.logprobs:
            return self.plan_rows([step])
        logits, code = sanitize_logits(step.logits)
        token = mx.argmax(logits)
        return _plan(token, _logprob(logits, token), _baseline_metrics(logits, step, self.metrics), code)

    @staticmethod
    def plan_rows(steps: list[Step]) -> dict:
        """The argmax-only plan of one or several rows (stacked): the argmax of
        the raw logits is the sanitized one's when none is NaN or infinite,
        which their largest value and their sum tell."""
        if len(steps) == 1:
            logits = steps[0].logits.astype(mx.float32)
            return {"token": mx.argmax(logits), "check": mx.stack([logits.max(), logits.sum()])}
        logits = mx.stack([step.logits for step in steps]).astype(mx.float32)
        return {
            "token": mx.argmax(logits, axis=-1),
            "check": mx.stack([logits.max(axis=-1), logits.sum(axis=-1)], axis=-1),
        }

    def finish(self, step: Step, plan: dict) -> TokenChoice:
        if "check" in plan:  # argmax only; a stacked plan's row comes as Python numbers
            token, check, note = plan["token"], plan["check"], ""
            token = token.item() if isinstance(token, mx.array) else token
            check = check.tolist() if isinstance(check, mx.array) else check
            if not all(math.isfinite(v) for v in check):
                # Rare: NaN or infinite logits take the sanitized argmax, one more host sync.
                logits, code = sanitize_logits(step.logits)
                chosen = mx.argmax(logits)
                mx.eval(chosen, code)
                token, note = chosen.item(), LOGIT_NOTES[code.item()]
            return TokenChoice([token], "argmax", [None], {}, params=dict(GREEDY_PARAMS), note=note)
        token, logprob, metrics, note = _finish(plan)
        return TokenChoice([token], "argmax", [logprob], metrics, params=dict(GREEDY_PARAMS), note=note)


class TemperatureSampler(TwoPhaseSampler):
    """Plain sampling at a fixed temperature, with optional top-k / top-p / min-p."""

    name = "temperature"

    def __init__(
        self, temperature: float = 0.7, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, metrics: bool = True
    ):
        _check_params(temperature, top_p, top_k, min_p)
        self.params = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
        self.metrics = metrics

    def reset(self):
        pass

    def plan(self, step: Step, key: mx.array) -> dict:
        p = self.params
        if p["temperature"] == 0:
            return GreedySampler(self.metrics).plan(step, key)
        logits, code = sanitize_logits(step.logits)
        logprobs = filtered_logprobs(logits, p["temperature"], p["top_k"], p["top_p"], p["min_p"])
        token = mx.random.categorical(logprobs, key=key)
        return _plan(token, _logprob(logits, token), _baseline_metrics(logits, step, self.metrics), code)

    def finish(self, step: Step, plan: dict) -> TokenChoice:
        if self.params["temperature"] == 0:
            return GreedySampler(self.metrics).finish(step, plan)
        token, logprob, metrics, note = _finish(plan)
        return TokenChoice([token], "sample", [logprob], metrics, params=dict(self.params), note=note)


class MinPSampler(TemperatureSampler):
    name = "min_p"

    def __init__(
        self, temperature: float = 0.7, min_p: float = 0.1, top_p: float = 1.0, top_k: int = 0, metrics: bool = True
    ):
        super().__init__(temperature, top_p=top_p, top_k=top_k, min_p=min_p, metrics=metrics)


def _check_params(temperature, top_p, top_k, min_p):
    # The same validation (and messages) as the Entropix config; 0 = greedy here.
    SamplerConfig(temperature=temperature if temperature != 0 else 1.0, top_p=top_p, top_k=top_k, min_p=min_p)
