"""A GGUF file as a Hugging Face-style model: config, weights under HF / mlx-lm
names, and a tokenizer.

The header is read and checked by gguf_check.py, the tensors are decoded by
llama.cpp's `gguf` package (gguf_tensors.py), the tokenizer is built by transformers'
GGUF converters. What is left here is llama.cpp's naming and its few changes to the
weights, undone per architecture (its convert_hf_to_gguf.py): Q/K rows permuted for
the interleaved RoPE in `llama`, Gemma's RMSNorm weights stored as `1 + w`.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import ModelLoadError, UnsupportedModelError
from .gguf_check import GGUFHeader, read_header
from .gguf_tensors import QUANTIZATION, TensorFile

# GGUF architecture -> HF model_type. Mistral files say `llama`.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3": "gemma3_text"}


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_ARCH_LAYER_NAMES = {
    "phi3": {"ffn_up": "mlp.gate_up_proj"},  # gate and up fused, as in HF's Phi-3
    "gemma3": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass
class GGUFModel:
    config: dict  # HF-style, as a config.json would say
    weights: dict  # HF / mlx-lm names -> mx.array; a quantized matrix as NAME.weight/.scales/.biases
    quantization: dict  # HF module path -> {"bits", "group_size"} of each quantized matrix
    rope_freqs: mx.array | None  # llama.cpp's Llama-3 RoPE factors, if the file has them
    header: GGUFHeader


def architecture(header: GGUFHeader) -> str:
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{header.path} holds a '{arch}' model; entropix-mlx runs these GGUF architectures: "
            f"{', '.join(ARCHITECTURES)}"
        )
    return arch


def read_gguf(path: Path, native: bool = True, hf_layout: bool = False) -> GGUFModel:
    """Everything but the tokenizer. `native`: quantized tensors stay quantized
    (gguf_tensors.py says how); otherwise every tensor but Q4_0/Q4_1/Q8_0 (kept
    exactly, for to_float32) is dequantized to float32.

    `hf_layout`: a `llama` file's Q/K rows go back to HF's order (for `convert`).
    Without it they stay in llama.cpp's order and the config asks for the interleaved
    ("traditional") RoPE, which gives the same model; it keeps each attention dot
    product's sum in the order it has always had, so outputs stay bit for bit."""
    header = read_header(path)
    arch = architecture(header)
    config = gguf_config(header, arch)
    if arch == "llama" and not hf_layout:
        config["rope_traditional"] = True
    # Gemma's activations overflow float16: keep its quantization scales in float32.
    scale_dtype = mx.float32 if arch == "gemma3" else mx.float16
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}
    data = TensorFile(header.path)
    weights, quantization, rope_freqs = {}, {}, None
    for info in header.tensors:
        if info.name == "rope_freqs.weight":
            rope_freqs = data.read(info, native=False)
            continue
        if info.name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            continue  # read into the config by gguf_config
        name = hf_name(info.name, names, header.path)
        value = data.read(info, native, scale_dtype)
        value = _undo_llama_cpp(arch, name, value, config, hf_layout)
        if isinstance(value, tuple):
            base = name.removesuffix(".weight")
            weights[name], weights[f"{base}.scales"], weights[f"{base}.biases"] = value
            bits, group = QUANTIZATION[info.kind]
            quantization[base] = {"group_size": group, "bits": bits}
        else:
            weights[name] = value
    check_config(config, weights, header.path)
    return GGUFModel(config, weights, quantization, rope_freqs, header)


def hf_name(gguf_name: str, names: dict, path) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) >= 4 and parts[1].isdigit() and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{'.'.join(parts[3:])}"
    if parts[0] in _TOP_NAMES and len(parts) == 2:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise UnsupportedModelError(f"{path} has a tensor '{gguf_name}' that this architecture does not use")


def _undo_llama_cpp(arch: str, name: str, value, config: dict, hf_layout: bool):
    if arch == "llama" and hf_layout and (".q_proj." in name or ".k_proj." in name):
        heads = config["num_attention_heads"] if ".q_proj." in name else config["num_key_value_heads"]
        return _map(value, lambda a: unpermute(a, heads))
    if arch == "gemma3" and name.endswith("norm.weight"):
        return value.astype(mx.float32) - 1  # llama.cpp stores Gemma's (1 + w) norms as 1 + w
    return value


def _map(value, f):
    return tuple(f(v) for v in value) if isinstance(value, tuple) else f(value)


