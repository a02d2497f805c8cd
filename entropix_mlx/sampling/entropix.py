"""The Entropix sampler: pick each next token by how uncertain the model is.

One decoding step:

1. Build one lazy MLX graph with the six metrics (metrics.py, bits) AND every
   strategy's candidate tokens and parameters (they are cheap: all filtering
   happens on the few hundred most likely tokens). Evaluate it once: one host
   sync per step, whatever the strategy turns out to be.
2. Decide the strategy on the host from entropy H and varentropy V (`decide`).
3. Return that strategy's token(s). `branch` and `think` may run the model
   further (rollouts, the inserted text) and hand the loop the cache they end on.

Strategies (stable names, used in JSON and colours):

- argmax   (H and V low): the best-scored token (see "Scores" below): the
           most likely one unless it would repeat an n-gram of the answer.
- think    (H high, V low: the model hesitates among many similar options):
           insert the model card's thinking text (e.g. " ..."), never twice in
           a row and at most `max_thinking_insertions` times per answer;
           otherwise sample at a raised temperature.
- branch   (H not high, V high: a few strong options and a long tail): draw
           `branch_candidates` distinct first tokens (sampling without
           replacement), roll each out greedily for `branch_rollout_tokens`
           tokens on a fork of the KV cache, in one batch, and keep the path
           with the best score: its total log-probability minus the repetition
           penalty for every n-gram of the path (over answer + path) that
           already occurred, so a loop cannot win on likelihood alone. Without
           a model it samples one token with the branch parameters. The card's
           variant (`branch_select = "confidence"`) takes the likeliest tokens
           and keeps the path the model is surest of; `branch_rollout =
           "scored"` continues each row by the score instead of the model's
           likeliest token (see `_branch`).
- resample (H and V high): sample at a high temperature with a tighter top-p.
- adaptive (everything else): draw `adaptive_samples` candidates with distinct
           random keys and parameters adapted to the metrics; keep the one
           with the best score.

Scores. Every strategy chooses by one score per token,
    score = log2 p(token) - repetition_penalty * repetition units
(`repeat_counts`: the times the n-gram it completes, n = repetition_ngram,
already occurred in the answer, plus the tokens by which the longest such
repeated span exceeds n, so copying a phrase gets dearer with every token). It is applied where tokens are chosen, not where the
metrics are measured: the metrics and the decision see the model's own
distribution; the candidates are drawn and ranked from the scored one (a bias
on a few log-probabilities, computed on the host from the answer so far). So
"argmax" is the best score, sampling strategies sample from the scored
distribution, adaptive keeps its best-scored candidate, and branch scores whole
paths. Unlike the reference's score (log p + a term equal for all candidates,
i.e. "most likely of N"), this one depends on the candidate: it trades a little
likelihood for not looping, the commonest failure of small models.

End of turn after thinking. The step right after an inserted thinking text may
not end the turn (the end-of-sequence tokens get score -inf there): the text
was inserted because the model hesitated, and ending right after it left the
question unanswered (issue 10: 17 of 40 built-in answers ended that way).

Parameter formulas are the reference's version 1 (see ENTROPIX_REFERENCE.md),
with one deviation: the adaptive temperature is capped at
`adaptive_max_temperature` (the reference leaves it unbounded, and H + V of a
few bits already pushes it past 2).
"""

import math

import mlx.core as mx

from ..model.cache import SharedPrefixCache
from .config import SamplerConfig
from .metrics import ATTENTION_METRICS, LOG2E, METRIC_NAMES, attention_metrics, logits_entropy, select_layers
from .repetition import first_repeat, path_repeats, repeat_counts
from .samplers import GREEDY_PARAMS, LOGIT_NOTES, Choice, Step, TwoPhaseSampler, sanitize_logits

NATS_TO_BITS = LOG2E


# How many distinct tokens per step can carry a score bias (repetitions and
# banned end-of-turn tokens): a fixed size keeps the compiled step graph's
# shapes fixed. More repeated tokens than this: the most repeated ones.
BIAS_SLOTS = 16


