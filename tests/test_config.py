"""SamplerConfig: validation with one clear message naming the field, TOML, presets, cards."""

import pytest

from entropix_mlx.errors import ConfigError
from entropix_mlx.front.registry import build
from entropix_mlx.sampling.config import SamplerConfig, load_toml, resolve_config


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("temperature", -0.5, "must be > 0"),
        ("temperature", 0.0, "must be > 0"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -1, ">= 0"),
        ("min_p", 1.0, "[0, 1)"),
        ("low_entropy", -0.1, "cannot be negative"),
        ("strategies", ("argmax", "pondering"), "unknown strategy 'pondering'"),
        ("attention_layers", "middle", '"all", "last"'),
        ("strategies", 5, "must be a list of names"),
        ("attention_layers", 5, "non-empty list of layer indices"),
        ("adaptive_samples", 0, ">= 1"),
        ("branch_rollout_tokens", 0, ">= 1"),
        ("branch_decide_tokens", -1, ">= 0"),
        ("thinking_text", "", "non-empty"),
        ("top_k", 2.5, "whole number"),
        ("temperature", "hot", "must be a number"),
    ],
)
def test_invalid_values_name_the_field(field, value, words):
    with pytest.raises(ConfigError) as e:
        SamplerConfig().replace(**{field: value})
    message = str(e.value)
    assert f"'{field}'" in message and words in message
    assert "\n" not in message


def test_thresholds_must_be_ordered():
    with pytest.raises(ConfigError, match="'medium_entropy'.*must not exceed high_entropy"):
        SamplerConfig(medium_entropy=6.0, high_entropy=5.0)


def test_unknown_setting_is_named():
    with pytest.raises(ConfigError, match="unknown sampler setting 'temprature'"):
        SamplerConfig().replace(temprature=1.0)


def test_entropix_repetition_score_read_under_its_earlier_name(tmp_path):
    # cards written before the rename call repetition_bits by llama.cpp's request parameter's name
    old = tmp_path / "old.toml"
    old.write_text("[sampler]\nrepetition_penalty = 0.5\n")
    assert load_toml(old).repetition_bits == 0.5
    assert SamplerConfig().replace(repetition_penalty=1.5).repetition_bits == 1.5
    assert "repetition_penalty" not in SamplerConfig().to_dict()
    with pytest.raises(ConfigError, match="setting .repetition_bits. = -1.0 is invalid"):
        SamplerConfig.from_dict({"repetition_penalty": -1.0})


def test_reference_defaults():
    c = SamplerConfig()
    assert (c.temperature, c.top_p, c.top_k, c.min_p, c.adaptive_samples) == (0.666, 0.90, 27, 0.03, 5)
    assert (c.low_entropy, c.low_varentropy, c.medium_entropy, c.high_entropy, c.high_varentropy) == (
        0.1,
        0.1,
        3.0,
        5.0,
        5.0,
    )


