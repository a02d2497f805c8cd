"""`deliberate`: branches start exactly where the metrics cross the thresholds,
each branch equals an independent greedy run from its split, the greedy answer
is always a candidate, the budget holds, and runs reproduce."""

import math

import mlx.core as mx
import pytest
from conftest import make_tiny_model

from entropix_mlx.decode.deliberate import deliberate, deliberate_batch
from entropix_mlx.decode.engine import generate_batch
from entropix_mlx.decode.generate import generate
from entropix_mlx.decode.rows import Request
from entropix_mlx.errors import ConfigError
from entropix_mlx.sampling.answers import default_answer
from entropix_mlx.sampling.branching import BranchSampler
from entropix_mlx.sampling.deliberate_config import DeliberateConfig, resolve_deliberate
from entropix_mlx.sampling.recorder import recording
from entropix_mlx.sampling.samplers import GreedySampler, Step
from entropix_mlx.sampling.selection import (
    Candidate,
    answer_scores,
    answer_token_span,
    lowest_group,
    select,
    why,
)

TEXTS = ["What is 7 + 5?", "hi", "a somewhat longer question about nothing in particular"]
WIDE = dict(max_branches=50, budget=100.0)  # no cap: only the thresholds decide


@pytest.fixture(scope="module")
def model():
    # untied embeddings: the random tiny model then answers differently per prompt
    return make_tiny_model(0, tie_word_embeddings=False)


def prompt_of(tokenizer, text):
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


def greedy_run(model, tokenizer, prompt, max_tokens):
    return list(generate(model, tokenizer, prompt, GreedySampler(), max_tokens=max_tokens))


# Each gate: its two metrics and the config fields of their thresholds. The attention gate also
# sets the logits gate to branch everywhere: its thresholds must not be read.
GATES = {
    "logits": (("entropy", "varentropy"), lambda x, y: dict(branch_entropy=x, branch_varentropy=y)),
    "attention": (
        ("attn_entropy", "agreement"),
        lambda x, y: dict(branch_gate="attention", branch_attn_entropy=x, branch_agreement=y, branch_entropy=0.0),
    ),
}


@pytest.mark.parametrize("gate", GATES)
def test_branches_start_exactly_where_the_gates_metrics_cross_its_thresholds(model, tiny_tokenizer, gate):
    (m1, m2), fields = GATES[gate]
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    events = greedy_run(model, tiny_tokenizer, prompt, 12)
    xs = sorted(e.metrics[m1] for e in events)
    ys = sorted(e.metrics[m2] for e in events)
    # Thresholds midway between two measured values: deliberate's root row runs
    # the prompt split differently (shared prefix), so its metrics may differ
    # from these in the last float bits, and a threshold equal to a value is a tie.
    mid = lambda xs, i: (xs[i] + xs[i + 1]) / 2  # noqa: E731
    for x, y in [(mid(xs, 6), 1e9), (1e9, mid(ys, 8)), (mid(xs, 9), mid(ys, 9))]:
        cfg = DeliberateConfig(first_alternatives=0, alternatives=1, max_branch_points=50, **fields(x, y), **WIDE)
        d = deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=12)
        expected = [i for i, e in enumerate(events) if i > 0 and (e.metrics[m1] > x or e.metrics[m2] > y)]
        assert 0 < len(expected) < 11  # the thresholds really split the positions
        assert d.candidates[0].branched_at == expected
        assert sorted(c.split for c in d.candidates[1:]) == expected


def test_first_token_alternatives_and_the_branch_point_cap(model, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    cfg = DeliberateConfig(first_alternatives=3, branch_entropy=0.0, alternatives=2, max_branch_points=2, **WIDE)
    d = deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=10)
    splits = [c.split for c in d.candidates[1:]]
    assert splits == [0, 0, 0, 1, 1, 2, 2]  # 3 at the first token, then 2 at each of 2 points
    root = d.candidates[0]
    # the alternatives are the next most likely tokens, most likely first
    first = [c.tokens[0] for c in d.candidates[1:4]]
    assert len(set(first + [root.tokens[0]])) == 4


