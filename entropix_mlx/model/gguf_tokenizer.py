"""The tokenizer of a GGUF file, built by transformers' GGUF converters.

transformers reads the vocabulary, merges and special tokens that llama.cpp stores
as metadata and builds the tokenizer the model was trained with (byte-level BPE,
SentencePiece, Gemma's and Phi-3's variants). Two things it leaves out are added:
SmolLM's pre-tokenizer (`tokenizer.ggml.pre = smollm`: digits one by one, which
llama.cpp does) and the BOS token that `tokenizer.ggml.add_bos_token` asks for.
"""

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, NaiveStreamingDetokenizer, TokenizerWrapper
from tokenizers import pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

from ..errors import ModelLoadError, UnsupportedModelError

_SPECIAL = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}

# Control tokens that end a generation whichever of them the file names its EOS, as llama.cpp
# treats them: Qwen2.5's GGUF names <|im_end|>, and the model may also end with <|endoftext|>.
END_OF_GENERATION = {
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
}
CONTROL = 3  # llama.cpp's token type


def build_tokenizer(metadata: dict, path) -> TokenizerWrapper:
    """From the file's metadata (as gguf_check.read_header decodes it; arrays may
    also be NumPy or MLX arrays)."""
    metadata = {k: _plain(v) for k, v in metadata.items() if k.startswith(("tokenizer.", "general."))}
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ModelLoadError(f"GGUF file {path} has no tokenizer vocabulary; the file is incomplete or corrupt")
    grouped = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    settings, extra = grouped["tokenizer"], grouped["tokenizer_config"]
    types = settings.get("token_type") or [1] * len(tokens)  # 1: a normal token
    if len(types) != len(tokens):
        raise ModelLoadError(f"GGUF file {path} has token types that do not match its vocabulary; the file is corrupt")
    try:
        backend, _ = convert_gguf_tokenizer(metadata.get("general.architecture", "llama"), settings)
    except ValueError as e:  # an unknown tokenizer.ggml.model
        raise UnsupportedModelError(f"{path}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # tokenizers raises bare Exceptions on an inconsistent vocabulary
        raise ModelLoadError(f"GGUF file {path} has an inconsistent tokenizer ({e}); the file is corrupt") from None

    if settings.get("pre_tokenizer_type") == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    special = {name: _token(metadata, tokens, f"tokenizer.ggml.{key}_token_id") for name, key in _SPECIAL.items()}
    bos = special["bos_token"]
    if bos is not None and extra.get("add_bos_token"):
        bos_id = tokens.index(bos) if bos in tokens else metadata["tokenizer.ggml.bos_token_id"]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    special["pad_token"] = special["pad_token"] or special["eos_token"]
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=extra.get("chat_template"), **special)
    eos_ids = [metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos_ids += [i for i, t in enumerate(tokens) if t in END_OF_GENERATION and types[i] == CONTROL]
    eos_ids = [int(i) for i in dict.fromkeys(eos_ids) if isinstance(i, int) and 0 <= i < len(tokens)]
    byte_level = settings.get("tokenizer_type") == "gpt2"
    detokenizer = byte_level_detokenizer if byte_level else NaiveStreamingDetokenizer
    return TokenizerWrapper(hf, detokenizer_class=detokenizer, eos_token_ids=eos_ids)


def _plain(value):
    """NumPy or MLX arrays (and their scalars) as Python lists and numbers."""
    return value.tolist() if hasattr(value, "tolist") else value


def _token(metadata, tokens, key):
    i = metadata.get(key)
    return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None


def byte_level_detokenizer(tokenizer):
    """mlx-lm's BPE streaming detokenizer, minus one thing: it drops the leading
    space of a stream's first segment, which is right for tokenizers that add a
    prefix space. GGUF byte-level BPE adds none, so that space is real text; keep
    it, so the streamed segments always join to exactly `decode(tokens)`."""
    detokenizer = BPEStreamingDetokenizer(tokenizer)
    detokenizer._maybe_trim_space = lambda text: text  # tests/test_tokenizer.py checks this hook still works
    return detokenizer
