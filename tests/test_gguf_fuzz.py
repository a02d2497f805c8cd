"""Fuzz the GGUF loader with mutated headers: every case must load or raise a
one-line EntropixError; no other exception, no crash of the process."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import CHAT_TEMPLATE, TINY_CONFIG, _byte_tokens, make_tiny_model
from mlx.utils import tree_flatten

HF_TO_GGUF = {
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


def write_tiny_gguf(path: Path) -> int:
    """A complete, loadable tiny Llama GGUF; returns where its tensor data starts (roughly)."""
    weights = {}
    for name, value in tree_flatten(make_tiny_model(vocab_size=260).parameters()):
        if name.startswith("model.layers."):
            _, _, layer, *rest = name.split(".")
            module, leaf = ".".join(rest[:-1]), rest[-1]
            weights[f"blk.{layer}.{HF_TO_GGUF[module]}.{leaf}"] = value
        else:
            weights[
                {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]
            ] = value
    c = {**TINY_CONFIG, "vocab_size": 260}

    def u32(v):
        return mx.array(v, dtype=mx.uint32)

    metadata = {
        "general.architecture": "llama",
        "llama.block_count": u32(c["num_hidden_layers"]),
        "llama.embedding_length": u32(c["hidden_size"]),
        "llama.feed_forward_length": u32(c["intermediate_size"]),
        "llama.attention.head_count": u32(c["num_attention_heads"]),
        "llama.attention.head_count_kv": u32(c["num_key_value_heads"]),
        "llama.context_length": u32(512),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        "llama.rope.freq_base": mx.array(10000.0),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_tokens() + ["Ġa"],
        "tokenizer.ggml.merges": ["Ġ a"],
        "tokenizer.ggml.token_type": mx.array([3, 3, 3] + [1] * 257, dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    mx.save_gguf(str(path), weights, metadata)
    size = path.stat().st_size
    return size - sum(v.nbytes for v in weights.values())


def test_tiny_gguf_loads(tmp_path):
    from entropix_mlx.model.loading import load_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf")
    model, tokenizer = load_gguf(tmp_path / "tiny.gguf")
    assert model.args.num_hidden_layers == TINY_CONFIG["num_hidden_layers"]
    assert tokenizer.eos_token_ids == {0, 2}  # the file's EOS and the <|endoftext|> control token
    assert tokenizer.encode(" a", add_special_tokens=False) == [259]  # the one merge applies


@pytest.mark.slow
def test_mutated_gguf_headers_never_crash_the_loader(tmp_path):
    header_end = write_tiny_gguf(tmp_path / "base.gguf")
    n_cases = 1000
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent / "gguf_fuzz_worker.py"),
            str(tmp_path / "base.gguf"),
            str(n_cases),
            "7",
            str(tmp_path),
            str(header_end),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"loader failed (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    )
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    print("gguf fuzz:", counts)
    assert counts["cases"] == n_cases
    # Most random header mutations break the file; the test is meaningless if none did.
    assert counts["rejected"] > n_cases // 4