def decide(entropy: float, varentropy: float, c: SamplerConfig, margin: float = 0.0) -> str:
    """The strategy for a step, checked top to bottom as in the reference; a
    state whose strategy is not enabled falls through to adaptive.

    `margin` (bits): how much likelier the best-scored token is than the
    second, log2 p1 - log2 p2. At or above `argmax_margin` the step is argmax
    whatever the entropy: a long tail raises H and V, but when one token is
    far ahead (often an answer-critical one: a digit, a name), sampling can
    only lose it."""
    enabled = c.strategies
    if (entropy < c.low_entropy and varentropy < c.low_varentropy) or (
        c.argmax_margin > 0 and margin >= c.argmax_margin
    ):
        state = "argmax"
    elif entropy > c.medium_entropy and varentropy < c.think_varentropy:
        state = "think"
    elif entropy < c.high_entropy and varentropy > c.high_varentropy:
        state = "branch"
    elif entropy > c.medium_entropy and varentropy > c.high_varentropy:
        state = "resample"
    else:
        state = "adaptive"
    return state if state in enabled else "adaptive"


def top_candidates(logprobs: mx.array, m: int) -> tuple[mx.array, mx.array]:
    """The m most likely tokens, most likely first: (logprobs (m,), ids (m,)).

    Every strategy filters with top-k (k <= m), so the rest of the vocabulary
    can never be sampled; working on these m values keeps each filter and draw
    to a few hundred elements instead of the whole vocabulary (a full sort of
    49k logits costs ~10 ms on CPU)."""
    vocab = logprobs.shape[-1]
    if m >= vocab:
        ids = mx.argsort(-logprobs)
    else:
        ids = mx.argpartition(-logprobs, m - 1)[:m]
        ids = ids[mx.argsort(-logprobs[ids])]
    return logprobs[ids], ids


def filter_sorted(sorted_logprobs: mx.array, temperature, top_k, top_p, min_p) -> mx.array:
    """Tempered log-weights of the kept tokens (-inf for removed ones), for
    log-probabilities sorted most likely first. Same rules and order as
    mlx-lm's apply_top_k -> apply_top_p -> apply_min_p -> temperature:

    - top-k keeps the k most likely (k = 0: all);
    - top-p keeps the most likely tokens until their mass, within the top-k
      set, reaches top_p (the token that crosses it is kept);
    - min-p keeps tokens with p >= min_p * p_max.

    Written here rather than calling mlx-lm's helpers because the parameters
    are MLX arrays computed from this step's metrics: mlx-lm's helpers are
    compiled with Python-number parameters, so they would need the metrics on
    the host first (a second sync per step) and recompile for every new value.
    The most likely token is always kept.
    """
    m = sorted_logprobs.shape[-1]
    rank = mx.arange(m)
    top_k = mx.array(top_k)
    keep = (top_k <= 0) | (rank < top_k)
    probs = mx.where(keep, mx.exp(sorted_logprobs), 0.0)
    mass_before = mx.cumsum(probs) - probs
    top_p = mx.array(top_p)
    keep = keep & ((top_p >= 1.0) | (mass_before < top_p * probs.sum()))
    keep = keep & (sorted_logprobs >= sorted_logprobs[0] + mx.log(mx.array(min_p, mx.float32)))
    keep = keep | (rank == 0)
    return mx.where(keep, sorted_logprobs / temperature, -mx.inf)


def _clip(x, lo, hi):
    return mx.minimum(mx.maximum(x, lo), hi)