@pytest.mark.parametrize("spacing, splits", [(0, [1, 2, 3]), (3, [1, 4, 7]), (5, [1, 6])])
def test_branch_points_keep_their_spacing(model, tiny_tokenizer, spacing, splits):
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    cfg = DeliberateConfig(
        first_alternatives=0, branch_entropy=0.0, alternatives=1, max_branch_points=3, branch_spacing=spacing, **WIDE
    )
    d = deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=10)
    assert d.candidates[0].branched_at == splits
    assert [c.split for c in d.candidates[1:]] == splits


def test_measured_candidates_keep_each_tokens_metrics(model, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    events = greedy_run(model, tiny_tokenizer, prompt, 8)
    cfg = DeliberateConfig(first_alternatives=2, max_branch_points=0, **WIDE)
    (_, d, _), *_ = deliberate_batch(model, tiny_tokenizer, [Request(prompt, 0, 8)], cfg, measure=True)
    for c in d.candidates:
        assert set(c.measures) == {"entropy", "varentropy", "attn_entropy", "agreement"}
        assert all(len(v) == len(c.tokens) for v in c.measures.values())
    root = d.candidates[0].measures
    for name in ("entropy", "attn_entropy", "agreement"):
        assert root[name] == pytest.approx([e.metrics[name] for e in events], abs=2e-3)
    assert deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=8).candidates[0].measures == {}


def test_every_branch_equals_an_independent_greedy_run_from_its_split(model, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    cfg = DeliberateConfig(first_alternatives=4, branch_entropy=0.0, alternatives=1, max_branch_points=3, **WIDE)
    d = deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=9)
    assert len(d.candidates) == 8
    root = d.candidates[0]
    assert root.tokens == [e.token for e in greedy_run(model, tiny_tokenizer, prompt, 9)]
    for c in d.candidates[1:]:
        assert c.parent == root.row and c.tokens[: c.split] == root.tokens[: c.split]
        assert c.tokens[c.split] != root.tokens[c.split]
        head = c.tokens[: c.split + 1]
        rest = greedy_run(model, tiny_tokenizer, prompt + head, 9 - len(head))
        assert c.tokens == head + [e.token for e in rest]
        assert c.own_tokens == len(c.tokens) - c.split


def test_the_greedy_answer_is_always_a_candidate_and_kept_by_default(model, tiny_tokenizer):
    for text in TEXTS:
        prompt = prompt_of(tiny_tokenizer, text)
        greedy = [e.token for e in greedy_run(model, tiny_tokenizer, prompt, 8)]
        for budget in (1.0, 2.5, 6.0):
            d = deliberate(
                model, tiny_tokenizer, prompt, DeliberateConfig(budget=budget, selector="greedy"), max_tokens=8
            )
            assert d.candidates[0].parent is None and d.candidates[0].tokens == greedy
            assert d.chosen == 0


@pytest.mark.parametrize("budget, branches", [(1.0, 5), (2.9, 5), (4.0, 5), (6.0, 5), (6.0, 2), (30.0, 40)])
def test_tokens_stay_within_the_budget(model, tiny_tokenizer, budget, branches):
    cfg = DeliberateConfig(
        first_alternatives=4,
        branch_entropy=0.0,
        alternatives=3,
        max_branch_points=10,
        max_branches=branches,
        budget=budget,
    )
    for text in TEXTS:
        d = deliberate(model, tiny_tokenizer, prompt_of(tiny_tokenizer, text), cfg, max_tokens=10)
        assert len(d.candidates) == cfg.max_candidates == min(branches + 1, math.floor(budget))
        assert d.tokens_spent <= budget * d.longest
        assert d.tokens_spent == sum(len(c.tokens) - (c.split or 0) for c in d.candidates)


