"""The Metal path, exercised on this CPU: with the CPU-only branches switched off
(MLX's fused attention, rope, softmax and SwiGLU, as a Mac's GPU runs them), the
model gives the same greedy tokens and the same metrics as the CPU paths."""

import pytest
from conftest import make_tiny_model

from entropix_mlx.accel.backend import Backend
from entropix_mlx.decode.generate import generate
from entropix_mlx.sampling.config import SamplerConfig
from entropix_mlx.sampling.entropix import EntropixSampler
from entropix_mlx.sampling.samplers import GreedySampler


def run(model, tokenizer, prompt, sampler, cpu_kernels: bool):
    """16 tokens on the CPU's kernels or on the paths a GPU takes; the model's
    own backend back after."""
    own, model.backend = model.backend, Backend(cpu_kernels=cpu_kernels)
    try:
        return [(e.token, e.strategy, e.metrics) for e in generate(model, tokenizer, prompt, sampler, max_tokens=16)]
    finally:
        model.backend = own


@pytest.mark.parametrize("family", [dict(), dict(tie_word_embeddings=False, num_key_value_heads=4)])
def test_the_gpu_paths_give_the_cpu_paths_tokens_and_metrics(tiny_tokenizer, family, on_cpu):
    model = make_tiny_model(3, **family)
    prompt = list(tiny_tokenizer.encode("a question about the weather"))
    seen = []
    for make in (GreedySampler, lambda: EntropixSampler(SamplerConfig(), tiny_tokenizer)):
        cpu = run(model, tiny_tokenizer, prompt, make(), cpu_kernels=True)
        gpu = run(model, tiny_tokenizer, prompt, make(), cpu_kernels=False)
        assert [t for t, _, _ in gpu] == [t for t, _, _ in cpu]
        assert [s for _, s, _ in gpu] == [s for _, s, _ in cpu]
        for (_, _, a), (_, _, b) in zip(cpu, gpu, strict=True):
            assert a.keys() == b.keys()
            for name in a:
                assert b[name] == pytest.approx(a[name], rel=1e-3, abs=1e-4), name
        seen.append(len(cpu))
    assert all(n == 16 for n in seen)


def test_the_bundled_model_on_the_gpu_paths(smollm_float32, on_cpu):
    model, tokenizer = smollm_float32
    from entropix_mlx.decode.prompt import encode_chat
    from entropix_mlx.front.registry import build

    prompt = encode_chat(tokenizer, [{"role": "user", "content": "How many legs does a spider have?"}])
    cpu = run(model, tokenizer, prompt, build("entropix", tokenizer=tokenizer, card="smollm2-135m"), True)
    gpu = run(model, tokenizer, prompt, build("entropix", tokenizer=tokenizer, card="smollm2-135m"), False)
    assert [t for t, _, _ in gpu] == [t for t, _, _ in cpu]
    for (_, _, a), (_, _, b) in zip(cpu, gpu, strict=True):
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-3, abs=1e-3)
