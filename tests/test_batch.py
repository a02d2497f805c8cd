"""Batched generation: every row must equal an unbatched `generate` run of the
same prompt, sampler and seed, whatever the batch size, the grouping, the
padding, and whichever rows finish or join along the way."""

import numpy as np
import pytest
from conftest import make_tiny_model

from entropix_mlx.decode.engine import generate_batch
from entropix_mlx.decode.generate import generate
from entropix_mlx.decode.rows import Request
from entropix_mlx.errors import ContextOverflowError
from entropix_mlx.sampling.config import SamplerConfig
from entropix_mlx.sampling.entropix import EntropixSampler
from entropix_mlx.sampling.samplers import GreedySampler, TemperatureSampler, TokenChoice

EOS = 2  # <|im_end|> in the tiny tokenizer


def prompts_of(tokenizer, texts):
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)) for t in texts
    ]


TEXTS = ["hi", "What is 7 + 5?", "a somewhat longer question about nothing in particular", "ok?", "Tell me."]


def make_model(seed=0, **overrides):
    """A tiny model whose greedy answers differ from prompt to prompt (with tied
    embeddings the random tiny model answers the same token to everything)."""
    return make_tiny_model(seed, tie_word_embeddings=False, **overrides)


def unbatched(model, tokenizer, prompt, sampler, max_tokens, seed):
    return [e.token for e in generate(model, tokenizer, prompt, sampler, max_tokens=max_tokens, seed=seed)]


def batched(model, tokenizer, requests, make_sampler, batch_size, **kw):
    out = {}
    for index, result, seconds in generate_batch(model, tokenizer, requests, make_sampler, batch_size, **kw):
        assert index not in out and seconds >= 0
        out[index] = result
    assert sorted(out) == list(range(len(requests)))
    return out


class StopsEarly(GreedySampler):
    """Greedy, but ends the answer (EOS) after a token divisible by 4 (from the
    third on): rows finish at different steps, decided by their own history."""

    def choose(self, step, key):
        if len(step.tokens) >= 3 and step.tokens[-1] % 4 == 0:
            return TokenChoice([EOS], "stop", [0.0])
        return super().choose(step, key)


@pytest.mark.parametrize("batch_size, groups", [(1, 1), (3, 1), (3, 2), (8, 2), (8, 3)])
def test_greedy_rows_equal_unbatched_runs(tiny_tokenizer, batch_size, groups):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS)
    requests = [Request(p, seed=i, max_tokens=6 + 2 * i) for i, p in enumerate(prompts)]
    out = batched(model, tiny_tokenizer, requests, GreedySampler, batch_size, groups=groups)
    for i, (p, r) in enumerate(zip(prompts, requests, strict=False)):
        assert out[i].tokens == unbatched(model, tiny_tokenizer, p, GreedySampler(), r.max_tokens, r.seed)
        assert out[i].finish_reason == "length" and len(out[i].tokens) == r.max_tokens


def test_rows_that_stop_early_leave_the_batch_and_others_continue(tiny_tokenizer):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS + ["more", "and more prompts", "x"])
    requests = [Request(p, seed=0, max_tokens=8) for p in prompts]
    out = batched(model, tiny_tokenizer, requests, StopsEarly, 3, groups=1)
    # Both kinds of ending, at several lengths: rows really leave mid-run.
    assert {r.finish_reason for r in out.values()} == {"eos", "length"}
    assert len({len(r.tokens) for r in out.values()}) >= 3
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(model, tiny_tokenizer, p, StopsEarly(), 8, 0)


def test_sampled_rows_follow_their_own_seed(tiny_tokenizer):
    """Per-row key chains: batched sampling reproduces unbatched sampling with
    the same seed, and different seeds give different answers."""
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS)
    requests = [Request(p, seed=100 + i, max_tokens=10) for i, p in enumerate(prompts)]

    def make():
        return TemperatureSampler(temperature=1.0)

    out = batched(model, tiny_tokenizer, requests, make, 4, groups=2)
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(model, tiny_tokenizer, p, make(), 10, 100 + i)
    again = batched(model, tiny_tokenizer, [Request(r.prompt, r.seed + 1, 10) for r in requests], make, 4)
    assert any(again[i].tokens != out[i].tokens for i in out)


