"""Honest seeds and legends: a sampler that gives the same answer for every seed
says so in its header, and a legend lists only the strategies the card can choose."""

import pytest
from test_cli_run import invoke

from entropix_mlx.front.registry import build, deterministic, legend, sampler_legend
from entropix_mlx.sampling.config import SamplerConfig
from entropix_mlx.sampling.strategies import max_entropy


@pytest.mark.parametrize(
    "name, overrides, expected",
    [
        ("greedy", {}, True),
        ("deliberate", {}, True),
        ("temperature", {"temperature": 0.0}, True),
        ("temperature", {}, False),
        ("min_p", {}, False),
        ("entropix", {}, False),
    ],
)
def test_which_samplers_are_deterministic(tiny_tokenizer, name, overrides, expected):
    assert deterministic(build(name, tiny_tokenizer, **overrides)) is expected


def test_a_deterministic_sampler_says_so_instead_of_a_seed(tiny_ref):
    for sampler in ("greedy", "deliberate"):
        code, _, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", sampler, "--max-tokens", "2", "--seed", "5")
        header = next(line for line in err.splitlines() if "sampler" in line)
        assert code == 0 and "deterministic" in header and "seed 5" not in header, header
    code, _, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", "min_p", "--max-tokens", "2", "--seed", "5")
    assert code == 0 and "seed 5" in err.splitlines()[0] and "deterministic" not in err


def test_the_seed_changes_a_sampling_answer(tiny_ref):
    answers = set()
    for seed in range(4):
        code, out, _ = invoke(
            "run", "hi", "-m", tiny_ref, "--sampler", "temperature", "--temperature", "50", "--seed", str(seed),
            "--max-tokens", "8", "--json",
        )  # fmt: skip
        answers.add(tuple(line for line in out.splitlines() if '"summary"' not in line))
    assert len(answers) > 1


def test_the_legend_leaves_out_strategies_the_card_gives_no_step():
    full = SamplerConfig()  # the reference preset: every strategy can fire
    assert legend("entropix", full, 49152) == ["argmax", "think", "branch", "resample", "adaptive"]
    card = full.replace(
        strategies=("argmax", "think", "branch", "resample", "adaptive"),
        think_varentropy=0.0,  # no varentropy is below 0
        high_entropy=max_entropy(49152),  # branch takes every high-varentropy step below the maximum
        high_varentropy=6.0,
        low_varentropy=6.0,
    )
    assert legend("entropix", card, 49152) == ["argmax", "branch", "adaptive"]
    assert legend("entropix", card, 10**6) == ["argmax", "branch", "resample", "adaptive"]
    assert legend("entropix", card.replace(strategies=("argmax",)), 49152) == ["argmax", "adaptive"]


def test_the_bundled_cards_legend(tiny_tokenizer):
    sampler = build("entropix", tiny_tokenizer, card="smollm2-135m")
    assert sampler_legend(sampler, 49152) == ["argmax", "branch", "adaptive"]
    assert sampler_legend(build("entropix", tiny_tokenizer, config="reference"), 49152) == [
        "argmax",
        "think",
        "branch",
        "resample",
        "adaptive",
    ]