def test_runs_reproduce_and_do_not_depend_on_what_shares_the_batch(model, tiny_tokenizer):
    cfg = DeliberateConfig(first_alternatives=2, branch_entropy=0.0, alternatives=1, max_branch_points=2)
    prompts = [prompt_of(tiny_tokenizer, t) for t in TEXTS]
    requests = [Request(p, seed=3, max_tokens=7) for p in prompts]
    alone = [deliberate(model, tiny_tokenizer, p, cfg, max_tokens=7, seed=3).to_dict() for p in prompts]
    again = [deliberate(model, tiny_tokenizer, p, cfg, max_tokens=7, seed=3).to_dict() for p in prompts]
    together = {i: d.to_dict() for i, d, _ in deliberate_batch(model, tiny_tokenizer, requests, cfg, batch_size=3)}
    assert alone == again

    def paths(d):
        return [(c["parent"] is None, c["split"], c["tokens"]) for c in d["candidates"]]

    assert [paths(together[i]) for i in range(3)] == [paths(d) for d in alone]


def test_a_shared_prefix_batch_equals_unbatched_runs(model, tiny_tokenizer):
    """Rows of different lengths: the padding sits between the shared prefix
    and each row's own positions, and must stay hidden."""
    prompts = [prompt_of(tiny_tokenizer, t) for t in TEXTS]
    prefix = prompts[0][:4]
    requests = [Request(p, 0, 6) for p in prompts]
    out = {
        i: r
        for i, r, _ in generate_batch(
            model, tiny_tokenizer, requests, GreedySampler, 3, prefix=prefix, share_prefix=True, groups=1
        )
    }
    for i, p in enumerate(prompts):
        assert out[i].tokens == [e.token for e in greedy_run(model, tiny_tokenizer, p, 6)]


def cand(answer, parent=0, margin=0.5, logprob=-1.0):
    return Candidate(
        row=0,
        parent=parent,
        split=None if parent is None else 0,
        tokens=[1],
        text="",
        answer=answer,
        logprobs=[logprob],
        margins=[margin],
        finish_reason="eos",
        own_tokens=1,
        mean_logprob=logprob,
        answer_margin=margin,
    )


def test_why_gives_each_candidates_confidence_its_share_of_the_vote_and_why_it_was_left_out():
    cands = [cand("7", None, logprob=-0.5), cand("8", logprob=-0.2), cand("8", logprob=-0.3), cand("9", logprob=-0.1)]
    cands[3].finish_reason = "length"  # cut off by the limit: it does not vote under "length"
    rows = why(cands, "confidence_vote", "length", temperature=0.1)
    assert [r["candidate"] for r in rows] == ["greedy", "branch 1", "branch 2", "branch 3"]
    assert [r["confidence"] for r in rows] == [round(math.exp(c.mean_logprob), 3) for c in cands]
    weights = [math.exp(c.mean_logprob / 0.1) for c in cands[:3]]
    assert [r["score"] for r in rows[:3]] == [round(w / sum(weights), 3) for w in weights]
    assert rows[3]["score"] is None and rows[3]["left_out"] == "ran into the length limit"
    assert all(r["left_out"] is None for r in rows[:3])
    # Not a vote: the selector's own score of the candidate.
    assert why(cands, "max_margin", "off")[1]["score"] == 0.5


def test_the_rule_line_gives_the_tables_numbers():
    cands = [cand("32", None, 0.416, -0.3), cand("32", margin=0.797, logprob=-0.5), cand("31", margin=0.548)]
    for c in cands:
        c.continuation_margin = c.answer_margin
    # A best-of selector: the greedy answer scores its best row's, a branch's here, as the table shows it.
    assert [r["score"] for r in why(cands, "continuation_margin", "loop")] == [0.416, 0.797, 0.548]
    assert select(cands, "continuation_margin", 0.1)[:2] == (
        0,
        "greedy answer kept: continuation_margin 0.797 for '32' (branch 1); "
        "the best other, 0.548 for '31' (branch 2), is not more than 0.1 above it",
    )
    # A vote: the shares the table shows, summed over an answer's rows, not the raw weights.
    cands = [
        cand("12", None, logprob=-0.5),
        cand("262", logprob=-0.3),
        cand("262", logprob=-0.45),
        cand("9", logprob=-0.6),
    ]
    shares = [r["score"] for r in why(cands, "confidence_vote", "loop")]
    assert shares == [0.096, 0.71, 0.158, 0.035]
    assert select(cands, "confidence_vote")[:2] == (
        1,
        "branch 1 won: confidence_vote 0.868 for '262' (branch 1 + branch 2) "
        "is more than 0 above the greedy answer's 0.096 for '12' (greedy)",
    )
    # A vote's margin counts votes: the line gives it as a share of the votes cast too.
    assert select(cands, "vote", 1.0)[1] == (
        "greedy answer kept: vote 0.250 for '12' (greedy); the best other, 0.500 for '262' "
        "(branch 1 + branch 2), is not more than 1 (0.250 of the votes) above it"
    )
    assert select([cand("7", None), cand("7")], "logprob")[1] == (
        "greedy answer kept: logprob -1.000 for '7' (greedy); no other answer"
    )


