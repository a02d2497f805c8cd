"""Tiny random-weight models of each family, built with mlx-lm's own implementation,
written as GGUF by the `gguf` package's writer (gguf_writer.py) in float32, Q8_0, Q5_0
and a K-quant, read back by entropix_mlx.model.gguf: the config and weights give
mlx-lm's model the logits of the weights the file holds."""

import importlib

import mlx.core as mx
import numpy as np
import pytest
from gguf_writer import write_gguf
from mlx.utils import tree_flatten

from entropix_mlx.accel.weights import to_float32
from entropix_mlx.model import gguf
from entropix_mlx.model.loading import build_model, load

BASE = dict(
    hidden_size=256,
    num_hidden_layers=2,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-5,
    vocab_size=300,
    rope_theta=10000.0,
    max_position_embeddings=512,
)
FAMILIES = {
    "llama": dict(BASE, model_type="llama", tie_word_embeddings=False),
    "qwen2": dict(BASE, model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(BASE, model_type="qwen3", tie_word_embeddings=True),
    "phi3": dict(BASE, model_type="phi3", tie_word_embeddings=False),
    "gemma3_text": dict(
        BASE,
        model_type="gemma3_text",
        num_hidden_layers=6,  # one global layer after five sliding-window ones, as llama.cpp assumes
        num_key_value_heads=1,
        query_pre_attn_scalar=64,
        sliding_window=8,
        sliding_window_pattern=6,
        rope_local_base_freq=10000.0,
    ),
}
TOKENS = mx.array([[5, 17, 200, 33, 9, 120, 64, 3, 250, 77, 18, 41, 260, 99, 7, 150]])

# Max logit error against the file's own weights, relative to the logits' spread:
# exact types (float32, Q8_0 repacked) are float rounding; requantized ones carry MLX's
# requantization of the file's values (gguf_tensors.REQUANTIZE).
# Native quantized weights compute in float16 (their scales' type), hence Q8_0's.
# The Q6_K blocks are random (gguf_writer.py), so neighbouring sub-blocks of 16 have
# unrelated scales, which MLX's groups of 32 must share: a worst case for requantizing.
TOLERANCE = {"F32": 1e-5, "Q8_0": 5e-3, "Q5_0": 5e-3, "Q4_K": 5e-3, "Q6_K": 0.2}


def mlx_lm_model(config, seed):
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = {}
    for name, w in tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):  # not all ones: a norm written wrong must show
            w = (
                1 + 0.2 * mx.random.normal(w.shape)
                if config["model_type"] != "gemma3_text"
                else 0.2 * mx.random.normal(w.shape)
            )
        elif name.endswith("bias"):
            w = 0.1 * mx.random.normal(w.shape)
        weights[name] = np.array(w.astype(mx.float32))
    if config.get("tie_word_embeddings", True):
        weights.pop("lm_head.weight", None)
    return module, weights


def reference_logits(module, config, held):
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = {k: mx.array(v) for k, v in held.items()}
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights
    model.load_weights(list(weights.items()), strict=True)
    return model(TOKENS)


def relative_error(got, want):
    got, want = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
    return float(np.abs(got - want).max() / want.std())


@pytest.mark.parametrize("kind", ["F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_family_matches_mlx_lm(tmp_path, family, kind):
    config = FAMILIES[family]
    module, weights = mlx_lm_model(config, seed=len(family))
    held = write_gguf(tmp_path / "tiny.gguf", config, weights, kind)
    want = reference_logits(module, config, held)

    for native in (True, False):
        g = gguf.read_gguf(tmp_path / "tiny.gguf", native=native, hf_layout=True)
        for key, value in config.items():
            assert g.config[key] == pytest.approx(value), key
        model = build_model(g.config, g.weights, module.Model, module.ModelArgs)
        if not native:
            to_float32(model)
        error = relative_error(model(TOKENS), want)
        assert error < (TOLERANCE[kind] if native else TOLERANCE["F32"]), (native, error)
        if kind in ("F32", "Q8_0") or not native:
            assert mx.array_equal(mx.argmax(model(TOKENS), -1), mx.argmax(want, -1))


@pytest.mark.parametrize("kind", ["F32", "Q8_0", "Q4_K"])
def test_llama_gguf_through_the_port(tmp_path, kind):
    """`load` keeps llama.cpp's Q/K row order and rotates the interleaved way: the same model."""
    config = FAMILIES["llama"]
    module, weights = mlx_lm_model(config, seed=3)
    held = write_gguf(tmp_path / "tiny.gguf", config, weights, kind)
    want = reference_logits(module, config, held)
    for fmt in ("native", "float32"):
        model, tokenizer = load(str(tmp_path / "tiny.gguf"), weights=fmt)
        logits, scores = model(TOKENS)
        tolerance = TOLERANCE[kind] if fmt == "native" else 1e-5
        assert relative_error(logits, want) < tolerance, fmt
        assert all(np.isfinite(np.array(s)).all() for s in scores)
    assert tokenizer.encode("hi 12") == [107, 108, 35, 52, 53]