def unpermute(w: mx.array, heads: int) -> mx.array:
    """Undo convert_hf_to_gguf's `permute`: rows back from the interleaved RoPE layout
    to HF's rotate-half layout (whole rows move, so a quantized matrix moves exactly)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_config(header: GGUFHeader, arch: str) -> dict:
    metadata, path = header.metadata, header.path

    def get(key, default=None):
        return metadata.get(f"{arch}.{key}", default)

    names = {t.name for t in header.tensors}
    try:
        n_heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        head_dim = int(get("attention.key_length", hidden // n_heads))
        config = {
            "model_type": ARCHITECTURES[arch],
            "hidden_size": hidden,
            "num_hidden_layers": int(get("block_count")),
            "intermediate_size": int(get("feed_forward_length")),
            "num_attention_heads": n_heads,
            "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
            "head_dim": head_dim,
            "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(get("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(get("context_length", 2048)),
            "vocab_size": int(get("vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
            "tie_word_embeddings": "output.weight" not in names,
        }
    except (TypeError, KeyError, ValueError) as e:
        raise ModelLoadError(
            f"GGUF file {path} lacks a valid hyper-parameter ({e}); the file is incomplete or corrupt"
        ) from None
    eos = [metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    config["eos_token_id"] = [int(i) for i in dict.fromkeys(eos) if isinstance(i, int)]
    rotary = get("rope.dimension_count")
    if arch == "phi3" and rotary:
        config["partial_rotary_factor"] = int(rotary) / head_dim
    if arch == "gemma3":
        # Not in the file: llama.cpp's own defaults for Gemma 3 (src/llama-model.cpp).
        config["rope_local_base_freq"] = float(get("rope.freq_base_swa", 10000.0))
        config["sliding_window"] = int(get("attention.sliding_window", 512))
        config["sliding_window_pattern"] = 6
        # llama.cpp scales queries by 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden/heads)
        config["query_pre_attn_scalar"] = hidden // n_heads if config["num_hidden_layers"] == 62 else head_dim
    config.update(_rope_scaling(header, arch, get))
    return config


def _rope_scaling(header: GGUFHeader, arch: str, get) -> dict:
    kind = get("rope.scaling.type")
    if "rope_factors_long.weight" in {t.name for t in header.tensors}:
        data = TensorFile(header.path)
        factors = {t.name: np.asarray(data.raw(t).view(np.float32)).ravel().tolist() for t in header.tensors}
        return {
            "rope_scaling": {
                "type": "longrope",
                "long_factor": factors["rope_factors_long.weight"],
                "short_factor": factors.get("rope_factors_short.weight", factors["rope_factors_long.weight"]),
            },
            "original_max_position_embeddings": int(get("rope.scaling.original_context_length", 4096)),
        }
    if kind == "linear":
        return {"rope_scaling": {"type": "linear", "factor": float(get("rope.scaling.factor"))}}
    if kind == "yarn":
        return {
            "rope_scaling": {
                "type": "yarn",
                "factor": float(get("rope.scaling.factor")),
                "original_max_position_embeddings": int(get("rope.scaling.original_context_length")),
            }
        }
    if kind not in (None, "none"):
        raise UnsupportedModelError(f"{header.path} uses RoPE scaling '{kind}', which is not supported")
    return {}


def check_config(config: dict, weights: dict, path) -> None:
    """The metadata must agree with the tensors before a model is built from it: a
    corrupt block count or head count would otherwise build a wrong (or huge)
    model before any weight is checked."""

    def bad(what):
        return ModelLoadError(f"GGUF file {path} is inconsistent: {what}; the file is corrupt")

    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads"):
        if config[key] <= 0:
            raise bad(f"{key} is {config[key]}")
    for key in ("num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
        if config[key] <= 0:
            raise bad(f"{key} is {config[key]}")
    for key in ("rms_norm_eps", "rope_theta"):
        if not (math.isfinite(config[key]) and config[key] > 0):
            raise bad(f"{key} is {config[key]}")
    layers = {int(k.split(".")[2]) for k in weights if k.startswith("model.layers.")}
    if len(layers) != config["num_hidden_layers"] or layers != set(range(len(layers))):
        raise bad(f"block_count is {config['num_hidden_layers']} but the file has {len(layers)} layers")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise bad("the head count is not a multiple of the KV head count")
    heads, kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    expected = {"model.embed_tokens.weight": config["vocab_size"]}
    if "model.layers.0.self_attn.qkv_proj.weight" in weights:
        expected["model.layers.0.self_attn.qkv_proj.weight"] = (heads + 2 * kv) * head_dim
    else:
        expected["model.layers.0.self_attn.q_proj.weight"] = heads * head_dim
        expected["model.layers.0.self_attn.k_proj.weight"] = kv * head_dim
    for name, rows in expected.items():
        if name not in weights:
            raise bad(f"tensor {name} is missing")
        if weights[name].shape[0] != rows:
            raise bad(f"tensor {name} has {weights[name].shape[0]} rows, the metadata implies {rows}")


def gguf_tokenizer(metadata: dict, path):
    """transformers' GGUF tokenizer for this file's metadata, wrapped like the
    tokenizers mlx-lm returns (chat template, streaming detokenizer, EOS ids)."""
    # transformers reads TRANSFORMERS_VERBOSITY when first imported, so it is imported here.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from .gguf_tokenizer import build_tokenizer

    return build_tokenizer(metadata, path)