def test_toml_top_level_and_sampler_table(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text('temperature = 0.8\ntop_k = 40\nstrategies = ["argmax", "adaptive"]\nattention_layers = [-1, -2]\n')
    c = load_toml(flat)
    assert (c.temperature, c.top_k, c.strategies, c.attention_layers) == (0.8, 40, ("argmax", "adaptive"), (-1, -2))
    assert c.top_p == 0.90  # unset fields keep the preset's value
    card = tmp_path / "card.toml"
    card.write_text('name = "x"\n[sampler]\nlow_entropy = 0.5\nthinking_text = " Wait,"\n[calibration]\ntokens = 3\n')
    c = load_toml(card)
    assert (c.low_entropy, c.thinking_text) == (0.5, " Wait,")


@pytest.mark.parametrize(
    "text, words",
    [
        ("temperature = ", "not valid TOML"),
        ("temperature = -1.0", "'temperature'"),
        ("top_p = 2", "'top_p'"),
        ('strategies = ["argmax", "dance"]', "unknown strategy 'dance'"),
        ('top_k = "many"', "'top_k'"),
    ],
)
def test_bad_toml_files(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        load_toml(path)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_missing_file_and_unknown_preset(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="unknown sampler config 'wild'"):
        resolve_config(None, "wild")
    with pytest.raises(ConfigError, match="no calibrated card"):
        resolve_config("no-such-model", "calibrated")


def test_card_is_used_and_reported(tmp_path, monkeypatch):
    card = tmp_path / "m1.toml"
    card.write_text("[sampler]\nlow_entropy = 0.42\nhigh_varentropy = 7.5\n")
    monkeypatch.setattr("entropix_mlx.sampling.cards.cards_dir", lambda: tmp_path)
    cfg, source = resolve_config("m1")
    assert (cfg.low_entropy, cfg.high_varentropy) == (0.42, 7.5) and "m1.toml" in source
    cfg, source = resolve_config("m2")
    assert cfg == SamplerConfig() and "reference" in source
    cfg, source = resolve_config("m1", "reference", temperature=0.9)
    assert cfg.low_entropy == 0.1 and cfg.temperature == 0.9 and "temperature=0.9" in source
    settings = tmp_path / "settings.cfg"  # any file name: TOML over the card
    settings.write_text("temperature = 0.5\n")
    cfg, source = resolve_config("m1", str(settings))
    assert (cfg.low_entropy, cfg.temperature) == (0.42, 0.5) and "settings.cfg" in source
    sampler = build("entropix", None, "m1", top_k=None, min_p=0.05)
    assert sampler.config.low_entropy == 0.42 and sampler.config.min_p == 0.05
    assert "m1.toml" in sampler.config_source


def test_a_card_without_a_sampler_table_is_no_calibrated_card(tmp_path, monkeypatch):
    (tmp_path / "m3.toml").write_text('name = "m3"\n[deliberate]\nbudget = 2\n')
    monkeypatch.setattr("entropix_mlx.sampling.cards.cards_dir", lambda: tmp_path)
    cfg, source = resolve_config("m3")
    assert cfg == SamplerConfig() and "no model card" in source
    with pytest.raises(ConfigError, match="no calibrated card"):
        resolve_config("m3", "calibrated")


def test_make_sampler_rejects_bad_values():
    with pytest.raises(ConfigError, match="'top_p'"):
        build("temperature", top_p=0)
    with pytest.raises(ConfigError, match="'temperature'"):
        build("entropix", temperature=-1)
    with pytest.raises(ConfigError, match="unknown sampler 'magic'"):
        build("magic")


def test_the_registry_says_what_a_config_sets_and_reads_settings_without_building(tmp_path):
    from entropix_mlx.front.registry import SAMPLERS, config_sets, read_settings

    both, plain = tmp_path / "both.toml", tmp_path / "plain.toml"
    both.write_text("[sampler]\ntemperature = 0.5\n[deliberate]\nbudget = 3.0\n")
    plain.write_text("temperature = 0.5\n")
    assert [SAMPLERS[n].table for n in ("entropix", "deliberate", "deliberate_wide", "cot_decoding", "greedy")] == [
        "sampler",
        "deliberate",
        "deliberate",
        None,
        None,
    ]
    assert SAMPLERS["entropix"].presets == ("reference", "calibrated") and not SAMPLERS["deliberate"].presets
    assert [n for n, s in SAMPLERS.items() if s.votes] == ["self_consistency", "cisc"]
    assert config_sets("entropix", "reference") and config_sets("entropix", plain) and config_sets("deliberate", both)
    assert not config_sets("deliberate", plain) and not config_sets("cot_decoding", both)
    assert not config_sets("greedy", both) and not config_sets("entropix", None)
    assert read_settings("entropix", None, both, temperature=0.7, top_p=None)[0].temperature == 0.7
    assert read_settings("deliberate", None, both)[0].budget == 3.0
    assert read_settings("deliberate_margin", None)[0].selector == "continuation_margin"  # its rule over the card
    assert read_settings("greedy") is None and read_settings("cot_decoding") is None
    with pytest.raises(ConfigError, match="'top_p'"):
        read_settings("entropix", None, None, top_p=1.5)
