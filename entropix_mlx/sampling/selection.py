"""deliberate's answer selection: the candidates, how each answer is scored, and
which one is kept (how a candidate's answer is read from its text: answers.py)."""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .gate import STOPPED
from .repetition import LOOP_ALERT, longest_loop


@dataclass
class Candidate:
    row: int
    parent: int | None  # None: the greedy answer
    split: int | None  # index of the first token that differs from the parent
    tokens: list[int]
    text: str
    answer: str | None  # what the answer extractor read from the text
    logprobs: list[float]
    margins: list[float]
    finish_reason: str
    own_tokens: int  # tokens this row generated itself (after its split)
    mean_logprob: float = 0.0
    answer_margin: float = 0.0  # mean margin over the answer's tokens (CoT-decoding)
    # The same means without the first token, which a branch did not choose
    # freely: how sure the model is of the path once it is on it.
    continuation_logprob: float = 0.0
    continuation_margin: float = 0.0
    branched_at: list[int] = field(default_factory=list)  # positions where this row spawned branches
    loop: int = 0  # tokens in its longest back-to-back repeat (repetition.longest_loop)
    top: list = field(default_factory=list)  # per token, the most likely tokens, if the row recorded them
    # Per token, what the row measured (MEASURES), if it was asked to (eval's records).
    measures: dict = field(default_factory=dict)

    def flaw(self, rule: str = "loop") -> str | None:
        """Why this answer is degenerate under `rule` ("off", "loop",
        "loop_or_length", "length"), or None: no text at all, a loop of LOOP_ALERT
        tokens or more ("loop", "loop_or_length"), or no ending of its own before the
        length limit ("loop_or_length", "length"). A candidate stopped early (the vote
        was decided) never competes."""
        if self.finish_reason == "stopped":
            return "stopped early"
        if self.finish_reason == STOPPED:
            return "its confidence fell below the greedy chain's"
        if rule == "off":
            return None
        if self.answer is None and not self.text.strip():  # ended at once: no answer to prefer
            return "says nothing"
        # A chain of thought repeats on purpose ("12,000 + 2,000 + " is 14 of Qwen's
        # digit tokens); "length" trusts an answer that ended on its own, since a
        # loop that takes over runs into the limit.
        if rule in ("loop", "loop_or_length") and self.loop >= LOOP_ALERT:
            return f"loops ({self.loop} tokens)"
        if rule in ("loop_or_length", "length") and self.finish_reason == "length":
            return "ran into the length limit"
        return None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Deliberation:
    candidates: list[Candidate]  # the greedy answer first
    chosen: int  # index into candidates
    reason: str
    scores: dict  # the selector's score per distinct answer
    prefilled: int = 0  # prompt tokens run again for a second stage's rows
    table: list = field(default_factory=list)  # why: each candidate's answer, confidence and score (`why`)

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
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "scores": self.scores,
            "tokens_spent": self.tokens_spent,
            "branches": len(self.candidates) - 1,
            "table": self.table,
            # What a row did not record (alternatives, measures) is left out, not written empty.
            "candidates": [{k: v for k, v in c.to_dict().items() if v != [] and v != {}} for c in self.candidates],
        }


def answer_token_span(tokenizer, tokens: list[int], answer: str | None) -> list[int]:
    """Indices of the tokens that spell the last occurrence of `answer` in the
    text (CoT-decoding scores the answer's tokens only); all tokens when the
    answer is not written verbatim."""
    if not answer or not tokens:
        return list(range(len(tokens)))
    ends = [len(tokenizer.decode(tokens[: i + 1])) for i in range(len(tokens))]
    text = tokenizer.decode(tokens)
    start = text.lower().rfind(answer.lower())
    if start < 0:
        return list(range(len(tokens)))
    stop = start + len(answer)
    begins = [0] + ends[:-1]
    return [i for i in range(len(tokens)) if begins[i] < stop and ends[i] > start] or list(range(len(tokens)))


