"""Entropix's reasoning profile: a card's [reasoning] table (else the default
one) over its [sampler] settings, chosen by `--reasoning`, `eval --cot`, a
server request's `reasoning` field and the Python API's `reasoning=True`."""

import json

import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer
from test_cli_run import invoke, one_error_line

from entropix_mlx.errors import ConfigError
from entropix_mlx.front.registry import SAMPLER_NAMES, build
from entropix_mlx.sampling.config import REASONING, SamplerConfig, reasoning_profile, resolve_config


@pytest.fixture
def cards(tmp_path, monkeypatch):
    monkeypatch.setattr("entropix_mlx.sampling.cards.cards_dir", lambda: tmp_path)
    (tmp_path / "plain.toml").write_text("[sampler]\nlow_entropy = 0.42\nrepetition_penalty = 2.0\n")
    (tmp_path / "own.toml").write_text(
        "[sampler]\nlow_entropy = 0.42\nrepetition_penalty = 2.0\n[reasoning]\nrepetition_ngram = 7\n"
    )
    return tmp_path


def test_the_default_profile_changes_the_card_it_lies_over(cards):
    plain, _ = resolve_config("plain")
    reasoned, source = resolve_config("plain", reasoning=True)
    assert any(getattr(plain, k) != v for k, v in REASONING.items())  # it changes something
    assert all(getattr(reasoned, k) == v for k, v in REASONING.items())
    assert reasoned.low_entropy == 0.42  # the card's other settings stay
    assert "plain.toml" in source and "default reasoning profile" in source


def test_a_cards_own_table_replaces_the_default(cards):
    cfg, source = resolve_config("own", reasoning=True)
    assert cfg.repetition_ngram == 7 and cfg.repetition_bits == 2.0 and "[reasoning] of own.toml" in source
    assert resolve_config("own")[0].repetition_ngram == SamplerConfig().repetition_ngram  # only when asked


def test_a_config_files_table_wins_and_overrides_come_last(cards, tmp_path):
    given = tmp_path / "mine.toml"
    given.write_text("[sampler]\ntemperature = 0.5\n[reasoning]\nrepetition_ngram = 9\n")
    cfg, source = resolve_config("own", str(given), reasoning=True, repetition_ngram=4)
    assert (cfg.temperature, cfg.repetition_ngram) == (0.5, 4) and "mine.toml" in source
    assert reasoning_profile("own", str(given)) == ({"repetition_ngram": 9}, "[reasoning] of mine.toml")
    assert reasoning_profile("plain") == (REASONING, "the default reasoning profile")


def test_a_bad_reasoning_table_is_one_line_naming_the_setting(cards):
    (cards / "bad.toml").write_text("[sampler]\n[reasoning]\nrepetition_ngram = 0\n")
    with pytest.raises(ConfigError, match="'repetition_ngram'") as e:
        resolve_config("bad", reasoning=True)
    assert "\n" not in str(e.value)
    (cards / "typo.toml").write_text("[sampler]\n[reasoning]\nrepetition_ngrams = 4\n")
    with pytest.raises(ConfigError, match="unknown sampler setting 'repetition_ngrams'"):
        resolve_config("typo", reasoning=True)


def test_only_entropix_and_deliberate_have_a_reasoning_setting(cards):
    assert all(getattr(build("entropix", card="plain", reasoning=True).config, k) == v for k, v in REASONING.items())
    with pytest.raises(ConfigError, match="the greedy sampler has no reasoning setting"):
        build("greedy", reasoning=True)
    with pytest.raises(ConfigError, match="the deliberate_staged sampler has no reasoning setting"):
        build("deliberate_staged", reasoning=True)


def test_deliberate_reasons_with_the_cards_table_else_the_default_and_a_config_file_wins(cards, tmp_path):
    from entropix_mlx.sampling.deliberate_config import shipped_reasoning

    DELIBERATE_REASONING = shipped_reasoning()

    plain = build("deliberate", card="plain").config
    reasoned = build("deliberate", card="plain", reasoning=True)
    assert all(getattr(reasoned.config, k) == v for k, v in DELIBERATE_REASONING.items())
    assert reasoned.config != plain and "the default reasoning setting" in reasoned.config_source
    (cards / "own.toml").write_text(
        "[sampler]\n[deliberate]\nbudget = 5.0\n[deliberate_reasoning]\nfirst_alternatives = 2\n"
    )
    own = build("deliberate", card="own", reasoning=True).config
    assert own.first_alternatives == 2 and own.budget == 5.0 and own.first_stage == plain.first_stage
    given = tmp_path / "mine.toml"
    given.write_text("[deliberate]\nfirst_alternatives = 3\n")
    assert (
        build("deliberate", card="own", config=given, reasoning=True).config
        == build("deliberate", card="own", config=given).config
    )


