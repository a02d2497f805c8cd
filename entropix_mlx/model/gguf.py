"""Read a Llama-architecture GGUF file: hyper-parameters, weights, tokenizer.

`mx.load` already decodes the tensors (Q4_0, Q4_1 and Q8_0 become MLX-quantized
weights with group size 32; F16/F32 stay plain) and returns the metadata. What
is left is renaming tensors to mlx-lm's Llama names, turning metadata into an
HF-style config, and rebuilding the tokenizer from the vocabulary and merges.
"""

import math
import os
from pathlib import Path

import mlx.core as mx

from ..errors import ModelLoadError, UnsupportedModelError
from .gguf_check import check_gguf

# The tokenizer stack (mlx_lm.tokenizer_utils, tokenizers, transformers) is imported in
# the functions that rebuild a GGUF tokenizer, after TRANSFORMERS_VERBOSITY is set:
# transformers reads it when first imported.

SUPPORTED_ARCHITECTURES = ("llama",)


_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


# Pre-tokenizer splits by `tokenizer.ggml.pre`, as llama.cpp defines them.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def read_gguf(path: Path):
    """Returns (weights, metadata) or raises ModelLoadError with a one-line reason."""
    path = Path(path)
    check_gguf(path)  # mx.load crashes the process on some corrupt headers
    try:
        weights, metadata = mx.load(str(path), return_metadata=True)
    except Exception as e:  # mx.load raises ValueError/RuntimeError with C++ text
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"cannot read GGUF file {path}: {reason} (is it truncated, corrupt, or using "
            "tensor types other than Q4_0, Q4_1, Q8_0, F16, F32?)"
        ) from None
    return weights, metadata


def _scalar(metadata, key, default=None):
    value = metadata.get(key, default)
    if isinstance(value, mx.array):
        return value.item()
    return value


