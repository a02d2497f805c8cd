"""Every supported family against mlx-lm's own implementation of it: a tiny
random-weight model built by mlx-lm, saved as a Hugging Face directory, loaded
through `load()`. Logits over a prefill and 20 decode steps, greedy tokens, and
attention metrics over exactly the keys each layer sees, also through the
batch engine with rows of different lengths."""

import json

import mlx.core as mx
import numpy as np
import pytest
from conftest import make_tiny_tokenizer
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text, llama, phi3, qwen2, qwen3
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import save_config, save_model
from test_batch import RecordsScores, batched, prompts_of, unbatched

from entropix_mlx import UnsupportedModelError, load
from entropix_mlx.decode.rows import Request
from entropix_mlx.model.cache import make_cache
from entropix_mlx.sampling.metrics import step_metrics

COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    vocab_size=259,
    max_position_embeddings=256,
)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LONGROPE = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0 + i / 4 for i in range(8)]}

# name: (mlx-lm module, config)
FAMILIES = {
    "llama3": (
        llama,
        dict(
            model_type="llama",
            rope_theta=500000.0,
            rope_scaling=LLAMA3_SCALING,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
        ),
    ),
    "llama-linear": (llama, dict(model_type="llama", rope_scaling={"type": "linear", "factor": 2.0})),
    "llama-yarn": (
        llama,
        dict(
            model_type="llama",
            tie_word_embeddings=False,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        ),
    ),
    "llama-sliding": (
        llama,
        dict(
            model_type="llama",
            tie_word_embeddings=False,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=5,
        ),
    ),
    "mistral": (llama, dict(model_type="mistral", head_dim=24, tie_word_embeddings=False, sliding_window=None)),
    "qwen2": (qwen2, dict(model_type="qwen2", rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": (qwen3, dict(model_type="qwen3", head_dim=24, rope_theta=1000000.0, tie_word_embeddings=False)),
    "phi3": (phi3, dict(model_type="phi3", num_key_value_heads=4, tie_word_embeddings=True)),
    "phi3-longrope": (
        phi3,
        dict(
            model_type="phi3", rope_scaling=LONGROPE, max_position_embeddings=4096, original_max_position_embeddings=64
        ),
    ),
}
# Gemma 3: local layers with a window shorter than every prompt below, so it matters.
GEMMA3 = dict(
    model_type="gemma3_text",
    num_hidden_layers=4,
    head_dim=32,
    sliding_window=5,
    sliding_window_pattern=2,
    query_pre_attn_scalar=24,
    rope_local_base_freq=10000.0,
    rope_theta=1000000.0,
)
FAMILIES["gemma3_text"] = (gemma3_text, GEMMA3)
FAMILIES["gemma3_text-tied"] = (gemma3_text, GEMMA3)


def build(name: str, seed: int = 0):
    """(mlx-lm's model, its config) with random float32 weights."""
    module, overrides = FAMILIES[name]
    config = {**COMMON, **overrides}
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    # Random init is near-uniform; larger embeddings make the distributions peaked.
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * 8
    # Norm weights start as ones: made random, a norm read wrongly shows.
    norms = [(k, 1 + 0.2 * mx.random.normal(v.shape)) for k, v in tree_flatten(model.parameters()) if "norm" in k]
    model.load_weights(norms, strict=False)
    if name.endswith("-tied"):
        model.sanitize({})  # no output projection: mlx-lm ties it to the embeddings
    mx.eval(model.parameters())
    return model, config


def write_hf_dir(path, model, config):
    path.mkdir(parents=True, exist_ok=True)
    make_tiny_tokenizer()._tokenizer.save_pretrained(path)
    save_model(path, model)
    save_config({**config, "eos_token_id": 2}, path / "config.json")
    return path


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, mlx-lm's model, ours loaded from its HF directory, config)."""
    theirs, config = build(request.param)
    path = write_hf_dir(tmp_path_factory.mktemp("families") / request.param, theirs, config)
    ours, _ = load(str(path), weights="float32")
    return request.param, theirs, ours, config


PROMPT = [1, 40, 41, 42, 200, 7, 7, 258, 3, 90, 17, 120]


def visible_keys(model, keys: int) -> list[int]:
    """How many keys each layer's last query sees."""
    return [min(keys, layer.self_attn.window or keys) for layer in model.layers]


def test_logits_tokens_and_metrics_match_mlx_lm(family):
    name, theirs, ours, config = family
    assert type(ours).__module__.startswith("entropix_mlx.model") and ours.model_type == config["model_type"]
    cache, their_cache = make_cache(ours), make_prompt_cache(theirs)
    tokens = mx.array([PROMPT])
    logits, scores = ours(tokens, cache)
    reference = theirs(tokens, cache=their_cache)
    assert mx.abs(logits - reference).max().item() < 1e-4, name
    greedy = []
    for step in range(21):  # the prefill's last position, then 20 decode steps
        if step:
            logits, scores = ours(tokens, cache)
            reference = theirs(tokens, cache=their_cache)
            assert mx.abs(logits - reference).max().item() < 1e-4, (name, step)
        token = mx.argmax(logits[0, -1]).item()
        assert token == mx.argmax(reference[0, -1]).item(), (name, step)
        greedy.append(token)
        keys = len(PROMPT) + step
        assert [s.shape for s in scores] == [(1, config["num_attention_heads"], keys)] * len(ours.layers)
        assert [mx.isfinite(s[0, 0]).sum().item() for s in scores] == visible_keys(ours, keys)
        metrics = step_metrics(logits[0, -1], [s[0] for s in scores])
        assert all(np.isfinite(v.item()) for v in metrics.values()), (name, step)
        tokens = mx.array([[token]])
    if not ours.tied:  # (a random model with tied embeddings repeats its input)
        assert len(set(greedy)) > 1, name  # the comparison saw more than one answer


def test_batch_rows_of_different_lengths_equal_single_runs(family):
    name, _, ours, _ = family
    tokenizer = make_tiny_tokenizer()
    prompts = prompts_of(tokenizer, ["hi", "a much longer prompt than the first one"])
    samplers = []

    def make():
        samplers.append(RecordsScores())
        return samplers[-1]

    out = batched(ours, tokenizer, [Request(p, 0, 6) for p in prompts], make, 2, groups=1)
    for s in samplers:
        width = s.seen[0][1][0].shape[-1]
        i = [len(p) for p in prompts].index(width)
        ref = RecordsScores()
        assert out[i].tokens == unbatched(ours, tokenizer, prompts[i], ref, 6, 0), name
        for t, ((logits, scores), (ref_logits, ref_scores)) in enumerate(zip(s.seen, ref.seen, strict=True)):
            assert [np.isfinite(x[0]).sum() for x in scores] == visible_keys(ours, len(prompts[i]) + t)
            np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
            for a, b in zip(scores, ref_scores, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
            metrics = step_metrics(mx.array(logits), [mx.array(x) for x in scores])
            assert all(np.isfinite(v.item()) for v in metrics.values()), name


def test_an_unsupported_architecture_is_one_line_naming_it(tmp_path):
    theirs, config = build("llama3")
    path = write_hf_dir(tmp_path / "gpt2", theirs, config)
    (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UnsupportedModelError) as err:
        load(str(path))
    message = str(err.value)
    assert "\n" not in message and "'gpt2'" in message
    assert all(family in message for family in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text"))


@pytest.mark.parametrize("name", ["qwen2", "phi3", "gemma3_text"])
def test_quantized_directories_match_mlx_lm_and_dequantize(name, tmp_path):
    """MLX-quantized weights (Phi-3's fused ones split at load) give mlx-lm's
    logits natively, and close ones dequantized for the CPU fast path."""
    import mlx.nn as nn

    theirs, config = build(name)
    nn.quantize(theirs, group_size=32, bits=4)
    path = write_hf_dir(tmp_path / name, theirs, {**config, "quantization": {"group_size": 32, "bits": 4}})
    tokens = mx.array([PROMPT])
    reference = theirs(tokens)
    native, _ = load(str(path), weights="native")
    assert isinstance(native.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert mx.abs(native(tokens)[0] - reference).max().item() < 1e-4
    dequantized, _ = load(str(path), weights="float32")
    assert type(dequantized.layers[0].self_attn.q_proj) is nn.Linear
    assert mx.abs(dequantized(tokens)[0] - reference).max().item() < 1e-3


def test_gemma_windows_through_a_shared_prefix_batch(tmp_path):
    """Rows that store a shared prefix once (deliberate's batches) with their
    padding between the prefix and their own keys: a row's window counts
    positions, so a short row still sees the prefix's last keys."""
    from entropix_mlx.decode.engine import generate_batch
    from entropix_mlx.sampling.samplers import GreedySampler

    theirs, config = build("gemma3_text")
    ours, _ = load(str(write_hf_dir(tmp_path / "gemma", theirs, config)), weights="float32")
    tokenizer = make_tiny_tokenizer()
    prefix = [1, 40, 41, 42, 43, 44]
    prompts = [prefix + [50], prefix + list(range(60, 69))]  # row 0 is left-padded by 8
    requests = [Request(p, 0, 6) for p in prompts]
    out = dict(
        (i, r)
        for i, r, _ in generate_batch(ours, tokenizer, requests, GreedySampler, 2, prefix=prefix, share_prefix=True)
    )
    for i, p in enumerate(prompts):
        assert out[i].tokens == unbatched(ours, tokenizer, p, GreedySampler(), 6, 0)


def test_gemma_local_layers_follow_the_configs_layer_types():
    from entropix_mlx.model.gemma3 import Model, ModelArgs

    kinds = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    model = Model(ModelArgs.from_dict({**COMMON, **GEMMA3, "layer_types": kinds}))
    assert [layer.self_attn.window for layer in model.layers] == [5, None, None, 5]
    model = Model(ModelArgs.from_dict({**COMMON, **GEMMA3}))  # without: every second layer is global
    assert [layer.self_attn.window for layer in model.layers] == [5, None, 5, None]
    assert model.windows == [5]


def test_entropix_branches_on_every_family(family):
    """The sampler's own passes (rollouts on a shared prefix) on each family: each
    token's log-probability is the one a single pass over the whole text gives."""
    from test_entropix import ALWAYS_BRANCH, path_logprobs

    from entropix_mlx.decode.generate import generate
    from entropix_mlx.sampling.config import SamplerConfig
    from entropix_mlx.sampling.entropix import EntropixSampler

    name, _, ours, _ = family
    sampler = EntropixSampler(SamplerConfig(**ALWAYS_BRANCH, strategies=("branch", "adaptive")))
    events = list(generate(ours, make_tiny_tokenizer(), PROMPT, sampler, max_tokens=7, seed=3))
    assert len(events) == 7, name
    if not ours.tied:  # (a random model with tied embeddings is sure of its next token)
        assert all(e.strategy == "branch" for e in events), name
    for e in events:  # a rollout's later tokens have no attention scores: those metrics are None
        for m, v in e.metrics.items():
            if v is None:
                assert e.metrics.get("rollout_step") and m not in ("entropy", "varentropy"), (name, m)
            else:
                assert np.isfinite(v), (name, m)
    replay = path_logprobs(ours, PROMPT, [e.token for e in events])
    np.testing.assert_allclose([e.logprob for e in events], replay, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen3", "phi3", "gemma3_text-tied"])
def test_build_model_dispatches_on_model_type(name):
    """The entry GGUF loading shares: an HF-style config and HF-named weights."""
    from entropix_mlx.model.loading import build_model

    theirs, config = build(name)
    ours = build_model(config, dict(tree_flatten(theirs.parameters())))
    assert ours.model_type == config["model_type"] and ("lm_head" in ours) == ("lm_head" in theirs)
    tokens = mx.array([PROMPT])
    assert mx.abs(ours(tokens)[0] - theirs(tokens)).max().item() < 1e-4
