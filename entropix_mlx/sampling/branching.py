"""deliberate's branch policy: greedy decisions that record the selectors' inputs
and, on the root answer, propose the alternative tokens that start branches."""

import math

import mlx.core as mx

from .candidates import top_candidates
from .deliberate_config import DeliberateConfig
from .gate import STOPPED, below
from .metrics import attention_metrics, fused_logprobs_entropy
from .samplers import GREEDY_PARAMS, Step, TokenChoice, sanitize_logits


class BranchSampler:
    """Greedy, recording each step's entropy, varentropy and margin
    p(top1) - p(top2) (the selectors' inputs). The root row's sampler
    (`spawns=True`) also proposes the alternatives that start branches; with
    `first_stage`, those past the first stage go to its first token's
    metrics["deferred"] instead, as (token, logprob). `first_token`: a later
    stage's row, which takes that token first and then continues greedily.
    `top`: how many of the most likely tokens each choice records (`TokenChoice.top`,
    eval's records), taken from the candidates it ranks anyway. `measure`: every
    step also records the attention metrics (eval's records, for replaying
    gates offline). `defer`: the root of a gated run, which spawns nothing and puts
    every alternative in its step's metrics["deferred"]. `floor`: a gated candidate
    that ends itself once its last `group_tokens` tokens' mean log-probability is
    below it (running_stop)."""

    name = "deliberate"

    def __init__(
        self,
        config: DeliberateConfig | None = None,
        spawns: bool = True,
        first_token: int | None = None,
        top: int = 0,
        measure: bool = False,
        defer: bool = False,
        floor: float | None = None,
    ):
        self.config = config or DeliberateConfig()
        self.spawns, self.first_token, self.top, self.measure = spawns, first_token, top, measure
        self.defer, self.floor = defer, floor
        self.reset()

    def reset(self):
        self.points = 0  # uncertain positions branched at, after the first token
        self.last_point = -math.inf  # the latest of them
        self.branches = 0  # branch rows started by this answer
        self.own: list[float] = []  # the log-probabilities of its tokens (running_stop)

    def choose(self, step: Step, key: mx.array) -> TokenChoice:
        c = self.config
        logits, _ = sanitize_logits(step.logits)
        logprobs = logits - mx.logsumexp(logits)
        entropy, varentropy = fused_logprobs_entropy(logprobs)
        k = min(logprobs.shape[-1], max(2, c.first_alternatives + 1, c.alternatives + 1, self.top))
        values, ids = top_candidates(logprobs, k)
        mx.eval(entropy, varentropy, values, ids)
        values, ids = values.tolist(), ids.tolist()
        metrics = {
            "entropy": entropy.item(),
            "varentropy": varentropy.item(),
            "margin": math.exp(values[0]) - math.exp(values[1]),
        }
        if self.measure:
            self._attention(metrics, step.scores)
        spawn = self._alternatives(len(step.tokens), metrics, values, ids, step.scores) if self.spawns else []
        if spawn and (self.defer or (not step.tokens and c.first_stage)):
            keep = 0 if self.defer else c.first_stage
            spawn, metrics["deferred"] = spawn[:keep], spawn[keep:]
        metrics["spawned"] = len(spawn)
        if self.first_token is not None and not step.tokens:
            choice = TokenChoice(
                [self.first_token], "branch", [logprobs[self.first_token].item()], metrics, dict(GREEDY_PARAMS)
            )
        else:
            spawned = [(t, lp, metrics) for t, lp in spawn]
            choice = TokenChoice([ids[0]], "argmax", [values[0]], metrics, dict(GREEDY_PARAMS), spawn=spawned)
        choice.top = list(zip(ids[: self.top], values[: self.top], strict=True))
        if self.floor is not None:
            self.own.append(choice.logprobs[0])
            w = c.group_tokens
            if len(self.own) >= w and below(self.own[-w:], self.floor, w):
                choice.last = STOPPED
        return choice

    def _alternatives(self, position: int, metrics: dict, values: list, ids: list, scores=None) -> list:
        """The branches to start here: (token, logprob) of the next most likely tokens."""
        c = self.config
        if position == 0 and c.first_alternatives:
            n = c.first_alternatives
        elif (
            position > 0
            and self.points < c.max_branch_points
            and position - self.last_point >= c.branch_spacing
            and self.uncertain(metrics, scores)
        ):
            n = c.alternatives
        else:
            return []
        n = min(n, c.max_candidates - 1 - self.branches)
        floor = math.log(c.min_probability) if c.min_probability > 0 else -math.inf
        # (a token a constraint rules out has log p -inf: never a branch)
        spawn = [
            (t, lp) for t, lp in zip(ids[1 : n + 1], values[1 : n + 1], strict=False) if lp >= floor and lp > -math.inf
        ]
        if spawn:
            self.branches += len(spawn)
            if position > 0:
                self.points += 1
                self.last_point = position
        return spawn

    def uncertain(self, metrics: dict, scores=None) -> bool:
        """Whether to branch here; the attention gate adds what it read to `metrics`."""
        c = self.config
        if c.branch_gate == "logits":
            return metrics["entropy"] > c.branch_entropy or metrics["varentropy"] > c.branch_varentropy
        if "attn_entropy" not in metrics and not self._attention(metrics, scores):
            return False  # a model that gives no attention scores never branches by them
        return metrics["attn_entropy"] > c.branch_attn_entropy or metrics["agreement"] > c.branch_agreement

    @staticmethod
    def _attention(metrics: dict, scores) -> bool:
        """Adds the heads' attention entropy and disagreement (means over heads and
        layers) to `metrics`; False when the model gives no scores."""
        if not scores:
            return False
        heads = attention_metrics([scores[i] for i in range(len(scores))])
        attn_entropy, agreement = heads["attn_entropy"].mean(), heads["agreement"].mean()
        mx.eval(attn_entropy, agreement)
        metrics["attn_entropy"], metrics["agreement"] = attn_entropy.item(), agreement.item()
        return True
