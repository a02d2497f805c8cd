"""Issue 10's failure modes of the Entropix sampler, each reproduced on constructed
distributions or a tiny model: the end of turn right after a thinking insertion,
loops through `branch` (a path score that preferred repetition), loops through
`argmax`; and the score's bias never touches the metrics or reported log-probs."""

import math

import mlx.core as mx
import numpy as np
import pytest
from test_entropix import ALWAYS_BRANCH, ATTENTION, FLAT, greedy_path, path_logprobs, smooth_model

from entropix_mlx.decode.generate import generate
from entropix_mlx.front.registry import build
from entropix_mlx.model.cache import make_cache
from entropix_mlx.sampling.config import SamplerConfig
from entropix_mlx.sampling.entropix import EntropixSampler
from entropix_mlx.sampling.metrics import step_metrics
from entropix_mlx.sampling.repetition import path_repeats, repeat_counts
from entropix_mlx.sampling.rollout import best_path
from entropix_mlx.sampling.samplers import GreedySampler, Step

V = 259  # the tiny tokenizer's vocabulary; id 2 is its end-of-turn token
EOS = 2


def step(logits, tokens=(), **kw):
    return Step(mx.array(logits, dtype=mx.float32), ATTENTION, list(tokens), **kw)


def repeated_ngram_share(tokens, n=4):
    """Share of the n-grams of `tokens` that already occurred earlier in it."""
    seen, repeated = set(), 0
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    for g in grams:
        repeated += g in seen
        seen.add(g)
    return repeated / max(len(grams), 1)


# -- the score --------------------------------------------------------------------------


def test_repeat_counts_and_path_repeats():
    history = [5, 6, 7, 5, 6, 8, 5, 6]
    assert repeat_counts(history, 3) == {7: 1, 8: 1}  # "5 6 7" and "5 6 8" occurred once each
    # n = 2: "6 7" and "6 8" occurred once, and each repeat is a 3-token span ("5 6 7"): one more unit
    assert repeat_counts(history, 2) == {7: 2, 8: 2}
    assert repeat_counts(history, 1)[5] == 3
    assert repeat_counts([1, 2], 3) == {}
    # Copying a phrase costs more with every token copied: the k-th token of the copy, k - n + 1 units.
    phrase = [10, 11, 12, 13, 14, 15]
    assert [repeat_counts(phrase + phrase[: k - 1], 3).get(phrase[k - 1], 0) for k in range(1, 7)] == [0, 0, 1, 2, 3, 4]
    # Path 7, 5, 6 after history: "5 6 7" (1 unit), "6 7 5" (1, + 1: "5 6 7 5" repeats), "7 5 6" (1, + 2)
    assert path_repeats(history, [7, 5, 6], 3) == 1 + 2 + 3
    # A path's own repetition counts too
    assert path_repeats([], [1, 1, 1, 1, 1], 3) == 0 + 0 + 1 + 3
    sampler = EntropixSampler(SamplerConfig(repetition_bits=2.0, repetition_ngram=3))
    assert sampler.path_score([7, 5, 6], [-1.0, -1.0, -1.0], history) == pytest.approx(-3.0 / math.log(2) - 2.0 * 6)


