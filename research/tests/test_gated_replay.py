"""research/gated_replay.py's selection rule and its tables (docs/gated-deliberate.md)."""

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from research import gated_replay as replay

ROOT = Path(__file__).resolve().parents[2]


def row(rule, accuracy, x_greedy, reads=True):
    return {
        "rule": rule,
        "reads_measurements": reads,
        "accuracy": accuracy,
        "interval": (accuracy - 0.05, accuracy + 0.05),
        "tokens": 100 * x_greedy,
        "x_greedy": x_greedy,
        "spent_more": 0.5,
        "wins": 3,
        "losses": 1,
        "p": 0.625,
        "diff": {"difference": 0.02, "ci95": [-0.01, 0.05]},
    }


ROWS = [
    row("staged (disagreement only)", 0.50, 3.5, reads=False),
    row("always +4first", 0.52, 4.0, reads=False),
    row("a: best, dear", 0.40, 2.6),
    row("b: level and cheaper", 0.392, 1.8),
    row("c: a point and more below", 0.389, 1.2),
    row("d: over the cap", 0.45, 2.8),
]


def test_the_best_within_the_cap_is_level_with_a_cheaper_rule_within_one_point():
    assert replay.choose(ROWS)["rule"] == "b: level and cheaper"
    assert replay.choose(ROWS, cap=1.5)["rule"] == "c: a point and more below"
    assert replay.choose(ROWS, cap=1.0) is None


def test_the_summary_marks_the_choice_and_keeps_the_baseline_and_the_full_table_every_rule():
    res = {"greedy": {"accuracy": 0.3, "interval": (0.25, 0.35)}, "rows": ROWS, "chosen": replay.choose(ROWS)}
    summary = replay.markdown(res, every=False, where="docs/records/x", top=1).splitlines()
    names = [line.split(" | ")[0] for line in summary[2:]]
    assert names == [
        "| greedy",
        "| `staged (disagreement only)`",
        "| **b: level and cheaper** (chosen)",
        "| `a: best, dear`",
        "| `always +4first`",
        "| `d: over the cap`",
    ]
    assert all(line.endswith("| docs/records/x |") for line in summary[2:])
    every = replay.markdown(res, every=True, where="docs/records/x").splitlines()
    assert len(every) == 2 + 1 + len(ROWS)
    assert "| 1.20 | 3/1 | 0.625 | +2.0 [-1.0, +5.0] | 50% |" in every[-1]


def test_the_shipped_reasoning_setting_is_the_rule_chosen_on_the_committed_pool():
    from entropix_mlx.sampling.deliberate_config import DeliberateConfig, shipped_reasoning

    pool = ROOT / "docs" / "records" / "dev_q05_wide"
    shipped = ROOT / "entropix_mlx" / "data" / "deliberate_reasoning.toml"
    assert shipped.read_text() == replay.frozen(pool, replay.results(pool))
    setting = DeliberateConfig(**shipped_reasoning())
    # it reads the measurements, and it names every field
    assert setting.gate_signal and set(shipped_reasoning()) == set(setting.to_dict())


def test_the_1_5b_candidate_for_the_next_freeze_is_the_rule_chosen_on_its_committed_pools():
    folders = tuple(ROOT / "docs" / "records" / n for n in ("dev_q15_staged", "dev_q15_staged_b", "dev_q15_staged_c"))
    candidate = ROOT / "docs" / "next-freeze-q15.toml"
    assert candidate.read_text() == replay.next_freeze(folders, replay.results_per_model(*folders))


def cand(kind, order, answer, right, own=10):
    return replay.Cand(kind, order, 0, answer, right, True, own, [-0.1] * own, {}, 0.9)


def split_pair():
    """Greedy wrong; its pair disagrees; the later first tokens agree with the alternative, which is right."""
    return [
        cand("greedy", 0, 1, False),
        cand("first", 0, 2, True),
        cand("first", 1, 2, True),
        cand("first", 2, 2, True),
    ]


