"""Calibration: thresholds at quantiles, atomic card writing, the card in use, the CLI."""

import tomllib

import numpy as np
import pytest
from conftest import SHELF, make_loaded, make_tiny_model, shelve

from entropix_mlx import files
from entropix_mlx.eval import calibrate as cal
from entropix_mlx.eval import tune as tuning
from entropix_mlx.front.registry import build
from entropix_mlx.sampling.cards import shipped_card
from entropix_mlx.sampling.config import SamplerConfig, load_toml
from entropix_mlx.sampling.metrics import METRIC_NAMES


def synthetic_samples(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    entropy = rng.uniform(0, 8, n)
    varentropy = entropy * 2 + rng.uniform(0, 4, n)
    other = {name: rng.uniform(0, 1, n) for name in METRIC_NAMES[2:]}
    return {"entropy": entropy, "varentropy": varentropy, **other}


def test_thresholds_sit_at_their_quantiles():
    s = synthetic_samples()
    t = cal.thresholds(s)
    for name, (metric, q) in cal.QUANTILES.items():
        if name != "think_varentropy":
            assert np.mean(s[metric] < t[name]) == pytest.approx(q, abs=0.002), name
    uncertain = s["varentropy"][s["entropy"] > t["medium_entropy"]]
    assert np.mean(uncertain < t["think_varentropy"]) == pytest.approx(cal.QUANTILES["think_varentropy"][1], abs=0.005)
    SamplerConfig().replace(**t)  # a valid config


def test_thresholds_stay_ordered_on_degenerate_data():
    s = {name: np.zeros(50) for name in METRIC_NAMES}  # a model that is always certain
    t = cal.thresholds(s)
    assert t["low_entropy"] <= t["medium_entropy"] <= t["high_entropy"]
    SamplerConfig().replace(**t)


def test_card_round_trip_keeps_user_settings_and_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.toml"
    path.write_text(
        '[sampler]\nthinking_text = " Hmm,"\nlow_entropy = 99.0\nhigh_entropy = 100.0\nmedium_entropy = 99.5\n'
    )
    samples = synthetic_samples()
    out, found, _ = cal.calibrate(None, None, "m", out=path, samples=samples)
    assert out == path and [p.name for p in tmp_path.iterdir()] == ["m.toml"]  # no temp file left
    assert path.stat().st_mode & 0o644 == 0o644  # readable like any file
    data = tomllib.loads(path.read_text())
    assert data["name"] == "m"
    assert data["sampler"]["thinking_text"] == " Hmm,"  # kept
    assert data["sampler"]["low_entropy"] == found["low_entropy"] != 99.0
    assert data["calibration"]["steps"] == 1000
    assert data["calibration"]["metrics"]["entropy"] == pytest.approx(
        np.quantile(samples["entropy"], cal.REPORTED_QUANTILES), abs=1e-4
    )
    config = load_toml(path)
    assert config.thinking_text == " Hmm," and config.high_varentropy == found["high_varentropy"]

    # A failed write leaves the old card untouched.
    before = path.read_text()
    monkeypatch.setattr(files.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        cal.write_card(path, "garbage")
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["m.toml"]


def test_calibrate_runs_a_model_and_the_sampler_uses_the_card(tmp_path, monkeypatch, tiny_tokenizer):
    floors = cal.new_model_floors()  # read from the shipped card, before the cards' folder moves
    monkeypatch.setattr("entropix_mlx.sampling.cards.cards_dir", lambda: tmp_path)
    model = make_tiny_model()
    path, found, samples = cal.calibrate(model, tiny_tokenizer, "tiny", prompts=("Hi", "Count: 1 2 3"), max_tokens=3)
    assert path == tmp_path / "tiny.toml"
    assert 1 <= len(samples["entropy"]) <= 6 and set(samples) == set(METRIC_NAMES)
    sampler = build("entropix", tiny_tokenizer, "tiny")
    assert "tiny.toml" in sampler.config_source
    assert sampler.config.low_entropy == max(found["low_entropy"], floors["low_entropy"])


def test_a_new_models_thresholds_are_its_quantiles_never_below_the_bundled_cards():
    sure = dict(low_entropy=0.7, low_varentropy=2.0, medium_entropy=1.8, high_entropy=3.7, high_varentropy=10.5)
    unsure = dict(low_entropy=2.5, low_varentropy=8.0, medium_entropy=4.0, high_entropy=6.0, high_varentropy=14.0)
    for found in (sure, unsure):
        fields = cal.new_model_fields({**found, "think_varentropy": 1.0}, 151936)
        for k, floor in cal.new_model_floors().items():
            assert fields[k] == max(found[k], floor)
        assert fields["high_varentropy"] == fields["low_varentropy"] and fields["think_varentropy"] == 0.0
        SamplerConfig().replace(**fields)  # a valid config
    assert cal.new_model_rules()["low_varentropy"] == "varentropy q0.45, at least 6.3016"


def test_bundled_card_is_committed_and_valid():

    path = shipped_card("smollm2-135m")
    data = tomllib.loads(path.read_text())
    config = load_toml(path)
    assert set(cal.QUANTILES) <= set(data["sampler"])
    assert data["calibration"]["prompts"] == len(cal.PROMPTS) and data["calibration"]["steps"] > 200
    assert config.thinking_text == data["sampler"]["thinking_text"]


def test_cli_calibrate_writes_the_card(tmp_path, monkeypatch, tiny_tokenizer, capsys):
    from entropix_mlx.cli.app import main

    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")  # a file the CLI resolves; the shelf holds the model loaded from it
    ref = shelve(monkeypatch, path, make_loaded(make_tiny_model(), tiny_tokenizer, path))
    monkeypatch.setattr(cal, "PROMPTS", ("Hello",))
    out = tmp_path / "card.toml"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "-m", ref, "--out", str(out), "--max-tokens", "2"], shelf=SHELF)
    assert e.value.code == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert load_toml(out).low_entropy >= 0
    assert out.read_text().startswith("# Model card for tiny: written by `entropix-mlx calibrate`;")