# Votes weighted by the model's confidence in each candidate: exp(confidence /
# temperature). A softmax over the candidates (CISC) divides every weight by the
# same sum, so the winner is the same, and each weight is known as soon as its
# candidate ends (what stopping early needs).
VOTE_SELECTORS = ("vote", "weighted_vote", "confidence_vote", "lowest_group_vote")
# The votes a sample's mean log-probability is enough for: self-consistency's and CISC's.
SAMPLE_VOTES = ("vote", "confidence_vote")


def lowest_group(logprobs: list[float], window: int) -> float:
    """DeepConf's lowest group confidence (Fu et al. 2025) with the chosen tokens'
    log-probabilities: the lowest mean over `window` consecutive tokens (the
    whole answer's mean when it is shorter)."""
    if not logprobs:
        return 0.0
    if len(logprobs) <= window:
        return sum(logprobs) / len(logprobs)
    total = sum(logprobs[:window])
    lowest = total
    for i in range(window, len(logprobs)):
        total += logprobs[i] - logprobs[i - window]
        lowest = min(lowest, total)
    return lowest / window


def confidence(mean_logprob: float, temperature: float, top: float = 0.0) -> float:
    """CISC's confidence weight (Taubenfeld et al. 2025): exp(mean log-probability /
    temperature), the length-normalized sequence probability sharpened; `top`, a
    shift that leaves the weights' ratios as they are (a softmax's stability)."""
    return math.exp((mean_logprob - top) / temperature)


def vote_weight(c: Candidate, selector: str, temperature: float = 0.1, window: int = 16) -> float:
    """A candidate's vote under a vote selector."""
    if selector == "vote":
        return 1.0
    if selector == "weighted_vote":
        return math.exp(c.mean_logprob)
    if selector == "confidence_vote":  # CISC: the length-normalized sequence probability
        return confidence(c.mean_logprob, temperature)
    if selector == "lowest_group_vote":  # DeepConf: the weakest stretch of the chain
        return confidence(lowest_group(c.logprobs, window), temperature)
    raise ValueError(f"{selector!r} is not a vote")


def _add(a, b):
    return a + b


# Each selector: a candidate's score for its answer (from the candidate, the vote
# temperature and the DeepConf window), and how the scores of one answer's candidates combine.
SELECTORS = {
    "greedy": (lambda c, t, w: float(c.parent is None), max),
    "margin": (lambda c, t, w: c.answer_margin, _add),  # CoT-decoding
    "max_margin": (lambda c, t, w: c.answer_margin, max),
    "logprob": (lambda c, t, w: c.mean_logprob, max),
    **{name: (lambda c, t, w, name=name: vote_weight(c, name, t, w), _add) for name in VOTE_SELECTORS},
    "continuation_logprob": (lambda c, t, w: c.continuation_logprob, max),
    "continuation_margin": (lambda c, t, w: c.continuation_margin, max),
}


def answer_scores(candidates: list[Candidate], selector: str, temperature: float = 0.1, window: int = 16) -> dict:
    """Score of each distinct answer (None, no answer, never scores):

    - greedy: 1 for the greedy answer;
    - margin: sum over its candidates of their answer margin (CoT-decoding);
    - max_margin: the best answer margin among its candidates;
    - logprob: the best mean log-probability (nats) among its candidates;
    - vote: how many candidates give it;
    - weighted_vote: sum over its candidates of exp(mean log-probability);
    - confidence_vote, lowest_group_vote: sum over its candidates of exp(mean
      log-probability / temperature) (CISC), or of exp(lowest group mean over
      `window` tokens / temperature) (DeepConf);
    - continuation_logprob, continuation_margin: the best mean log-probability
      or margin after the first token among its candidates."""
    if selector not in SELECTORS:
        raise ValueError(f"unknown selector {selector!r}")
    score, combine = SELECTORS[selector]
    scores: dict = {}
    for c in candidates:
        if c.answer is None:
            continue
        value = score(c, temperature, window)
        scores[c.answer] = combine(scores[c.answer], value) if c.answer in scores else value
    return scores


def _mean(values: list) -> float:
    return sum(values) / len(values) if values else 0.0


def pool_of(candidates: list[Candidate], clean_first: str) -> list[int]:
    """The candidates that compete: those without a flaw under `clean_first`
    (`Candidate.flaw`), else all but those a running stop ended."""
    clean = [i for i, c in enumerate(candidates) if c.flaw(clean_first) is None]
    return clean or [i for i, c in enumerate(candidates) if c.finish_reason != STOPPED] or list(range(len(candidates)))