def test_selectors_score_answers_and_keep_greedy_unless_beaten_by_the_margin():
    cands = [
        cand("7", None, 0.4, -0.5),
        cand("8", margin=0.3, logprob=-0.4),
        cand("8", margin=0.3, logprob=-2.0),
        cand(None, margin=0.9),
    ]
    assert answer_scores(cands, "margin") == pytest.approx({"7": 0.4, "8": 0.6})
    assert answer_scores(cands, "vote") == {"7": 1.0, "8": 2.0}
    assert answer_scores(cands, "logprob") == {"7": -0.5, "8": -0.4}
    assert answer_scores(cands, "max_margin") == {"7": 0.4, "8": 0.3}
    assert answer_scores(cands, "weighted_vote") == pytest.approx(
        {"7": math.exp(-0.5), "8": math.exp(-0.4) + math.exp(-2.0)}
    )
    assert select(cands, "margin", 0.0)[0] == 1  # "8" wins; its likelier candidate
    assert select(cands, "margin", 0.25)[0] == 0  # 0.6 - 0.4 is within the margin
    assert select(cands, "max_margin", 0.0)[0] == 0
    assert select([cand(None, None), cand("3")], "vote")[0] == 1  # no greedy answer: any answer beats it
    assert select([cand(None, None), cand(None)], "vote")[0] == 0


def test_answer_helpers(tiny_tokenizer):
    assert default_answer("The answer is 1,250.0 apples") == "1250"
    assert default_answer("So -3.") == "-3"
    assert default_answer("\nParis, of course!\nmore") == "paris of course"
    tokens = tiny_tokenizer.encode("It is 42 then", add_special_tokens=False)
    span = answer_token_span(tiny_tokenizer, tokens, "42")
    assert tiny_tokenizer.decode([tokens[i] for i in span]) == "42"
    assert answer_token_span(tiny_tokenizer, tokens, "forty") == list(range(len(tokens)))


def test_the_root_sampler_alone_spawns():
    assert BranchSampler(spawns=False).spawns is False and BranchSampler().spawns is True


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"budget": 0.5}, "'budget' = 0.5 is invalid"),
        ({"selector": "best"}, "'selector' = 'best' is invalid: choose one of"),
        ({"alternatives": -1}, "'alternatives' = -1 is invalid"),
        ({"branch_entropy": -1.0}, "cannot be negative"),
        ({"branch_gate": "heads"}, "'branch_gate' = 'heads' is invalid: choose one of: logits, attention"),
        ({"branch_agreement": -0.1}, "cannot be negative"),
        ({"min_probability": 1.0}, "must be in [0, 1)"),
        ({"max_branches": 2.5}, "must be a whole number"),
        ({"margin": float("nan")}, "must be a finite number"),
    ],
)
def test_invalid_settings_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError) as e:
        DeliberateConfig(**changes)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_config_from_a_table_the_card_and_overrides(tmp_path):
    path = tmp_path / "d.toml"
    path.write_text('[sampler]\nlow_entropy = 1.0\n[deliberate]\nbudget = 3\nselector = "vote"\n')
    cfg = DeliberateConfig.from_toml(path)
    assert cfg.budget == 3.0 and cfg.selector == "vote" and cfg.max_candidates == 3
    path.write_text("[deliberate]\nbudgett = 3\n")
    with pytest.raises(ConfigError, match="unknown deliberate setting 'budgett'"):
        DeliberateConfig.from_toml(path)
    cfg, source = resolve_deliberate("smollm2-135m", None, budget=2.0)
    assert cfg.budget == 2.0 and "smollm2-135m.toml" in source and "budget=2.0" in source


