"""The Entropix sampler: pick each next token by how uncertain the model is.

One decoding step:

1. Build one lazy MLX graph with the six metrics (metrics.py, bits) AND every
   strategy's candidate tokens and parameters (they are cheap: all filtering
   happens on the few hundred most likely tokens). Evaluate it once: one host
   sync per step, whatever the strategy turns out to be.
2. Decide the strategy on the host from entropy H and varentropy V (`strategies.decide`).
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
           likeliest token (see rollout.py).
- resample (H and V high): sample at a high temperature with a tighter top-p.
- adaptive (everything else): draw `adaptive_samples` candidates with distinct
           random keys and parameters adapted to the metrics; keep the one
           with the best score.

Scores. Every strategy chooses by one score per token,
    score = log2 p(token) - repetition_bits * repetition units
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
question unanswered.

Parameter formulas are the reference's version 1 (see ENTROPIX_REFERENCE.md),
with one deviation: the adaptive temperature is capped at
`adaptive_max_temperature` (the reference leaves it unbounded, and H + V of a
few bits already pushes it past 2).
"""

import math

import mlx.core as mx

from .candidates import filter_sorted, top_candidates
from .config import CONFIDENCE_SELECTS, SamplerConfig
from .constraint import constrained
from .metrics import ATTENTION_METRICS, LOG2E, METRIC_NAMES, attention_metrics, logits_entropy, select_layers
from .repetition import path_repeats, repeat_counts
from .rollout import branch
from .samplers import GREEDY_PARAMS, LOGIT_NOTES, Step, TokenChoice, TwoPhaseSampler, sanitize_logits
from .strategies import ENTROPIX_NAMES, decide

NATS_TO_BITS = LOG2E


# How many distinct tokens per step can carry a score bias (repetitions and
# banned end-of-turn tokens): a fixed size keeps the compiled step graph's
# shapes fixed. More repeated tokens than this: the most repeated ones.
BIAS_SLOTS = 16
# The strategies whose temperature, top-k, top-p and min-p the metrics set (argmax takes the best).
SAMPLED = tuple(s for s in ENTROPIX_NAMES if s != "argmax")


def _clip(x, lo, hi):
    return mx.minimum(mx.maximum(x, lo), hi)