class EntropixSampler(TwoPhaseSampler):
    name = "entropix"

    def __init__(self, config: SamplerConfig | None = None, tokenizer=None, source: str = "preset reference"):
        self.config = config or SamplerConfig()
        self.config_source = source  # where the thresholds came from, for the CLI to print
        self.thinking_tokens: list[int] = []
        self.eos_tokens: list[int] = []
        self._compiled = None
        if tokenizer is not None:
            self.thinking_tokens = list(tokenizer.encode(self.config.thinking_text, add_special_tokens=False))
            self.eos_tokens = sorted(getattr(tokenizer, "eos_token_ids", None) or ())
        self.reset()

    def reset(self):
        self.insertions = 0
        self._just_inserted = False

    # -- the one graph per step -------------------------------------------------

    def _candidate_pool(self, vocab: int) -> int:
        c = self.config
        if c.top_k <= 0:
            return vocab
        return min(vocab, max(c.adaptive_top_k_max, math.ceil(1.5 * c.top_k), 5, c.branch_candidates))

    def bias(self, history: list[int]) -> tuple[mx.array, mx.array]:
        """The score's bias (nats) on a few tokens, padded to BIAS_SLOTS:
        (ids, values). Repeated n-grams cost repetition_penalty bits per earlier
        occurrence; right after a thinking insertion the end-of-turn tokens are
        banned (-inf)."""
        values = self.repetition_bias(history)
        if self._just_inserted:
            for t in self.eos_tokens:
                values[t] = -math.inf
        items = sorted(values.items(), key=lambda kv: kv[1])[:BIAS_SLOTS]  # bans first
        ids = [t for t, _ in items] + [0] * (BIAS_SLOTS - len(items))
        vals = [v for _, v in items] + [0.0] * (BIAS_SLOTS - len(items))
        return mx.array(ids, dtype=mx.int32), mx.array(vals, dtype=mx.float32)

    def repetition_bias(self, history: list[int]) -> dict[int, float]:
        """{token: the score's repetition bias in nats} after `history`, for the
        BIAS_SLOTS most repeated tokens."""
        c = self.config
        if c.repetition_penalty <= 0:
            return {}
        counts = repeat_counts(history, c.repetition_ngram).most_common(BIAS_SLOTS)
        return {t: -c.repetition_penalty * k / NATS_TO_BITS for t, k in counts}

    def plan(self, step: Step, key: mx.array) -> dict:
        """Metrics, every strategy's parameters and candidates, as lazy arrays.

        The attention metrics change shape every step (one more key), so they
        are built op by op; everything that depends only on the logits and four
        scalars goes through one compiled function (fixed shapes), which fuses
        its many small element-wise ops."""
        attention = mx.zeros(4)
        if step.scores:
            layers = select_layers(len(step.scores), self.config.attention_layers)
            per_layer = attention_metrics([step.scores[i] for i in layers])
            attention = mx.stack([per_layer[n].mean() for n in ATTENTION_METRICS])
        if self._compiled is None:
            self._compiled = mx.compile(self._logits_plan)
        bias_ids, bias_vals = self.bias(step.tokens)
        metrics, params, idx, tokens, logprobs, kept, think_lp, note, margin, top_ids, top_lps = self._compiled(
            step.logits, attention, key, bias_ids, bias_vals
        )
        c = self.config
        sizes = {
            "argmax": 1,
            "think": 1,
            "branch": min(c.branch_candidates, idx.shape[0] - c.adaptive_samples - 3),
            "resample": 1,
            "adaptive": c.adaptive_samples,
        }
        out = {
            "metrics": metrics,
            "params": params,
            "tokens": {},
            "logprobs": {},
            "kept": {},
            "thinking_logprob": think_lp,
            "note": note,
            "margin": margin,
            "top_ids": top_ids,
            "top_logprobs": top_lps,
        }
        start = 0
        for s, n in sizes.items():
            out["tokens"][s], out["logprobs"][s], out["kept"][s] = (
                tokens[start : start + n],
                logprobs[start : start + n],
                kept[start : start + n],
            )
            start += n
        return out

    def _logits_plan(
        self, logits: mx.array, attention: mx.array, key: mx.array, bias_ids: mx.array, bias_vals: mx.array
    ):
        c = self.config
        logits, note = sanitize_logits(logits)
        logprobs = logits - mx.logsumexp(logits)
        H, V = logits_entropy(logits)  # the model's own distribution decides the strategy
        ae, av, ag, ist = attention[0], attention[1], attention[2], attention[3]
        T0, p0, k0, mp0 = c.temperature, c.top_p, c.top_k, c.min_p

        # Candidates come from the scored distribution (log p + bias, renormalized).
        scored = logprobs.at[bias_ids].add(bias_vals)
        finite = mx.any(scored > -mx.inf)  # never ban everything
        scored = mx.where(finite, scored, logprobs)
        scored = scored - mx.logsumexp(scored)
        pool = self._candidate_pool(logprobs.shape[-1])
        vals, ids = top_candidates(scored, pool)
        kmax = pool if k0 > 0 else 0

        def as_k(x):  # a top-k computed from metrics, kept within the candidate pool
            return _clip(x, 1, pool).astype(mx.int32) if k0 > 0 else mx.array(0)

        params = {
            "think": (mx.minimum(1.5, T0 * (1.3 + 0.2 * ae)), mx.array(k0), mx.array(p0), mx.array(mp0)),
            "branch": (
                mx.minimum(1.5, T0 * (1.2 + 0.3 * ist)),
                as_k(mx.maximum(5, mx.floor(k0 * (1 + 0.5 * (1 - ag))))),
                mx.array(p0),
                mx.array(mp0),
            ),
            "resample": (
                mx.maximum(2.0, T0 * (2.0 + 0.5 * av)),
                mx.array(k0),
                mx.maximum(0.5, p0 - 0.2 * ae),
                mx.array(mp0),
            ),
            "adaptive": (
                _clip(T0 * (1 + 0.3 * (H + V) + 0.2 * (ae + av) - 0.2 * ag), 0.05 * T0, c.adaptive_max_temperature),
                as_k(_clip(mx.round(k0 * (1 + 0.3 * ist - 0.2 * ag)), 1, min(kmax or pool, c.adaptive_top_k_max))),
                _clip(p0 * (1 + 0.1 * av), 0.1, 1.0),
                _clip(mp0 * (1 - 0.5 * (H + V)), 0.01, 0.5),
            ),
        }
        k_think, k_branch, k_resample, k_adaptive = mx.random.split(key, 4)
        w = {s: filter_sorted(vals, *p) for s, p in params.items()}
        # Sampling without replacement (Gumbel-top-n): distinct branch candidates.
        gumbel = w["branch"] + mx.random.gumbel(shape=w["branch"].shape, key=k_branch)
        branch_idx = mx.argsort(-gumbel)[: c.branch_candidates]
        # One independent key per adaptive candidate.
        adaptive_idx = mx.stack(
            [mx.random.categorical(w["adaptive"], key=k) for k in mx.random.split(k_adaptive, c.adaptive_samples)]
        )
        picks = [
            mx.array([0]),
            mx.random.categorical(w["think"], key=k_think)[None],
            branch_idx,
            mx.random.categorical(w["resample"], key=k_resample)[None],
            adaptive_idx,
        ]
        owner = ["think", "think", "branch", "resample", "adaptive"]  # whose filter a pick passed (argmax: any)
        idx = mx.concatenate([p.astype(mx.int32) for p in picks])
        kept = mx.concatenate([w[o][p] > -mx.inf for o, p in zip(owner, picks, strict=False)])
        metrics = mx.stack([H, V, ae, av, ag, ist])
        param_rows = mx.stack([mx.stack([mx.array(x).astype(mx.float32) for x in params[s]]) for s in params])
        # log p of the thinking text's first token, in case it is inserted
        think_lp = logprobs[self.thinking_tokens[0]] if self.thinking_tokens else mx.array(0.0)
        # bits between the best-scored token and the second (inf when only one is possible)
        margin = (vals[0] - vals[1]) * NATS_TO_BITS if vals.shape[0] > 1 else mx.array(mx.inf)
        top = min(c.branch_candidates, pool)  # the most likely by score, for branch_select "confidence"
        return (
            metrics,
            param_rows,
            idx,
            ids[idx],
            logprobs[ids[idx]],
            kept,
            think_lp,
            note,
            margin,
            ids[:top],
            logprobs[ids[:top]],
        )

    # -- the decision -------------------------------------------------------------

    def finish(self, step: Step, plan: dict) -> Choice:
        """The decision from the evaluated `plan` (batch.py evaluates every
        row's plan at once): the strategy table, the candidate scores, and any
        rollout or insertion."""
        c = self.config
        metrics = dict(zip(METRIC_NAMES, plan["metrics"].tolist(), strict=False))
        strategy = decide(metrics["entropy"], metrics["varentropy"], c, plan["margin"].item())
        param_rows = dict(zip(("think", "branch", "resample", "adaptive"), plan["params"].tolist(), strict=False))
        tokens = {s: v.tolist() for s, v in plan["tokens"].items()}
        logprobs = {s: v.tolist() for s, v in plan["logprobs"].items()}

        def params_of(s):
            t, k, p, mp = param_rows[s]
            # float32 values, shown at the precision they have
            return {"temperature": round(t, 6), "top_k": int(k), "top_p": round(p, 6), "min_p": round(mp, 6)}

        inserted = False
        advanced = None
        if strategy == "argmax":
            out, lps, params = tokens["argmax"], logprobs["argmax"], dict(GREEDY_PARAMS)
        elif strategy == "think":
            if self.thinking_tokens and not self._just_inserted and self.insertions < c.max_thinking_insertions:
                out, lps, advanced = self._insert_thinking(step, plan["thinking_logprob"].item())
                params = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}  # inserted, not sampled
                inserted = True
                self.insertions += 1
            else:
                out, lps, params = tokens["think"], logprobs["think"], params_of("think")
        elif strategy == "branch":
            if c.branch_select == "confidence":  # the most likely tokens, not drawn ones
                cands = list(zip(plan["top_ids"].tolist(), plan["top_logprobs"].tolist(), strict=False))
            else:
                kept = plan["kept"]["branch"].tolist()
                cands = [(t, lp) for t, lp, k in zip(tokens["branch"], logprobs["branch"], kept, strict=False) if k]
            params = params_of("branch")
            if step.model is not None and step.cache is not None and len(cands) > 1:
                out, lps, advanced = self._branch(step, cands)
            else:
                out, lps = [cands[0][0]], [cands[0][1]]
        elif strategy == "resample":
            out, lps, params = tokens["resample"], logprobs["resample"], params_of("resample")
        else:
            best = max(
                range(len(tokens["adaptive"])),
                key=lambda i: self.adaptive_score(tokens["adaptive"][i], logprobs["adaptive"][i], step.tokens),
            )
            out, lps, params = [tokens["adaptive"][best]], [logprobs["adaptive"][best]], params_of("adaptive")
        self._just_inserted = inserted
        return Choice(
            list(out),
            strategy,
            list(lps),
            metrics,
            params,
            advanced=advanced,
            inserted=inserted,
            note=LOGIT_NOTES[plan["note"].item()],
        )

    def adaptive_score(self, token: int, logprob: float, history: list[int]) -> float:
        """log2 p(token) minus repetition_penalty bits for every earlier
        occurrence, in `history`, of the n-gram that `token` would complete."""
        return self.path_score([token], [logprob], history)

    def path_score(self, path: list[int], logprobs: list[float], history: list[int]) -> float:
        """The score of a sequence of tokens after `history`: total log2 p minus
        repetition_penalty bits per repeated n-gram it completes (over history
        and the path so far)."""
        repeats = path_repeats(history, path, self.config.repetition_ngram) if self.config.repetition_penalty else 0
        return sum(logprobs) * NATS_TO_BITS - self.config.repetition_penalty * repeats

    # -- strategies that run the model ----------------------------------------------

    def _insert_thinking(self, step: Step, first_logprob: float):
        """The thinking tokens, their log-probabilities and, with a model, the
        state after them (the loop would run the same forward pass anyway)."""
        toks = self.thinking_tokens
        if step.model is None or step.cache is None:
            # No model here: only the first token's probability is known (None, so
            # JSON output stays valid; NaN is not JSON).
            return list(toks), [first_logprob] + [None] * (len(toks) - 1), None
        logits, scores = step.model(mx.array([toks]), step.cache)
        lp = logits[0].astype(mx.float32)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        rest = mx.stack([lp[i, toks[i + 1]] for i in range(len(toks) - 1)]) if len(toks) > 1 else mx.zeros(0)
        last_logits = logits[:, -1:, :]
        mx.eval(rest, last_logits, scores)
        return list(toks), [first_logprob] + rest.tolist(), (step.cache, last_logits, scores)

    def _branch(self, step: Step, cands: list[tuple[int, float]]):
        """Roll every candidate out greedily, all rows in one batch over the
        step's cache (shared, not copied); accept the best path (`_best_path`).

        The rollout's last forward pass runs for the winner only, on the step's
        own cache (after the winner's earlier rollout keys are appended to it):
        the losers' last pass would be thrown away, and on a CPU a batch of n
        rows costs nearly n single passes. With branch_select "confidence" the
        rollout stops once every row has ended its turn (nothing after an end of
        turn is scored), and an accepted path that ends the turn needs no state
        after it. With branch_decide_tokens the rows are compared once their
        paths hold that many tokens, and only the winner rolls on; alone, it
        stops at its first repetition unit (nothing after it is handed out)."""
        n, depth = len(cands), self.config.branch_rollout_tokens
        decide = self.config.branch_decide_tokens or depth
        confidence = self.config.branch_select == "confidence"
        scored = self.config.branch_rollout == "scored" and self.config.repetition_penalty > 0
        synced = scored or (confidence and bool(self.eos_tokens))  # each row's tokens known on the host
        eos = set(self.eos_tokens)
        ended = [t in eos for t, _ in cands]
        said = [list(step.tokens) + [t] for t, _ in cands]  # each row's answer so far (scored rollouts)
        path = [mx.array([t for t, _ in cands])]
        path_lps = [mx.array([lp for _, lp in cands])]  # nats, (n,) per position
        margins = []  # top-1 - top-2 probability, (n,) per position
        rollout = [SharedPrefixCache(c, n, depth - 1) for c in step.cache] if depth > 1 else []
        for _ in range(depth - 1):
            if confidence and eos and all(ended):
                break
            if n > 1 and len(path) >= decide:  # decided: the other rows stop here
                best = self._rank_rows(path, path_lps, margins, step.tokens)[0]
                path, path_lps, margins = ([a[best : best + 1] for a in arrays] for arrays in (path, path_lps, margins))
                said, ended, n = [said[best]], [ended[best]], 1
                for shared in rollout:
                    shared.keep_row(best)
            if (
                n == 1
                and synced
                and self.config.repetition_penalty
                and first_repeat(step.tokens, said[0][len(step.tokens) :], self.config.repetition_ngram) < len(path)
            ):
                break  # the path is handed out only up to here: rolling on would be thrown away
            logits, _ = step.model(path[-1][:, None], rollout)  # scores unused (never computed: lazy)
            lp = logits[:, -1].astype(mx.float32)
            lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
            nxt = mx.argmax(lp + self._rows_bias(said, lp.shape[-1]) if scored else lp, axis=-1)
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
        best, paths, lps, path = self._rank_rows(path, path_lps, margins, step.tokens)
        # The rollout continued greedily, unscored: accept it only up to its first token
        # with repetition units (at least its first token), so a looping continuation is
        # never handed out whole; the next step decides there, with the score.
        keep = len(paths[best])
        if self.config.repetition_penalty:
            keep = max(1, first_repeat(step.tokens, paths[best], self.config.repetition_ngram))
        end = next((j for j, t in enumerate(paths[best][:keep]) if t in eos), None)
        if end is not None:  # the turn ends here: no state after it is needed
            return paths[best][: end + 1], lps[best][: end + 1], None
        for layer, shared in zip(step.cache, rollout if keep > 1 else (), strict=False):
            keys, values = shared.row(best)
            layer.update_and_fetch(keys[..., : keep - 1, :], values[..., : keep - 1, :])
        del rollout  # it references the prefix: appending to the cache while it lives would copy it
        logits, scores = step.model(path[best : best + 1, keep - 1 : keep], step.cache)
        mx.eval(logits, scores)
        return paths[best][:keep], lps[best][:keep], (step.cache, logits[:, -1:, :], scores)

    def _rank_rows(self, path: list, path_lps: list, margins: list, history: list[int]):
        """The rollout so far (per position, one (rows,) array each) stacked to
        (rows, positions) and evaluated: (the row `_best_path` accepts, the paths,
        their log-probabilities, the paths as one array)."""
        rows = path[0].shape[0]
        path, path_lps = mx.stack(path, axis=1), mx.stack(path_lps, axis=1)
        margins = mx.stack(margins, axis=1) if margins else mx.zeros((rows, 0))
        mx.eval(path, path_lps, margins)
        paths, lps = path.tolist(), path_lps.tolist()
        return self._best_path(paths, lps, margins.tolist(), history), paths, lps, path

    def _rows_bias(self, histories: list[list[int]], vocab: int) -> mx.array:
        """(rows, vocab): each row's repetition bias (nats) after its own history."""
        bias = mx.zeros((len(histories), vocab), dtype=mx.float32)
        for i, history in enumerate(histories):
            values = self.repetition_bias(history)
            if values:
                bias[i, mx.array(list(values), dtype=mx.int32)] = mx.array(list(values.values()), dtype=mx.float32)
        return bias

    def _best_path(
        self, paths: list[list[int]], lps: list[list[float]], margins: list[list[float]], history: list[int]
    ) -> int:
        """The index of the path to accept. "logprob": the best `path_score`.
        "confidence": the fewest repetition units, then the highest mean
        top-1 - top-2 margin after the candidate (up to and including an end
        of turn: what follows it is never said); the first path (the most
        likely candidate) gets branch_keep_margin on top."""
        c = self.config
        if c.branch_select == "logprob":
            return max(range(len(paths)), key=lambda i: self.path_score(paths[i], lps[i], history))

        # where each path ends its turn (its last token when it does not)
        ends = [next((j for j, t in enumerate(p) if t in self.eos_tokens), len(p) - 1) for p in paths]

        def confidence(i):
            if ends[i] == 0 and paths[i][0] in self.eos_tokens:
                return math.exp(lps[i][0])  # ending here: nothing follows, its own probability is its certainty
            seen = margins[i][: ends[i]]
            return sum(seen) / len(seen) if seen else 0.0

        def repeats(i):
            if not c.repetition_penalty:
                return 0
            return path_repeats(history, paths[i][: ends[i] + 1], c.repetition_ngram)

        return max(
            range(len(paths)), key=lambda i: (-repeats(i), confidence(i) + (c.branch_keep_margin if i == 0 else 0.0))
        )
