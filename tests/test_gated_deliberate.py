"""Gated `deliberate`: the greedy chain's own measurements decide whether more runs
(docs/gated-deliberate.md). The live decoder reads a chain exactly as
research/gated_replay.py replays it from a pool run, an always-sure gate is plain
greedy, a never-sure one always spends, and running_stop ends a weak candidate early."""

import json
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import make_tiny_model

from entropix_mlx.decode.deliberate import deliberate_batch, eval_rows
from entropix_mlx.decode.gated import voting
from entropix_mlx.decode.generate import generate
from entropix_mlx.decode.rows import Request
from entropix_mlx.errors import ConfigError
from entropix_mlx.sampling import gate
from entropix_mlx.sampling.deliberate_config import DeliberateConfig
from entropix_mlx.sampling.gate import STOPPED
from entropix_mlx.sampling.penalties import make_penalties
from entropix_mlx.sampling.samplers import GreedySampler
from research import gated_replay as replay

ROOT = Path(__file__).resolve().parents[1]

TEXTS = ["What is 7 + 5?", "hi", "a b c", "why?", "ok then", "x"]
MAX_TOKENS = 64
# The pool's branching (docs/gated-deliberate.md's wide run, at the tiny model's entropies):
# 4 first tokens, up to 3 branches inside the chain, no cap below them, the CISC vote.
BRANCHING = dict(
    alternatives=1,
    branch_entropy=7.79,
    branch_varentropy=1000.0,
    branch_spacing=4,
    max_branches=7,
    budget=8.0,
    selector="confidence_vote",
    clean_first="length",
)
POOL = DeliberateConfig(first_alternatives=4, max_branch_points=3, **BRANCHING)