def test_a_chat_cache_as_the_shared_prefix_gives_the_same_deliberation(model, tiny_tokenizer):
    from entropix_mlx.decode.deliberate import DeliberateGeneration, Deliberator
    from entropix_mlx.decode.generate import generate as make_generation
    from entropix_mlx.model.cache import make_cache

    prompt = prompt_of(tiny_tokenizer, TEXTS[2])
    sampler = Deliberator(DeliberateConfig(first_alternatives=2, branch_entropy=0.0, max_branch_points=1))
    fresh = make_generation(model, tiny_tokenizer, prompt, sampler, max_tokens=6)
    assert isinstance(fresh, DeliberateGeneration)
    expected = [e.token for e in fresh]
    cache = make_cache(model)
    model(__import__("mlx.core").core.array([prompt[:10]]), cache)
    held = make_generation(model, tiny_tokenizer, prompt[10:], sampler, max_tokens=6, cache=cache)
    assert [e.token for e in held] == expected and cache[0].offset == 10  # read, never written

    def paths(g):  # the same paths (log-probabilities differ in the last bits: other prefill chunks)
        return [(c["split"], c["tokens"]) for c in g.summary().deliberation["candidates"]]

    assert paths(held) == paths(fresh) and len(paths(fresh)) == 4  # 2 at the first token, 1 later


def test_a_deliberators_own_reading_gives_its_candidates_answers_unless_eval_gives_the_tasks(model, tiny_tokenizer):
    from entropix_mlx.decode.deliberate import Deliberator

    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    sampler = Deliberator(DeliberateConfig(first_alternatives=2, max_branch_points=0), answer_of=lambda t: f"{len(t)}")
    generation = sampler.generate(model, tiny_tokenizer, prompt, max_tokens=5)
    list(generation)
    candidates = generation.deliberation.candidates
    assert len(candidates) == 3 and all(c.answer == f"{len(c.text)}" for c in candidates)
    ((_, row, _),) = sampler.answer_rows(model, tiny_tokenizer, [Request(prompt, 0, 5)], 1)
    assert [c["answer"] for c in row.extra["candidates"]] == [c.answer for c in candidates]
    ((_, row, _),) = sampler.answer_rows(model, tiny_tokenizer, [Request(prompt, 0, 5)], 1, None, lambda i, t: "7")
    assert {c["answer"] for c in row.extra["candidates"]} == {"7"}  # eval reads by the task


def test_eval_runs_deliberate_items_through_the_branches(model, tiny_tokenizer, tmp_path):
    from entropix_mlx.eval import EvalConfig, parse_task, run_eval

    tasks = [parse_task({"question": f"What is {i} + 1?", "answer": str(i + 1)}, i, "x") for i in range(4)]
    outs = []
    for batch_size in (1, 3):
        run_eval(
            model,
            tiny_tokenizer,
            tasks,
            EvalConfig(samplers=["deliberate"], max_tokens=5, batch_size=batch_size),
            out_dir=tmp_path / str(batch_size),
        )
        lines = (tmp_path / str(batch_size) / "items.jsonl").read_text().splitlines()
        records = sorted((__import__("json").loads(x) for x in lines if '"deliberate"' in x), key=lambda r: r["index"])
        assert len(records) == 4
        for r in records:
            cands = r["candidates"]
            assert 4 <= r["branches"] == len(cands) - 1 <= 5 and cands[0]["split"] is None
            assert r["output"] == cands[r["chosen"]]["text"]
            assert r["tokens_spent"] == sum(c["own_tokens"] for c in cands) <= 6 * 5
        outs.append([(r["output"], r["tokens_spent"]) for r in records])
    assert outs[0] == outs[1]  # the batch does not change any answer


def step_after(model, ids):
    logits, scores = model(mx.array([ids]), None)
    return Step(logits[0, -1], [s[0] for s in scores], [], model, None)