def test_after_the_sealed_scoring_the_gate_decides_staged_second_stage_with_and_or_or():
    cands = split_pair()
    cands[0].signals = {"head_agreement": 0.5}
    rules = {r.second_stage: r for r in replay.after_sealed() if r.signal == "head_agreement" and r.quantile == 0.5}
    sure, unsure = 0.4, 0.6  # the gate the chain's head agreement is at or above / below
    spent = {
        (how, gate): replay.replay(rules[how], cands, gate)["tokens"]
        for how in ("and", "or")
        for gate in (sure, unsure)
    }
    assert spent == {("and", sure): 20, ("and", unsure): 40, ("or", sure): 40, ("or", unsure): 40}
    cands[1].answer = 1  # the pair agrees: only an unsure chain gets the second stage, and only with "or"
    spent = {
        (how, gate): replay.replay(rules[how], cands, gate)["tokens"]
        for how in ("and", "or")
        for gate in (sure, unsure)
    }
    assert spent == {("and", sure): 20, ("and", unsure): 20, ("or", sure): 20, ("or", unsure): 40}
    assert all(replay.live_fields(r, 0.5) is None for r in rules.values())  # never run live
    assert not {r.name for r in replay.after_sealed()} & {r.name for r in replay.grid()}  # outside the choice


def test_a_pair_rule_spends_the_second_stage_only_where_the_alternative_reads_as_contested():
    cands = split_pair()
    cands[0].signals, cands[1].signals = {"tail_logprob": -0.2}, {"tail_logprob": -0.5}
    rules = {r.second_stage: r for r in replay.after_sealed() if r.signal == "tail_logprob" and r.quantile == 0.5}
    # "alt" reads the alternative's own signal (-0.5), "gap" that less greedy's (-0.3)
    assert replay.pair_value(rules["alt"], cands) == -0.5
    assert abs(replay.pair_value(rules["gap"], cands) - -0.3) < 1e-12
    spent = {how: [replay.replay(rules[how], cands, gate)["tokens"] for gate in (-0.6, -0.4, -0.2)] for how in rules}
    assert spent["alt"] == [40, 20, 20] and spent["gap"] == [40, 40, 20]
    outcome = replay.replay(rules["alt"], cands, -0.4)  # no second stage: the pair's own vote
    assert outcome["answer"] == replay.vote(cands[:2])[0]
    cands[1].answer = 1  # the pair agrees: no second stage, whatever the alternative reads
    assert all(replay.replay(r, cands, -1.0)["tokens"] == 20 for r in rules.values())
    assert all(replay.live_fields(r, 0.5) is None for r in rules.values())


def test_a_pair_rule_can_read_the_share_of_numbers_the_two_texts_both_write():
    cands = split_pair()[:3]
    cands[0].values, cands[1].values = frozenset({3, 12, 36}), frozenset({3, 36, 18})
    rules = {r.second_stage: r for r in replay.after_sealed() if r.signal == replay.NUMBERS and r.quantile == 0.5}
    assert replay.pair_value(rules["shared"], cands) == 0.5  # 3 and 36 of 3, 12, 18, 36
    assert replay.pair_value(rules["parted"], cands) == 0.5
    cands[1].values = frozenset({3, 12})
    assert abs(replay.pair_value(rules["shared"], cands) - 2 / 3) < 1e-12
    assert [replay.replay(rules["shared"], cands, gate)["tokens"] for gate in (0.6, 0.7)] == [30, 20]
    assert [replay.replay(rules["parted"], cands, gate)["tokens"] for gate in (0.3, 0.4)] == [30, 20]


def test_a_candidate_keeps_the_numbers_its_text_writes():
    record = {
        "expected": "12",
        "candidates": [
            {
                "split": None,
                "answer": "12",
                "finish_reason": "eos",
                "own_tokens": 3,
                "logprobs": [-0.1] * 3,
                "answer_margin": 0.9,
                "text": "3 dozen is 3 x 12 = 36, so 1,200 eggs; half is 0.5",
            }
        ],
    }
    (greedy,) = replay.candidates(record)
    assert greedy.right and greedy.values == {3, 12, 36, 1200, 0.5}


def test_auroc_counts_right_over_wrong_pairs_ties_half_and_a_backwards_signal_is_below_half():
    a, (lo, hi) = replay.auroc([3.0, 2.0], [1.0, 2.0])  # 3>1, 3>2, 2>1, 2=2: 3.5 of 4
    assert a == 0.875 and lo < a < hi <= 1.0
    assert replay.auroc([0.0, 0.1], [1.0, 2.0])[0] == 0.0
    assert abs(replay.rank_correlation([1, 2, 2, 3], [1, 2, 3, 4]) - 3 / 10**0.5) < 1e-12  # tied ranks 1.5, 1.5
    assert replay.rank_correlation([1, 2, 3], [9, 5, 1]) == -1.0


