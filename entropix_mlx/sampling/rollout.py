"""The branch strategy's rollouts: every candidate first token rolls out on a
fork of the step's KV cache, all rows in one batch, and one path is accepted.

The functions take the EntropixSampler: its config, its end-of-turn tokens and
its score (`path_score`, `repetition_bias`)."""

import math

import mlx.core as mx

from ..model.cache import SharedPrefixCache
from .config import CONFIDENCE_SELECTS
from .metrics import logits_entropy
from .repetition import first_repeat, path_repeats
from .samplers import Step


def branch(sampler, step: Step, cands: list[tuple[int, float]]):
    """Roll every candidate out greedily, all rows in one batch over the
    step's cache (shared, not copied); accept the best path (`ranked_paths`),
    or the one the sampler's choice of a request's n takes (`pick_path`).

    The rollout's last forward pass runs for the winner only, on the step's
    own cache (after the winner's earlier rollout keys are appended to it):
    the losers' last pass would be thrown away, and on a CPU a batch of n
    rows costs nearly n single passes. With a confidence branch_select the
    rollout stops once every row has ended its turn (nothing after an end of
    turn is scored), and an accepted path that ends the turn needs no state
    after it. With branch_decide_tokens the rows are compared once their
    paths hold that many tokens, and only the winner rolls on; alone, it
    stops at its first repetition unit (nothing after it is handed out).

    Returns the accepted tokens, their log-probabilities, the state after them
    (or None) and, for each token after the first, the entropy and varentropy
    of the distribution it was chosen from (the first is the step's own)."""
    n, depth = len(cands), sampler.config.branch_rollout_tokens
    decide = sampler.config.branch_decide_tokens or depth
    confidence = sampler.config.branch_select in CONFIDENCE_SELECTS
    scored = sampler.config.branch_rollout == "scored" and sampler.config.repetition_bits > 0
    penalties = step.penalties
    # each row's tokens known on the host
    synced = scored or (confidence and bool(sampler.eos_tokens)) or penalties is not None
    eos = set(sampler.eos_tokens)
    ended = [t in eos for t, _ in cands]
    said = [list(step.tokens) + [t] for t, _ in cands]  # each row's answer so far (scored rollouts)
    path = [mx.array([t for t, _ in cands])]
    path_lps = [mx.array([lp for _, lp in cands])]  # nats, (n,) per position
    margins = []  # top-1 - top-2 probability, (n,) per position
    spread = []  # entropy and varentropy of the next token's distribution, (n, 2) per position
    rollout = [SharedPrefixCache(c, n, depth - 1) for c in step.cache] if depth > 1 else []
    for _ in range(depth - 1):
        if confidence and eos and all(ended):
            break
        if n > 1 and len(path) >= decide:  # decided: the other rows stop here
            best = sampler.pick_path(_rank_rows(sampler, path, path_lps, margins, step.tokens)[0])
            path, path_lps, margins, spread = (
                [a[best : best + 1] for a in arrays] for arrays in (path, path_lps, margins, spread)
            )
            said, ended, n = [said[best]], [ended[best]], 1
            for shared in rollout:
                shared.keep_row(best)
        if (
            n == 1
            and synced
            and sampler.config.repetition_bits
            and first_repeat(
                step.tokens, said[0][len(step.tokens) :], sampler.config.repetition_ngram, sampler.config.loops_only
            )
            < len(path)
        ):
            break  # the path is handed out only up to here: rolling on would be thrown away
        logits, _ = step.model(path[-1][:, None], rollout)  # scores unused (never computed: lazy)
        lp = logits[:, -1].astype(mx.float32)
        if penalties is not None:  # the request's penalties along each row's own path
            lp = mx.stack([penalties.apply(lp[i], row) for i, row in enumerate(said)])
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        spread.append(mx.stack(logits_entropy(lp), axis=-1))
        nxt = mx.argmax(lp + _rows_bias(sampler, said, lp.shape[-1]) if scored else lp, axis=-1)
        if confidence:
            top2 = mx.exp(mx.topk(lp, 2, axis=-1))
            margins.append(mx.abs(top2[:, 0] - top2[:, 1]))
        path_lps.append(mx.take_along_axis(lp, nxt[:, None], axis=-1)[:, 0])
        path.append(nxt)
        if synced:  # one host sync per rollout step
            chosen = nxt.tolist()
            ended = [e or t in eos for e, t in zip(ended, chosen, strict=False)]
            for row, t in zip(said, chosen, strict=False):
                row.append(t)
    ranked, paths, lps, path, spreads = _rank_rows(sampler, path, path_lps, margins, step.tokens, spread)
    best = sampler.pick_path(ranked)
    later = [{"entropy": h, "varentropy": v} for h, v in spreads[best]]
    # The rollout continued greedily, unscored: accept it only up to its first token
    # with repetition units (at least its first token), so a looping continuation is
    # never handed out whole; the next step decides there, with the score.
    keep = len(paths[best])
    if sampler.config.repetition_bits:
        keep = max(
            1, first_repeat(step.tokens, paths[best], sampler.config.repetition_ngram, sampler.config.loops_only)
        )
    end = next((j for j, t in enumerate(paths[best][:keep]) if t in eos), None)
    # The step's cache takes the winner's rollout keys: up to the end of the turn, for a
    # conversation that goes on from this cache; up to the last kept token otherwise.
    fed = end if end is not None else keep - 1
    for layer, shared in zip(step.cache, rollout if fed > 0 else (), strict=False):
        keys, values = shared.row(best)
        layer.update_and_fetch(keys[..., :fed, :], values[..., :fed, :])
    if end is not None:  # the turn ends here: no state after it is needed
        return paths[best][: end + 1], lps[best][: end + 1], None, later[:end]
    del rollout  # it references the prefix: appending to the cache while it lives would copy it
    logits, scores = step.model(path[best : best + 1, keep - 1 : keep], step.cache)
    mx.eval(logits, scores)
    return paths[best][:keep], lps[best][:keep], (step.cache, logits[:, -1:, :], scores), later[: keep - 1]