def test_each_candidate_records_the_likeliest_tokens_at_every_step(model, tiny_tokenizer):
    # eval's records: per generated token, the 3 likeliest tokens under the model (what
    # `recording` gives any other sampler), also on a second stage's forced first token
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    recorded = recording(GreedySampler(), 3)
    for cfg in (
        DeliberateConfig(first_alternatives=2, **WIDE),
        DeliberateConfig(first_alternatives=2, first_stage=1, **WIDE),
    ):
        ((_, d, _),) = deliberate_batch(model, tiny_tokenizer, [Request(prompt, 0, 6)], cfg, alternatives=3)
        for c in d.candidates:
            assert len(c.top) == len(c.tokens) > 0
            for i, top in enumerate(c.top):
                expected = recorded.choose(step_after(model, prompt + c.tokens[:i]), mx.random.key(0)).top
                assert [t for t, _ in top] == [t for t, _ in expected]
                # the candidate keeps its log-probabilities to 3 decimals
                assert [lp for _, lp in top] == pytest.approx([lp for _, lp in expected], abs=6e-4)


def test_continuation_scores_leave_out_the_forced_first_token(model, tiny_tokenizer):
    cfg = DeliberateConfig(first_alternatives=3, max_branch_points=0, selector="continuation_logprob")
    d = deliberate(model, tiny_tokenizer, prompt_of(tiny_tokenizer, TEXTS[0]), cfg, max_tokens=6)
    for c in d.candidates:
        assert c.continuation_logprob == pytest.approx(sum(c.logprobs[1:]) / 5)
        assert c.continuation_margin == pytest.approx(sum(c.margins[1:]) / 5)
    best = max(d.candidates, key=lambda c: (c.continuation_logprob, c.parent is None))
    if best.answer is not None and best.answer != d.candidates[0].answer:
        assert d.winner.answer == best.answer
    cands = [cand("7", None), cand("8")]
    cands[0].continuation_margin, cands[1].continuation_margin = 0.2, 0.5
    assert select(cands, "continuation_margin", 0.2)[0] == 1 and select(cands, "continuation_margin", 0.3)[0] == 0


def test_one_token_answers_still_compare_every_first_token(model, tiny_tokenizer):
    cfg = DeliberateConfig(first_alternatives=3, branch_entropy=0.0, max_branch_points=5)
    d = deliberate(model, tiny_tokenizer, prompt_of(tiny_tokenizer, TEXTS[1]), cfg, max_tokens=1)
    assert [len(c.tokens) for c in d.candidates] == [1, 1, 1, 1]
    assert [c.split for c in d.candidates] == [None, 0, 0, 0] and d.tokens_spent == 4
    assert all(c.finish_reason == "length" for c in d.candidates)


def test_early_stop_ends_the_other_rows_once_the_vote_is_decided(model, tiny_tokenizer):
    # "2+2" on this tiny model: two candidates end (eos) at tokens 0 and 10, the others run to 30
    prompt = prompt_of(tiny_tokenizer, "2+2")
    cfg = DeliberateConfig(
        first_alternatives=5, max_branch_points=0, max_branches=50, budget=100.0, selector="vote", clean_first="off"
    )
    full = deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=30, answer_of=lambda text: "same")
    assert sorted(len(c.tokens) for c in full.candidates) == [0, 10, 30, 30, 30, 30]
    stopped = deliberate(
        model, tiny_tokenizer, prompt, cfg.replace(stop_share=0.6), max_tokens=30, answer_of=lambda text: "same"
    )
    ends = [c.finish_reason for c in stopped.candidates]
    assert ends.count("stopped") == 4 and ends.count("eos") == 2
    assert all(len(c.tokens) == 11 for c in stopped.candidates if c.finish_reason == "stopped")  # one step after
    assert stopped.tokens_spent == 10 + 4 * 11 < full.tokens_spent == 10 + 4 * 30
    assert stopped.winner.finish_reason == "eos"  # a stopped row never competes
    # two different answers never hold 0.6 of two votes: nothing stops
    split = deliberate(
        model, tiny_tokenizer, prompt, cfg.replace(stop_share=0.6), max_tokens=30, answer_of=lambda text: text
    )
    assert [c.tokens for c in split.candidates] == [c.tokens for c in full.candidates]