def test_the_loop_scope_charges_a_loop_as_before_and_a_copy_from_further_back_nothing():
    phrase = [10, 11, 12, 13, 14, 15]
    # A copy is a loop once it is a whole unit long, back to back with its source: a 6-token
    # phrase copied right after itself goes free for 5 tokens, then costs what it always did.
    units = [repeat_counts(phrase + phrase[: k - 1], 3, loops_only=True).get(phrase[k - 1], 0) for k in range(1, 7)]
    assert units == [0, 0, 0, 0, 0, 4]
    unit = [10, 11, 12]  # a 3-token unit repeated: charged from its first repeat, ever more
    loop = unit * 4
    charged = [repeat_counts(loop[:k], 3, loops_only=True).get(loop[k], 0) for k in range(5, 12)]
    assert all(c > 0 for c in charged) and charged == sorted(charged) and charged[-1] > charged[0]
    # The same phrase copied after other text (a restated name, the next test line): free.
    apart = phrase + [20, 21, 22, 23, 24, 25, 26] + phrase[:4]
    assert repeat_counts(apart, 3)[phrase[4]] == 3
    assert repeat_counts(apart, 3, loops_only=True) == {}
    # A short unit repeated back to back is a loop from its n-th token: "1, 1, 1" in test data too.
    assert repeat_counts([7, 8, 7, 8], 3, loops_only=True) == {7: 1}
    assert repeat_counts([7, 9, 9], 1, loops_only=True) == {9: 1}
    assert path_repeats([30, 31, 32], [30, 31, 32], 3, loops_only=True) == path_repeats([30, 31, 32], [30, 31, 32], 3)
    history = [9, 8, 0, 7, 1, 2, 3, 4, 9, 8]  # "9 8 0" again, far from the first
    loops = EntropixSampler(SamplerConfig(repetition_bits=2.0, repetition_scope="loops", **ARGMAX_HERE))
    answer = EntropixSampler(SamplerConfig(repetition_bits=2.0, **ARGMAX_HERE))
    assert answer.choose(step(CLOSE, tokens=history), mx.random.key(0)).tokens == [1]
    assert loops.choose(step(CLOSE, tokens=history), mx.random.key(0)).tokens == [0]  # greedy's token
    assert loops.choose(step(CLOSE, tokens=[9, 8, 0, 9, 8]), mx.random.key(0)).tokens == [1]  # a loop


# -- end of turn right after a thinking insertion ---------------------------------------------

ENDS = [0.0] * V
ENDS[EOS], ENDS[40] = 12.0, 6.0  # end-of-turn dominant, token 40 next: low entropy -> argmax


def test_no_end_of_turn_right_after_a_thinking_insertion(tiny_tokenizer):
    sampler = EntropixSampler(SamplerConfig(thinking_text="..", low_entropy=0.5, low_varentropy=5.0), tiny_tokenizer)
    assert sampler.eos_tokens == [0, EOS]  # <|endoftext|> ends a turn too
    # Without an insertion just before, the model may end its turn.
    assert sampler.choose(step(ENDS), mx.random.key(0)).tokens == [EOS]
    inserted = sampler.choose(step(FLAT[:V]), mx.random.key(0))
    assert inserted.inserted
    after = sampler.choose(step(ENDS, tokens=inserted.tokens), mx.random.key(0))
    assert after.strategy == "argmax" and after.tokens == [40]
    # What is reported is the model's own probability and metrics, not the ban's.
    lp = np.array(ENDS) - np.log(np.exp(np.array(ENDS)).sum())
    assert after.logprobs[0] == pytest.approx(lp[40], abs=1e-4)
    ref = {k: v.item() for k, v in step_metrics(mx.array(ENDS), ATTENTION).items()}
    assert after.metrics == pytest.approx(ref, rel=1e-5, abs=1e-6)
    # One step only: afterwards the model may end its turn again.
    assert sampler.choose(step(ENDS, tokens=inserted.tokens + [40]), mx.random.key(0)).tokens == [EOS]


@pytest.mark.parametrize("strategy_logits", ["think", "adaptive"])
def test_sampling_strategies_after_an_insertion_never_end_the_turn(strategy_logits, tiny_tokenizer):
    # The end-of-turn token holds most of the mass, in a state that samples.
    logits = [0.0] * V
    logits[EOS] = 9.0 if strategy_logits == "think" else 3.0
    config = SamplerConfig(thinking_text="..", max_thinking_insertions=100)
    for seed in range(6):
        sampler = EntropixSampler(config, tiny_tokenizer)
        first = sampler.choose(step(FLAT[:V]), mx.random.key(seed))
        assert first.inserted
        after = sampler.choose(step(logits, tokens=first.tokens), mx.random.key(seed))
        assert EOS not in after.tokens


# -- branch cannot win with a repetition ----------------------------------------------------


def _branch_step(model, prompt, history):
    cache = make_cache(model)
    logits, scores = model(mx.array([prompt]), cache)
    return Step(logits[0, -1], [x[0] for x in scores], list(history), model, cache)