def test_cli_calibrate_unknown_model_is_one_line(capsys):
    from entropix_mlx.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", "no/such-model-here.gguf"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: ") and "\n" not in err


def test_recalibrating_keeps_the_cards_other_tables(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        'name = "m"\n\n[sampler]\nlow_entropy = 1.0\nmedium_entropy = 2.0\nhigh_entropy = 3.0\nrepetition_penalty = 3.0\n\n'
        "[calibration]\nsteps = 5\n\n[calibration.metrics]\nentropy = [1.0]\n\n"
        '# how the settings were chosen\n[tuning]\nchosen = "b"\n\n[[tuning.trials]]\nname = "a"\ndev_accuracy = 0.4\n\n'
        '[[tuning.trials]]\nname = "b"\ndev_accuracy = 0.5\n\n[deliberate]\nwidth = 4\n'
    )
    cal.calibrate(None, None, "m", out=path, samples=synthetic_samples())
    text = path.read_text()
    data = tomllib.loads(text)
    assert data["tuning"] == {
        "chosen": "b",
        "trials": [{"name": "a", "dev_accuracy": 0.4}, {"name": "b", "dev_accuracy": 0.5}],
    }
    assert data["deliberate"] == {"width": 4}
    assert "# how the settings were chosen\n[tuning]" in text
    # a tuned setting, kept, under its name now (the card had the earlier one)
    assert data["sampler"]["repetition_bits"] == 3.0 and "repetition_penalty" not in data["sampler"]
    assert data["calibration"]["steps"] == 1000 and text.count("[calibration]") == 1


# -- tuning on the dev split ---------------------------------------------------------------


def _trial(name, accuracy, share, loops=0, logprob=-1.0, **overrides):
    return {
        "name": name,
        "accuracy": accuracy,
        "overrides": overrides,
        "wins": 1,
        "losses": 0,
        "ties": 2,
        "p": 1.0,
        "open": {
            "repeated_4gram_share": share,
            "longest_loop": 12 if loops else 4,
            "loops": loops,
            "mean_logprob": logprob,
            "early_endings": 0,
        },
    }