def _rank_rows(sampler, path: list, path_lps: list, margins: list, history: list[int], spread: list = ()):
    """The rollout so far (per position, one (rows,) array each) stacked to
    (rows, positions) and evaluated in one host sync: (the rows, best first
    (`ranked_paths`), the paths, their log-probabilities, the paths as one
    array, and each row's (entropy, varentropy) per position after the first)."""
    rows = path[0].shape[0]
    path, path_lps = mx.stack(path, axis=1), mx.stack(path_lps, axis=1)
    margins = mx.stack(margins, axis=1) if margins else mx.zeros((rows, 0))
    spread = mx.stack(spread, axis=1) if spread else mx.zeros((rows, 0, 2))
    mx.eval(path, path_lps, margins, spread)
    paths, lps = path.tolist(), path_lps.tolist()
    return ranked_paths(sampler, paths, lps, margins.tolist(), history), paths, lps, path, spread.tolist()


def _rows_bias(sampler, histories: list[list[int]], vocab: int) -> mx.array:
    """(rows, vocab): each row's repetition bias (nats) after its own history."""
    bias = mx.zeros((len(histories), vocab), dtype=mx.float32)
    for i, history in enumerate(histories):
        values = sampler.repetition_bias(history)
        if values:
            bias[i, mx.array(list(values), dtype=mx.int32)] = mx.array(list(values.values()), dtype=mx.float32)
    return bias


def best_path(
    sampler, paths: list[list[int]], lps: list[list[float]], margins: list[list[float]], history: list[int]
) -> int:
    """The index of the path to accept (`ranked_paths`' first)."""
    return ranked_paths(sampler, paths, lps, margins, history)[0]


def ranked_paths(
    sampler, paths: list[list[int]], lps: list[list[float]], margins: list[list[float]], history: list[int]
) -> list[int]:
    """The paths' indices, the one to accept first (ties: the earlier path). "logprob": the best `path_score`.
    "confidence": the fewest repetition units, then the highest mean
    top-1 - top-2 margin after the candidate (up to and including an end
    of turn: what follows it is never said); the first path (the most
    likely candidate) gets branch_keep_margin on top. "path_confidence": as
    "confidence", the candidate's probability counted as the first margin."""
    c = sampler.config
    if c.branch_select == "logprob":
        return sorted(range(len(paths)), key=lambda i: sampler.path_score(paths[i], lps[i], history), reverse=True)

    # where each path ends its turn (its last token when it does not)
    ends = [next((j for j, t in enumerate(p) if t in sampler.eos_tokens), len(p) - 1) for p in paths]

    def confidence(i):
        if ends[i] == 0 and paths[i][0] in sampler.eos_tokens:
            return math.exp(lps[i][0])  # ending here: nothing follows, its own probability is its certainty
        seen = margins[i][: ends[i]]
        if c.branch_select == "path_confidence":
            seen = [math.exp(lps[i][0]), *seen]
        return sum(seen) / len(seen) if seen else 0.0

    def repeats(i):
        if not c.repetition_bits:
            return 0
        return path_repeats(history, paths[i][: ends[i] + 1], c.repetition_ngram, c.loops_only)

    return sorted(
        range(len(paths)),
        key=lambda i: (-repeats(i), confidence(i) + (c.branch_keep_margin if i == 0 else 0.0)),
        reverse=True,
    )
