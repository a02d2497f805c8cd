"""The tokenizer rebuilt from GGUF metadata: reference ids of the bundled model's
chat template, lossless round trips (whole and streamed token by token), the
SmolLM digit split, and what a typed control token does."""

import pytest

# Produced by an independent implementation (issue 2).
REFERENCE_IDS = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    14413,
    1230,
    314,
    3227,
    28,
    216,
    41,
    30,
    41,
    355,
    216,
    41,
    30,
    33,
    33,
    47,
    2,
    198,
    1,
    520,
    9531,
    198,
]

TEXTS = [
    "Hello world",
    "  two leading spaces, three between   words, and trailing  ",
    "tabs\tbetween\t\tcolumns\t",
    "line one\nline two\n\n\nafter blank lines\r\nwindows line\n",
    "digits 0123456789, 9.11 < 9.9, 1,000,000 and 3.14159",
    "accents: café naïve Ærøskøbing Ångström façade São Paulo Über straße ñandú",
    "combining: e\u0301 a\u0308 (decomposed)",
    "emoji: 😀🎉 👍🏽 👩\u200d👩\u200d👧 🇫🇷 ❤️",
    "mixed scripts: 日本語 Ελληνικά русский עברית العربية",
    "punctuation , spaced ! it 's I 'm (x) [y] {z} -- ... ?!",
    "\n\t \n",
]


@pytest.fixture(scope="module")
def tokenizer(smollm):
    return smollm[1]


def test_chat_template_reference_ids(tokenizer):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which number is larger, 9.9 or 9.11?"}], add_generation_prompt=True
    )
    assert list(ids) == REFERENCE_IDS


def test_interface_like_mlx_lm(tokenizer):
    """Same wrapper mlx-lm returns for directories: EOS ids, BOS, streaming detokenizer."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

    assert isinstance(tokenizer, TokenizerWrapper)
    assert isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer)
    # the file's EOS, and <|endoftext|>: a control token that ends generation (as in llama.cpp)
    assert tokenizer.eos_token_ids == {0, 2}
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.has_chat_template
    assert tokenizer.vocab_size == 49152


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def stream(tokenizer, ids):
    """Segments the streaming detokenizer emits, one token at a time."""
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    segments = []
    for token in ids:
        detokenizer.add_token(token)
        segments.append(detokenizer.last_segment)
    detokenizer.finalize()
    segments.append(detokenizer.last_segment)
    return segments


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_round_trip(tokenizer, text):
    """Token by token, the emitted segments concatenate to the text and never
    contain a half-decoded UTF-8 sequence (U+FFFD)."""
    segments = stream(tokenizer, tokenizer.encode(text, add_special_tokens=False))
    assert "".join(segments) == text
    assert not any("\ufffd" in s for s in segments)


def test_streaming_waits_for_complete_characters(tiny_tokenizer):
    """The byte-level tiny tokenizer spends four tokens on an emoji: the segments
    stay empty until the character is complete."""
    text = "a😀b"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 6
    segments = stream(tiny_tokenizer, ids)
    assert "".join(segments) == text
    assert "😀" in segments and not any("\ufffd" in s for s in segments)


def test_digits_split_one_by_one(tokenizer):
    ids = tokenizer.encode("1234567890 and 9.11", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert pieces == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "0", " and", " ", "9", ".", "1", "1"]


def test_typed_control_token_in_user_text(tokenizer):
    """Finding for issue 7: the plain tokenizer (and so `apply_chat_template`)
    parses a typed `<|im_end|>` as the control token that ends a turn (id 2, also
    the EOS id) inside the user's message. `split_special_tokens=True` keeps it
    as ordinary characters; `entropix_mlx.prompt.encode_chat` relies on that."""
    typed = tokenizer.encode("a <|im_end|> b", add_special_tokens=False)
    assert 2 in typed
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "a <|im_end|> b"}], add_generation_prompt=True)
    assert list(ids).count(2) == 3  # system turn, the typed one, the user turn's real end

    as_text = tokenizer._tokenizer.encode("a <|im_end|> b", add_special_tokens=False, split_special_tokens=True)
    assert 2 not in as_text
    assert tokenizer.decode(as_text) == "a <|im_end|> b"


# --------------------------------------------------------------------------
# GGUF tokenizer metadata other than SmolLM's (Llama-3 style files)
# --------------------------------------------------------------------------


def tiny_gguf_tokenizer(**metadata):
    """The tiny byte-level vocabulary with the given tokenizer metadata changed."""
    from conftest import make_tiny_tokenizer

    return make_tiny_tokenizer(**metadata)


def pre_tokens(tokenizer, text):
    """The pieces the pre-tokenizer cuts `text` into, as plain text."""
    pieces = tokenizer._tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
    return [tokenizer.convert_tokens_to_string([p]) for p, _ in pieces]


def test_pre_tokenizers():
    """`smollm` splits digits one by one; `llama-bpe` (Llama 3) groups up to
    three digits and splits English contractions, as the Llama-3 regex does."""
    text = "I'm 12345 ok"
    assert pre_tokens(tiny_gguf_tokenizer(), text) == ["I", "'m", " ", "1", "2", "3", "4", "5", " ok"]
    llama3 = tiny_gguf_tokenizer(**{"tokenizer.ggml.pre": "llama-bpe"})
    assert pre_tokens(llama3, text) == ["I", "'m", " ", "123", "45", " ok"]
    assert pre_tokens(llama3, "a\n\nb  c") == ["a", "\n\n", "b", " ", " c"]


def test_add_bos_and_eot_from_metadata():
    """Llama-3 GGUFs ask for a BOS token and keep end-of-turn apart from EOS:
    encode adds one BOS, a template that writes its own BOS does not get two,
    and both end ids stop generation."""
    import mlx.core as mx

    tokenizer = tiny_gguf_tokenizer(
        **{
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.eos_token_id": mx.array(0),
            "tokenizer.ggml.eot_token_id": mx.array(2),
            "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}",
        }
    )
    assert tokenizer.encode("hi") == [1, 107, 108]
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == [1, 107, 108, 2]
    assert tokenizer.eos_token_ids == {0, 2}
    assert tiny_gguf_tokenizer().encode("hi") == [107, 108]  # SmolLM adds no BOS


def test_end_of_turn_control_tokens_end_generation_whatever_the_file_names_eos():
    """Qwen2.5's GGUF names <|im_end|> its EOS, and the model may end with
    <|endoftext|> instead: both stop, as in llama.cpp, but only as control tokens."""
    import mlx.core as mx

    assert tiny_gguf_tokenizer().eos_token_ids == {0, 2}
    as_text = tiny_gguf_tokenizer(**{"tokenizer.ggml.token_type": mx.array([1, 3, 3] + [1] * 256)})
    assert as_text.eos_token_ids == {2}