def test_branch_path_score_refuses_a_repeated_path():
    model = smooth_model()
    prompt = [1, 40, 50, 60]
    key = mx.random.key(5)
    base = dict(branch_candidates=3, branch_rollout_tokens=3, **ALWAYS_BRANCH)
    plain = EntropixSampler(SamplerConfig(repetition_bits=0.0, **base))
    s = _branch_step(model, prompt, [])
    plan = plain.plan(s, key)
    mx.eval(plan)
    firsts = plan["tokens"]["branch"].tolist()
    paths = [greedy_path(model, prompt, f, 3) for f in firsts]
    totals = [sum(path_logprobs(model, prompt, p)) for p in paths]
    likeliest = paths[int(np.argmax(totals))]
    assert plain.choose(s, key).tokens == likeliest

    # The same step, but the answer so far already repeated the likeliest path twice:
    # the likelihood alone still prefers it (the model's logits are the same), the score does not.
    history = likeliest * 2
    assert plain.choose(_branch_step(model, prompt, history), key).tokens == likeliest
    scored = EntropixSampler(SamplerConfig(repetition_bits=2.0, repetition_ngram=3, **base))
    choice = scored.choose(_branch_step(model, prompt, history), key)
    assert choice.tokens != likeliest
    assert path_repeats(history, choice.tokens, 3) < path_repeats(history, likeliest, 3)


def test_branching_generation_loops_less_than_greedy_on_a_tiny_model(tiny_tokenizer):
    """A tiny random model loops under greedy decoding; always branching with the
    old score (likelihood only) loops as much, the scored branch does not."""
    model = smooth_model()
    prompt = [1, 72, 105]
    n = 48
    greedy = [e.token for e in generate(model, tiny_tokenizer, prompt, GreedySampler(), max_tokens=n)]
    share = {}
    for penalty in (0.0, 2.0):
        config = SamplerConfig(repetition_bits=penalty, **ALWAYS_BRANCH)
        tokens = []
        for seed in range(3):
            sampler = build("entropix", tiny_tokenizer, config=config)
            tokens.append([e.token for e in generate(model, tiny_tokenizer, prompt, sampler, max_tokens=n, seed=seed)])
        share[penalty] = np.mean([repeated_ngram_share(t) for t in tokens])
    assert repeated_ngram_share(greedy) > 0.5, greedy  # the failure: greedy loops
    assert share[0.0] > 0.3  # likelihood-only branching loops too
    assert share[2.0] <= share[0.0] / 2, share


# -- argmax is the best score ------------------------------------------------------------------

CLOSE = [4.0, 3.0] + [-10.0] * (V - 2)  # token 0 likeliest, 1 a bit less (1.44 bits apart)
ARGMAX_HERE = dict(low_entropy=2.0, low_varentropy=3.0)


def test_argmax_takes_the_likeliest_token_unless_it_repeats():
    sampler = EntropixSampler(SamplerConfig(repetition_bits=2.0, repetition_ngram=3, **ARGMAX_HERE))
    assert sampler.choose(step(CLOSE, tokens=[9, 8]), mx.random.key(0)).tokens == [0]
    repeat = sampler.choose(step(CLOSE, tokens=[9, 8, 0, 7, 9, 8]), mx.random.key(0))  # "9 8 0" again
    assert repeat.strategy == "argmax" and repeat.tokens == [1]
    lp = np.array(CLOSE) - np.log(np.exp(np.array(CLOSE)).sum())
    assert repeat.logprobs[0] == pytest.approx(lp[1], abs=1e-4)  # the model's log p, not the score
    off = EntropixSampler(SamplerConfig(repetition_bits=0.0, **ARGMAX_HERE))
    assert off.choose(step(CLOSE, tokens=[9, 8, 0, 7, 9, 8]), mx.random.key(0)).tokens == [0]
    # A token far likelier than the rest stays, whatever it repeats (here 1 earlier occurrence: 2 bits < 14).
    far = [10.0, 0.0] + [-10.0] * (V - 2)
    assert sampler.choose(step(far, tokens=[9, 8, 0, 7, 9, 8]), mx.random.key(0)).tokens == [0]


# -- one clear winner on a long tail --------------------------------------------------------------

WINNER = [6.0] + [0.0] * (V - 1)  # p1 ~ 0.38 (8.7 bits ahead of each other token), H ~ 5.5 bits