def test_choose_takes_the_best_dev_accuracy_among_acceptable_open_text():
    greedy = _trial("greedy", 0.40, 0.10, logprob=-0.7)
    min_p = _trial("min_p", 0.0, 0.05, logprob=-1.0)
    trials = [
        _trial("loops", 0.50, 0.04, loops=1),  # best accuracy, but a 12-token loop
        _trial("repeats", 0.48, 0.06),  # more than half greedy's repetition
        _trial("incoherent", 0.47, 0.01, logprob=-1.2),  # less likely text than min_p's
        _trial("a", 0.41, 0.02),
        _trial("b", 0.45, 0.05),
        _trial("c", 0.45, 0.01),
    ]
    assert [tuning.acceptable(t, greedy, min_p) for t in trials] == [False, False, False, True, True, True]
    assert tuning.choose(trials, greedy, min_p)["name"] == "b"  # the first of the two best
    assert tuning.choose(trials[:3], greedy, min_p)["name"] == "loops"  # none acceptable: best accuracy


def test_tuned_card_text_sets_sampler_fields_and_replaces_tuning():
    text = (
        '# card\nname = "m"\n\n[sampler]\nlow_entropy = 1.0\nargmax_margin = 0.0\n\n'
        '[calibration]\nsteps = 5\n\n# old\n[tuning]\nchosen = "x"\n\n[[tuning.trials]]\nname = "x"\n\n'
        "[deliberate]\nwidth = 4\n"
    )
    new = tuning.tuned_card_text(
        text, {"argmax_margin": 3.0, "strategies": ("argmax", "adaptive")}, '[tuning]\nchosen = "y"'
    )
    data = tomllib.loads(new)
    assert data["sampler"] == {"low_entropy": 1.0, "argmax_margin": 3.0, "strategies": ["argmax", "adaptive"]}
    assert data["tuning"] == {"chosen": "y"} and data["deliberate"] == {"width": 4}
    assert data["calibration"]["steps"] == 5 and "# old" not in new and new.startswith("# card\n")


@pytest.mark.slow
def test_tune_on_a_tiny_model_writes_the_chosen_settings_and_every_trial(tmp_path, monkeypatch, tiny_tokenizer):
    path = tmp_path / "tiny.toml"
    path.write_text('[sampler]\nthinking_text = " ..."\n')  # an existing card: recalibrated, not new-model defaults
    cal.calibrate(None, None, "tiny", out=path, samples=synthetic_samples())
    path.write_text(path.read_text() + "\n[deliberate]\nwidth = 4\n")
    monkeypatch.setattr(tuning, "PROMPTS", ("Write a poem.", "Hi"))  # tuning's open prompts
    candidates = (("card", {}), ("margin", {"argmax_margin": 2.5, "strategies": ["argmax", "adaptive"]}))
    seen = []
    chosen, trials, greedy, min_p = tuning.tune(
        make_tiny_model(), tiny_tokenizer, "tiny", path, candidates, limit=3, progress=seen.append
    )
    assert seen == ["greedy", "min_p", "card", "margin"]
    assert [t["name"] for t in trials] == ["card", "margin"]
    for t in trials:
        assert len(t["correct"]) == 3 and t["wins"] + t["losses"] + t["ties"] == 3
        assert 0.0 <= t["open"]["repeated_4gram_share"] <= 1.0 and t["open"]["mean_logprob"] <= 0.0
    data = tomllib.loads(path.read_text())
    assert data["tuning"]["chosen"] == chosen["name"] and data["tuning"]["items"] == 3
    assert data["tuning"]["open_prompts"] == 2  # both: the limit is above them
    assert [t["name"] for t in data["tuning"]["trials"]] == ["card", "margin"]
    assert data["tuning"]["trials"][1]["overrides"] == {"argmax_margin": 2.5, "strategies": ["argmax", "adaptive"]}
    assert data["deliberate"] == {"width": 4}
    config = load_toml(path)
    expected = SamplerConfig().replace(**chosen["overrides"])
    assert config.argmax_margin == expected.argmax_margin and config.strategies == expected.strategies
    # Tuning again replaces the [tuning] table instead of adding a second one; the
    # trials it did not repeat stay on record as earlier ones, with their date. A
    # limit shortens the open text as well as the dev items.
    tuning.tune(make_tiny_model(), tiny_tokenizer, "tiny", path, candidates[:1], limit=1)
    data = tomllib.loads(path.read_text())
    assert data["tuning"]["items"] == 1 and data["tuning"]["open_prompts"] == 1
    assert [t["name"] for t in data["tuning"]["trials"]] == ["card"] and data["sampler"]["argmax_margin"] == 0.0
    assert [t["name"] for t in data["tuning"]["earlier"]] == ["margin"]
    assert data["tuning"]["earlier"][0]["accuracy"] == trials[1]["accuracy"]
    assert data["tuning"]["earlier"][0]["date"] == data["tuning"]["date"]
    tuning.tune(make_tiny_model(), tiny_tokenizer, "tiny", path, candidates[1:], limit=2)
    data = tomllib.loads(path.read_text())
    assert [t["name"] for t in data["tuning"]["earlier"]] == ["card"]  # "margin" ran again: a trial now