NO_REASONING = "the greedy sampler has no reasoning setting; drop reasoning or choose entropix or deliberate"


def test_run_and_chat_refuse_reasoning_for_another_sampler_before_the_model_loads():
    for command in (["run", "Hi"], ["chat"]):
        code, _, err = invoke(*command, "--sampler", "greedy", "--reasoning", "-m", "/nowhere/model.gguf")
        assert code == 2 and NO_REASONING in one_error_line(err), err


def test_temperature_0_hands_a_reasoning_request_to_greedy_without_reasoning():
    from entropix_mlx.front import choose

    choice = choose("entropix", {"temperature": 0})
    assert choice.name == "greedy" and choice.reasons(True) is False  # the asked sampler has one: no error
    assert choose("deliberate").reasons(True) is True and choose("entropix").reasons(False) is False
    with pytest.raises(ConfigError, match="the min_p sampler has no reasoning setting"):  # the asked one has none
        choose("min_p", {"temperature": 0}).reasons(True)


def test_a_chat_session_that_reasons_refuses_a_switch_to_a_sampler_without_reasoning(tiny_ref):
    code, out, err = invoke(
        "chat",
        "-m",
        tiny_ref,
        "--sampler",
        "entropix",
        "--reasoning",
        "--max-tokens",
        "2",
        input="/sampler greedy\n/sampler\n",
    )
    assert code == 0, err
    assert f"error: {NO_REASONING}" in out and "sampler: entropix; give a name" in out  # the session goes on


def test_the_python_api_refuses_reasoning_for_another_sampler():
    import entropix_mlx

    with pytest.raises(ConfigError, match=NO_REASONING):
        entropix_mlx.make_sampler("greedy", reasoning=True)


@pytest.mark.slow
def test_the_api_takes_reasoning(monkeypatch):
    import entropix_mlx

    model, tokenizer = entropix_mlx.load()
    sampler = entropix_mlx.make_sampler("entropix", model=model, reasoning=True)
    assert all(getattr(sampler.config, k) == v for k, v in REASONING.items())
    assert "reasoning profile" in sampler.config_source


def test_a_request_asks_for_the_profile():
    from entropix_mlx.server import Engine, PrefixCache
    from entropix_mlx.server.app import Server
    from entropix_mlx.server.schema import APIError, parse

    engine = Engine(make_loaded(make_tiny_model(), make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 4096))
    try:
        server = Server(engine)
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        (job,), notes = server._prepare(parse({**body, "reasoning": True}, True, SAMPLER_NAMES), chat=True)
        assert all(getattr(job.sampler.config, k) == v for k, v in REASONING.items()) and notes == []
        assert job.recipe["reasoning"] is True  # a follower rank rebuilds the same sampler
        (job,), _ = server._prepare(parse(body, True, SAMPLER_NAMES), chat=True)
        assert job.sampler.config == resolve_config("tiny")[0]  # not asked: the card's settings
        with pytest.raises(APIError) as e:
            server._prepare(parse({**body, "reasoning": True, "sampler": "greedy"}, True, SAMPLER_NAMES), True)
        assert e.value.status == 400 and e.value.body()["error"]["param"] == "reasoning"
        assert NO_REASONING in e.value.message
        with pytest.raises(APIError) as e:
            parse({**body, "reasoning": "yes"}, True, SAMPLER_NAMES)
        assert e.value.status == 400 and e.value.body()["error"]["param"] == "reasoning"
    finally:
        engine.close()