def test_a_clear_top_1_margin_takes_argmax_whatever_the_entropy(tiny_tokenizer):
    m = {k: v.item() for k, v in step_metrics(mx.array(WINNER), ATTENTION).items()}
    assert m["entropy"] > SamplerConfig().medium_entropy  # not an argmax state by H and V
    off = EntropixSampler(SamplerConfig(), tiny_tokenizer)
    strategies = {off.choose(step(WINNER), mx.random.key(s)).strategy for s in range(4)}
    assert "argmax" not in strategies
    on = EntropixSampler(SamplerConfig(argmax_margin=8.0), tiny_tokenizer)
    for s in range(4):
        choice = on.choose(step(WINNER), mx.random.key(s))
        assert choice.strategy == "argmax" and choice.tokens == [0]
    strict = EntropixSampler(SamplerConfig(argmax_margin=9.0), tiny_tokenizer)  # 8.66 bits is not enough
    assert strict.choose(step(WINNER), mx.random.key(0)).strategy != "argmax"
    # The margin is the scored one: when the winner would repeat an n-gram three times over
    # (6 bits of penalty), it is only 2.66 bits ahead and the rule does not fire.
    history = [9, 8, 0] * 3 + [9, 8]
    assert on.choose(step(WINNER, tokens=history), mx.random.key(0)).strategy != "argmax"


def margins_along(model, prompt, path):
    """top-1 minus top-2 probability at each position after the first token of path."""
    out = []
    for j in range(1, len(path)):
        logits, _ = model(mx.array([prompt + path[:j]]))
        p = mx.softmax(logits[0, -1].astype(mx.float32))
        top2 = mx.sort(p)[-2:].tolist()
        out.append(top2[1] - top2[0])
    return out


def test_confidence_branch_takes_the_most_likely_tokens_and_the_surest_continuation():
    """branch_select="confidence": the candidates are the most likely tokens
    (whatever the key), each continued greedily, and the accepted path is the
    one whose continuation has the highest mean top-1 - top-2 margin; the most
    likely candidate keeps its place unless beaten by more than branch_keep_margin."""
    model = smooth_model()
    config = SamplerConfig(
        branch_candidates=3,
        branch_rollout_tokens=4,
        branch_select="confidence",
        repetition_bits=0.0,
        **ALWAYS_BRANCH,
    )
    overtaken = 0
    for prompt in ([1, 40, 50, 60], [1, 72, 105], [1, 9, 33, 200], [1, 150, 4]):
        logits, _ = model(mx.array([prompt]))
        firsts = mx.argsort(-logits[0, -1])[:3].tolist()
        paths = [greedy_path(model, prompt, f, 4) for f in firsts]
        confidence = [np.mean(margins_along(model, prompt, p)) for p in paths]
        surest = paths[int(np.argmax(confidence))]
        for seed in (0, 1):
            choice = EntropixSampler(config).choose(_branch_step(model, prompt, []), mx.random.key(seed))
            assert choice.strategy == "branch" and choice.tokens == surest
            assert choice.logprobs == pytest.approx(path_logprobs(model, prompt, surest), abs=1e-4)
        if surest == paths[0]:
            continue
        overtaken += 1
        lead = max(confidence) - confidence[0]
        for keep, expected in ((lead + 0.01, paths[0]), (lead / 2, surest)):
            sampler = EntropixSampler(config.replace(branch_keep_margin=keep))
            assert sampler.choose(_branch_step(model, prompt, []), mx.random.key(0)).tokens == expected
    assert overtaken >= 1  # the margin rule was really exercised


def test_confidence_ranks_repeating_paths_last_and_stops_at_the_end_of_turn():
    sampler = EntropixSampler(SamplerConfig(branch_select="confidence", repetition_bits=2.0, repetition_ngram=3))
    sampler.eos_tokens = [EOS]
    history = [7, 8, 9, 7, 8]
    paths = [[9, 7, 8], [5, 6, 11], [12, 13, 14]]  # the first repeats "7 8 9" and "8 9 7"
    margins = [[0.99, 0.99], [0.6, 0.6], [0.5, 0.5]]
    lps = [[-1.0] * 3] * 3
    assert best_path(sampler, paths, lps, margins, history) == 1
    # Margins after an end of turn are never said, so they never count: path 2 ends at once
    # with a sure end (0.9), path 1's continuation is less sure.
    paths = [[5, 6, 11], [12, EOS, 14]]
    assert best_path(sampler, paths, lps[:2], [[0.6, 0.6], [0.9, 0.0]], []) == 1
    assert best_path(sampler, paths, lps[:2], [[0.6, 0.6], [0.5, 1.0]], []) == 0
    # Ending as the candidate: its own probability is its certainty.
    paths = [[5, 6, 11], [EOS, 3, 3]]
    assert best_path(sampler, paths, [[-1.0] * 3, [math.log(0.8), 0.0, 0.0]], [[0.6, 0.6], [1.0, 1.0]], []) == 1
    assert best_path(sampler, paths, [[-1.0] * 3, [math.log(0.3), 0.0, 0.0]], [[0.6, 0.6], [1.0, 1.0]], []) == 0