def short_answer(answer: str | None, width: int = 20) -> str:
    """An answer as the table and its rule line show it: one line, cut to `width`
    (an answer read from text without a number is its whole first line)."""
    if answer is None:
        return "none"
    answer = " ".join(answer.split())
    return answer if len(answer) <= width else answer[: width - 1] + "…"


def why(
    candidates: list[Candidate], selector: str, clean_first: str, temperature: float = 0.1, window: int = 16
) -> list[dict]:
    """One row per candidate, for a reader: its answer, how sure the model was of it
    (exp of its mean log-probability: the geometric mean of its tokens'
    probabilities), its score under the selector (a vote's share of the votes cast),
    how it ended, and why it did not compete, if it did not (`Candidate.flaw`)."""
    pool = pool_of(candidates, clean_first)
    score, _ = SELECTORS[selector]
    values = {i: score(candidates[i], temperature, window) for i in pool if candidates[i].answer is not None}
    total = sum(values.values()) if selector in VOTE_SELECTORS else 0.0
    rows = []
    for i, c in enumerate(candidates):
        value = values.get(i)
        rows.append(
            {
                "candidate": "greedy" if c.parent is None else f"branch {i}",
                "answer": c.answer,
                "confidence": round(math.exp(c.mean_logprob), 3),
                "score": None if value is None else round(value / total if total else value, 3),
                "tokens": c.own_tokens,
                "ended": c.finish_reason,
                "left_out": None if i in pool else c.flaw(clean_first),
            }
        )
    return rows


def _told(rows: list[dict], selector: str, answer: str) -> str:
    """An answer's score as the table gives it: its candidates' scores combined
    as the selector combines them (the best, or the sum: a vote's share), and
    which rows they are."""
    _, combine = SELECTORS[selector]
    mine = [r for r in rows if r["answer"] == answer and r["score"] is not None]
    if combine is max:
        mine = [max(mine, key=lambda r: r["score"])]
    value = round(sum(r["score"] for r in mine), 3)
    return f"{value:.3f} for {short_answer(answer)!r} ({' + '.join(r['candidate'] for r in mine)})"


def select(
    candidates: list[Candidate],
    selector: str,
    margin: float = 0.0,
    clean_first: str = "loop",
    temperature: float = 0.1,
    window: int = 16,
) -> tuple[int, str, dict]:
    """(index of the chosen candidate, why, the answers' scores). The greedy
    answer (candidates[0]) stays unless another answer scores more than
    `margin` above it; then the best candidate (mean log-probability) giving
    that answer wins.

    A degenerate candidate (`Candidate.flaw` under the rule `clean_first`)
    loses to any that ended cleanly, whatever its score: only the clean ones
    compete when there are some, and a degenerate greedy answer keeps no
    margin, so the best clean answer replaces it.

    Why is the rule line under the table (`why`), from the table's numbers:
    the winner's score, the runner-up's, the margin and whether it held."""
    pool = pool_of(candidates, clean_first)
    scores = answer_scores([candidates[i] for i in pool], selector, temperature, window)
    rows = why(candidates, selector, clean_first, temperature, window)

    def likeliest(answer):
        return max((i for i in pool if candidates[i].answer == answer), key=lambda i: (candidates[i].mean_logprob, -i))

    def best_other(than):
        return max((a for a in scores if a != than), key=lambda a: scores[a], default=None)

    if 0 not in pool:
        flaw = candidates[0].flaw(clean_first)
        if not scores:
            index = likeliest(None)
            return index, f"the greedy answer {flaw}; no clean candidate has an answer: the likeliest won", scores
        best = max(scores, key=lambda a: scores[a])
        index, other = likeliest(best), best_other(best)
        how = f"{selector} {_told(rows, selector, best)}"
        how += f"; the best other, {_told(rows, selector, other)}" if other is not None else ""
        return index, f"the greedy answer {flaw}, so it keeps no margin; {rows[index]['candidate']} won: {how}", scores
    greedy = candidates[0].answer
    if not scores:
        return 0, "no candidate has an answer: kept the greedy one", scores
    best = max(scores, key=lambda a: (scores[a], a == greedy))
    base = scores.get(greedy, -math.inf)
    # A vote's margin counts votes; its table shows shares of the votes cast.
    total = sum(scores.values())
    step = f"{margin:g}" + (
        f" ({margin / total:.3f} of the votes)" if selector in VOTE_SELECTORS and margin and total else ""
    )
    if best == greedy or scores[best] - base <= margin:
        other = best_other(greedy)
        rest = (
            f"the best other, {_told(rows, selector, other)}, is not more than {step} above it"
            if other is not None
            else ""
        )
        return 0, f"greedy answer kept: {selector} {_told(rows, selector, greedy)}; {rest or 'no other answer'}", scores
    index = likeliest(best)
    how = f"{rows[index]['candidate']} won: {selector} {_told(rows, selector, best)}"
    if greedy is None:
        return index, f"{how}; the greedy answer has none", scores
    return index, f"{how} is more than {step} above the greedy answer's {_told(rows, selector, greedy)}", scores