def test_a_shared_prefix_gives_the_same_answers(tiny_tokenizer):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS)
    prefix = prompts[0][:5]
    assert all(p[:5] == prefix for p in prompts)
    requests = [Request(p, seed=i, max_tokens=8) for i, p in enumerate(prompts)]
    out = batched(model, tiny_tokenizer, requests, GreedySampler, 3, prefix=prefix)
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(model, tiny_tokenizer, p, GreedySampler(), 8, i)
    with pytest.raises(ValueError):
        list(generate_batch(model, tiny_tokenizer, requests, GreedySampler, 3, prefix=[99, 98]))


class RecordsScores(GreedySampler):
    """Greedy, keeping the attention scores and logits it was shown."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def choose(self, step, key):
        self.seen.append((np.array(step.logits), [np.array(s) for s in step.scores]))
        return super().choose(step, key)


def test_rows_see_their_own_scores_without_padding(tiny_tokenizer):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, ["hi", "a much longer prompt than the first one"])
    assert len(prompts[0]) < len(prompts[1])  # row 0 is left-padded in the batch
    samplers = []

    def make():
        samplers.append(RecordsScores())
        return samplers[-1]

    requests = [Request(p, 0, 5) for p in prompts]
    out = batched(model, tiny_tokenizer, requests, make, 2, groups=1)
    assert len(samplers) == 2 and all(len(s.seen) == 5 for s in samplers)  # one slot per row
    for s in samplers:
        # Which prompt the slot served: its first scores span exactly that prompt's keys.
        width0 = s.seen[0][1][0].shape[-1]
        i = [len(p) for p in prompts].index(width0)
        ref = RecordsScores()
        unbatched(model, tiny_tokenizer, prompts[i], ref, 5, 0)
        for t, ((logits, scores), (ref_logits, ref_scores)) in enumerate(zip(s.seen, ref.seen, strict=False)):
            assert [x.shape for x in scores] == [(4, len(prompts[i]) + t)] * 2  # heads x real keys only
            assert np.isfinite(np.concatenate([x.ravel() for x in scores])).all()
            np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
            for a, b in zip(scores, ref_scores, strict=False):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        assert out[i].tokens == unbatched(model, tiny_tokenizer, prompts[i], GreedySampler(), 5, 0)


class SaysThreeTokens(GreedySampler):
    """Every other decision returns three tokens at once (as a thinking text
    does) without running the model: the batch must queue and feed them."""

    def reset(self):
        self.n = 0

    def choose(self, step, key):
        self.n += 1
        if self.n % 2:
            return TokenChoice([70, 71, 72], "think", [None, None, None])
        return super().choose(step, key)


def test_multi_token_choices_are_fed_one_per_step(tiny_tokenizer):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS[:3])
    requests = [Request(p, 0, 10) for p in prompts]
    out = batched(model, tiny_tokenizer, requests, SaysThreeTokens, 3)
    for i, p in enumerate(prompts):
        tokens = out[i].tokens
        assert tokens[:3] == [70, 71, 72] and tokens[4:7] == [70, 71, 72] and len(tokens) == 10
        assert out[i].strategies[:4] == ["think"] * 3 + ["argmax"]
        assert tokens == unbatched(model, tiny_tokenizer, p, SaysThreeTokens(), 10, 0)


class EndsAfterTwo(GreedySampler):
    """Its first decision is a whole rest of the answer: two tokens and the end of turn."""

    def choose(self, step, key):
        return TokenChoice([70, 71, EOS, 73], "branch", [-0.1, -0.2, -0.3, -0.4])


class CountsCalls:
    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, inputs, *args, **kwargs):
        self.calls.append(inputs.shape)
        return self.model(inputs, *args, **kwargs)

    def packed(self, segments, *args, **kwargs):  # several inputs in one pass: each counts
        self.calls += [seg.tokens.shape for seg in segments]
        return self.model.packed(segments, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_a_choice_that_ends_the_answer_finishes_the_row_without_feeding_it(tiny_tokenizer):
    model = CountsCalls(make_model())
    prompts = prompts_of(tiny_tokenizer, TEXTS[:2])
    out = batched(model, tiny_tokenizer, [Request(p, 0, 10) for p in prompts], EndsAfterTwo, 2)
    for i, p in enumerate(prompts):
        assert out[i].tokens == [70, 71] and out[i].logprobs == [-0.1, -0.2] and out[i].finish_reason == "eos"
        assert out[i].tokens == unbatched(model.model, tiny_tokenizer, p, EndsAfterTwo(), 10, 0)
    assert model.calls == [(1, len(p)) for p in prompts]  # the prompts' prefills, nothing else


class RecordsPasses(CountsCalls):
    def __init__(self, model):
        super().__init__(model)
        self.passes = []

    def packed(self, segments, *args, **kwargs):
        self.passes.append([seg.tokens.shape for seg in segments])
        return super().packed(segments, *args, **kwargs)


def test_waiting_prompts_ride_along_in_the_rows_forward_pass(tiny_tokenizer):
    """A prompt that takes a freed slot is not run in a pass of its own: it goes
    with the other rows' next tokens, and its row's answer is unchanged."""
    model = RecordsPasses(make_model())
    prompts = prompts_of(tiny_tokenizer, TEXTS[:4])
    out = batched(model, tiny_tokenizer, [Request(p, 0, 6 + 3 * i) for i, p in enumerate(prompts)], GreedySampler, 2)
    assert model.passes[0] == [(1, len(prompts[0])), (1, len(prompts[1]))]  # both slots fill at once
    for p in prompts[2:]:  # the later prompts join a pass that also feeds the other row
        joined = [shapes for shapes in model.passes if (1, len(p)) in shapes]
        assert len(joined) == 1 and any(rows_and_length[1] == 1 for rows_and_length in joined[0])
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(model.model, tiny_tokenizer, p, GreedySampler(), 6 + 3 * i, 0)


def entropix(tokenizer, **changes):
    return EntropixSampler(SamplerConfig(**changes), tokenizer)


@pytest.mark.parametrize(
    "changes",
    [
        # branch at every step: rollouts on the row's own cache, accepted paths rejoin the batch
        {
            "strategies": ("branch", "adaptive"),
            "low_entropy": 0.0,
            "low_varentropy": 0.0,
            "medium_entropy": 50.0,
            "high_entropy": 100.0,
            "high_varentropy": 0.0,
            "branch_rollout_tokens": 2,
        },
        # think at every step: the thinking text is run by the sampler (TokenChoice.advanced)
        {
            "strategies": ("think", "adaptive"),
            "low_entropy": 0.0,
            "medium_entropy": 0.0,
            "think_varentropy": 1e9,
            "thinking_text": " (hm)",
        },
        # the default decision table
        {},
    ],
)
def test_entropix_rows_equal_unbatched_runs_even_when_the_sampler_runs_the_model(tiny_tokenizer, changes):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS[:4])
    requests = [Request(p, seed=7 + i, max_tokens=9) for i, p in enumerate(prompts)]
    out = batched(model, tiny_tokenizer, requests, lambda: entropix(tiny_tokenizer, **changes), 3, groups=2)
    strategies = set()
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(model, tiny_tokenizer, p, entropix(tiny_tokenizer, **changes), 9, 7 + i)
        strategies.update(out[i].strategies)
    if changes.get("strategies"):
        assert changes["strategies"][0] in strategies
    if "thinking_text" in changes:
        assert any(r.thinking_insertions for r in out.values())


def test_too_long_a_request_is_refused_before_any_work(tiny_tokenizer):
    model = make_model(max_position_embeddings=32)
    prompt = prompts_of(tiny_tokenizer, ["x" * 10])[0]
    with pytest.raises(ContextOverflowError, match="context of 32"):
        list(generate_batch(model, tiny_tokenizer, [Request(prompt, 0, 32)], GreedySampler))


@pytest.mark.slow
def test_real_model_greedy_rows_equal_unbatched_runs(smollm):
    model, tokenizer = smollm
    # Short raw prompts of different lengths (the chat template alone is 30 tokens).
    prompts = [list(tokenizer.encode(t)) for t in ("The capital of France is", "One, two, three, four, five,")]
    assert len(prompts[0]) != len(prompts[1])
    requests = [Request(p, 0, 6) for p in prompts]
    out = batched(model, tokenizer, requests, lambda: GreedySampler(metrics=False), 2, groups=1)
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(model, tokenizer, p, GreedySampler(metrics=False), 6, 0)
    assert "Paris" in tokenizer.decode(out[0].tokens) and "six" in tokenizer.decode(out[1].tokens)


def test_every_rows_decision_takes_one_host_sync_and_equals_its_own_choose(tiny_tokenizer, monkeypatch):
    """choose_together: the two-phase samplers (greedy, sampling, Entropix) of
    all rows are evaluated in one mx.eval, and each row's choice is what its
    own `choose` gives with the same key; a sampler that overrides `choose`
    keeps it."""
    import mlx.core as mx

    from entropix_mlx.decode.prefill import prefill
    from entropix_mlx.model.cache import make_cache
    from entropix_mlx.sampling.samplers import MinPSampler, Step, choose_together

    model = make_model()
    steps = []
    for p in prompts_of(tiny_tokenizer, TEXTS[:4]):
        logits, scores = prefill(model, p, make_cache(model))
        steps.append(Step(logits[0, -1], [s[0] for s in scores], [], None, None))
    keys = [mx.random.key(i) for i in range(4)]

    def samplers():
        return [GreedySampler(), TemperatureSampler(1.0, metrics=False), MinPSampler(), EntropixSampler()]

    alone = [s.choose(step, key) for s, step, key in zip(samplers(), steps, keys, strict=False)]
    evals = []
    real_eval = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: evals.append(a) or real_eval(*a))
    together = choose_together(samplers(), steps, keys)
    assert len(evals) == 1  # none of these steps branched, so no rollout needed a sync of its own
    for a, b in zip(alone, together, strict=False):
        assert (a.tokens, a.strategy, a.logprobs, a.params) == (b.tokens, b.strategy, b.logprobs, b.params)
        assert a.metrics == pytest.approx(b.metrics)

    evals.clear()
    stops = StopsEarly()
    choice = choose_together([stops], [Step(steps[0].logits, [], [1, 2, 8])], [keys[0]])[0]
    assert choice.strategy == "stop"


@pytest.mark.parametrize("joiner_length", [12, 20, 28, 33])
def test_a_long_prompt_joins_a_batch_that_sheds_its_shared_padding(tiny_tokenizer, joiner_length):
    """Row 2 (the longest prompt, no padding) and row 0 finish at the same step;
    a waiting prompt takes row 0's slot, row 2 leaves, and the rows left (0 and
    1) share row 1's padding, which `filter` drops: the batch shrinks by it. A
    prompt nearly as long as the batch was before must not take the slot then
    (it would not fit the next step's cache); it joins the other way, and every
    answer equals its unbatched run."""
    model = make_model()

    def ids(n, start):
        return [3 + (start + 7 * j) % 250 for j in range(n)]  # byte tokens of the tiny tokenizer

    prompts = [ids(5, 0), ids(5, 1), ids(30, 2), ids(joiner_length, 3)]
    requests = [
        Request(prompts[0], 0, 3),
        Request(prompts[1], 0, 9),
        Request(prompts[2], 0, 3),
        Request(prompts[3], 0, 4),
    ]
    out = batched(model, tiny_tokenizer, requests, GreedySampler, 3, groups=1)
    for i, (p, r) in enumerate(zip(prompts, requests, strict=False)):
        assert out[i].tokens == unbatched(model, tiny_tokenizer, p, GreedySampler(), r.max_tokens, 0)
        assert out[i].finish_reason == ("length" if len(out[i].tokens) == r.max_tokens else "eos")


def test_argmax_only_rows_decide_in_one_stacked_argmax_and_equal_their_own_choose(tiny_tokenizer, monkeypatch):
    """Eval's greedy (no metrics, no log-probabilities): the rows' decisions are
    one stacked argmax, not a plan per row; each equals the row's own `choose`,
    also for a row whose logits hold NaN (it takes the sanitized argmax and says
    so) and next to a row whose sampler is not argmax-only."""
    import mlx.core as mx

    from entropix_mlx.decode.prefill import prefill
    from entropix_mlx.model.cache import make_cache
    from entropix_mlx.sampling.samplers import Step, choose_together

    model = make_model()
    steps = []
    for p in prompts_of(tiny_tokenizer, TEXTS[:4]):
        logits, scores = prefill(model, p, make_cache(model))
        steps.append(Step(logits[0, -1], [s[0] for s in scores], [], None, None))
    top = int(mx.argmax(steps[1].logits).item())
    steps[1] = Step(mx.where(mx.arange(steps[1].logits.size) == top, mx.nan, steps[1].logits), [], [], None, None)
    keys = [mx.random.key(i) for i in range(4)]

    def samplers():
        return [GreedySampler(False, False), GreedySampler(False, False), GreedySampler(), GreedySampler(False, False)]

    alone = [s.choose(step, key) for s, step, key in zip(samplers(), steps, keys, strict=False)]
    planned = []
    real_plan = GreedySampler.plan
    monkeypatch.setattr(
        GreedySampler, "plan", lambda self, step, key: planned.append(self) or real_plan(self, step, key)
    )
    together = choose_together(samplers(), steps, keys)
    assert len(planned) == 1 and planned[0].logprobs  # only the row that wants its log-probability
    for a, b in zip(alone, together, strict=False):
        assert (a.tokens, a.strategy, a.logprobs, a.note) == (b.tokens, b.strategy, b.logprobs, b.note)
    assert together[1].tokens != [top] and together[1].note == "NaN logits ignored"