def test_path_confidence_counts_the_candidates_own_probability():
    """Qwen2.5-Coder on "Which body part do you use to hear?": "Ears" (p 0.57) then
    a continuation margin of 0.71, "Nose" (p 0.02) then its second piece, sure at
    0.99. "confidence" looks only after the candidate and says "Nose";
    "path_confidence" counts the candidate's probability as the path's first
    certainty and keeps "Ears"."""
    paths = [[20, 21], [30, EOS], [40, 41]]
    lps = [[math.log(0.567), -0.2], [math.log(0.296), -0.4], [math.log(0.022), -0.01]]
    margins = [[0.706], [0.425], [0.99]]
    picks = {}
    for select in ("confidence", "path_confidence"):
        sampler = EntropixSampler(SamplerConfig(branch_select=select, branch_keep_margin=0.1))
        sampler.eos_tokens = [EOS]
        picks[select] = best_path(sampler, paths, lps, margins, [])
    assert picks == {"confidence": 2, "path_confidence": 0}
    # A less likely candidate still wins when the model is much surer along its path.
    sampler = EntropixSampler(SamplerConfig(branch_select="path_confidence", branch_keep_margin=0.1))
    sampler.eos_tokens = [EOS]
    sure_after = [[0.1], [0.2], [0.99]]
    assert (
        best_path(
            sampler, [[20, 21], [30, 31], [40, 41]], [[math.log(0.4)] * 2, lps[1], [math.log(0.3)] * 2], sure_after, []
        )
        == 2
    )


def test_branch_select_is_validated():
    from entropix_mlx.errors import ConfigError

    with pytest.raises(ConfigError, match="branch_select"):
        SamplerConfig(branch_select="vote")
    with pytest.raises(ConfigError, match="branch_keep_margin"):
        SamplerConfig(branch_keep_margin=-0.1)


def test_a_branch_hands_out_its_path_only_up_to_its_first_repetition(tiny_tokenizer):
    """The rollout continues greedily, unscored: a path that starts to repeat the
    answer (or itself) is cut before the token that repeats, and the state handed
    back is the one after the kept tokens (the next logits equal a fresh forward)."""
    from entropix_mlx.sampling.repetition import first_repeat

    assert first_repeat([5, 6, 7], [5, 6, 7, 8], 3) == 2  # "5 6 7" again at its third token
    assert first_repeat([], [1, 2, 3, 1, 2, 3], 3) == 5
    assert first_repeat([1, 2], [3, 4], 3) == 2

    model = smooth_model()
    prompt = [1, 72, 105]
    config = SamplerConfig(
        branch_candidates=3,
        branch_rollout_tokens=12,
        branch_select="confidence",
        repetition_bits=2.0,
        **ALWAYS_BRANCH,
    )
    greedy = [e.token for e in generate(model, tiny_tokenizer, prompt, GreedySampler(), max_tokens=48)]
    assert repeated_ngram_share(greedy) > 0.5  # this prompt loops under greedy
    history, cut = [], 0
    for _ in range(6):
        s = _branch_step(model, prompt, history)
        choice = EntropixSampler(config).choose(s, mx.random.key(0))
        assert path_repeats(history, choice.tokens, 3) == 0
        cut += len(choice.tokens) < 12
        cache, logits, _ = choice.advanced  # the step's cache held the prompt only
        fresh, _ = model(mx.array([prompt + choice.tokens]))
        assert mx.allclose(logits[0, -1], fresh[0, -1], atol=1e-4)
        history += choice.tokens
    assert cut >= 1  # some path was really cut