def gguf_config(metadata: dict, weights: dict, path: Path) -> dict:
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(f"{path} holds a '{arch}' model; entropix-mlx runs Llama-architecture models only")

    def get(key, default=None):
        return _scalar(metadata, f"{arch}.{key}", default)

    try:
        n_heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        config = {
            "model_type": "llama",
            "hidden_size": hidden,
            "num_hidden_layers": int(get("block_count")),
            "intermediate_size": int(get("feed_forward_length")),
            "num_attention_heads": n_heads,
            "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
            "head_dim": int(get("attention.key_length", hidden // n_heads)),
            "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(get("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(get("context_length", 2048)),
            "vocab_size": int(get("vocab_size", len(metadata["tokenizer.ggml.tokens"]))),
            "tie_word_embeddings": "output.weight" not in weights,
            # llama.cpp stores Q and K rows permuted for the interleaved
            # ("traditional") RoPE layout; rotating that way undoes it.
            "rope_traditional": True,
        }
    except (TypeError, KeyError, ValueError) as e:
        raise ModelLoadError(
            f"GGUF file {path} lacks a valid hyper-parameter ({e}); the file is incomplete or corrupt"
        ) from None
    scaling_type = get("rope.scaling.type")
    if scaling_type == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling_type not in (None, "none"):
        raise UnsupportedModelError(f"{path} uses RoPE scaling '{scaling_type}', which is not supported")
    return config


def gguf_weights(weights: dict) -> tuple[dict, mx.array | None]:
    """GGUF tensor names to mlx-lm Llama names; also returns `rope_freqs` (the
    Llama-3 frequency factors llama.cpp stores as a tensor), if any."""
    renamed = {}
    rope_freqs = None
    for name, value in weights.items():
        if name.startswith("rope_freqs."):
            rope_freqs = value
            continue
        parts = name.split(".")
        if parts[0] == "blk":
            layer, kind, leaf = parts[1], parts[2], ".".join(parts[3:])
            if kind not in _LAYER_NAMES or not layer.isdigit():
                raise UnsupportedModelError(f"unexpected tensor '{name}' for a Llama model")
            renamed[f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{leaf}"] = value
        elif parts[0] in _TOP_NAMES:
            renamed[f"{_TOP_NAMES[parts[0]]}.{'.'.join(parts[1:])}"] = value
        else:
            raise UnsupportedModelError(f"unexpected tensor '{name}' for a Llama model")
    return renamed, rope_freqs


def gguf_tokenizer(metadata: dict, path: Path):
    """Rebuild the tokenizer as a Hugging Face fast tokenizer, wrapped like the
    tokenizers mlx-lm returns (chat template, streaming detokenizer, EOS ids)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(
            f"{path} uses a '{kind}' tokenizer; only byte-level BPE ('gpt2') GGUF tokenizers "
            "are supported (use the model's Hugging Face directory instead)"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    merges = metadata.get("tokenizer.ggml.merges")
    types = metadata.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else [1] * len(tokens or [])
    if not (isinstance(tokens, list) and isinstance(merges, list) and len(types) == len(tokens)):
        raise ModelLoadError(
            f"GGUF file {path} lacks a complete tokenizer (vocabulary, merges, token types); "
            "the file is incomplete or corrupt"
        )
    merges = [tuple(m.split(" ", 1)) for m in merges]

    try:
        tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    except Exception as e:  # the tokenizers library raises a bare Exception
        raise ModelLoadError(f"GGUF file {path} has an inconsistent tokenizer ({e}); the file is corrupt") from None
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre == "smollm":  # SmolLM splits digits one by one
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre == "llama-bpe":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp token type CONTROL
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == control]
    )

    def token_at(key):
        i = _scalar(metadata, key)
        return (tokens[i], i) if i is not None and 0 <= i < len(tokens) else (None, None)

    bos, bos_id = token_at("tokenizer.ggml.bos_token_id")
    eos, eos_id = token_at("tokenizer.ggml.eos_token_id")
    unk, _ = token_at("tokenizer.ggml.unknown_token_id")
    pad, _ = token_at("tokenizer.ggml.padding_token_id")
    if bos is not None and _scalar(metadata, "tokenizer.ggml.add_bos_token", False):
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        pad_token=pad or eos,
        chat_template=metadata.get("tokenizer.chat_template"),
    )
    eos_ids = [eos_id] if eos_id is not None else []
    _, eot_id = token_at("tokenizer.ggml.eot_token_id")
    if eot_id is not None:
        eos_ids.append(eot_id)
    return TokenizerWrapper(hf, detokenizer_class=_streaming_detokenizer, eos_token_ids=eos_ids)


def _streaming_detokenizer(tokenizer):
    """mlx-lm's BPE streaming detokenizer, minus one thing: it drops the leading
    space of a stream's first segment, which is right for tokenizers that add a
    prefix space. GGUF byte-level BPE adds none, so that space is real text; keep
    it, so the streamed segments always join to exactly `decode(tokens)`."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

    detokenizer = BPEStreamingDetokenizer(tokenizer)
    detokenizer._maybe_trim_space = lambda text: text  # tests/test_tokenizer.py checks this hook still works
    return detokenizer


def check_config(config: dict, weights: dict, path) -> None:
    """The metadata must agree with the tensors before a model is built from it: a
    corrupt block count or head count would otherwise build a wrong (or huge)
    model before any weight is checked."""

    def bad(what):
        return ModelLoadError(f"GGUF file {path} is inconsistent: {what}; the file is corrupt")

    for key in (
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
    ):
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
    expected = {
        "model.embed_tokens.weight": config["vocab_size"],
        "model.layers.0.self_attn.q_proj.weight": config["num_attention_heads"] * config["head_dim"],
        "model.layers.0.self_attn.k_proj.weight": config["num_key_value_heads"] * config["head_dim"],
        "model.layers.0.mlp.gate_proj.weight": config["intermediate_size"],
    }
    for name, rows in expected.items():
        if name not in weights:
            raise bad(f"tensor {name} is missing")
        if weights[name].shape[0] != rows:
            raise bad(f"tensor {name} has {weights[name].shape[0]} rows, the metadata implies {rows}")
