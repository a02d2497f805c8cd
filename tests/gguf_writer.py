"""Tiny GGUF files as llama.cpp writes them, through the `gguf` package's own writer
and tensor-name map: HF names to GGUF names by `gguf.get_tensor_name_map`, Q/K rows
permuted for `llama`, Gemma's norms stored as 1 + w, matrices quantized by
`gguf.quants.quantize`. The package has no K-quant quantizer, so Q4_K/Q6_K tensors
are random valid blocks (random codes and sub-scales, sane super-block scales)."""

import numpy as np
from gguf import GGML_QUANT_SIZES, MODEL_ARCH, GGMLQuantizationType, GGUFWriter, get_tensor_name_map
from gguf.quants import dequantize, quantize

from tests.conftest import CHAT_TEMPLATE, _byte_tokens

ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3_text": "gemma3"}


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def k_quant_blocks(rows: int, cols: int, kind: str, rng) -> np.ndarray:
    """Random but valid Q4_K / Q6_K data: random codes, and scales that keep the
    weights within about +-0.1, as a trained model's are."""
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    data = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    scale = rng.uniform(0.5, 1.0, size=(rows, cols // block, 1))
    if kind == "Q4_K":  # d, dmin, then 6-bit sub-scales and sub-mins (up to 63), codes up to 15
        data[..., 0:2] = (scale * 1e-4).astype(np.float16).view(np.uint8)
        data[..., 2:4] = (scale * 1e-4).astype(np.float16).view(np.uint8)
    else:  # Q6_K: codes (-32..31), int8 sub-scales kept within +-16, d last
        data[..., 192:208] = rng.integers(-16, 17, size=(rows, cols // block, 16)).astype(np.int8).view(np.uint8)
        data[..., 208:210] = (scale * 2e-4).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def encode(w: np.ndarray, kind: str, rng):
    """(bytes or floats to write, the float32 values the file then holds)."""
    if w.ndim == 1 or kind == "F32":
        return w.astype(np.float32), w.astype(np.float32)
    qtype = GGMLQuantizationType[kind]
    data = k_quant_blocks(*w.shape, kind, rng) if kind in ("Q4_K", "Q6_K") else quantize(w.astype(np.float32), qtype)
    return data, dequantize(data, qtype).reshape(w.shape)


def write_gguf(path, config: dict, weights: dict, kind: str = "F32", seed: int = 0, extra=None):
    """Write HF-named float `weights` of a `config["model_type"]` model as GGUF; returns
    the weights the file holds, dequantized and back in HF layout (the reference)."""
    rng = np.random.default_rng(seed)
    arch = ARCH[config["model_type"]]
    names = get_tensor_name_map(MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    writer = GGUFWriter(str(path), arch)
    held = {}
    for name, w in weights.items():
        w = np.asarray(w, dtype=np.float32)
        base, leaf = name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{leaf}"
        heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
        module = base.rsplit(".", 1)[-1]
        if arch == "llama" and module in heads:
            w = permute(w, heads[module])
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + 1
        data, values = encode(w, kind, rng)
        if arch == "llama" and module in heads:
            values = unpermute(values, heads[module])
        if arch == "gemma3" and name.endswith("norm.weight"):
            values = values - 1
        held[name] = values
        qtype = None if data.dtype == np.float32 else GGMLQuantizationType[kind]
        writer.add_tensor(gguf_name, data, raw_dtype=qtype)
    c = config
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_context_length(c.get("max_position_embeddings", 512))
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c["num_key_value_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_rope_freq_base(c.get("rope_theta", 10000.0))
    writer.add_rope_dimension_count(int(head_dim * c.get("partial_rotary_factor", 1.0)))
    if "sliding_window" in c:
        writer.add_sliding_window(c["sliding_window"])
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_tokens()
    tokens += ["Ġa"] + [f"<extra_{i}>" for i in range(c["vocab_size"] - len(tokens) - 1)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_merges(["Ġ a"])
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for key, value in (extra or {}).items():
        writer.add_key_value(key, *value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held