def chain_record(index, answer, own, lowest, ended=True, prompt=50):
    """A pool record whose greedy chain answers `answer` (12 is right) over `own` tokens of log-probability `lowest`."""
    greedy = {
        "split": None,
        "answer": answer,
        "finish_reason": "eos" if ended else "length",
        "own_tokens": own,
        "logprobs": [lowest] * own,
        "answer_margin": 0.9,
        "measures": {"agreement": [1 / own] * own},  # the heads disagree less as the chain grows
    }
    return {"index": index, "sampler": "deliberate", "expected": "12", "prompt_tokens": prompt, "candidates": [greedy]}


def write_pool(folder, records):
    folder.mkdir()
    (folder / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_ranking_reads_a_cut_off_chain_as_the_least_sure_and_each_signal_by_its_own_direction(tmp_path):
    records = [
        chain_record(0, "12", 10, -0.1),
        chain_record(1, "12", 20, -0.2),
        chain_record(2, "7", 30, -0.3),
        chain_record(3, "7", 40, -0.05, ended=False),  # surest log-probabilities, but cut off
    ]
    write_pool(tmp_path / "pool", [*records, {**records[0], "sampler": "greedy"}])
    r = replay.ranking(tmp_path / "pool", "deliberate")
    assert (r["items"], r["wrong"]) == (4, 2)
    assert r["auroc"]["lowest_group"][0] == 1.0  # both right chains above the wrong one and the cut-off one
    assert r["auroc"][replay.LENGTH][0] == 1.0  # shorter is surer
    # the longer wrong chain's heads disagree least: it reads surer than both right ones, the cut-off one below them
    assert r["auroc"]["head_agreement"][0] == 0.5 and r["agreement_by_length"] == 1.0


def test_the_fixable_table_splits_the_questions_at_the_gate_and_counts_what_staged_puts_right(tmp_path):
    def record(index, greedy_answer, agreement, pair):
        rec = chain_record(index, greedy_answer, 10, -0.5)
        rec["candidates"][0]["measures"] = {"agreement": [agreement] * 10}
        alt = {**rec["candidates"][0], "split": 0, "answer": pair, "logprobs": [-0.2] * 10}
        rec["candidates"] += [alt, *({**alt, "logprobs": [-0.3 - k] * 10} for k in range(3))]
        return rec

    # heads that agree (agreement 0.001) keep greedy at a gate of -0.005; disagreeing ones (0.01) spend
    write_pool(
        tmp_path / "pool",
        [
            record(0, "7", 0.01, "12"),
            record(1, "12", 0.01, "12"),
            record(2, "7", 0.001, "12"),
            record(3, "7", 0.001, "7"),
        ],
    )
    r = replay.fixable(tmp_path / "pool", "deliberate", "head_agreement", -0.005)
    assert r["spent"] == {"items": 2, "wrong": 1, "fixed": 1}
    assert r["kept"] == {"items": 2, "wrong": 2, "fixed": 1}
    assert "| pool | 2 of 4 | 1 (50%) | 1 (100%) | 2 of 4 | 2 (100%) | 1 (50%) | x |" in replay.fixable_markdown(
        [("pool", r, "x")]
    )


def test_a_gate_in_front_of_staged_keeps_greedy_when_sure_and_runs_staged_whole_when_not():
    cands = split_pair()
    cands[0].signals = {"lowest_group": -0.2}
    rule = next(r for r in replay.per_model() if r.name == "lowest_group>=q0.5 then staged")
    sure = replay.replay(rule, cands, -0.3)
    assert (sure["tokens"], sure["right"], sure["spent_more"]) == (10, False, False)
    unsure = replay.replay(rule, cands, -0.1)  # greedy, its pair, which disagree, then the later first tokens
    assert (unsure["tokens"], unsure["right"]) == (40, True)
    staged = replay.replay(replay.STAGED, cands, None)
    assert (unsure["tokens"], unsure["answer"]) == (staged["tokens"], staged["answer"])
    # the pair started after the greedy chain ended: its prompt runs again too
    assert (unsure["rerun"], staged["rerun"]) == (3, 2)
    agree = [cands[0], cand("first", 0, 1, False)]
    assert replay.replay(rule, agree, -0.1)["tokens"] == 20  # a pair that agrees stops there
    # live it is the gated path with a first stage of one
    fields = replay.live_fields(rule, -0.1)
    assert (fields["gate_first_alternatives"], fields["gate_staged"], fields["first_stage"]) == (4, True, 1)
    assert replay.rule_of(fields) == replace(rule, name="live", quantile=0.0)  # read back, the same rule
    assert not any(r.second_stage == "or" for r in replay.per_model())  # a staged pool never ran those


def test_a_staged_pool_must_hold_the_later_first_tokens_exactly_where_the_pair_did_not_settle(tmp_path):
    rec = chain_record(0, "12", 10, -0.1)
    alt = {**rec["candidates"][0], "split": 0, "answer": "12"}
    write_pool(tmp_path / "agree", [{**rec, "sampler": "deliberate_staged", "candidates": [rec["candidates"][0], alt]}])
    replay.staged_pool_check(tmp_path / "agree", replay.read_pool(tmp_path / "agree", "deliberate_staged"))
    four = [rec["candidates"][0], *({**alt, "logprobs": [-0.1 - k] * 10} for k in range(4))]
    write_pool(tmp_path / "more", [{**rec, "sampler": "deliberate_staged", "candidates": four}])
    with pytest.raises(SystemExit, match="item 0 has 4 first tokens, not 1"):
        replay.staged_pool_check(tmp_path / "more", replay.read_pool(tmp_path / "more", "deliberate_staged"))


def staged_record(index, tail, greedy_answer="7", pair_answer="12"):
    """A staged pool's record: greedy's chain at log-probability `tail`, its pair, and the later
    first tokens (all answering `pair_answer`) where the two disagree."""
    rec = {**chain_record(index, greedy_answer, 40, tail), "sampler": "deliberate_staged"}
    alt = {**rec["candidates"][0], "split": 0, "answer": pair_answer}
    more = 1 if pair_answer == greedy_answer else 4
    rec["candidates"] += [{**alt, "logprobs": [-0.1 - k] * 40} for k in range(more)]
    return rec


def test_a_threshold_carried_from_another_pool_is_used_as_it_was_set_not_re_read(tmp_path):
    rule = next(r for r in replay.per_model() if r.name == "tail_logprob>=q0.5 then staged")
    write_pool(tmp_path / "check", [staged_record(100, -0.25), staged_record(101, -0.35)])
    pool = replay.staged_pool(tmp_path / "check")
    own = replay.table(pool, [rule])[0]  # its own median stops the surer question at greedy's wrong answer
    assert (own["gate"], own["accuracy"], own["spent_more"]) == (-0.25, 0.5, 0.5)
    carried = replay.table(pool, [rule], fixed={rule.name: -0.2})[0]  # neither is that sure: staged on both
    assert (carried["gate"], carried["accuracy"], carried["right"]) == (-0.2, 1.0, [True, True])
    assert replay.table(pool, [rule], fixed={rule.name: 0.0})[0]["gate"] == 0.0  # a zero threshold is one too


def test_the_held_out_check_replays_the_choice_at_the_thresholds_set_where_it_was_made(tmp_path):
    tails = [-0.05, -0.1, -0.2, -0.3, -0.4, -0.5]
    write_pool(
        tmp_path / "choice", [staged_record(i, t, pair_answer="7" if i % 2 else "12") for i, t in enumerate(tails)]
    )
    write_pool(tmp_path / "check", [staged_record(100 + i, t - 0.02) for i, t in enumerate(tails)])
    made = replay.results_per_model(tmp_path / "choice")
    res = replay.held_out(made, tmp_path / "check")
    assert res["rows"][0]["rule"] == replay.STAGED.name and res["chosen"] is res["rows"][1]
    assert res["chosen"]["rule"] == made["chosen"]["rule"] and res["choice_items"] == 6
    set_there = {r["rule"]: r["gate"] for r in made["rows"]}
    assert all(r["gate"] == set_there[r["rule"]] for r in res["rows"][1:])
    staged = res["rows"][0]["right"]
    for r in res["rows"][1:]:
        wins = sum(a and not b for a, b in zip(r["right"], staged, strict=True))
        assert r["vs_staged"]["wins"] == wins and r["wins"] + r["losses"] <= 6
    table = replay.held_out_markdown(res, "docs/records/check").splitlines()
    assert table[0].startswith("| rule | threshold (set on the 6 items it was chosen on) |")
    assert table[2].startswith("| greedy |  | ") and "(chosen)" in table[4]


def test_staged_pools_read_as_one_must_cover_different_items(tmp_path):
    write_pool(tmp_path / "a", [staged_record(0, -0.1)])
    write_pool(tmp_path / "b", [staged_record(0, -0.2), staged_record(1, -0.3)])
    with pytest.raises(SystemExit, match="the runs share items"):
        replay.staged_pool(tmp_path / "a", tmp_path / "b")
    write_pool(tmp_path / "c", [staged_record(2, -0.3, greedy_answer="12")])
    assert [rec["index"] for _, rec in replay.staged_pool(tmp_path / "a", tmp_path / "c")] == [0, 2]


def test_a_candidate_for_the_next_freeze_is_the_pools_staged_table_with_the_chosen_gate(tmp_path):
    from entropix_mlx.sampling.deliberate_config import STAGED, DeliberateConfig

    staged = DeliberateConfig(branch_entropy=1.5, **STAGED).to_dict()
    tails = [-0.05, -0.1, -0.2, -0.3, -0.4, -0.5]
    for name, part in (("a", tails[:3]), ("b", tails[3:])):
        offset = 0 if name == "a" else 3
        write_pool(tmp_path / name, [staged_record(offset + i, t, pair_answer="7") for i, t in enumerate(part)])
        config = {"model": "m", "samplers": {"greedy": {}, "deliberate_staged": staged}}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    folders = (tmp_path / "a", tmp_path / "b")
    res = replay.summary(replay.staged_pool(*folders), replay.per_model())
    text = replay.next_freeze(folders, res)
    assert "not scored" in text.splitlines()[0] and f"# {res['chosen']['rule']}." in text
    setting = DeliberateConfig(**tomllib.loads(text)["deliberate"])
    assert setting.branch_entropy == 1.5 and setting.first_stage == 1  # the pools' own table
    rule = next(r for r in replay.per_model() if r.name == res["chosen"]["rule"])
    assert (setting.gate_signal, setting.gate_threshold) == (rule.signal, res["chosen"]["gate"])
    other = {"model": "m", "samplers": {"greedy": {}, "deliberate_staged": {**staged, "budget": 5.0}}}
    (tmp_path / "b" / "config.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="settings differ"):
        replay.next_freeze(folders, res)


def test_a_live_run_is_counted_against_its_replay_item_by_item(tmp_path):
    # Greedy answers 7 (wrong); its pair answers 12 and disagrees, so the three more start: 5 x 40 tokens.
    write_pool(tmp_path / "pool", [staged_record(0, -0.5), staged_record(1, -0.01), staged_record(2, -0.5)])
    setting = {
        "gate_signal": "tail_logprob",
        "gate_threshold": -0.1,
        "gate_first_alternatives": 4,
        "gate_branches": 0,
        "gate_staged": True,
        "first_stage": 1,
        "running_stop": False,
    }
    live = [
        {"index": 0, "sampler": "deliberate", "extracted": "12", "correct": True, "tokens_spent": 200},
        {"index": 1, "sampler": "deliberate", "extracted": "7", "correct": False, "tokens_spent": 40},
        {
            "index": 2,
            "sampler": "deliberate",
            "extracted": "7",
            "correct": False,
            "tokens_spent": 80,
        },  # not as replayed
        {
            "index": 9,
            "sampler": "deliberate",
            "extracted": "7",
            "correct": False,
            "tokens_spent": 40,
        },  # not in the pool
    ]
    live[0]["candidates"] = [{}] * 5
    live[1]["candidates"] = [{}]
    live[2]["candidates"] = [{}] * 2
    write_pool(tmp_path / "live", live)
    (tmp_path / "live" / "config.json").write_text(json.dumps({"samplers": {"deliberate": setting}}))
    res = replay.live_against_replay(tmp_path / "live", tmp_path / "pool")
    assert res["items"] == 3 and res["spent_more"] == (2, 2) and res["right"] == (1, 2)
    assert (res["same_answer"], res["same_tokens"], res["tokens"]) == (2, 2, (320, 440))
    assert "| 3 | 2 / 2 | 1 / 2 | 2 of 3 | 2 of 3 (320 / 440 in all) | x |" in replay.live_markdown(res, "x")


def wide_record(index, tail, greedy_answer="7", pair_answer="12", sampler="deliberate"):
    """A wide pool's record: all four first tokens and a branch inside the chain, whatever the pair says."""
    rec = {**chain_record(index, greedy_answer, 40, tail), "sampler": sampler}
    alt = {**rec["candidates"][0], "split": 0, "answer": pair_answer}
    inside = {**rec["candidates"][0], "split": 12, "answer": "12", "own_tokens": 28, "logprobs": [-0.1] * 28}
    rec["candidates"] += [*({**alt, "logprobs": [-0.1 - k] * 40} for k in range(4)), inside]
    return rec


def test_a_wide_pool_replays_the_per_model_rules_as_a_live_staged_run_of_the_same_chains(tmp_path):
    # a pair that agrees (item 0) ran no later first tokens live; the wide pool holds them all the same
    answers = [("7", "7"), ("7", "12"), ("12", "7"), ("12", "12")]
    tails = [-0.05, -0.1, -0.2, -0.3]
    write_pool(tmp_path / "wide", [wide_record(i, t, *a) for i, (t, a) in enumerate(zip(tails, answers, strict=True))])
    write_pool(
        tmp_path / "staged", [staged_record(i, t, *a) for i, (t, a) in enumerate(zip(tails, answers, strict=True))]
    )
    wide, staged = replay.staged_pool(tmp_path / "wide"), replay.staged_pool(tmp_path / "staged")
    assert [rec["sampler"] for _, rec in wide] == ["deliberate"] * 4
    for a, b in zip(replay.table(wide, replay.per_model()), replay.table(staged, replay.per_model()), strict=True):
        assert (a["rule"], a["gate"], a["right"], a["tokens"]) == (b["rule"], b["gate"], b["right"], b["tokens"])
    # read as one with a staged run of other items; a freeze takes the staged run's own table
    write_pool(tmp_path / "more", [staged_record(10 + i, t) for i, t in enumerate(tails)])
    config = {"model": "m", "samplers": {"greedy": {}, "deliberate_staged": {"first_stage": 1, "budget": 6.0}}}
    (tmp_path / "more" / "config.json").write_text(json.dumps(config))
    (tmp_path / "wide" / "config.json").write_text(json.dumps({"model": "m", "samplers": {"deliberate": {}}}))
    folders = (tmp_path / "wide", tmp_path / "more")
    res = replay.summary(replay.staged_pool(*folders), replay.per_model())
    assert res["items"] == 8 and "[deliberate]" in replay.next_freeze(folders, res)
    with pytest.raises(SystemExit, match="no live staged run"):
        replay.next_freeze((tmp_path / "wide",), res)


def write_choice_pool(folder):
    """A wide pool of six items, pairs alternately agreeing; its greedy tails, surest first."""
    tails = [-0.05, -0.1, -0.2, -0.3, -0.4, -0.5]
    write_pool(folder, [wide_record(i, t, pair_answer="7" if i % 2 else "12") for i, t in enumerate(tails)])
    return tails


def test_the_held_out_check_replays_named_rules_at_the_choice_pools_thresholds_too(tmp_path):
    tails = write_choice_pool(tmp_path / "choice")
    write_pool(tmp_path / "check", [staged_record(100 + i, t - 0.02) for i, t in enumerate(tails)])
    made = replay.results_per_model(tmp_path / "choice")
    named = "tail_logprob>=q0.5 then staged"
    res = replay.held_out(made, tmp_path / "check", also=(named,))
    row = next(r for r in res["rows"] if r["rule"] == named)
    assert row["gate"] == next(r["gate"] for r in made["rows"] if r["rule"] == named)
    assert row["gate"] != next(
        r["gate"] for r in replay.results_per_model(tmp_path / "check")["rows"] if r["rule"] == named
    )
    assert "vs_staged" in row and res["chosen"]["rule"] == made["chosen"]["rule"]


def test_a_wide_pool_must_hold_all_four_first_tokens_on_every_item(tmp_path):
    rec = wide_record(0, -0.1)
    rec["candidates"] = rec["candidates"][:3]  # greedy and two first tokens
    write_pool(tmp_path / "wide", [rec])
    with pytest.raises(SystemExit, match="item 0 has 2 first tokens, not 4: not a wide pool"):
        replay.staged_pool(tmp_path / "wide")


def test_a_held_out_check_may_be_several_runs_read_as_one(tmp_path):
    tails = write_choice_pool(tmp_path / "choice")
    write_pool(tmp_path / "a", [staged_record(100 + i, t - 0.02) for i, t in enumerate(tails[:3])])
    write_pool(tmp_path / "b", [staged_record(200 + i, t - 0.02, greedy_answer="12") for i, t in enumerate(tails[3:])])
    made = replay.results_per_model(tmp_path / "choice")
    both = replay.held_out(made, tmp_path / "a", tmp_path / "b")
    parts = [replay.held_out(made, tmp_path / n) for n in ("a", "b")]
    assert both["items"] == 6
    for whole, a, b in zip(both["rows"], parts[0]["rows"], parts[1]["rows"], strict=True):
        assert whole["right"] == a["right"] + b["right"] and whole["gate"] == a["gate"] == b["gate"]
