"""Presence, frequency and repetition penalties (sampling/penalties.py), applied
before every sampler in both decode paths, and the server fields that ask for them."""

import mlx.core as mx
import numpy as np
import pytest
from conftest import make_tiny_model

from entropix_mlx.decode.deliberate import DeliberateGeneration
from entropix_mlx.decode.engine import generate_batch
from entropix_mlx.decode.generate import generate
from entropix_mlx.decode.rows import Request
from entropix_mlx.errors import ConfigError
from entropix_mlx.front.registry import SAMPLER_NAMES, build
from entropix_mlx.sampling.deliberate_config import DeliberateConfig
from entropix_mlx.sampling.penalties import Penalties, make_penalties
from entropix_mlx.server.schema import APIError, parse

PROMPT = [1, 50, 60, 70, 2, 1, 80]


def by_hand(logits, prompt, generated, presence=0.0, frequency=0.0, repetition=1.0, window=64):
    """The penalised logits as llama.cpp and OpenAI describe them, in NumPy."""
    out = np.array(logits, dtype=np.float64)
    for t in set((list(prompt) + list(generated))[-window:]):
        out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    for t in set(generated):
        out[t] -= presence + frequency * generated.count(t)
    return out


def test_penalties_match_the_arithmetic_by_hand():
    logits = mx.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, 4.0])
    prompt, generated = [0, 1, 6], [3, 3, 4, 7, 3]
    for kw in (
        {"presence": 0.7},
        {"frequency": 0.4},
        {"repetition": 1.3},
        {"presence": -0.5, "frequency": 1.5, "repetition": 2.0},
        {"repetition": 1.5, "window": 3},  # only the last 3 tokens seen: 4, 7, 3
    ):
        got = Penalties(**kw).after(prompt).apply(logits, generated)
        assert np.allclose(np.array(got), by_hand(np.array(logits), prompt, generated, **kw), atol=1e-6), kw
    assert make_penalties() is None and make_penalties(repetition=1.0, presence=0.0) is None
    with pytest.raises(ConfigError, match="above 0"):
        Penalties(repetition=0.0)


def tiny_setup():
    from conftest import make_tiny_tokenizer

    return make_tiny_model(3), make_tiny_tokenizer()


def test_a_strong_presence_penalty_never_repeats_a_token_with_any_sampler():
    """The tiny model loops on a few tokens under greedy decoding; a strong
    presence penalty makes every decision a new token, whatever the sampler, in
    a single stream and in the batch engine."""
    model, tokenizer = tiny_setup()
    greedy = [e.token for e in generate(model, tokenizer, PROMPT, build("greedy"), max_tokens=24)]
    assert len(set(greedy)) < len(greedy)  # it repeats without the penalty
    penalties = make_penalties(presence=100.0, prompt=PROMPT)
    for name in SAMPLER_NAMES:
        sampler = build(name, tokenizer=tokenizer, card="tiny")
        out = [e.token for e in generate(model, tokenizer, PROMPT, sampler, 24, seed=1, penalties=penalties)]
        assert len(out) == len(set(out)) and len(out) > 1, (name, out)
    for name in ("greedy", "entropix", "min_p"):
        rows = generate_batch(
            model,
            tokenizer,
            [Request(PROMPT, seed, 24, penalties) for seed in range(3)],
            lambda name=name: build(name, tokenizer=tokenizer, card="tiny"),
            batch_size=3,
        )
        for _, result, _ in rows:
            assert len(result.tokens) == len(set(result.tokens)), (name, result.tokens)


def test_greedy_takes_the_argmax_of_the_penalised_logits():
    """Each token of a penalised greedy answer is the argmax of the model's raw
    logits after the penalties computed by hand from the answer so far."""
    model, tokenizer = tiny_setup()
    kw = {"presence": 5.0, "frequency": 3.0, "repetition": 2.5}  # the tiny model's logits span ~80
    penalties = make_penalties(**kw, prompt=PROMPT)
    answer = [e.token for e in generate(model, tokenizer, PROMPT, build("greedy"), 16, penalties=penalties)]
    plain = [e.token for e in generate(model, tokenizer, PROMPT, build("greedy"), 16)]
    assert answer != plain
    for i, token in enumerate(answer):
        logits, _ = model(mx.array([PROMPT + answer[:i]]))
        expected = by_hand(np.array(logits[0, -1].astype(mx.float32)), PROMPT, answer[:i], **kw)
        assert token == int(np.argmax(expected)), i
    (_, batched, _), *_ = generate_batch(model, tokenizer, [Request(PROMPT, 0, 16, penalties)], lambda: build("greedy"))
    assert batched.tokens == answer


def test_deliberate_branches_carry_the_penalties():
    """Every candidate deliberate compares, branches included, is penalised."""
    model, tokenizer = tiny_setup()
    config = DeliberateConfig(first_alternatives=2, alternatives=2, max_branch_points=2)
    generation = DeliberateGeneration(
        model, tokenizer, PROMPT, config, 20, penalties=make_penalties(presence=100.0, prompt=PROMPT)
    )
    list(generation)
    candidates = generation.deliberation.candidates
    assert len(candidates) > 1
    for c in candidates:
        assert len(c.tokens) == len(set(c.tokens)), c.tokens


def chat(**fields):
    return {"messages": [{"role": "user", "content": "Hi"}], **fields}


def test_the_server_reads_the_penalties_and_the_response_format():
    p = parse(chat(presence_penalty=1.5, frequency_penalty=-0.5, repetition_penalty=1.1), True, SAMPLER_NAMES)
    assert p.penalties == {"presence": 1.5, "frequency": -0.5, "repetition": 1.1}
    assert parse(chat(response_format={"type": "text"}), True, SAMPLER_NAMES).penalties["repetition"] is None
    assert parse(chat(response_format={"type": "text"}), True, SAMPLER_NAMES).json_schema is None
    assert parse(chat(response_format={"type": "json_object"}), True, SAMPLER_NAMES).json_schema == {"type": "object"}
    schema = {"type": "array"}
    asked = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": False}}
    assert parse(chat(response_format=asked), True, SAMPLER_NAMES).json_schema == schema
    for fields, param in (
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "high"}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"response_format": {"type": "json_schema", "json_schema": []}}, "response_format.json_schema"),
        ({"response_format": "json"}, "response_format"),
    ):
        with pytest.raises(APIError) as e:
            parse(chat(**fields), True, SAMPLER_NAMES)
        assert e.value.status == 400 and e.value.param == param, fields


def test_entropix_rollouts_are_penalised_along_their_paths():
    """A branch decision hands out a whole rolled-out path: each of its tokens
    is chosen under the penalties too, not only the first."""
    from entropix_mlx.sampling.config import SamplerConfig
    from entropix_mlx.sampling.entropix import EntropixSampler

    model, tokenizer = tiny_setup()
    always_branch = dict(low_entropy=0.0, medium_entropy=0.0, low_varentropy=0.0, high_varentropy=0.0)
    config = SamplerConfig(
        strategies=("argmax", "branch", "adaptive"),
        branch_candidates=3,
        branch_rollout_tokens=8,
        repetition_bits=0.0,  # Entropix's own repetition score, off: only the request's penalties act
        high_entropy=1e9,
        **always_branch,
    )
    sampler = EntropixSampler(config, tokenizer)
    penalties = make_penalties(presence=100.0, prompt=PROMPT)
    generation = generate(model, tokenizer, PROMPT, sampler, 24, penalties=penalties)
    out = [e.token for e in generation]
    assert generation.summary().strategy_counts.get("branch", 0) > 12
    assert len(out) == len(set(out)), out