def counting_model(model, bonus=20.0):
    """The tiny model with a strong pull towards the token after the current one (t -> t+1),
    so greedy paths move on instead of repeating one token."""

    def forward(inputs, cache=None, **kwargs):
        logits, scores = model(inputs, cache, **kwargs)
        nxt = (inputs + 1) % V
        return logits + bonus * (mx.arange(V)[None, None, :] == nxt[:, :, None]), scores

    forward.args, forward.layers = model.args, model.layers
    return forward


def test_a_confidence_rollout_stops_once_every_path_has_ended_its_turn():
    """Nothing after an end of turn is scored, so once every row has ended the rollout
    stops; the choice is the one the full-length rollout makes, cut at its end of turn,
    with no state handed back (the turn is over)."""
    model = counting_model(smooth_model())
    prompt = [1, 40, 50, 60]
    depth = 8
    logits, _ = model(mx.array([prompt]))
    firsts = mx.argsort(-logits[0, -1])[:3].tolist()
    paths = [greedy_path(model, prompt, f, depth) for f in firsts]
    assert all(len(set(p)) == depth for p in paths)  # no path repeats a token
    ends_turn = {p[2] for p in paths} - set(firsts)  # every path ends by its third token
    assert all(set(p[1:3]) & ends_turn for p in paths)
    config = SamplerConfig(
        branch_candidates=3,
        branch_rollout_tokens=depth,
        branch_select="confidence",
        repetition_bits=0.0,
        think_varentropy=0.0,
        **ALWAYS_BRANCH,
    )

    calls = []

    def counting(inputs, cache=None, **kwargs):
        calls.append(inputs.shape)
        return model(inputs, cache, **kwargs)

    sampler = EntropixSampler(config)
    sampler.eos_tokens = sorted(ends_turn)
    s = _branch_step(model, prompt, [])
    choice = sampler.choose(Step(s.logits, s.scores, [], counting, s.cache), mx.random.key(0))
    assert choice.strategy == "branch"
    assert len(calls) == 2 and all(shape[0] == 3 for shape in calls)  # two rollout steps, no final pass
    assert choice.advanced is None and choice.tokens[-1] in ends_turn

    # The full-length rollout's choice (every position's margin, by hand), cut at its end.
    margins = [margins_along(model, prompt, p) for p in paths]
    lps = [path_logprobs(model, prompt, p) for p in paths]
    best = best_path(sampler, paths, lps, margins, [])
    end = next(j for j, t in enumerate(paths[best]) if t in ends_turn)
    assert choice.tokens == paths[best][: end + 1]
    assert choice.logprobs == pytest.approx(lps[best][: end + 1], abs=1e-4)

    # Without an end of turn in sight the rollout runs its full length, then the winner's last pass.
    calls.clear()
    sampler.eos_tokens = []
    choice = sampler.choose(Step(s.logits, s.scores, [], counting, make_cache_like(model, prompt)), mx.random.key(0))
    assert len(calls) == depth and choice.advanced is not None and len(choice.tokens) == depth


def make_cache_like(model, prompt):
    cache = make_cache(model)
    model(mx.array([prompt]), cache)
    return cache


def scored_path(sampler, model, prompt, history, first, length):
    """A path continued by the best score (log p + the repetition bias after history + path)."""
    path = [first]
    while len(path) < length:
        logits, _ = model(mx.array([prompt + path]))
        lp = logits[0, -1] - mx.logsumexp(logits[0, -1])
        for t, v in sampler.repetition_bias(history + path).items():
            lp[t] = lp[t] + v
        path.append(int(mx.argmax(lp).item()))
    return path


