"""Self-consistency and CISC: k sampled answers over one prefill in the batch
engine, the votes, every k' <= k recomputed from one run's records, and the
cost of every sampler counted in eval's summary."""

import json
from pathlib import Path

import mlx.nn as nn
import pytest
from conftest import make_tiny_model

from entropix_mlx import eval as ev
from entropix_mlx.decode.rows import Request, Row
from entropix_mlx.decode.voting import vote_rows
from entropix_mlx.errors import ConfigError
from entropix_mlx.front.registry import build
from entropix_mlx.sampling.selection import confidence_weights, vote
from entropix_mlx.sampling.voting import VoteConfig


class CountingEmbedding(nn.Module):
    """The model's embedding, counting the positions that go through the model."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.positions = inner, 0

    def __call__(self, x):
        self.positions += x.size
        return self.inner(x)

    def as_linear(self, h):
        return self.inner.as_linear(h)


@pytest.fixture
def model():
    return make_tiny_model(0, tie_word_embeddings=False)


def chat(tokenizer, text):
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


def test_k_answers_share_one_prefill_and_differ(model, tiny_tokenizer):
    texts = ["a long question about apples and pears and plums " * 3, "another long question about the weather " * 3]
    prompts = [chat(tiny_tokenizer, t) for t in texts]
    prefix = ev.common_prefix(prompts)
    counter = CountingEmbedding(model.model.embed_tokens)
    model.model.embed_tokens = counter
    cfg = VoteConfig(k=4, temperature=1.0, top_p=1.0)
    requests = [Request(p, seed=i, max_tokens=10) for i, p in enumerate(prompts)]
    out = {i: r for i, r, _ in vote_rows(model, tiny_tokenizer, requests, cfg, lambda i, t: t[:1], 8, prefix)}
    assert sorted(out) == [0, 1]
    own = sum(len(p) - len(prefix) for p in prompts)
    generated = sum(s["tokens"] for r in out.values() for s in r.extra["samples"])
    # Each question's own prompt runs once (the k answers start on copies of its cache);
    # k prefills would run 4 * own positions.
    assert counter.positions <= len(prefix) + own + generated + 8
    assert 4 * own > len(prefix) + own + generated + 8
    for r in out.values():
        samples = r.extra["samples"]
        assert len(samples) == 4 and r.extra["tokens_spent"] == sum(s["tokens"] for s in samples)
        assert len({s["text"] for s in samples}) > 1  # sampled, each with its own key chain
        assert all(len(s["logprobs"]) == len(s["top"]) == s["tokens"] for s in samples)
        # the alternatives where each sample's sampler chose (a spawned sample's first token was chosen by its root)
        assert all(len(top) == 3 for s in samples for top in s["top"][1:])


def test_answers_do_not_depend_on_the_batch(model, tiny_tokenizer):
    prompts = [chat(tiny_tokenizer, t) for t in ("one", "two", "three")]
    prefix = ev.common_prefix(prompts)
    cfg = VoteConfig(k=3, temperature=1.0)
    requests = [Request(p, seed=7 + i, max_tokens=8) for i, p in enumerate(prompts)]

    def texts(batch):
        rows = vote_rows(model, tiny_tokenizer, requests, cfg, lambda i, t: None, batch, prefix)
        return {i: [s["text"] for s in r.extra["samples"]] for i, r, _ in rows}

    assert texts(3) == texts(9)


def test_samples_that_start_alike_still_go_their_own_ways():
    # The k first tokens are drawn independently, so several rows often start with the same
    # token: each still gets a key chain of its own. The first of each token keeps the seed
    # it always had (deliberate's branches, whose tokens differ, are unchanged).
    parent = Row(0, Request([1, 2, 3], seed=5, max_tokens=8), None)
    parent.split_point, parent.eos = 0, set()
    seeds = [parent.child(9, -0.1, {}, None, n, "sample", repeat).request.seed for n, repeat in enumerate((0, 1, 2))]
    assert len(set(seeds)) == 3
    assert seeds[0] == (5 * 1_000_003 + 65_537 + 9) % 2**63
    assert parent.child(9, -0.1, {}, None, 3).result.strategies == ["branch"]
    assert parent.child(9, -0.1, {}, None, 4, "sample").result.strategies == ["sample"]


def test_majority_and_confidence_votes():
    answers = ["18", "7", None, "7", "18"]
    lps = [-0.1, -0.9, -0.01, -0.8, -0.2]
    # one vote each: 18 and 7 tie 2-2; the answer given first wins; None never votes
    assert vote(answers, lps, "vote") == (0, {"18": 2.0, "7": 2.0})
    chosen, votes = vote(answers, lps, "confidence_vote", 0.1)
    assert chosen == 0 and votes["18"] > 100 * votes["7"]  # e^-1 + e^-2 against e^-9 + e^-8
    # a sure minority wins the confidence vote, not the majority one
    answers, lps = ["5", "6", "6"], [-0.05, -1.0, -1.2]
    assert vote(answers, lps, "vote")[0] == 1
    assert vote(answers, lps, "confidence_vote", 0.1)[0] == 0
    assert vote([None, None], [0.0, 0.0], "vote") == (0, {})
    with pytest.raises(ValueError, match="'lowest_group_vote' is not a vote over samples"):
        vote(answers, lps, "lowest_group_vote")  # it needs each token's log-probability
    w = confidence_weights([-0.1, -0.2], 0.1)
    assert sum(w) == pytest.approx(1.0) and w[0] / w[1] == pytest.approx(2.718281828, rel=1e-6)


def test_vote_settings_are_checked():
    with pytest.raises(ConfigError, match="'k' = 0"):
        VoteConfig(k=0)
    with pytest.raises(ConfigError, match="'selector' = 'loudest'.*choose one of: vote, confidence_vote"):
        VoteConfig(selector="loudest")
    sc = build("self_consistency", k=3)
    assert sc.config.k == 3 and sc.config.selector == "vote"
    assert build("cisc").config.selector == "confidence_vote"  # deliberate's selector of the same name
    with pytest.raises(ConfigError, match="eval baseline"):
        sc.generate(None, None, [1])


def test_cot_decoding_preset_keeps_the_largest_answer_margin(model, tiny_tokenizer):
    decoder = build("cot_decoding")
    assert decoder.name == "cot_decoding" and decoder.config.max_candidates == 10
    prompt = chat(tiny_tokenizer, "What is 7 + 5?")
    rows = list(decoder.answer_rows(model, tiny_tokenizer, [Request(prompt, 0, 8)], 1, prompt[:-1]))
    ((_, result, _),) = rows
    candidates = result.extra["candidates"]
    assert len(candidates) == 10 and all(c["split"] == 0 for c in candidates[1:])
    assert len({c["text"][:1] for c in candidates}) > 1  # started from different first tokens
    best = max(range(10), key=lambda i: candidates[i]["answer_margin"])
    assert candidates[result.extra["chosen"]]["answer_margin"] == candidates[best]["answer_margin"]
    assert result.extra["tokens_spent"] == sum(c["own_tokens"] for c in candidates)
    # every candidate keeps each token's alternatives (the rule of another selector can be recomputed)
    assert all(len(c["top"]) == len(c["logprobs"]) for c in candidates)
    assert all(len(top) == 3 for top in candidates[0]["top"])


TASKS = [ev.Task(i, q, [a]) for i, (q, a) in enumerate([("one plus one", "2"), ("two plus two", "4"), ("x", "1")])]


def test_eval_reports_every_k_and_vote_from_one_run(model, tiny_tokenizer, tmp_path):
    config = ev.EvalConfig(samplers=["greedy", "self_consistency"], max_tokens=6, batch_size=4)

    def factory(name):
        return build(name, tokenizer=tiny_tokenizer, metrics=False, k=4 if name != "greedy" else None)

    results = ev.run_eval(model, tiny_tokenizer, TASKS, config, tmp_path / "o", factory)
    rows = results["samplers"]
    assert list(rows) == [
        "greedy",
        "self_consistency k=1",
        "cisc k=1",
        "self_consistency k=2",
        "cisc k=2",
        "self_consistency k=4",
        "cisc k=4",
    ]
    records = [r for r in map(__import__("json").loads, (tmp_path / "o" / "items.jsonl").read_text().splitlines())]
    sc = [r for r in records if r["sampler"] == "self_consistency"]
    assert len(sc) == 3 and all(len(r["samples"]) == 4 for r in sc)
    # every candidate counted: k=4 spends all four samples' tokens, k=2 the first two
    assert rows["self_consistency k=4"]["tokens_generated"] == pytest.approx(sum(r["tokens_spent"] for r in sc) / 3)
    two = sum(s["tokens"] for r in sc for s in r["samples"][:2]) / 3
    assert rows["cisc k=2"]["tokens_generated"] == pytest.approx(two)
    one = [r["samples"][0] for r in sc]
    assert rows["self_consistency k=1"]["cut_off"] == pytest.approx(
        sum(s["finish_reason"] == "length" for s in one) / 3
    )
    for name, row in rows.items():
        assert {"tokens_generated", "prompt_tokens", "seconds_per_answer", "cut_off", "no_answer"} <= set(row)
        if name != "greedy":
            assert {"difference", "difference_ci95", "p_holm"} <= set(row["vs_greedy"])
    # the greedy records keep each token's log-probability and its most likely alternatives
    g = next(r for r in records if r["sampler"] == "greedy")
    assert len(g["logprobs"]) == len(g["top"]) == g["tokens"] and all(lp is not None for lp in g["logprobs"])
    assert all(len(top) == 3 and top[0][1] >= top[1][1] for top in g["top"])
    assert g["top"][0][0][0] == tiny_tokenizer.encode(g["output"])[0] or g["tokens"] == 0
    # the protocol: this was a test-split scoring, on record
    assert [s["items"] for s in results["scorings"]] == ["0-2"]
    # scoring again (resumed: nothing decoded again) adds to the log
    again = ev.run_eval(model, tiny_tokenizer, TASKS, config, tmp_path / "o", factory)
    assert len(again["scorings"]) == 2 and len((tmp_path / "o" / "items.jsonl").read_text().splitlines()) == 6
    assert {k: v["accuracy"] for k, v in again["samplers"].items()} == {k: v["accuracy"] for k, v in rows.items()}


def test_budgets_pair_items_across_limits(model, tiny_tokenizer, tmp_path):
    config = ev.EvalConfig(samplers=["greedy", "deliberate"], max_tokens=[3, 7], batch_size=4)
    factory = lambda name: build(name, tokenizer=tiny_tokenizer, metrics=False)  # noqa: E731
    results = ev.run_eval(model, tiny_tokenizer, TASKS, config, tmp_path / "b", factory)
    assert list(results["samplers"]) == ["greedy@3", "deliberate@3", "greedy@7", "deliberate@7"]
    assert "greedy@3 vs greedy@7" in results["pairs"] and "deliberate@3 vs deliberate@7" in results["pairs"]
    records = [__import__("json").loads(line) for line in (tmp_path / "b" / "items.jsonl").read_text().splitlines()]
    short = {r["index"]: r for r in records if r["sampler"] == "greedy@3"}
    long = {r["index"]: r for r in records if r["sampler"] == "greedy@7"}
    for i in short:  # greedy at the larger budget goes on from the same tokens
        assert long[i]["output"].startswith(short[i]["output"]) and short[i]["tokens"] <= 3 < long[i]["tokens"] + 1
    d3 = results["samplers"]["deliberate@3"]
    spent = [r["tokens_spent"] for r in records if r["sampler"] == "deliberate@3"]
    assert d3["tokens_generated"] == pytest.approx(sum(spent) / 3) and d3["tokens_generated"] > d3["mean_tokens"]
    # the cut-off share of the baseline is the share of answers the limit ended, and it is warned about
    g3 = results["samplers"]["greedy@3"]
    assert g3["cut_off"] == sum(r["finish_reason"] == "length" for r in short.values()) / 3
    assert any(w.startswith("greedy@3 was cut off") for w in results["warnings"]) == (g3["cut_off"] > 0.05)


def test_holm_adjustment():
    assert ev.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert ev.holm({"a": 0.5, "b": 0.9}) == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize("spread", [0.5, 3.0, 12.0])  # flat (the full sort's path) to peaked
@pytest.mark.parametrize("top_p", [0.5, 0.95])
def test_nucleus_keeps_what_mlx_lms_top_p_keeps(spread, top_p):
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_top_p

    from entropix_mlx.sampling.samplers import nucleus

    logits = mx.random.normal((1, 50_000), key=mx.random.key(7)) * spread
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    kept, expected = nucleus(logprobs, top_p) > -mx.inf, apply_top_p(logprobs, top_p) > -mx.inf
    assert mx.array_equal(kept, expected).item()
    assert 0 < kept.sum().item() < 50_000


def test_vote_rows_are_told_from_other_rows_by_name():
    from entropix_mlx.eval.summary import split_label, vote_k

    assert vote_k("self_consistency k=4") == 4 and vote_k("cisc k=12") == 12
    assert vote_k(split_label("cisc k=2@768")[0]) == 2
    for other in ("greedy", "deliberate", "deliberate k=4", "self_consistency", "cisc k=", "cisc k=4 (seed 2)"):
        assert vote_k(other) is None


RECORDS = Path(__file__).resolve().parents[1] / "docs" / "records"


def test_settings_written_with_the_earlier_vote_names_still_read():
    from entropix_mlx.eval.store import settings_changed

    assert VoteConfig.from_dict({"vote": "majority"}) == VoteConfig()
    assert VoteConfig.from_dict({"k": 4, "vote": "confidence"}) == VoteConfig(k=4, selector="confidence_vote")
    assert VoteConfig().replace(vote="confidence").selector == "confidence_vote"
    now = VoteConfig().to_dict()
    assert VoteConfig.earlier_names(now) == {**{k: v for k, v in now.items() if k != "selector"}, "vote": "majority"}
    saved = json.loads((RECORDS / "sealed_q05" / "config.json").read_text())["samplers"]["self_consistency"]
    assert saved["vote"] == "majority"  # a committed record, written before the rename
    assert not settings_changed(saved, VoteConfig().to_dict())  # a result folder of then resumes now
    assert settings_changed(saved, VoteConfig(selector="confidence_vote").to_dict())


def test_a_sealed_files_log_written_before_the_rename_knows_the_same_configuration():
    from entropix_mlx.eval.sealed import config_hash, config_hashes

    for folder in ("sealed_q05", "sealed_q15"):
        saved = json.loads((RECORDS / folder / "config.json").read_text())
        logged = [json.loads(line) for line in (RECORDS / folder / "scoring_log.jsonl").read_text().splitlines()]
        hashes = {r["config"] for e in logged for r in e["rows"] if r["sampler"] == "self_consistency"}
        read = VoteConfig.from_dict(saved["samplers"]["self_consistency"])  # the settings of then, read now
        assert read.selector == "vote"
        now = {**saved, "samplers": {**saved["samplers"], "self_consistency": read.to_dict()}}
        assert hashes and hashes <= config_hashes(now, "self_consistency")
        assert config_hash(now, "self_consistency") not in hashes  # written now, the log holds the new names
        other = read.replace(selector="confidence_vote").to_dict()
        cisc = {**now, "samplers": {"self_consistency": other}}
        assert not hashes & config_hashes(cisc, "self_consistency")  # another vote is another configuration
