"""Gated `deliberate` (docs/gated-deliberate.md) on the batch engine: the greedy
chain runs alone; when it ends, its own measurements (sampling/gate.py, the same
functions the offline replay reads a pool with) decide whether its answer stands.
If not, the candidates the rule adds start as new requests of the same index
(`follow_up`): a first-token alternative from the prompt, a branch at step p from
the prompt and the chain's first p tokens, each taking its token first and then
going on greedily. With `gate_staged` the rest start only when the first stage
(`first_stage` of them, or half) has not settled the answer; with `running_stop`
a candidate ends itself once its confidence falls below the chain's weakest
stretch, and does not vote."""

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..sampling import gate
from ..sampling.branching import BranchSampler
from ..sampling.deliberate_config import DeliberateConfig
from .rows import Request, RowResult

_PER_TOKEN = ("tokens", "logprobs", "strategies", "metrics", "params", "notes", "tops")


def root_sampler(config: DeliberateConfig, top: int, measure: bool) -> BranchSampler:
    """The greedy chain's: it spawns nothing, and keeps as `deferred` at each step
    the first-token alternatives and in-chain branches an unsure answer would add."""
    settings = config.replace(first_alternatives=config.gate_first_alternatives, max_branch_points=config.gate_branches)
    return BranchSampler(settings, top=top, measure=measure or config.gate_signal == "head_agreement", defer=True)


def added(config: DeliberateConfig, greedy, root: RowResult) -> list[tuple[int, int]]:
    """(step, token) of each candidate the greedy chain's gate adds (none when it is sure):
    the likeliest first tokens, then the branches inside the chain in order."""
    value = gate.signals(greedy.logprobs, greedy.answer_margin, greedy.measures, config.group_tokens)
    if gate.sure(greedy.finish_reason != "length", value[config.gate_signal], config.gate_threshold):
        return []
    deferred = [(p, t) for p, m in enumerate(root.metrics) for t, _ in m.get("deferred", [])]
    firsts = [d for d in deferred if d[0] == 0][: config.gate_first_alternatives]
    return firsts + [d for d in deferred if d[0] > 0][: config.gate_branches]


def adopt(root: RowResult, result: RowResult, prompt_len: int) -> None:
    """A candidate's row read as a branch of the greedy chain at its split: the
    chain's tokens before the split come first, as a spawned row's would."""
    p = result.prompt_tokens - prompt_len
    for name in _PER_TOKEN:
        setattr(result, name, getattr(root, name)[:p] + getattr(result, name))
    result.parent, result.split, result.prompt_tokens = root.row, p, prompt_len


@dataclass
class _Open:
    root: RowResult
    stages: list
    floor: float | None
    voters: list
    pending: int = 0


def gated_stages(config: DeliberateConfig, requests, candidate, make_branch, later: dict, rerun: dict) -> Callable:
    """`follow_up` for the batch engine. `make_branch(token, floor)` makes a candidate's
    sampler; `later[index]` counts the rows started, `rerun[index]` the chain's tokens
    their prompts run again."""
    running: dict[int, _Open] = {}

    def follow_up(index: int, result: RowResult) -> list:
        r, s = requests[index], running.get(index)
        if s is None:  # the greedy chain
            greedy = candidate(index, result)
            extra = added(config, greedy, result)
            if not extra:
                return []
            floor = min(gate.windows(greedy.logprobs, config.group_tokens)) if config.running_stop else None
            s = running[index] = _Open(
                result, gate.stages(extra, config.gate_staged, config.first_stage), floor, [greedy]
            )
        else:
            adopt(s.root, result, len(r.prompt))
            c = candidate(index, result)
            if c.finish_reason != gate.STOPPED:
                s.voters.append(c)
            s.pending -= 1
            if s.pending:
                return []
            if not s.stages or gate.settled([(c.finish_reason != "length", c.answer) for c in s.voters]):
                del running[index]
                return []
        stage = s.stages.pop(0)
        s.pending = len(stage)
        later[index] = later.get(index, 0) + len(stage)
        rerun[index] = rerun.get(index, 0) + sum(p for p, _ in stage)
        return [
            (
                Request(r.prompt + s.root.tokens[:p], r.seed, r.max_tokens - p, _after(r.penalties, s.root.tokens[:p])),
                make_branch(t, s.floor),
            )
            for p, t in stage
        ]

    return follow_up


def _after(penalties, tokens: list):
    """The request's penalties for a row whose prompt ends with the chain's `tokens`."""
    return replace(penalties, before=tuple(tokens)) if penalties is not None and tokens else penalties


def voting(candidates: list) -> list:
    """The candidates that vote: all but those running_stop ended."""
    return [c for c in candidates if c.finish_reason != gate.STOPPED]