@pytest.fixture(scope="module")
def model():
    # This seed's greedy chains end on their own for some of TEXTS and run into the limit for others.
    return make_tiny_model(2, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def requests(tiny_tokenizer):
    prompts = [
        tiny_tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in TEXTS
    ]
    return [Request(list(p), 0, MAX_TOKENS) for p in prompts]


def answer_of(index, text):
    return str(len(text) % 3)  # a small answer space: candidates agree and disagree


def run(model, tokenizer, requests, config):
    out = deliberate_batch(model, tokenizer, requests, config, answer_of, batch_size=len(requests))
    return dict(sorted((i, d) for i, d, _ in out))


def gated(**fields):
    return DeliberateConfig(**BRANCHING, **fields)


@pytest.fixture(scope="module")
def pool(model, tiny_tokenizer, requests):
    """The wide pool run as eval records it, read back as the replay reads it."""
    rows = eval_rows(model, tiny_tokenizer, requests, POOL, answer_of, len(requests))
    records = {i: {"index": i, "sampler": "deliberate", "expected": "1", **r.extra} for i, r, _ in rows}
    return [replay.candidates(json.loads(json.dumps(records[i]))) for i in sorted(records)]


def test_the_chains_both_end_and_run_into_the_limit(pool):
    ended = [c[0].ended for c in pool]
    assert any(ended) and not all(ended)


RULES = [
    ("lowest_group", 2, 2, True, True, 0),
    ("answer_margin", 1, 1, False, False, 0),
    ("tail_logprob", 0, 3, False, True, 0),
    ("calm_tokens", 4, 0, True, False, 0),
    ("calm_varentropy", 2, 0, False, False, 0),
    ("head_agreement", 1, 2, True, True, 0),
    ("lowest_group", 4, 3, False, True, 0),
    (None, 1, 2, True, False, 0),
    ("tail_logprob", 4, 0, True, False, 1),  # `staged` behind the gate: one first token, then three
]


@pytest.mark.parametrize("signal,firsts,insides,staged,online,first_stage", RULES)
def test_live_gated_run_is_the_replay_of_its_rule(
    model, tiny_tokenizer, requests, pool, signal, firsts, insides, staged, online, first_stage
):
    threshold = None  # "never stop": always spend
    if signal is not None:
        values = sorted(replay.signals(c[0])[signal] for c in pool if c[0].ended)
        # Some chains that ended stand, some do not. Midway between two of them: the greedy
        # chain decoded alone (live) and beside its candidates (the pool) agrees only to
        # rounding, which a threshold at one chain's own value would see.
        k = len(values) // 2
        assert values[k - 1] < values[k]
        threshold = (values[k - 1] + values[k]) / 2
    rule = replay.Rule("r", signal, 0.5, firsts, insides, staged, online, first_stage=first_stage)
    # The fields the replay gives for its rule, over the pool's own table, run it live.
    config = POOL.replace(**replay.live_fields(rule, threshold))
    live = run(model, tiny_tokenizer, requests, config)
    spent = []
    for i, cands in enumerate(pool):
        want, d = replay.replay(rule, cands, threshold), live[i]
        assert Fraction(d.winner.answer) == want["answer"]
        assert d.tokens_spent == want["tokens"]
        mine = sorted((c.split or 0, c.own_tokens, c.answer) for c in voting(d.candidates))
        assert mine == sorted((c.split, c.own, str(c.answer)) for c in want["voters"])
        spent.append(len(d.candidates) > 1)
    assert any(spent) and (signal is None or not all(spent))


def test_the_first_stage_holds_half_the_added_candidates_or_as_many_as_set():
    four = ["f1", "f2", "f3", "b1"]
    assert gate.stages(four, staged=False, first=1) == [four]
    assert gate.stages(four, staged=True) == [["f1", "f2"], ["f3", "b1"]]
    assert gate.stages(four, staged=True, first=1) == [["f1"], ["f2", "f3", "b1"]]
    assert gate.stages(four, staged=True, first=4) == [four]  # nothing left for a second stage
    assert gate.stages(["f1"], staged=True) == [["f1"]]


def test_a_first_stage_of_one_stops_where_the_pair_ends_on_one_answer(model, tiny_tokenizer, requests):
    config = gated(gate_signal="lowest_group", gate_threshold=1.0, gate_first_alternatives=4, gate_staged=True)
    config = config.replace(first_stage=1)
    counts = {}
    for name, answer in (("same", lambda i, text: "same"), ("own", lambda i, text: text)):
        out = deliberate_batch(model, tiny_tokenizer, requests, config, answer, batch_size=len(requests))
        counts[name] = {i: [c.finish_reason != "length" for c in d.candidates] for i, d, _ in out}
    for ended in counts["same"].values():
        # the pair settles the answer when both ended; otherwise the other three start
        assert len(ended) == (2 if all(ended[:2]) else 5)
    assert any(len(e) == 2 for e in counts["same"].values()) and any(len(e) == 5 for e in counts["same"].values())
    assert all(len(e) == 5 for e in counts["own"].values())  # every chain's text differs


def test_a_gate_above_every_signal_always_spends(model, tiny_tokenizer, requests):
    for signal in gate.SIGNALS:
        live = run(
            model,
            tiny_tokenizer,
            requests,
            gated(gate_signal=signal, gate_threshold=1e9, gate_first_alternatives=2, gate_branches=1),
        )
        for d in live.values():
            assert [c.split for c in d.candidates][:3] == [None, 0, 0]
            assert len(d.candidates) == 4
            assert d.tokens_spent > d.candidates[0].own_tokens


def test_a_gate_below_every_signal_is_plain_greedy_where_the_chain_ended(model, tiny_tokenizer, requests):
    for signal in gate.SIGNALS:
        live = run(
            model,
            tiny_tokenizer,
            requests,
            gated(gate_signal=signal, gate_threshold=-1e9, gate_first_alternatives=2, gate_branches=1),
        )
        for i, d in live.items():
            greedy = [
                e.token
                for e in generate(model, tiny_tokenizer, requests[i].prompt, GreedySampler(), max_tokens=MAX_TOKENS)
            ]
            assert d.candidates[0].tokens == greedy
            if len(greedy) < MAX_TOKENS:  # ended: its answer stands, nothing more runs
                assert len(d.candidates) == 1 and d.winner.tokens == greedy and d.tokens_spent == len(greedy)
            else:  # cut off by the limit: always unsure
                assert len(d.candidates) == 4


def test_running_stop_ends_a_candidate_below_the_chains_lowest_group(model, tiny_tokenizer, requests):
    fields = dict(gate_signal="lowest_group", gate_threshold=1e9, gate_first_alternatives=4, gate_branches=3)
    stopping = run(model, tiny_tokenizer, requests, gated(**fields, running_stop=True))
    free = run(model, tiny_tokenizer, requests, gated(**fields))
    stopped = 0
    for i, d in stopping.items():
        floor = min(gate.windows(d.candidates[0].logprobs, 16))
        assert [c.split for c in d.candidates] == [c.split for c in free[i].candidates]
        for c, whole in zip(d.candidates[1:], free[i].candidates[1:], strict=True):
            own = whole.logprobs[whole.split :]
            at = gate.stopped_at(own, floor, 16)
            if at is None:
                assert c.tokens == whole.tokens and c.finish_reason != STOPPED
                continue
            stopped += 1
            assert c.finish_reason == STOPPED and c.own_tokens == at < whole.own_tokens
            assert c.tokens == whole.tokens[: c.split + at]
            assert sum(c.logprobs[-16:]) / 16 < floor
            assert c not in voting(d.candidates)
        assert d.tokens_spent == sum(c.own_tokens for c in d.candidates)
        assert d.tokens_spent < free[i].tokens_spent or all(c.finish_reason != STOPPED for c in d.candidates)
    assert stopped > 0


def test_gate_fields_are_read_from_a_deliberate_table_and_checked(tmp_path):
    path = tmp_path / "gated.toml"
    path.write_text(
        '[deliberate]\ngate_signal = "answer_margin"\ngate_threshold = 0.4\ngate_first_alternatives = 2\n'
        "gate_branches = 1\ngate_staged = true\nrunning_stop = true\n"
    )
    config = DeliberateConfig.from_toml(path)
    assert (config.gate_signal, config.gate_threshold, config.gate_staged, config.running_stop) == (
        "answer_margin",
        0.4,
        True,
        True,
    )
    assert (config.gate_first_alternatives, config.gate_branches) == (2, 1)
    assert DeliberateConfig().gate_signal == "" and not DeliberateConfig().running_stop
    with pytest.raises(ConfigError, match="gate_signal"):
        DeliberateConfig(gate_signal="vibes")
    with pytest.raises(ConfigError, match="running_stop"):
        DeliberateConfig(running_stop=True)


def test_a_branch_inside_the_chain_is_the_spawned_branch_under_penalties(model, tiny_tokenizer, requests):
    """A gated branch runs from the prompt and the chain's first tokens, which its
    penalties count as generated, as they do for a branch spawned at that step."""
    penalised = [
        Request(r.prompt, 0, MAX_TOKENS, make_penalties(presence=0.5, frequency=0.2, repetition=1.3, prompt=r.prompt))
        for r in requests
    ]
    spawned = run(
        model, tiny_tokenizer, penalised, DeliberateConfig(first_alternatives=0, max_branch_points=3, **BRANCHING)
    )
    live = run(model, tiny_tokenizer, penalised, gated(gate_signal="lowest_group", gate_threshold=1.0, gate_branches=3))
    plain = run(model, tiny_tokenizer, requests, gated(gate_signal="lowest_group", gate_threshold=1.0, gate_branches=3))
    differ = 0
    for i, d in live.items():
        assert [c.tokens for c in d.candidates] == [c.tokens for c in spawned[i].candidates]
        assert [c.split for c in d.candidates][1:] == [c.split for c in spawned[i].candidates][1:]
        differ += [c.tokens for c in d.candidates] != [c.tokens for c in plain[i].candidates]
    assert differ  # the penalties changed the chains: the comparison above is not penalty-free


def test_a_gated_run_does_not_depend_on_the_batch_size(model, tiny_tokenizer, requests):
    config = gated(
        gate_signal="tail_logprob",
        gate_threshold=-4.0,
        gate_first_alternatives=2,
        gate_branches=2,
        gate_staged=True,
        running_stop=True,
    )
    wide = run(model, tiny_tokenizer, requests, config)
    unread = run(model, tiny_tokenizer, requests, config.replace(stop_share=1.0, first_alternatives=9))
    assert [[c.tokens for c in d.candidates] for d in unread.values()] == [
        [c.tokens for c in d.candidates] for d in wide.values()
    ]
    for size in (1, 2):
        narrow = {i: d for i, d, _ in deliberate_batch(model, tiny_tokenizer, requests, config, answer_of, size)}
        for i, d in wide.items():
            assert [c.tokens for c in narrow[i].candidates] == [c.tokens for c in d.candidates]
            assert (narrow[i].chosen, narrow[i].tokens_spent, narrow[i].prefilled) == (
                d.chosen,
                d.tokens_spent,
                d.prefilled,
            )
    assert any(c.finish_reason == STOPPED for d in wide.values() for c in d.candidates)
    assert any(len(d.candidates) > 1 for d in wide.values())


def test_run_takes_the_gate_from_a_config_file(tiny_ref, tmp_path):
    from test_cli_run import invoke

    config = tmp_path / "gated.toml"
    config.write_text(
        '[deliberate]\nfirst_alternatives = 3\ngate_signal = "tail_logprob"\ngate_threshold = 1.0\n'
        'gate_first_alternatives = 1\nselector = "confidence_vote"\nclean_first = "length"\n'
    )
    args = ["run", "hi", "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "6", "--json"]
    code, out, err = invoke(*args, "--config", config)
    assert code == 0, err
    d = json.loads(out.splitlines()[-1])["summary"]["deliberation"]
    # the gate's one first-token alternative, not first_alternatives' three, and no early
    # stop (the tiny model's card has stop_share 1)
    assert [c.get("split") for c in d["candidates"]] == [None, 0]
    assert d["tokens_spent"] == sum(c["own_tokens"] for c in d["candidates"])
