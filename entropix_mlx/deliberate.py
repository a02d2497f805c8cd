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
batch.py's generator: they advance together, one forward pass per step, over a
prompt stored once (`share_prefix`); a branch starts on a copy of its parent's
generated positions only. The candidates (the greedy answer always among them)
are then compared by a selector (`answer_scores`) and the greedy answer is
replaced only when another answer's score beats it by `margin`.

Budget: each candidate generates at most as many tokens as the longest one, so
capping the candidates at floor(budget) keeps all generated tokens within
budget x the longest candidate.
"""

import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from .batch import Request, RowResult, generate_batch
from .deliberate_config import DeliberateConfig
from .entropix import top_candidates
from .metrics import logits_entropy
from .samplers import Choice, Step, sanitize_logits

GREEDY_PARAMS = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0}


class BranchSampler:
    """Greedy, recording each step's entropy, varentropy and margin
    p(top1) - p(top2) (the selectors' inputs). The root row's sampler
    (`spawns=True`) also proposes the alternatives that start branches."""

    name = "deliberate"
    deliberates = True    # `generate` runs a whole deliberation with it (deliberate_stream.py)

    def __init__(self, config: DeliberateConfig | None = None, spawns: bool = True, source: str = "defaults"):
        self.config = config or DeliberateConfig()
        self.spawns = spawns
        self.config_source = f"deliberate settings: {source}"
        self.reset()

    def reset(self):
        self.points = 0       # uncertain positions branched at, after the first token
        self.branches = 0     # branch rows started by this answer

    def choose(self, step: Step, key: mx.array) -> Choice:
        c = self.config
        logits, _ = sanitize_logits(step.logits)
        logprobs = logits - mx.logsumexp(logits)
        entropy, varentropy = logits_entropy(logits)
        k = min(logprobs.shape[-1], max(2, c.first_alternatives + 1, c.alternatives + 1))
        values, ids = top_candidates(logprobs, k)
        mx.eval(entropy, varentropy, values, ids)
        values, ids = values.tolist(), ids.tolist()
        metrics = {"entropy": entropy.item(), "varentropy": varentropy.item(),
                   "margin": math.exp(values[0]) - math.exp(values[1])}
        spawn = self._alternatives(len(step.tokens), metrics, values, ids) if self.spawns else []
        metrics["spawned"] = len(spawn)
        return Choice([ids[0]], "argmax", [values[0]], metrics, dict(GREEDY_PARAMS),
                      spawn=[(t, lp, metrics) for t, lp in spawn])

    def _alternatives(self, position: int, metrics: dict, values: list, ids: list) -> list:
        """The branches to start here: (token, logprob) of the next most likely tokens."""
        c = self.config
        if position == 0 and c.first_alternatives:
            n = c.first_alternatives
        elif position > 0 and self.points < c.max_branch_points and self.uncertain(metrics):
            n = c.alternatives
        else:
            return []
        n = min(n, c.max_candidates - 1 - self.branches)
        floor = math.log(c.min_probability) if c.min_probability > 0 else -math.inf
        spawn = [(t, lp) for t, lp in zip(ids[1:n + 1], values[1:n + 1]) if lp >= floor]
        if spawn:
            self.branches += len(spawn)
            self.points += position > 0
        return spawn

    def uncertain(self, metrics: dict) -> bool:
        c = self.config
        return metrics["entropy"] > c.branch_entropy or metrics["varentropy"] > c.branch_varentropy


@dataclass
class Candidate:
    row: int
    parent: int | None          # None: the greedy answer
    split: int | None           # index of the first token that differs from the parent
    tokens: list[int]
    text: str
    answer: str | None          # what the answer extractor read from the text
    logprobs: list[float]
    margins: list[float]
    finish_reason: str
    own_tokens: int             # tokens this row generated itself (after its split)
    mean_logprob: float = 0.0
    answer_margin: float = 0.0  # mean margin over the answer's tokens (CoT-decoding)
    # The same means without the first token, which a branch did not choose
    # freely: how sure the model is of the path once it is on it.
    continuation_logprob: float = 0.0
    continuation_margin: float = 0.0
    branched_at: list[int] = field(default_factory=list)   # positions where this row spawned branches

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Deliberation:
    candidates: list[Candidate]     # the greedy answer first
    chosen: int                     # index into candidates
    reason: str
    scores: dict                    # the selector's score per distinct answer

    @property
    def tokens_spent(self) -> int:
        return sum(c.own_tokens for c in self.candidates)

    @property
    def longest(self) -> int:
        return max(len(c.tokens) for c in self.candidates)

    @property
    def winner(self) -> Candidate:
        return self.candidates[self.chosen]

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "reason": self.reason, "scores": self.scores,
                "tokens_spent": self.tokens_spent, "branches": len(self.candidates) - 1,
                "candidates": [c.to_dict() for c in self.candidates]}


# -- scoring and choosing -----------------------------------------------------------

_NUMBER = re.compile(r"[-\u2212]?\d+(?:\.\d+)?")


def default_answer(text: str) -> str | None:
    """Without a task: the last number in the text (so that "5.0" and "5" agree),
    else its first non-empty line in lower case without punctuation."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    if numbers:
        value = numbers[-1].replace("\u2212", "-")
        return value.rstrip("0").rstrip(".") if "." in value else value
    line = next((s for s in text.splitlines() if s.strip()), "")
    return " ".join(re.sub(r"[^\w\s]", " ", line.lower()).split()) or None


def answer_token_span(tokenizer, tokens: list[int], answer: str | None) -> list[int]:
    """Indices of the tokens that spell the last occurrence of `answer` in the
    text (CoT-decoding scores the answer's tokens only); all tokens when the
    answer is not written verbatim."""
    if not answer or not tokens:
        return list(range(len(tokens)))
    ends = [len(tokenizer.decode(tokens[:i + 1])) for i in range(len(tokens))]
    text = tokenizer.decode(tokens)
    start = text.lower().rfind(answer.lower())
    if start < 0:
        return list(range(len(tokens)))
    stop = start + len(answer)
    begins = [0] + ends[:-1]
    return [i for i in range(len(tokens)) if begins[i] < stop and ends[i] > start] or list(range(len(tokens)))


def answer_scores(candidates: list[Candidate], selector: str) -> dict:
    """Score of each distinct answer (None, no answer, never scores):

    - greedy: 1 for the greedy answer;
    - margin: sum over its candidates of their answer margin (CoT-decoding);
    - max_margin: the best answer margin among its candidates;
    - logprob: the best mean log-probability (nats) among its candidates;
    - vote: how many candidates give it;
    - weighted_vote: sum over its candidates of exp(mean log-probability);
    - continuation_logprob, continuation_margin: the best mean log-probability
      or margin after the first token among its candidates."""
    scores: dict = {}
    for c in candidates:
        if c.answer is None:
            continue
        if selector == "greedy":
            value, combine = float(c.parent is None), max
        elif selector == "margin":
            value, combine = c.answer_margin, _add
        elif selector == "max_margin":
            value, combine = c.answer_margin, max
        elif selector == "logprob":
            value, combine = c.mean_logprob, max
        elif selector == "vote":
            value, combine = 1.0, _add
        elif selector == "weighted_vote":
            value, combine = math.exp(c.mean_logprob), _add
        elif selector == "continuation_logprob":
            value, combine = c.continuation_logprob, max
        elif selector == "continuation_margin":
            value, combine = c.continuation_margin, max
        else:
            raise ValueError(f"unknown selector {selector!r}")
        scores[c.answer] = combine(scores[c.answer], value) if c.answer in scores else value
    return scores


def _mean(values: list) -> float:
    return sum(values) / len(values) if values else 0.0


def _add(a, b):
    return a + b


def select(candidates: list[Candidate], selector: str, margin: float = 0.0) -> tuple[int, str, dict]:
    """(index of the chosen candidate, why, the answers' scores). The greedy
    answer (candidates[0]) stays unless another answer scores more than
    `margin` above it; then the best candidate (mean log-probability) giving
    that answer wins."""
    scores = answer_scores(candidates, selector)
    greedy = candidates[0].answer
    if not scores:
        return 0, "no candidate has an answer: kept the greedy one", scores
    best = max(scores, key=lambda a: (scores[a], a == greedy))
    base = scores.get(greedy, -math.inf)
    if best == greedy or scores[best] - base <= margin:
        return 0, f"greedy answer kept ({selector} {_fmt(base)}; best other within {margin:g})", scores
    index = max((i for i, c in enumerate(candidates) if c.answer == best),
                key=lambda i: candidates[i].mean_logprob)
    return index, (f"{selector} {_fmt(scores[best])} for {best!r} beats the greedy answer's "
                   f"{_fmt(base)} by more than {margin:g}"), scores


def _fmt(x: float) -> str:
    return "none" if x == -math.inf else f"{x:.3f}"


# -- generation ------------------------------------------------------------------------

def candidate_from(result: RowResult, tokenizer, answer_of) -> Candidate:
    text = tokenizer.decode(result.tokens)
    answer = answer_of(text)
    logprobs = [lp if lp is not None else 0.0 for lp in result.logprobs]
    margins = [m.get("margin", 0.0) for m in result.metrics]
    span = answer_token_span(tokenizer, result.tokens, answer)
    split = result.split
    rest = slice(1, None) if len(logprobs) > 1 else slice(None)
    return Candidate(
        row=result.row, parent=result.parent, split=split, tokens=list(result.tokens), text=text, answer=answer,
        logprobs=logprobs, margins=margins, finish_reason=result.finish_reason,
        own_tokens=len(result.tokens) - (split or 0),
        mean_logprob=sum(logprobs) / len(logprobs) if logprobs else 0.0,
        answer_margin=sum(margins[i] for i in span) / len(span) if span else 0.0,
        continuation_logprob=_mean(logprobs[rest]), continuation_margin=_mean(margins[rest]),
        branched_at=[i for i, m in enumerate(result.metrics) if m.get("spawned")] if result.parent is None else [])


def deliberate_batch(model, tokenizer, requests: list[Request], config: DeliberateConfig,
                     answer_of: Callable[[int, str], str | None] | None = None, batch_size: int = 1,
                     prefix: list[int] | None = None, on_row: Callable | None = None,
                     prefix_cache=None) -> Iterator[tuple[int, Deliberation, float]]:
    """Deliberate every request; yields (request index, deliberation, seconds)
    as answers complete. `answer_of(index, text)` extracts a candidate's answer
    (default: `default_answer`). `batch_size` requests are in flight at once,
    each with its branches; with one, the whole prompt but its last token is
    the shared prefix (default `prefix`: the requests' common beginning).
    `on_row(index, result)` sees every row as it finishes (progress display);
    `prefix_cache`, the prefix already run (see `generate_batch`)."""
    answer_of = answer_of or (lambda index, text: default_answer(text))
    if prefix is None:   # the requests' common beginning, kept shorter than each of them
        prefix = os.path.commonprefix([r.prompt for r in requests])[:min(len(r.prompt) for r in requests) - 1]
    done: dict[int, list[RowResult]] = {}
    seconds: dict[int, float] = {}
    rows = generate_batch(model, tokenizer, requests, lambda: BranchSampler(config), batch_size,
                          prefix=prefix, share_prefix=bool(prefix), groups=1,
                          branch_sampler=lambda: BranchSampler(config, spawns=False), prefix_cache=prefix_cache)
    for index, result, spent in rows:
        if on_row:
            on_row(index, result)
        done.setdefault(index, []).append(result)
        seconds[index] = seconds.get(index, 0.0) + spent
        root = next((r for r in done[index] if r.parent is None), None)
        if root is None or len(done[index]) < 1 + sum(m.get("spawned", 0) for m in root.metrics):
            continue
        results = sorted(done.pop(index), key=lambda r: (r.parent is not None, r.row))
        candidates = [candidate_from(r, tokenizer, lambda text: answer_of(index, text)) for r in results]
        chosen, reason, scores = select(candidates, config.selector, config.margin)
        yield index, Deliberation(candidates, chosen, reason, scores), seconds.pop(index)


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


def eval_rows(model, tokenizer, requests: list[Request], config: DeliberateConfig, answer_of, batch_size: int,
              prefix: list[int] | None = None) -> Iterator[tuple[int, RowResult, float]]:
    """For `eval`: `deliberate_batch` with each answer as the winner's RowResult,
    plus `extra` for the item's record (tokens spent, branches, each candidate)."""
    for index, d, seconds in deliberate_batch(model, tokenizer, requests, config, answer_of, batch_size, prefix):
        w = d.winner
        result = RowResult(tokens=w.tokens, strategies=token_strategies(d), logprobs=w.logprobs,
                           finish_reason=w.finish_reason, prompt_tokens=len(requests[index].prompt))
        result.extra = {"tokens_spent": d.tokens_spent, "branches": len(d.candidates) - 1, "chosen": d.chosen,
                        "reason": d.reason, "candidates": [
                            {k: getattr(c, k) for k in ("split", "answer", "answer_margin", "mean_logprob",
                                                        "continuation_logprob", "continuation_margin",
                                                        "own_tokens", "text")} for c in d.candidates]}
        yield index, result, seconds


def deliberate(model, tokenizer, prompt: list[int], config: DeliberateConfig | None = None,
               max_tokens: int = 256, seed: int = 0, answer_of: Callable[[str], str | None] | None = None,
               on_row: Callable | None = None) -> Deliberation:
    """One prompt's deliberation (see `deliberate_batch`)."""
    extract = (lambda index, text: answer_of(text)) if answer_of else None
    for _, result, _ in deliberate_batch(model, tokenizer, [Request(prompt, seed, max_tokens)],
                                         config or DeliberateConfig(), extract, on_row=on_row):
        return result
    raise RuntimeError("deliberate produced no answer")