class EntropixSampler(TwoPhaseSampler):
    name = "entropix"

    def __init__(self, config: SamplerConfig | None = None, tokenizer=None, source: str = "preset reference"):
        self.config = config or SamplerConfig()
        self.config_source = source  # where the thresholds came from, for the CLI to print
        self.path_choice = 0  # which of a request's n choices it answers (`pick_path`)
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
        self._choice_left = self.path_choice

    def pick_path(self, ranked: list[int]) -> int:
        """The branch path to accept among `ranked` (best first): the best, but
        for choice i > 0 of a request's n, the paths whose ranks write i in mixed
        radix over its first branch steps (each step's paths its base). Branching
        by confidence draws nothing, so the seed alone would give n equal
        choices; these differ from the first branch step on."""
        if self._choice_left and len(ranked) > 1:
            digit, self._choice_left = self._choice_left % len(ranked), self._choice_left // len(ranked)
            return ranked[digit]
        return ranked[0]

    # -- the one graph per step -------------------------------------------------

    def _candidate_pool(self, vocab: int) -> int:
        c = self.config
        if c.top_k <= 0:
            return vocab
        return min(vocab, max(c.adaptive_top_k_max, math.ceil(1.5 * c.top_k), 5, c.branch_candidates))

    def bias(self, history: list[int]) -> tuple[mx.array, mx.array]:
        """The score's bias (nats) on a few tokens, padded to BIAS_SLOTS:
        (ids, values). Repeated n-grams cost repetition_bits per earlier
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
        if c.repetition_bits <= 0:
            return {}
        counts = repeat_counts(history, c.repetition_ngram, c.loops_only).most_common(BIAS_SLOTS)
        return {t: -c.repetition_bits * k / NATS_TO_BITS for t, k in counts}

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
        drawn = {
            "branch": min(c.branch_candidates, idx.shape[0] - c.adaptive_samples - 3),
            "adaptive": c.adaptive_samples,
        }
        sizes = {s: drawn.get(s, 1) for s in ENTROPIX_NAMES}  # each strategy's candidates, in the table's order
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
                mx.maximum(c.resample_temperature, T0 * (2.0 + 0.5 * av)),
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
        picks = {
            "argmax": mx.array([0]),
            "think": mx.random.categorical(w["think"], key=k_think)[None],
            "branch": branch_idx,
            "resample": mx.random.categorical(w["resample"], key=k_resample)[None],
            "adaptive": adaptive_idx,
        }
        idx = mx.concatenate([picks[s].astype(mx.int32) for s in ENTROPIX_NAMES])
        # whose filter a pick passed (argmax's: any, think's)
        kept = mx.concatenate([w[s if s in w else "think"][picks[s]] > -mx.inf for s in ENTROPIX_NAMES])
        metrics = mx.stack([H, V, ae, av, ag, ist])
        param_rows = mx.stack([mx.stack([mx.array(x).astype(mx.float32) for x in params[s]]) for s in SAMPLED])
        # log p of the thinking text's first token, in case it is inserted
        think_lp = logprobs[self.thinking_tokens[0]] if self.thinking_tokens else mx.array(0.0)
        # bits between the best-scored token and the second (inf when only one is possible)
        margin = (vals[0] - vals[1]) * NATS_TO_BITS if vals.shape[0] > 1 else mx.array(mx.inf)
        top = min(c.branch_candidates, pool)  # the most likely by score, for the confidence selects
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

    def finish(self, step: Step, plan: dict) -> TokenChoice:
        """The decision from the evaluated `plan` (the batch engine evaluates every
        row's plan at once): the strategy table, the candidate scores, and any
        rollout or insertion."""
        c = self.config
        metrics = dict(zip(METRIC_NAMES, plan["metrics"].tolist(), strict=False))
        strategy = decide(metrics, c, plan["margin"].item())
        param_rows = dict(zip(SAMPLED, plan["params"].tolist(), strict=True))
        tokens = {s: v.tolist() for s, v in plan["tokens"].items()}
        logprobs = {s: v.tolist() for s, v in plan["logprobs"].items()}

        def params_of(s):
            t, k, p, mp = param_rows[s]
            # float32 values, shown at the precision they have
            return {"temperature": round(t, 6), "top_k": int(k), "top_p": round(p, 6), "min_p": round(mp, 6)}

        inserted = False
        advanced = token_metrics = None
        if strategy == "argmax":
            out, lps, params = tokens["argmax"], logprobs["argmax"], dict(GREEDY_PARAMS)
        elif strategy == "think":
            # (under a constraint the answer holds only the tokens its grammar allows)
            insert = self.thinking_tokens and not self._just_inserted and not constrained(step.penalties)
            if insert and self.insertions < c.max_thinking_insertions:
                out, lps, advanced = self._insert_thinking(step, plan["thinking_logprob"].item())
                params = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}  # inserted, not sampled
                inserted = True
                self.insertions += 1
            else:
                out, lps, params = tokens["think"], logprobs["think"], params_of("think")
        elif strategy == "branch":
            if c.branch_select in CONFIDENCE_SELECTS:  # the most likely tokens, not drawn ones
                top = zip(plan["top_ids"].tolist(), plan["top_logprobs"].tolist(), strict=False)
                cands = [(t, lp) for t, lp in top if lp > -math.inf]  # (a constraint rules some out)
            else:
                kept = plan["kept"]["branch"].tolist()
                cands = [(t, lp) for t, lp, k in zip(tokens["branch"], logprobs["branch"], kept, strict=False) if k]
            params = params_of("branch")
            if step.model is not None and step.cache is not None and len(cands) > 1:
                out, lps, advanced, later = branch(self, step, cands)
                # The rollout computes no attention scores: those metrics are unknown (None) there.
                unknown = dict.fromkeys(ATTENTION_METRICS)
                token_metrics = [metrics] + [{**m, **unknown, "rollout_step": j} for j, m in enumerate(later, 1)]
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
        return TokenChoice(
            list(out),
            strategy,
            list(lps),
            metrics,
            params,
            advanced=advanced,
            inserted=inserted,
            token_metrics=token_metrics,
            note=LOGIT_NOTES[plan["note"].item()],
        )

    def adaptive_score(self, token: int, logprob: float, history: list[int]) -> float:
        """log2 p(token) minus repetition_bits for every earlier
        occurrence, in `history`, of the n-gram that `token` would complete."""
        return self.path_score([token], [logprob], history)

    def path_score(self, path: list[int], logprobs: list[float], history: list[int]) -> float:
        """The score of a sequence of tokens after `history`: total log2 p minus
        repetition_bits per repeated n-gram it completes (over history
        and the path so far)."""
        c = self.config
        repeats = path_repeats(history, path, c.repetition_ngram, c.loops_only) if c.repetition_bits else 0
        return sum(logprobs) * NATS_TO_BITS - c.repetition_bits * repeats

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
