"""`deliberate`: branch over whole answers where the model is unsure, then pick
the answer that holds up.

One answer is a root row, decoded greedily, plus branch rows it spawns:

- at its first token, the `first_alternatives` next most likely tokens each
  start a branch (CoT-decoding, Wang & Zhou 2024: the paths that reason
  differently often start differently);
- later, at positions where the next-token entropy or varentropy crosses the
  config's thresholds (EAGer-style gating), the `alternatives` next most
  likely tokens do, at most `max_branch_points` times.

Every branch continues greedily to the end of its answer. All rows are rows of
the batch engine (engine.py): they advance together, one forward pass per step, over a
prompt stored once (`share_prefix`); a branch starts on a copy of its parent's
generated positions only. The candidates (the greedy answer always among them)
are then compared by a selector (`answer_scores`) and the greedy answer is
replaced only when another answer's score beats it by `margin`.

Budget: each candidate generates at most as many tokens as the longest one, so
capping the candidates at floor(budget) keeps all generated tokens within
budget x the longest candidate.
"""

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx

from ..errors import ConfigError
from ..sampling.answers import default_answer
from ..sampling.branching import BranchSampler
from ..sampling.deliberate_config import DeliberateConfig
from ..sampling.recorder import KEPT_ALTERNATIVES
from ..sampling.samplers import GREEDY_PARAMS
from ..sampling.selection import Candidate, Deliberation, answer_scores, candidate_from, select, why
from .engine import all_finished, by_request, forking_batch
from .events import Summary, TextStream, TokenEvent
from .gated import gated_stages, root_sampler
from .rows import DEFAULT_MAX_TOKENS, Request, RowResult


def deliberate_batch(
    model,
    tokenizer,
    requests: list[Request],
    config: DeliberateConfig,
    answer_of: Callable[[int, str], str | None] | None = None,
    batch_size: int = 1,
    prefix: list[int] | None = None,
    on_row: Callable | None = None,
    prefix_cache=None,
    alternatives: int = 0,
    measure: bool = False,
) -> Iterator[tuple[int, Deliberation, float]]:
    """Deliberate every request; yields (request index, deliberation, seconds)
    as answers complete. `answer_of(index, text)` extracts a candidate's answer
    (default: `default_answer`). `batch_size` requests are in flight at once,
    each with its branches; with one, the whole prompt but its last token is
    the shared prefix (default `prefix`: the requests' common beginning).
    `on_row(index, result)` sees every row as it finishes (progress display);
    `prefix_cache`, the prefix already run (see `generate_batch`);
    `alternatives`: the most likely tokens each row records per step, and `measure`:
    its entropy, varentropy and attention metrics too (eval's records)."""
    answer_of = answer_of or (lambda index, text: default_answer(text))
    gated = bool(config.gate_signal)
    made: dict[int, Candidate] = {}  # by row number: the early stop's candidates are the selection's

    def candidate(index: int, result: RowResult) -> Candidate:
        if result.row not in made:
            made[result.row] = candidate_from(result, tokenizer, lambda text: answer_of(index, text), measure or gated)
        return made[result.row]

    stop_when = early_stop(config, candidate) if config.stop_share > 0 and not gated else None
    if prefix is None:  # the requests' common beginning, kept shorter than each of them
        prefix = os.path.commonprefix([r.prompt for r in requests])[: min(len(r.prompt) for r in requests) - 1]
    later: dict[int, int] = {}  # by request: the rows of its second stage
    rerun: dict[int, int] = {}  # by request: the greedy chain's tokens a gated branch's prompt runs again

    def make_branch(first_token=None, floor=None):
        return BranchSampler(config, False, first_token, alternatives, measure, floor=floor)

    if gated:
        follow_up = gated_stages(config, requests, candidate, make_branch, later, rerun)
        make_root = lambda: root_sampler(config, alternatives, measure)  # noqa: E731
    else:
        follow_up = second_stage(config, requests, candidate, make_branch, later) if config.first_stage else None
        make_root = lambda: BranchSampler(config, top=alternatives, measure=measure)  # noqa: E731

    rows = forking_batch(
        model, tokenizer, requests, make_root, make_branch, batch_size, prefix, prefix_cache, stop_when, follow_up
    )
    rows = _watched(rows, on_row) if on_row else rows
    for index, results, seconds in by_request(rows, later):
        candidates = [candidate(index, r) for r in results]
        for r in results:
            del made[r.row]
        # A candidate the running stop ended never competes (`pool_of`): it keeps its row in the table.
        chosen, reason, scores = select(
            candidates, config.selector, config.margin, config.clean_first, config.vote_temperature, config.group_tokens
        )
        prefilled = later.pop(index, 0) * (len(requests[index].prompt) - len(prefix)) + rerun.pop(index, 0)
        table = why(candidates, config.selector, config.clean_first, config.vote_temperature, config.group_tokens)
        yield index, Deliberation(candidates, chosen, reason, scores, prefilled, table), seconds


