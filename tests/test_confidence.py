"""An answer's confidence: the chain's features, the fitted table's probability, and
where it is shown (run's summary and JSON, chat, the server), "uncalibrated" without one."""

import json
import math

import numpy as np
import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer, shelve
from test_cli_run import invoke

from entropix_mlx.sampling.confidence import FEATURES, AnswerConfidence, answer_end, chain_features


def test_answer_end_is_the_token_that_completes_the_last_number():
    assert answer_end(["So", " 3", " +", " 4", " =", " 1", "2", ".", "\n"]) == 6
    assert answer_end(["no", " digits", " here"]) == 2
    assert answer_end(["7"]) == 0


def test_chain_features_by_hand():
    lp = [-0.1, -2.0, -0.5, -0.05]
    h = [0.2, 3.0, 1.5, 0.1]
    v = [0.5, 4.0, 2.0, 0.3]
    f = chain_features(lp, h, v, end=2, cut_off=True)
    assert set(f) == set(FEATURES)
    assert f["log_tokens"] == pytest.approx(math.log(4))
    assert f["cut_off"] == 1.0
    assert f["logprob_mean"] == pytest.approx(-2.65 / 4)
    assert f["logprob_min"] == -2.0
    assert f["entropy_max"] == 3.0
    assert f["entropy_above_1"] == 0.5  # 3.0 and 1.5
    assert f["logprob_below_minus_1"] == 0.25
    assert f["lowest_window_16"] == pytest.approx(-2.65 / 4)  # shorter than the window: the mean
    assert f["answer_logprob"] == -2.0  # tokens 0-2
    assert f["answer_entropy"] == 3.0


def test_lowest_window_slides():
    lp = [0.0] * 20 + [-1.0] * 16 + [0.0] * 5
    assert chain_features(lp, [0.0] * 41, [0.0] * 41, 40, False)["lowest_window_16"] == pytest.approx(-1.0)


TABLE = {
    "features": ["logprob_mean", "entropy_max"],
    "mean": [-0.5, 2.0],
    "scale": [0.25, 1.0],
    "weights": [1.5, -0.8],
    "bias": -0.3,
    "threshold": 0.6,
    "fitted_on": "test",
    "date": "2026-12-08",
}


def test_probability_is_the_logistic_of_the_standardised_features():
    model = AnswerConfidence.from_table(TABLE)
    z = -0.3 + 1.5 * (-0.25 + 0.5) / 0.25 - 0.8 * (4.0 - 2.0) / 1.0
    p = model.probability({"logprob_mean": -0.25, "entropy_max": 4.0})
    assert p == pytest.approx(1 / (1 + math.exp(-z)))
    assert model.verdict(0.59) == "unsure" and model.verdict(0.6) == "likely right"
    assert AnswerConfidence.from_table(model.to_table()) == model


@pytest.mark.parametrize(
    "change, problem",
    [({"features": ["logprob_mean", "vibes"]}, "unknown features: vibes"), ({"weights": [1.0]}, "one mean")],
)
def test_a_bad_table_is_refused(change, problem):
    with pytest.raises(ValueError, match=problem):
        AnswerConfidence.from_table({**TABLE, **change})