@pytest.mark.slow
def test_cli_calibrate_tune(tmp_path, monkeypatch, tiny_tokenizer, capsys):
    from entropix_mlx.cli.app import main

    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")  # a file the CLI resolves; the shelf holds the model loaded from it
    ref = shelve(monkeypatch, path, make_loaded(make_tiny_model(), tiny_tokenizer, path))
    monkeypatch.setattr(cal, "PROMPTS", ("Hello",))  # calibration's, read when the CLI runs
    monkeypatch.setattr(tuning, "PROMPTS", ("Hello",))  # tuning's, bound at import
    monkeypatch.setattr(tuning, "TUNE_CANDIDATES", (("card", {}), ("no-think", {"strategies": tuning.NO_THINK})))
    out = tmp_path / "card.toml"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "-m", ref, "--out", str(out), "--max-tokens", "2", "--tune", "--limit", "2"], shelf=SHELF)
    assert e.value.code == 0
    printed = capsys.readouterr().out
    assert "no-think" in printed and "chose " in printed
    assert [t["name"] for t in tomllib.loads(out.read_text())["tuning"]["trials"]] == ["card", "no-think"]

    # --keep-thresholds: the card's thresholds stay as they are (here: edited by hand).
    text = out.read_text().replace("high_entropy = ", "high_entropy = 99.0 #", 1)
    out.write_text(text)
    monkeypatch.setattr(tuning, "TUNE_CANDIDATES", (("margin-2", {"argmax_margin": 2.0}), ("margin-3", {})))
    with pytest.raises(SystemExit) as e:
        main(
            ["calibrate", "-m", ref, "--out", str(out), "--tune", "--keep-thresholds", "--only", "-2", "--limit", "2"],
            shelf=SHELF,
        )
    assert e.value.code == 0
    data = tomllib.loads(out.read_text())
    assert data["sampler"]["high_entropy"] == 99.0 and data["sampler"]["argmax_margin"] == 2.0
    assert [t["name"] for t in data["tuning"]["trials"]] == ["margin-2"]
    assert {t["name"] for t in data["tuning"]["earlier"]} == {"card", "no-think"}


@pytest.mark.slow  # loads the real model before it looks for the card
def test_keep_thresholds_needs_tune_and_a_card(tmp_path, capsys):
    from entropix_mlx.cli.app import main

    for args in (["--keep-thresholds"], ["--tune", "--keep-thresholds"]):
        with pytest.raises(SystemExit) as e:
            main(["calibrate", "--out", str(tmp_path / "none.toml"), *args])
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "apply with --tune only" in err and "does not exist" in err
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--out", str(tmp_path / "none.toml"), "--tune", "--only", "no such trial"])
    assert e.value.code == 2 and "no tuning candidate's name contains 'no such trial'" in capsys.readouterr().err