def test_a_scored_rollout_follows_the_score(tiny_tokenizer):
    """branch_rollout="scored": each row continues with its best-scored token (the
    argmax rule: log p minus the repetition penalty after the answer and the row's
    own path), not the model's likeliest, so a path that would copy the answer moves
    on instead of being cut at its first repetition."""
    model = smooth_model()
    prompt = [1, 72, 105]
    depth = 12
    config = SamplerConfig(
        branch_candidates=3,
        branch_rollout_tokens=depth,
        branch_select="confidence",
        branch_rollout="scored",
        repetition_bits=2.0,
        think_varentropy=0.0,
        **ALWAYS_BRANCH,
    )
    history, differs = [], 0
    for _ in range(6):
        sampler = EntropixSampler(config)
        s = _branch_step(model, prompt, history)
        choice = sampler.choose(s, mx.random.key(0))
        # the rows, by hand: the three likeliest (scored) tokens, continued by the score
        plan = sampler.plan(s, mx.random.key(0))
        firsts = plan["top_ids"].tolist()
        paths = [scored_path(sampler, model, prompt, history, f, depth) for f in firsts]
        differs += sum(p != greedy_path(model, prompt, f, depth) for p, f in zip(paths, firsts, strict=False))
        lps = [path_logprobs(model, prompt, p) for p in paths]
        best = best_path(sampler, paths, lps, [margins_along(model, prompt, p) for p in paths], history)
        assert choice.strategy == "branch" and choice.tokens == paths[best][: len(choice.tokens)]
        assert choice.logprobs == pytest.approx(lps[best][: len(choice.tokens)], abs=1e-4)
        # (the first token is kept even when every candidate repeats; none after it repeats)
        assert path_repeats(history + choice.tokens[:1], choice.tokens[1:], 3) == 0
        history += choice.tokens
    assert differs >= 3  # the score really steered the rows away from the model's likeliest


@pytest.mark.parametrize("rollout", ["greedy", "scored"])
def test_a_branch_decided_early_rolls_only_the_winner_on(rollout):
    """branch_decide_tokens=k: the rows are compared over their first k tokens (the
    choice a k-token rollout makes, by hand), then the winner alone rolls on to
    branch_rollout_tokens, so every forward pass after the decision has one row;
    the state handed back equals a fresh forward over prompt + path."""
    model = smooth_model()
    prompt = [1, 72, 105]
    depth, k = 10, 3
    base = dict(
        branch_candidates=3,
        branch_select="confidence",
        branch_rollout=rollout,
        repetition_bits=2.0,
        think_varentropy=0.0,
        **ALWAYS_BRANCH,
    )
    calls = []

    def counting(inputs, cache=None, **kwargs):
        calls.append(inputs.shape[0])
        return model(inputs, cache, **kwargs)

    history, cuts = [], 0
    for _ in range(6):
        sampler = EntropixSampler(SamplerConfig(branch_rollout_tokens=depth, branch_decide_tokens=k, **base))
        s = _branch_step(model, prompt, history)
        plan = sampler.plan(s, mx.random.key(0))
        firsts = plan["top_ids"].tolist()
        follow = (
            (lambda f: scored_path(sampler, model, prompt, history, f, depth))
            if rollout == "scored"
            else (lambda f: greedy_path(model, prompt, f, depth))
        )
        paths = [follow(f) for f in firsts]
        short = [p[:k] for p in paths]
        best = best_path(
            sampler,
            short,
            [path_logprobs(model, prompt, p) for p in short],
            [margins_along(model, prompt, p) for p in short],
            history,
        )
        calls.clear()
        choice = sampler.choose(Step(s.logits, s.scores, list(history), counting, s.cache), mx.random.key(0))
        assert choice.strategy == "branch"
        assert choice.tokens == paths[best][: len(choice.tokens)]
        assert calls[: k - 1] == [3] * (k - 1) and all(rows == 1 for rows in calls[k - 1 :])
        if len(choice.tokens) == depth:  # not cut at a repetition: the whole rollout, one pass per step
            assert len(calls) == depth
        elif rollout == "scored":  # cut: the winner stopped there (tokens known on the host)
            assert len(calls) == max(len(choice.tokens) + 1, k)
            cuts += 1
        _, logits, _ = choice.advanced
        fresh, _ = model(mx.array([prompt + choice.tokens]))
        assert mx.allclose(logits[0, -1], fresh[0, -1], atol=1e-4)
        history += choice.tokens
    assert rollout == "greedy" or cuts >= 1  # some winner really stopped early


def test_deciding_over_the_whole_rollout_is_the_reference():
    """branch_decide_tokens 0 and = branch_rollout_tokens both compare over the whole rollout."""
    model = smooth_model()
    prompt = [1, 40, 50, 60]
    base = dict(branch_candidates=3, branch_rollout_tokens=6, branch_select="confidence", **ALWAYS_BRANCH)
    choices = [
        EntropixSampler(SamplerConfig(branch_decide_tokens=k, **base))
        .choose(_branch_step(model, prompt, []), mx.random.key(0))
        .tokens
        for k in (0, 6, 9)
    ]
    assert choices[0] == choices[1] == choices[2]