def card_with(tmp_path, table: dict | None) -> str:
    lines = ['name = "tiny"', "[sampler]", "low_entropy = 0.5"]
    if table is not None:
        lines.append("[confidence]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path = tmp_path / "card.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def tiny_with_card(tmp_path, monkeypatch, table):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    loaded = make_loaded(
        make_tiny_model(max_position_embeddings=64), make_tiny_tokenizer(), path, card=card_with(tmp_path, table)
    )
    return shelve(monkeypatch, path, loaded)


def json_run(ref, *args):
    code, out, err = invoke("run", "-m", ref, "--json", "--max-tokens", "6", *args, "What is 2 + 2?")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    return lines[:-1], lines[-1]["summary"]


def test_run_without_a_fitted_confidence_says_uncalibrated(tiny_ref):
    _, summary = json_run(tiny_ref, "--sampler", "greedy")
    assert summary["confidence"] == {"confidence": None, "verdict": "uncalibrated"}
    code, _, err = invoke("run", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "6", "What is 2 + 2?")
    assert code == 0 and "confidence uncalibrated" in err


def test_run_reports_the_cards_confidence_of_its_own_tokens(tmp_path, monkeypatch):
    ref = tiny_with_card(tmp_path, monkeypatch, TABLE)
    tokens, summary = json_run(ref, "--sampler", "greedy")
    lp = np.array([t["logprob"] for t in tokens])
    h = np.array([t["entropy"] for t in tokens])
    z = -0.3 + 1.5 * (lp.mean() + 0.5) / 0.25 - 0.8 * (h.max() - 2.0)
    expected = 1 / (1 + math.exp(-z))
    got = summary["confidence"]
    assert got["confidence"] == pytest.approx(expected, abs=1e-4)
    assert got["verdict"] == ("likely right" if expected >= 0.6 else "unsure") and got["threshold"] == 0.6
    code, _, err = invoke("run", "-m", ref, "--sampler", "greedy", "--max-tokens", "6", "What is 2 + 2?")
    assert f"confidence {expected:.2f} ({got['verdict']})" in err


def test_the_user_sets_the_threshold_below_which_an_answer_is_unsure(tmp_path, monkeypatch):
    ref = tiny_with_card(tmp_path, monkeypatch, TABLE)
    _, summary = json_run(ref, "--sampler", "greedy")
    p = summary["confidence"]["confidence"]
    for sure_at, verdict in ((p, "likely right"), (min(1.0, p + 0.01), "unsure"), (0.0, "likely right")):
        _, summary = json_run(ref, "--sampler", "greedy", "--sure-at", str(sure_at))
        assert summary["confidence"] == {"confidence": p, "verdict": verdict, "threshold": sure_at}
    code, _, err = invoke("run", "-m", ref, "--sure-at", "1.5", "hi")
    assert code == 2 and "--sure-at" in err


def test_chat_shows_the_confidence_after_each_answer(tiny_ref):
    code, out, err = invoke("chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "4", input="hi\nagain\n")
    assert code == 0
    assert (out + err).count("confidence uncalibrated") == 2


@pytest.mark.slow  # a real HTTP server (uvicorn on a port)
def test_the_server_gives_each_choice_its_confidence_from_its_own_records(tmp_path):
    from serving import app_on_a_port, request

    from entropix_mlx.server import Engine, PrefixCache

    def post(port, body):
        raw = json.dumps(body).encode()
        status, data = request(port, "POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"})
        assert status == 200, data
        return json.loads(data)["choices"][0]

    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 6, "sampler": "greedy"}
    card = card_with(tmp_path, TABLE)
    loaded = make_loaded(make_tiny_model(), make_tiny_tokenizer(), tmp_path / "tiny.gguf", card=card)
    with app_on_a_port(Engine(loaded, PrefixCache(4, 4096))) as port:
        choice = post(port, body)
        unsure = post(port, {**body, "sure_at": 1.0})["entropix_confidence"]
        refused = request(port, "POST", "/v1/chat/completions", json.dumps({**body, "sure_at": 2}).encode(), {})
    assert unsure["verdict"] == "unsure" and unsure["threshold"] == 1.0
    assert refused[0] == 400 and json.loads(refused[1])["error"]["param"] == "sure_at"
    lp = np.array([r["logprob"] for r in choice["entropix"]])
    h = np.array([r["entropy"] for r in choice["entropix"]])
    z = -0.3 + 1.5 * (lp.mean() + 0.5) / 0.25 - 0.8 * (h.max() - 2.0)
    assert choice["entropix_confidence"]["confidence"] == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-4)
    plain = make_loaded(make_tiny_model(), make_tiny_tokenizer(), tmp_path / "plain.gguf")
    with app_on_a_port(Engine(plain, PrefixCache(4, 4096))) as port:
        assert post(port, body)["entropix_confidence"] == {"confidence": None, "verdict": "uncalibrated"}
