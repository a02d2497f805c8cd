"""Honest seeds and legends: a sampler that gives the same answer for every seed
says so in its header, and a legend lists only the strategies the card can choose."""

import json

import pytest
from test_cli_run import invoke

from entropix_mlx.front.registry import build, deterministic, legend, same_for_every_seed, sampler_legend
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


# A card like the bundled one, set to branch at every step: branching by confidence
# takes the likeliest tokens and rolls them out greedily, so nothing is drawn.
BRANCHING = SamplerConfig().replace(
    strategies=("argmax", "branch", "adaptive"),
    branch_select="confidence",
    low_entropy=0.0,
    low_varentropy=0.0,
    high_varentropy=0.0,
    high_entropy=max_entropy(259),
    think_varentropy=0.0,
)


def _tokens(tiny_tokenizer, seed: int, path_choice: int = 0) -> list[int]:
    from conftest import make_tiny_model

    from entropix_mlx.decode.generate import generate
    from entropix_mlx.sampling.entropix import EntropixSampler

    sampler = EntropixSampler(BRANCHING, tiny_tokenizer)
    sampler.path_choice = path_choice
    sampler.reset()
    generation = generate(make_tiny_model(3), tiny_tokenizer, [5, 6, 7], sampler, max_tokens=8, seed=seed)
    events = list(generation)
    assert {e.strategy for e in events} == {"branch"}
    return [e.token for e in events]


def test_entropix_choices_take_other_branch_paths_where_seeds_change_nothing(tiny_tokenizer):
    # Why n choices of the bundled card were one answer: its steps draw nothing, so seeds alone agree.
    assert _tokens(tiny_tokenizer, 1) == _tokens(tiny_tokenizer, 7) == _tokens(tiny_tokenizer, 1, path_choice=0)
    choices = [_tokens(tiny_tokenizer, 1, path_choice=i) for i in range(4)]
    assert len({tuple(c) for c in choices}) == 4
    assert same_for_every_seed(build("entropix", tiny_tokenizer, config=BRANCHING), {"argmax": 3, "branch": 5})
    assert not same_for_every_seed(build("entropix", tiny_tokenizer, config=BRANCHING), {"adaptive": 1})


def test_the_header_names_the_steps_the_seed_draws_at_and_the_end_says_when_none_did(tiny_ref, tmp_path):
    config = tmp_path / "branching.toml"
    config.write_text(
        "[sampler]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in BRANCHING.to_dict().items() if k in BRANCHING_KEYS)
    )
    code, out, err = invoke("run", "hi", "-m", tiny_ref, "--config", config, "--max-tokens", "3", "--seed", "4")
    header = next(line for line in err.splitlines() if "sampler" in line)
    assert code == 0 and "seed 4 (used at adaptive steps)" in header, err
    assert "no token drawn: every seed gives this answer" in err
    code, out, _ = invoke("run", "hi", "-m", tiny_ref, "--config", config, "--max-tokens", "3", "--json")
    assert code == 0 and json.loads(out.splitlines()[-1])["summary"]["deterministic"] is True
    for sampler, expected in (("greedy", True), ("min_p", False)):
        code, out, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", sampler, "--max-tokens", "3", "--json")
        assert code == 0 and json.loads(out.splitlines()[-1])["summary"]["deterministic"] is expected, err
    code, _, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", "min_p", "--max-tokens", "3")
    assert code == 0 and "every seed gives" not in err


BRANCHING_KEYS = (
    "strategies",
    "branch_select",
    "low_entropy",
    "low_varentropy",
    "high_varentropy",
    "high_entropy",
    "think_varentropy",
)