def test_confidence_votes_weigh_each_candidate_by_its_probability():
    sure, unsure, unsure2 = cand("7", logprob=-0.1), cand("8", logprob=-0.5), cand("8", logprob=-0.5)
    # majority says 8; CISC's weights exp(c / 0.1) say 7 (e^-1 > 2 e^-5)
    assert select([sure, unsure, unsure2], "vote")[0] == 1
    assert select([sure, unsure, unsure2], "confidence_vote")[0] == 0
    assert answer_scores([sure, unsure], "confidence_vote", temperature=1.0) == pytest.approx(
        {"7": math.exp(-0.1), "8": math.exp(-0.5)}
    )
    # DeepConf's lowest group: one bad stretch sinks a chain whose mean is fine
    steady = cand("7", logprob=-0.3)
    steady.logprobs = [-0.3] * 8
    dip = cand("8", logprob=-0.2)
    dip.logprobs = [0.0] * 6 + [-0.8, -0.8]
    assert lowest_group(dip.logprobs, 2) == -0.8 and lowest_group(steady.logprobs, 2) == pytest.approx(-0.3)
    assert select([steady, dip], "lowest_group_vote", window=2)[0] == 0
    assert select([steady, dip], "confidence_vote")[0] == 1


def test_stopping_early_needs_a_vote():
    with pytest.raises(ConfigError, match="'stop_share'.*vote selector"):
        DeliberateConfig(selector="margin", stop_share=0.6)


def test_the_earlier_rule_is_a_named_preset_over_the_card(tmp_path, monkeypatch):
    from entropix_mlx.front.registry import EVAL_SAMPLER_NAMES, build

    (tmp_path / "m.toml").write_text(
        '[deliberate]\nfirst_alternatives = 3\nselector = "confidence_vote"\nstop_share = 1.0\n'
    )
    monkeypatch.setattr("entropix_mlx.sampling.cards.cards_dir", lambda: tmp_path)
    now, before = build("deliberate", card="m"), build("deliberate_margin", card="m")
    assert (now.config.selector, now.config.stop_share) == ("confidence_vote", 1.0)
    assert (before.config.selector, before.config.margin, before.config.stop_share) == ("continuation_margin", 0.1, 0.0)
    assert before.config.first_alternatives == 3 and before.name == "deliberate_margin"  # the card's candidates
    assert "deliberate_margin" in EVAL_SAMPLER_NAMES


def test_two_more_budgets_are_named_presets(tmp_path, monkeypatch):
    from entropix_mlx.front.registry import EVAL_SAMPLER_NAMES, build

    (tmp_path / "m.toml").write_text("[deliberate]\nfirst_alternatives = 2\nmax_branch_points = 2\nbudget = 6.0\n")
    monkeypatch.setattr("entropix_mlx.sampling.cards.cards_dir", lambda: tmp_path)
    narrow, wide = build("deliberate_narrow", card="m"), build("deliberate_wide", card="m")
    staged = build("deliberate_staged", card="m")
    assert (narrow.config.first_stage, wide.config.first_stage, staged.config.first_stage) == (0, 0, 1)
    for d, first in ((narrow, 1), (wide, 4), (staged, 4)):
        cfg = d.config
        assert (cfg.first_alternatives, cfg.max_branch_points, cfg.selector, cfg.stop_share) == (
            first,
            0,
            "confidence_vote",
            0.0,
        )
        assert cfg.clean_first == "length" and cfg.budget == 6.0  # the rest is the card's
    assert {"deliberate_narrow", "deliberate_wide", "deliberate_staged"} <= set(EVAL_SAMPLER_NAMES)


STAGED = dict(first_alternatives=4, max_branch_points=0, max_branches=50, budget=100.0, clean_first="off")