MEASURES = ("entropy", "varentropy", "attn_entropy", "agreement")


def candidate_from(result, tokenizer, answer_of, measured: bool = False) -> Candidate:
    """A finished row (`decode.rows.RowResult`) as a candidate answer; `measured`:
    it keeps each token's MEASURES."""
    text = tokenizer.decode(result.tokens)
    answer = answer_of(text)
    logprobs = [lp if lp is not None else 0.0 for lp in result.logprobs]
    margins = [m.get("margin", 0.0) for m in result.metrics]
    span = answer_token_span(tokenizer, result.tokens, answer)
    split = result.split
    rest = slice(1, None) if len(logprobs) > 1 else slice(None)
    return Candidate(
        row=result.row,
        parent=result.parent,
        split=split,
        tokens=list(result.tokens),
        text=text,
        answer=answer,
        logprobs=logprobs,
        margins=margins,
        finish_reason=result.finish_reason,
        own_tokens=len(result.tokens) - (split or 0),
        mean_logprob=sum(logprobs) / len(logprobs) if logprobs else 0.0,
        answer_margin=sum(margins[i] for i in span) / len(span) if span else 0.0,
        continuation_logprob=_mean(logprobs[rest]),
        continuation_margin=_mean(margins[rest]),
        branched_at=[i for i, m in enumerate(result.metrics) if m.get("spawned")] if result.parent is None else [],
        loop=longest_loop(result.tokens),
        # A row asked for no alternatives records an empty list per token: none kept, then.
        top=[[[t, round(lp, 3)] for t, lp in alternatives] for alternatives in result.tops] if any(result.tops) else [],
        measures={k: [round(m.get(k, 0.0), 4) for m in result.metrics] for k in MEASURES} if measured else {},
    )


def confidence_weights(mean_logprobs: Sequence[float], temperature: float) -> list[float]:
    """CISC's weights: softmax of the samples' confidences over `temperature`."""
    if not mean_logprobs:
        return []
    top = max(mean_logprobs)
    raw = [confidence(c, temperature, top) for c in mean_logprobs]
    total = sum(raw)
    return [r / total for r in raw]


def vote(answers: Sequence[str | None], mean_logprobs: Sequence[float], selector: str, temperature: float = 0.1):
    """(index of the sample whose answer wins, {answer: its votes}) under a vote
    selector of `SAMPLE_VOTES` (CISC's weights a softmax: they sum to 1). Samples
    without an answer do not vote; ties go to the answer given first. With
    no answer at all, sample 0 and no votes."""
    if selector not in SAMPLE_VOTES:
        raise ValueError(f"{selector!r} is not a vote over samples; choose one of: {', '.join(SAMPLE_VOTES)}")
    weights = [1.0] * len(answers) if selector == "vote" else confidence_weights(mean_logprobs, temperature)
    votes: dict[str, float] = {}
    for answer, w in zip(answers, weights, strict=True):
        if answer is not None:
            votes[answer] = votes.get(answer, 0.0) + w
    if not votes:
        return 0, votes
    best = max(votes, key=lambda a: (votes[a], -answers.index(a)))
    return answers.index(best), votes