def test_eval_cot_uses_the_profile_unless_told_not_to(tiny_ref, tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    item = {"question": "3 + 4?", "answer": "#### 7", "prompt": "Q: {question}"}  # short: a 64-token context
    gsm.write_text(json.dumps(item) + "\n")
    common = ["eval", gsm, "--cot", "-m", tiny_ref, "--samplers", "entropix", "--max-tokens", "3"]
    for extra, folder, reasoned in (([], "cot", True), (["--no-reasoning"], "plain", False)):
        code, _, err = invoke(*common, *extra, "--out", tmp_path / folder)
        assert code == 0, err
        settings = json.loads((tmp_path / folder / "config.json").read_text())["samplers"]["entropix"]
        assert all(settings[k] == v for k, v in REASONING.items()) is reasoned
    code, _, err = invoke("eval", gsm, "--cot", "-m", tiny_ref, "--samplers", "greedy,min_p", "--reasoning")
    assert code == 2 and "none of greedy, min_p has a reasoning setting; drop reasoning" in one_error_line(err)


def test_run_eval_and_the_server_reason_with_one_deliberate_setting(tiny_ref, tmp_path):
    """What `run --reasoning --sampler deliberate` runs is eval's deliberate row with
    --reasoning, and the server's with "reasoning": true."""
    from entropix_mlx.server import Engine, PrefixCache
    from entropix_mlx.server.app import Server
    from entropix_mlx.server.schema import parse

    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(json.dumps({"question": "3 + 4?", "answer": "#### 7", "prompt": "Q: {question}"}) + "\n")
    code, _, err = invoke(
        "eval", gsm, "--cot", "-m", tiny_ref, "--samplers", "deliberate", "--max-tokens", "3", "--out", tmp_path / "e"
    )
    assert code == 0, err
    row = json.loads((tmp_path / "e" / "config.json").read_text())["samplers"]["deliberate"]
    code, out, err = invoke(
        "run", "3 + 4?", "-m", tiny_ref, "--sampler", "deliberate", "--reasoning", "--max-tokens", "3", "--json"
    )
    assert code == 0, err
    ran = json.loads(out.strip().splitlines()[-1])["summary"]["deliberation"]
    engine = Engine(make_loaded(make_tiny_model(), make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 4096))
    try:
        body = {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "reasoning": True,
            "sampler": "deliberate",
        }
        (job,), notes = Server(engine)._prepare(parse(body, True, SAMPLER_NAMES), chat=True)
    finally:
        engine.close()
    from entropix_mlx.sampling.answers import chain_of_thought_answer
    from entropix_mlx.sampling.deliberate_config import shipped_reasoning

    DELIBERATE_REASONING = shipped_reasoning()

    served = job.sampler.config.to_dict()
    assert notes == [] and all(served[k] == v for k, v in DELIBERATE_REASONING.items())
    assert job.sampler.answer_of is chain_of_thought_answer  # its candidates read as eval's row reads them
    assert {k: row[k] for k in DELIBERATE_REASONING} == {k: served[k] for k in DELIBERATE_REASONING}
    assert ran["branches"] >= 1
    code, _, err = invoke(
        "run", "3 + 4?", "-m", tiny_ref, "--sampler", "deliberate", "--reasoning", "--max-tokens", "3"
    )
    assert code == 0 and "+ the default reasoning setting" in err.splitlines()[0]


# Texts a chain of thought ends with: three ways of writing 1000 and one other answer.
COT_ENDINGS = [
    "I think it is 999 boxes.",
    "So 250 * 4 = \\boxed{1,000}. So 3 boxes.",
    "The answer is 1000.",
    "Each holds 1{,}000: \\boxed{1{,}000}",
]


def cot_candidates(answer_of) -> list:
    """The greedy answer (999) surer than each branch, the three branches one answer between them."""
    from entropix_mlx.sampling.selection import Candidate

    return [
        Candidate(
            row=i,
            parent=None if i == 0 else 0,
            split=None if i == 0 else 0,
            tokens=[1],
            text=text,
            answer=answer_of(text),
            logprobs=[lp],
            margins=[0.0],
            finish_reason="eos",
            own_tokens=1,
            mean_logprob=lp,
        )
        for i, (text, lp) in enumerate(zip(COT_ENDINGS, [-0.1, -0.15, -0.15, -0.15], strict=True))
    ]


def test_a_reasoning_deliberate_reads_and_picks_a_chain_of_thoughts_answer_as_eval_does(cards):
    from entropix_mlx.eval.scoring import score
    from entropix_mlx.eval.tasks import Task
    from entropix_mlx.sampling.selection import select

    reasoned, plain = build("deliberate", card="plain", reasoning=True), build("deliberate", card="plain")
    number = Task(0, "How many?", ["1000"])
    by_eval = [score(t, number, cot=True)[0] for t in COT_ENDINGS]
    assert [reasoned.answer_of(t) for t in COT_ENDINGS] == by_eval == ["999", "1000", "1000", "1000"]
    assert [plain.answer_of(t) for t in COT_ENDINGS] == ["999", "3", "1000", "000"]  # the last number, unchanged
    cfg = reasoned.config
    rule = (cfg.selector, cfg.margin, cfg.clean_first, cfg.vote_temperature, cfg.group_tokens)
    chosen, _, scores = select(cot_candidates(reasoned.answer_of), *rule)
    assert set(scores) == {"999", "1000"} and chosen != 0  # the three 1000s outvote the surer 999
    by_eval_chosen, _, by_eval_scores = select(cot_candidates(lambda t: score(t, number, cot=True)[0]), *rule)
    assert (chosen, scores) == (by_eval_chosen, by_eval_scores)
    assert select(cot_candidates(plain.answer_of), *rule)[0] == 0  # read by their last numbers, 999 stays


@pytest.mark.parametrize(
    "prompt,answer,expected",
    [
        ("Solve it step by step: 3 + 4?", "7", True),
        ("How many apples? Show your work.", "Some apples.", True),
        ("Think it through: which is larger?", "", True),
        ("3 + 4?", "3 plus 4 makes 7.\nSo $\\boxed{7}$.", True),
        ("3 + 4?", "We add 3 and 4.\nThat is 7.\nAnswer: 7", True),
        ("3 + 4?", "Adding them:\n**Final Answer**: 7", True),
        ("3 + 4?", "\\boxed{7}", True),
        ("Write a haiku about rain.", "Soft rain on the roof\nthe gutters sing\nmorning smells of earth", False),
        ("What is the capital of France?", "Answer: Paris", False),  # one line: a short answer
        ("List the steps to bake bread.", "1. Mix.\n2. Knead.\n3. Bake.", False),
        ("3 + 4?", "The boxed{7} answer is 7.\nDone.", False),
        ("3 + 4?", "Answer: 7\nIt is a small number.", False),  # the answer line is not the end
        ("", "", False),
    ],
)
def test_what_reads_as_a_chain_of_thought(prompt, answer, expected):
    from entropix_mlx.sampling.answers import looks_like_chain_of_thought

    assert looks_like_chain_of_thought(prompt, answer) is expected


def hints(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("hint: this looks like a chain of thought")]


def test_run_hints_at_the_reasoning_switch_once_and_not_with_it(tiny_ref):
    asks = ["run", "-m", tiny_ref, "3 + 4, step by step", "--max-tokens", "3"]
    code, out, err = invoke(*asks)
    assert code == 0, err
    (hint,) = hints(err)
    assert "--reasoning sets entropix" in hint and "--reasoning --sampler deliberate sets deliberate" in hint
    assert err.index("stopped: ") < err.index(hint) and not hints(out)  # after the summary, never in the answer
    for extra in (["--reasoning"], ["--sampler", "deliberate", "--reasoning"], ["--json"]):
        code, out, err = invoke(*asks, *extra)
        assert code == 0 and not hints(err) and not hints(out), err
    code, _, err = invoke("run", "-m", tiny_ref, "3 + 4?", "--max-tokens", "3")
    assert code == 0 and not hints(err)
    # from a sampler without the switch, the hint names the sampler that has it
    code, _, err = invoke(*asks, "--sampler", "greedy")
    assert code == 0 and "--sampler entropix --reasoning sets entropix" in hints(err)[0]


def test_chat_hints_once_a_session(tiny_ref):
    script = "2 + 2 step by step\n/reset\n2 + 2 step by step\n"
    code, out, err = invoke("chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "2", input=script)
    assert code == 0, err
    assert len(hints(out)) == 1 and out.count("stopped: ") == 2
    code, out, err = invoke("chat", "-m", tiny_ref, "--reasoning", "--max-tokens", "2", input=script)
    assert code == 0 and not hints(out), err


def test_the_server_answers_reasoning_for_another_sampler_with_a_400_error_object():
    from starlette.testclient import TestClient

    from entropix_mlx.server import Engine, PrefixCache
    from entropix_mlx.server.app import create_app

    engine = Engine(make_loaded(make_tiny_model(), make_tiny_tokenizer(), "tiny.gguf"), PrefixCache(4, 4096))
    try:
        client = TestClient(create_app(engine))
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "reasoning": True}
        for path, extra in (("/v1/chat/completions", {}), ("/v1/chat/completions", {"stream": True})):
            r = client.post(path, json={**body, **extra, "sampler": "greedy"})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "reasoning" and NO_REASONING in error["message"]
        r = client.post(
            "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "reasoning": True, "sampler": "min_p"}
        )
        assert r.status_code == 400 and "the min_p sampler has no reasoning setting" in r.json()["error"]["message"]
        assert client.post("/v1/chat/completions", json={**body, "sampler": "entropix"}).status_code == 200
    finally:
        engine.close()