def early_stop(config: DeliberateConfig, candidate) -> Callable[[int, RowResult], bool]:
    """`stop_when` for the batch engine: True once a request's candidates that
    ended cleanly (two or more) give one answer stop_share of their vote.
    `candidate(index, result)` makes a finished row's candidate."""
    ended: dict[int, list] = {}

    def stop_when(index: int, result: RowResult) -> bool:
        c = candidate(index, result)
        if c.answer is None or c.flaw(config.clean_first) is not None:
            return False
        ended.setdefault(index, []).append(c)
        return vote_decided(ended[index], config)

    return stop_when


def second_stage(config: DeliberateConfig, requests, candidate, make_branch, later: dict) -> Callable:
    """`follow_up` for the batch engine: once a request's first stage has
    finished without settling its answer (`stage_decided`), its deferred
    first-token alternatives start from the prompt, each taking its token first;
    `later[index]` counts them. Their rows read as branches of the greedy answer
    at its first token, as if they had been spawned with the others."""
    first: dict[int, list] = {}
    root_row: dict[int, int] = {}

    def follow_up(index: int, result: RowResult) -> list:
        if index in later:  # a second-stage row
            result.parent, result.split = root_row[index], 0
            return []
        rows = first.setdefault(index, [])
        rows.append(result)
        if not all_finished(rows):
            return []
        del first[index]
        root = next(r for r in rows if r.parent is None)
        deferred = root.metrics[0].get("deferred", []) if root.metrics else []
        if not deferred or stage_decided([candidate(index, r) for r in rows], config):
            return []
        later[index], root_row[index] = len(deferred), root.row
        r = requests[index]
        return [(Request(r.prompt, r.seed, r.max_tokens, r.penalties), make_branch(token)) for token, _ in deferred]

    return follow_up


def stage_decided(candidates: list, config: DeliberateConfig) -> bool:
    """Whether a first stage settles the answer: its vote stopped it early, or
    every candidate ended cleanly on one answer."""
    if any(c.finish_reason == "stopped" for c in candidates):
        return True
    clean = all(c.answer is not None and c.flaw(config.clean_first) is None for c in candidates)
    return clean and len({c.answer for c in candidates}) == 1


def vote_decided(ended: list, config: DeliberateConfig) -> bool:
    if len(ended) < 2:
        return False
    votes = answer_scores(ended, config.selector, config.vote_temperature, config.group_tokens)
    return max(votes.values()) >= config.stop_share * sum(votes.values())


def _watched(rows, on_row):
    for index, result, spent in rows:
        on_row(index, result)
        yield index, result, spent


def token_strategies(d: Deliberation) -> list[str]:
    """Per token of the chosen answer: "split" where the greedy answer spawned
    branches (before the winner left it), "branch" for the winner's first own
    token, "argmax" otherwise."""
    winner, splits = d.winner, set(d.candidates[0].branched_at)
    out = []
    for i in range(len(winner.tokens)):
        if winner.split is not None and i == winner.split:
            out.append("branch")
        elif i in splits and (winner.split is None or i < winner.split):
            out.append("split")
        else:
            out.append("argmax")
    return out


def eval_rows(
    model,
    tokenizer,
    requests: list[Request],
    config: DeliberateConfig,
    answer_of,
    batch_size: int,
    prefix: list[int] | None = None,
) -> Iterator[tuple[int, RowResult, float]]:
    """For `eval`: `deliberate_batch` with each answer as the winner's RowResult,
    plus `extra` for the item's record (tokens spent, branches, each candidate)."""
    rows = deliberate_batch(
        model, tokenizer, requests, config, answer_of, batch_size, prefix, alternatives=KEPT_ALTERNATIVES, measure=True
    )
    for index, d, seconds in rows:
        w = d.winner
        result = RowResult(
            tokens=w.tokens,
            strategies=token_strategies(d),
            logprobs=w.logprobs,
            finish_reason=w.finish_reason,
            prompt_tokens=len(requests[index].prompt) + d.prefilled,
        )
        result.extra = {
            "tokens_spent": d.tokens_spent,
            "branches": len(d.candidates) - 1,
            "chosen": d.chosen,
            "reason": d.reason,
            "candidates": [
                {
                    k: getattr(c, k)
                    for k in (
                        "split",
                        "answer",
                        "answer_margin",
                        "mean_logprob",
                        "continuation_logprob",
                        "continuation_margin",
                        "own_tokens",
                        "finish_reason",
                        "loop",
                        "logprobs",
                        "margins",
                        "top",
                        "measures",
                        "text",
                    )
                }
                for c in d.candidates
            ],
        }
        yield index, result, seconds


def deliberate(
    model,
    tokenizer,
    prompt: list[int],
    config: DeliberateConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    answer_of: Callable[[str], str | None] | None = None,
    on_row: Callable | None = None,
) -> Deliberation:
    """One prompt's deliberation (see `deliberate_batch`)."""
    extract = (lambda index, text: answer_of(text)) if answer_of else None
    for _, result, _ in deliberate_batch(
        model, tokenizer, [Request(prompt, seed, max_tokens)], config or DeliberateConfig(), extract, on_row=on_row
    ):
        return result
    raise RuntimeError("deliberate produced no answer")


