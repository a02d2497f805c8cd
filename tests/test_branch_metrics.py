"""A token that a branch rollout chose carries the entropy and varentropy of its
own step, not those of the step where the branch started (run --json, the
page's chart and --html draw them per token)."""

import mlx.core as mx
import pytest
from conftest import make_tiny_model

from entropix_mlx.decode.generate import generate
from entropix_mlx.sampling.config import SamplerConfig
from entropix_mlx.sampling.entropix import EntropixSampler
from entropix_mlx.sampling.metrics import logits_entropy

# every step a branch of 3 candidates rolled out 6 tokens; no repetition rule cutting the path short
ALWAYS_BRANCH = dict(
    low_entropy=0.0, low_varentropy=0.0, medium_entropy=1e3, high_entropy=1e3, high_varentropy=0.0,
    strategies=("branch", "adaptive"), branch_rollout_tokens=6, branch_candidates=3, repetition_bits=0.0,
)  # fmt: skip


@pytest.mark.parametrize("decide", [0, 2])
def test_rollout_tokens_carry_their_own_steps_metrics(tiny_tokenizer, decide):
    model = make_tiny_model(0, tie_word_embeddings=False)
    sampler = EntropixSampler(SamplerConfig(**ALWAYS_BRANCH, branch_decide_tokens=decide), tiny_tokenizer)
    prompt = list(tiny_tokenizer.encode("a question"))
    events = list(generate(model, tiny_tokenizer, prompt, sampler, max_tokens=12))
    rollout = [i for i, e in enumerate(events) if e.metrics.get("rollout_step")]
    assert rollout and all(events[i].strategy == "branch" for i in rollout)
    tokens = [e.token for e in events]
    logits = model(mx.array([prompt + tokens]))[0][0]  # the model's own distribution at every position
    differs = 0
    for i in rollout:
        h, v = logits_entropy(logits[len(prompt) + i - 1])
        assert events[i].metrics["entropy"] == pytest.approx(h.item(), abs=1e-3)
        assert events[i].metrics["varentropy"] == pytest.approx(v.item(), abs=1e-2)
        start = events[i - events[i].metrics["rollout_step"]]
        differs += abs(events[i].metrics["entropy"] - start.metrics["entropy"]) > 1e-3
    assert differs  # not the branch start's values copied along


def test_the_batch_engine_keeps_each_rollout_tokens_metrics(tiny_tokenizer):
    """The server's and eval's records come from the batch engine's rows."""
    from entropix_mlx.decode.engine import generate_batch
    from entropix_mlx.decode.rows import Request

    model = make_tiny_model(0, tie_word_embeddings=False)
    config = SamplerConfig(**ALWAYS_BRANCH)
    prompts = [list(tiny_tokenizer.encode(t)) for t in ("a question", "another one")]
    requests = [Request(p, seed=i, max_tokens=10) for i, p in enumerate(prompts)]
    rows = generate_batch(model, tiny_tokenizer, requests, lambda: EntropixSampler(config, tiny_tokenizer), 2)
    for index, result, _ in rows:
        alone = [
            e.metrics
            for e in generate(
                model, tiny_tokenizer, prompts[index], EntropixSampler(config, tiny_tokenizer), 10, seed=index
            )
        ]
        assert any(m.get("rollout_step") for m in result.metrics)
        assert [m.get("rollout_step") for m in result.metrics] == [m.get("rollout_step") for m in alone]
        for got, want in zip(result.metrics, alone, strict=True):
            assert got["entropy"] == pytest.approx(want["entropy"], abs=1e-3)