def test_a_second_stage_starts_the_other_first_tokens_only_when_the_first_disagrees(model, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, TEXTS[0])
    cfg = DeliberateConfig(selector="vote", **STAGED)
    at_once = deliberate(model, tiny_tokenizer, prompt, cfg, max_tokens=12, answer_of=lambda text: text)
    # distinct texts disagree: the 3 deferred alternatives start after the first stage, from the prompt
    staged = deliberate(
        model, tiny_tokenizer, prompt, cfg.replace(first_stage=1), max_tokens=12, answer_of=lambda text: text
    )
    assert [(c.split, c.tokens) for c in staged.candidates] == [(c.split, c.tokens) for c in at_once.candidates]
    root = staged.candidates[0].row
    assert all(c.parent == root for c in staged.candidates[1:])
    for a, b in zip(staged.candidates, at_once.candidates, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert staged.tokens_spent == at_once.tokens_spent and staged.chosen == at_once.chosen
    # one answer from both first-stage candidates: the others never start
    agreed = deliberate(
        model, tiny_tokenizer, prompt, cfg.replace(first_stage=1), max_tokens=12, answer_of=lambda text: "same"
    )
    assert [c.tokens for c in agreed.candidates] == [c.tokens for c in at_once.candidates[:2]]
    assert agreed.tokens_spent == sum(c.own_tokens for c in at_once.candidates[:2]) and agreed.prefilled == 0


def test_second_stage_rows_count_their_prompt_and_leave_other_requests_alone(model, tiny_tokenizer):
    cfg = DeliberateConfig(selector="vote", first_stage=2, **STAGED)
    prompts = [prompt_of(tiny_tokenizer, t) for t in TEXTS]
    alone = [
        deliberate(model, tiny_tokenizer, p, cfg, max_tokens=8, answer_of=lambda text: text).candidates for p in prompts
    ]
    requests = [Request(p, 0, 8) for p in prompts]
    prefix = prompts[0][:3]
    together = {
        i: d
        for i, d, _ in deliberate_batch(
            model, tiny_tokenizer, requests, cfg, lambda i, text: text, batch_size=2, prefix=prefix
        )
    }
    for i, p in enumerate(prompts):
        assert [(c.split, c.tokens) for c in together[i].candidates] == [(c.split, c.tokens) for c in alone[i]]
        assert together[i].prefilled == 2 * (len(p) - len(prefix))  # the 2 deferred rows ran the prompt again


def test_more_rows_for_a_request_in_flight_wait_ahead_of_new_requests(model, tiny_tokenizer):
    from entropix_mlx.decode.engine import BatchEngine

    engine = BatchEngine(model, tiny_tokenizer, 1, make_sampler=GreedySampler)
    for index in (0, 1):
        engine.add(index, Request([1, 2], 0, 4))
    engine.add(7, Request([1, 2], 0, 4), GreedySampler(), first=True)
    assert [w.index for w in engine.waiting] == [7, 0, 1]


def test_first_stage_is_validated():
    with pytest.raises(ConfigError, match="first_stage"):
        DeliberateConfig(first_stage=-1)


def test_eval_counts_a_second_stage_prompt_and_matches_the_wide_set(model, tiny_tokenizer, tmp_path):
    import json

    from entropix_mlx.eval import EvalConfig, parse_task, run_eval

    tasks = [parse_task({"question": f"What is {i} + 1?", "answer": str(i + 1)}, i, "x") for i in range(3)]
    run_eval(
        model,
        tiny_tokenizer,
        tasks,
        EvalConfig(samplers=["deliberate_wide", "deliberate_staged"], max_tokens=6, batch_size=2),
        out_dir=tmp_path,
    )
    records = [json.loads(x) for x in (tmp_path / "items.jsonl").read_text().splitlines()]
    greedy = {r["index"]: r for r in records if r["sampler"] == "greedy"}
    wide = {r["index"]: r for r in records if r["sampler"] == "deliberate_wide"}
    staged = {r["index"]: r for r in records if r["sampler"] == "deliberate_staged"}
    for i, r in staged.items():
        # random text reads no answer: the first stage never settles, so all 5 candidates run
        assert [c["text"] for c in r["candidates"]] == [c["text"] for c in wide[i]["candidates"]]
        assert r["tokens_spent"] == wide[i]["tokens_spent"] and r["output"] == wide[i]["output"]
        assert wide[i]["prompt_tokens"] == greedy[i]["prompt_tokens"] < r["prompt_tokens"]