@dataclass
class DeliberateSummary(Summary):
    branches: int = 0  # candidates besides the greedy answer
    tokens_spent: int = 0  # generated over all candidates
    budget: float = 0.0
    deliberation: dict | None = None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["winner"] = (self.deliberation or {}).get("chosen")
        return d


class DeliberateGeneration:
    """Same use as `generate.Generation`. A given `cache` holding the start of
    the conversation (chat) is the branches' shared prefix: it is read, never
    written, so it still holds only that start afterwards."""

    def __init__(
        self,
        model,
        tokenizer,
        prompt_tokens: list[int],
        config: DeliberateConfig,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        seed: int = 0,
        cache=None,
        penalties=None,
        answer_of: Callable[[str], str | None] = default_answer,
    ):
        if len(prompt_tokens) == 0:
            raise ConfigError("the prompt has no tokens; give some text")
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.prompt_tokens, self.max_tokens, self.seed = list(prompt_tokens), max_tokens, seed
        self.cache, self.penalties, self.answer_of = cache, penalties, answer_of
        self.tokens: list[int] = []
        self.events: list[TokenEvent] = []
        self.finish_reason = "running"
        self.deliberation: Deliberation | None = None
        self.on_row = None  # called with each finished row's RowResult (progress display)
        self._prompt_time = self._gen_time = 0.0
        self._spent = 0

    def __iter__(self):
        if self.max_tokens <= 0:
            self.finish_reason = "length"
            return
        mx.reset_peak_memory()
        start = time.perf_counter()
        held = self.cache[0].offset if self.cache else 0
        # Tokens of a prefix already in the cache are never run again; only
        # their number matters, so stand-ins take their place in the prompt.
        prompt = [0] * held + self.prompt_tokens
        prefix = prompt[:-1] if held == 0 else prompt[:held]
        request = Request(prompt, self.seed, self.max_tokens, self.penalties)

        def seen(index, result):
            self._spent += len(result.tokens) - (result.split or 0)
            self._gen_time = time.perf_counter() - start
            if self.on_row:
                self.on_row(result)

        for _, deliberation, _ in deliberate_batch(
            self.model,
            self.tokenizer,
            [request],
            self.config,
            lambda index, text: self.answer_of(text),
            prefix=prefix,
            prefix_cache=self.cache if held else None,
            on_row=seen,
        ):
            self.deliberation = deliberation
        self._gen_time = time.perf_counter() - start
        yield from self._replay()

    def _replay(self):
        """The chosen candidate's tokens as events, with the strategy that explains each."""
        d = self.deliberation
        winner = d.winner
        text = TextStream(self.tokenizer)
        for i, (token, strategy) in enumerate(zip(winner.tokens, token_strategies(d), strict=True)):
            piece = text.add(token, last=i == len(winner.tokens) - 1)
            metrics = {"margin": winner.margins[i]} if i < len(winner.margins) else {}
            event = TokenEvent(token, piece, strategy, winner.logprobs[i], metrics, dict(GREEDY_PARAMS))
            self.tokens.append(token)
            self.events.append(event)
            yield event
        self.finish_reason = winner.finish_reason

    def summary(self) -> DeliberateSummary:
        d = self.deliberation
        spent = d.tokens_spent if d else self._spent
        return DeliberateSummary(
            tokens=len(self.events),
            prompt_tokens=len(self.prompt_tokens),  # as Generation.summary
            strategy_counts=dict(Counter(e.strategy for e in self.events)),
            thinking_insertions=0,
            prompt_tps=0.0,
            generation_tps=spent / self._gen_time if self._gen_time else 0.0,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            finish_reason=self.finish_reason,
            branches=len(d.candidates) - 1 if d else 0,
            tokens_spent=spent,
            budget=self.config.budget,
            deliberation=d.to_dict() if d else None,
        )


class Deliberator:
    """`deliberate` as a decoder (see `generate.Decoder`): it answers by branching
    over whole answers, so it has no per-step decision to put in a shared batch.
    `answer_of(text)` reads an answer where no task does (eval reads the task's)."""

    def __init__(
        self,
        config: DeliberateConfig | None = None,
        source: str = "defaults",
        name: str = "deliberate",
        answer_of: Callable[[str], str | None] = default_answer,
    ):
        self.name, self.config, self.answer_of = name, config or DeliberateConfig(), answer_of
        self.config_source = f"deliberate settings: {source}"

    def generate(
        self, model, tokenizer, prompt_tokens, max_tokens=DEFAULT_MAX_TOKENS, seed=0, cache=None, penalties=None
    ) -> DeliberateGeneration:
        return DeliberateGeneration(
            model, tokenizer, prompt_tokens, self.config, max_tokens, seed, cache, penalties, self.answer_of
        )

    def answer_rows(self, model, tokenizer, requests, batch_size=8, prefix=None, answer_of=None):
        answer_of = answer_of or (lambda index, text: self.answer_of(text))
        return eval_rows(model, tokenizer, requests, self.config, answer_of, batch_size, prefix)
