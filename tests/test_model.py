"""The Llama port: logits equal mlx-lm's own Llama, attention scores equal a
by-hand computation over exactly the visible keys, Llama-3 RoPE scaling, and the
plain greedy decode loop."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import TINY_CONFIG, make_tiny_model, make_tiny_tokenizer
from mlx_lm.models import llama
from mlx_lm.models.rope_utils import Llama3RoPE
from mlx_lm.utils import dequantize_model

from entropix_mlx.decode.generate import generate
from entropix_mlx.model.cache import fork_cache, make_cache
from entropix_mlx.model.loading import FreqsRoPE, bundled_path, load_gguf
from entropix_mlx.sampling.samplers import GreedySampler

# --------------------------------------------------------------------------
# A by-hand reference: the whole causal forward pass written out with plain
# matrix products over the full sequence (no cache, no fused kernels).
# --------------------------------------------------------------------------


def llama3_inv_freqs(head_dim, base, factor, low_freq_factor, high_freq_factor, original_context):
    """Meta's `apply_scaling` (llama3 reference code), on inverse frequencies."""
    scaled = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original_context / high_freq_factor:
            scaled.append(freq)
        elif wavelen > original_context / low_freq_factor:
            scaled.append(freq / factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            scaled.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(scaled)


def _rope(x, inv_freqs, traditional):
    """x: (heads, L, D) numpy; rotate position p by p * inv_freqs."""
    L, D = x.shape[1], x.shape[2]
    angles = np.arange(L)[:, None] * inv_freqs[None, :]  # (L, D/2)
    cos, sin = np.cos(angles), np.sin(angles)
    if traditional:  # rotate interleaved pairs (x0, x1), (x2, x3), ...
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    a, b = x[..., : D // 2], x[..., D // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _np(a):
    return np.array(a.astype(mx.float32), dtype=np.float64)


def reference_forward(model, tokens, inv_freqs=None):
    """Full-sequence forward pass of a plain (unquantized) port `Model`, in float64
    numpy. Returns (logits (L, vocab), [per layer: last query row's pre-softmax
    scores (heads, L)])."""
    args = model.args
    n_heads, n_kv = args.num_attention_heads, args.num_key_value_heads
    head_dim = args.head_dim or args.hidden_size // n_heads
    if inv_freqs is None:
        inv_freqs = 1.0 / args.rope_theta ** (np.arange(0, head_dim, 2) / head_dim)
    L = len(tokens)
    eps = args.rms_norm_eps

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * _np(w)

    embed = _np(model.model.embed_tokens.weight)
    h = embed[np.array(tokens)]
    causal = np.tril(np.ones((L, L), dtype=bool))
    last_scores = []
    for layer in model.layers:
        attn = layer.self_attn
        x = rms(h, layer.input_layernorm.weight)
        q = (x @ _np(attn.q_proj.weight).T).reshape(L, n_heads, head_dim).transpose(1, 0, 2)
        k = (x @ _np(attn.k_proj.weight).T).reshape(L, n_kv, head_dim).transpose(1, 0, 2)
        v = (x @ _np(attn.v_proj.weight).T).reshape(L, n_kv, head_dim).transpose(1, 0, 2)
        q, k = _rope(q, inv_freqs, args.rope_traditional), _rope(k, inv_freqs, args.rope_traditional)
        k, v = np.repeat(k, n_heads // n_kv, axis=0), np.repeat(v, n_heads // n_kv, axis=0)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
        last_scores.append(s[:, -1, :])
        s = np.where(causal, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(L, -1)
        h = h + o @ _np(attn.o_proj.weight).T
        x = rms(h, layer.post_attention_layernorm.weight)
        gate, up = x @ _np(layer.mlp.gate_proj.weight).T, x @ _np(layer.mlp.up_proj.weight).T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ _np(layer.mlp.down_proj.weight).T
    h = rms(h, model.model.norm.weight)
    head = embed if args.tie_word_embeddings else _np(model.lm_head.weight)
    return h @ head.T, last_scores


def assert_step_matches(model, logits, scores, tokens, tol=1e-4):
    """The port's output for the last position (logits (1, ., V), scores per
    layer (1, heads, keys)) equals the by-hand full forward over `tokens`."""
    ref_logits, ref_scores = reference_forward(model, tokens)
    assert len(scores) == len(ref_scores)
    for s, ref in zip(scores, ref_scores, strict=False):
        assert s.dtype == mx.float32
        assert s.shape == (1, ref.shape[0], len(tokens)), "scores must cover exactly the visible keys"
        np.testing.assert_allclose(_np(s[0]), ref, atol=tol, rtol=tol)
    np.testing.assert_allclose(_np(logits[0, -1]), ref_logits[-1], atol=tol, rtol=tol)


# --------------------------------------------------------------------------
# Tiny model: scores over exactly the visible keys, at every step
# --------------------------------------------------------------------------


@pytest.mark.parametrize("traditional", [False, True])
def test_full_forward_matches_by_hand(traditional):
    """Without a cache, every position's logits and the last row's scores equal
    the written-out computation (both RoPE layouts: HF halves and GGUF pairs)."""
    model = make_tiny_model(seed=1, rope_traditional=traditional)
    tokens = [5, 80, 17, 200, 33, 33, 9, 150, 71]
    logits, scores = model(mx.array([tokens]))
    ref_logits, _ = reference_forward(model, tokens)
    np.testing.assert_allclose(_np(logits[0]), ref_logits, atol=1e-4, rtol=1e-4)
    assert_step_matches(model, logits, scores, tokens)


def test_scores_cover_visible_keys_through_decode_trim_and_fork():
    """Prefill N, decode N+1, N+2, ...; trim by k; fork and decode different
    tokens on both sides: at every step the scores have exactly the visible keys
    and their values equal q.k^T*scale of a full uncached forward pass."""
    model = make_tiny_model(seed=2)
    cache = make_cache(model)
    tokens = [12, 99, 4, 250, 61, 7, 7]
    logits, scores = model(mx.array([tokens]), cache, last_only=True)
    assert logits.shape == (1, 1, TINY_CONFIG["vocab_size"])
    assert_step_matches(model, logits, scores, tokens)

    for token in [40, 41, 3, 180, 18]:  # decode steps: N+1, N+2, ...
        tokens.append(token)
        logits, scores = model(mx.array([[token]]), cache)
        assert_step_matches(model, logits, scores, tokens)

    assert [c.trim(3) for c in cache] == [3, 3]  # drop the last three positions
    del tokens[-3:]
    tokens.append(77)
    logits, scores = model(mx.array([[77]]), cache)
    assert_step_matches(model, logits, scores, tokens)

    fork = fork_cache(cache)
    fork_tokens = tokens + [200]
    logits, scores = model(mx.array([[200]]), fork)  # the fork writes first
    mx.eval(logits, scores, [c.keys for c in fork])
    assert_step_matches(model, logits, scores, fork_tokens)

    tokens.append(5)  # the original then decodes a different token
    logits, scores = model(mx.array([[5]]), cache)
    mx.eval(logits, scores)
    assert_step_matches(model, logits, scores, tokens)

    # Trimming the original and overwriting positions the fork still holds
    # must not reach the fork (they shared the written prefix).
    for c in cache:
        c.trim(2)
    del tokens[-2:]
    tokens += [130, 131]
    logits, scores = model(mx.array([[130, 131]]), cache)
    mx.eval(logits, scores)
    assert_step_matches(model, logits, scores, tokens)

    fork_tokens.append(9)
    logits, scores = model(mx.array([[9]]), fork)
    assert_step_matches(model, logits, scores, fork_tokens)


def test_key_mask_hides_padding_keys():
    """Left padding: keys marked False get -inf scores; the real ones keep the
    values an unpadded pass gives."""
    model = make_tiny_model(seed=3)
    tokens = [30, 31, 32, 33]
    _, plain = model(mx.array([tokens]))
    padded = [0, 0] + tokens
    key_mask = mx.array([[False, False, True, True, True, True]])
    mask = mx.where(mx.tril(mx.ones((6, 6), dtype=mx.bool_)) & key_mask[:, None, :], 0.0, -mx.inf)
    _, scores = model(mx.array([padded]), mask=mask[:, None].astype(mx.float32), key_mask=key_mask)
    for s, p in zip(scores, plain, strict=False):
        assert s.shape == (1, 4, 6)
        assert np.all(np.isneginf(_np(s[0, :, :2])))
        # RoPE is relative, so a shift by two positions leaves q.k unchanged.
        np.testing.assert_allclose(_np(s[0, :, 2:]), _np(p[0]), atol=1e-4, rtol=1e-4)


def test_a_packed_pass_equals_one_pass_per_input():
    """Decode rows of a padded batch and two prompts (one on a fresh cache, one
    after a cached prefix) in one pass: each gets the logits, scores and cache
    a pass of its own gives, and the prompts' equal the by-hand forward."""
    from mlx_lm.models.cache import BatchKVCache

    from entropix_mlx.model.llama import Segment

    model = make_tiny_model(seed=4)
    rows = [[7, 8, 9, 10], [20, 21]]

    def batch_cache():
        cache = [BatchKVCache([0, 2]) for _ in model.layers]
        model(mx.array([rows[0], [0, 0] + rows[1]]), cache, last_only=True)
        return cache

    def prefix_cache():
        cache = make_cache(model)
        model(mx.array([[3, 4, 5]]), cache)
        return cache

    key_mask = mx.array([[True] * 5, [False, False, True, True, True]])
    decode, fresh, after = mx.array([[11], [22]]), mx.array([[40, 41, 42]]), mx.array([[50, 51]])
    alone = [
        model(decode, c := batch_cache(), key_mask=key_mask, last_only=True) + (c,),
        model(fresh, c := make_cache(model), last_only=True) + (c,),
        model(after, c := prefix_cache(), last_only=True) + (c,),
    ]
    caches = [batch_cache(), make_cache(model), prefix_cache()]
    packed = model.packed(
        [Segment(decode, caches[0], key_mask=key_mask), Segment(fresh, caches[1]), Segment(after, caches[2])]
    )
    for (logits, scores, cache), (p_logits, p_scores), p_cache in zip(alone, packed, caches, strict=False):
        assert p_logits.shape == logits.shape and len(p_scores) == len(scores)
        np.testing.assert_allclose(_np(p_logits), _np(logits), atol=1e-5, rtol=1e-5)
        for s, p in zip(scores, p_scores, strict=False):
            np.testing.assert_allclose(_np(p), _np(s), atol=1e-5, rtol=1e-5)
        for c, pc in zip(cache, p_cache, strict=False):
            assert pc.offset == c.offset if isinstance(c.offset, int) else mx.array_equal(pc.offset, c.offset)
            np.testing.assert_allclose(_np(pc.state[0]), _np(c.state[0]), atol=1e-5, rtol=1e-5)
    assert_step_matches(model, packed[1][0], packed[1][1], [40, 41, 42])
    assert_step_matches(model, packed[2][0], packed[2][1], [3, 4, 5, 50, 51])


# --------------------------------------------------------------------------
# Llama-3 RoPE scaling
# --------------------------------------------------------------------------

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def test_llama3_rope_scaling_matches_mlx_lm_and_reference():
    """A tiny model with Llama-3 RoPE scaling, run past its original context (16):
    our port equals mlx-lm's llama on the same weights and the by-hand forward
    with Meta's scaled frequencies; the scaling really changes the output."""
    model = make_tiny_model(seed=4, rope_scaling=LLAMA3_SCALING)
    reference = llama.Model(llama.ModelArgs.from_dict({**TINY_CONFIG, "rope_scaling": LLAMA3_SCALING}))
    reference.load_weights(list(nn.utils.tree_flatten(model.parameters())))
    tokens = [int(t) for t in np.random.default_rng(0).integers(3, 259, size=40)]

    logits, scores = model(mx.array([tokens]))
    np.testing.assert_allclose(_np(logits), _np(reference(mx.array([tokens]))), atol=1e-4, rtol=1e-4)

    inv_freqs = llama3_inv_freqs(16, TINY_CONFIG["rope_theta"], 8.0, 1.0, 4.0, 16)
    ref_logits, ref_scores = reference_forward(model, tokens, inv_freqs)
    np.testing.assert_allclose(_np(logits[0]), ref_logits, atol=1e-4, rtol=1e-4)
    for s, ref in zip(scores, ref_scores, strict=False):
        np.testing.assert_allclose(_np(s[0]), ref, atol=1e-4, rtol=1e-4)

    unscaled_logits, _ = reference_forward(model, tokens)
    assert np.abs(unscaled_logits[20:] - ref_logits[20:]).max() > 1e-2


def test_freqs_rope_matches_llama3_rope():
    """llama.cpp stores Llama-3 scaling as per-frequency factors (`rope_freqs`);
    FreqsRoPE with the factors llama.cpp's converter computes equals mlx-lm's
    Llama3RoPE, in both layouts, at offsets past the original context."""
    dims, base = 64, 500000.0
    cfg = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    inv = 1.0 / base ** (np.arange(0, dims, 2) / dims)
    factors = inv / llama3_inv_freqs(dims, base, 8.0, 1.0, 4.0, 64)  # 1 (high freq) .. 8 (low freq)
    assert factors.min() == pytest.approx(1.0) and factors.max() == pytest.approx(8.0)
    assert np.any((factors > 1.01) & (factors < 7.99)), "the smooth middle band must be exercised"
    x = mx.random.normal((1, 4, 5, dims), key=mx.random.key(0))
    for traditional in (False, True):
        ours = FreqsRoPE(nn.RoPE(dims, traditional=traditional, base=base), mx.array(factors, dtype=mx.float32))
        theirs = Llama3RoPE(dims, traditional=traditional, base=base, scaling_config=cfg)
        for offset in (0, 100, 5000):
            np.testing.assert_allclose(_np(ours(x, offset=offset)), _np(theirs(x, offset=offset)), atol=1e-3, rtol=1e-4)


# --------------------------------------------------------------------------
# The bundled model against mlx-lm's own Llama on the same GGUF weights
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlx_lm_bundled():
    """mlx-lm's `llama.Model` built from the bundled GGUF (same weights as `smollm`): as
    stored (Q4_1), and dequantized with float32 scales, as `--weights float32` makes ours.
    MLX's quantized products are slow on a CPU, so the long comparisons use the second."""
    native, _ = load_gguf(bundled_path(), llama.Model, llama.ModelArgs)
    exact, _ = load_gguf(bundled_path(), llama.Model, llama.ModelArgs)
    exact.set_dtype(mx.float32)
    return native, dequantize_model(exact)


@pytest.mark.slow
def test_bundled_logits_match_mlx_lm(smollm_native, smollm_float32, mlx_lm_bundled):
    """As stored, the prompt's logits; dequantized, prefill and 20 greedy decode steps:
    max |logit difference| < 1e-2 and the same argmax at every step; scores grow by one
    key per step."""
    from mlx_lm.models.cache import make_prompt_cache

    (native, tokenizer), (model, _) = smollm_native, smollm_float32
    theirs_native, theirs = mlx_lm_bundled
    ids = tokenizer.encode("Which number is larger, 9.9 or 9.11?")
    logits, _ = native(mx.array([ids]), make_cache(native))
    ref = theirs_native(mx.array([ids]), cache=make_prompt_cache(theirs_native))
    assert mx.abs(logits - ref).max().item() < 1e-2
    assert mx.array_equal(mx.argmax(logits, -1), mx.argmax(ref, -1))

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which number is larger, 9.9 or 9.11?"}], add_generation_prompt=True
    )
    cache, ref_cache = make_cache(model), make_prompt_cache(theirs)
    logits, scores = model(mx.array([ids]), cache)
    ref = theirs(mx.array([ids]), cache=ref_cache)
    assert mx.abs(logits - ref).max().item() < 1e-2
    assert mx.array_equal(mx.argmax(logits, -1), mx.argmax(ref, -1))
    for step in range(20):
        token = mx.argmax(logits[0, -1]).item()
        assert token == mx.argmax(ref[0, -1]).item()
        logits, scores = model(mx.array([[token]]), cache)
        ref = theirs(mx.array([[token]]), cache=ref_cache)
        assert mx.abs(logits - ref).max().item() < 1e-2, f"step {step}"
        assert len(scores) == 30 and scores[0].shape == (1, 9, len(ids) + step + 1)
    assert mx.argmax(logits[0, -1]).item() == mx.argmax(ref[0, -1]).item()


@pytest.mark.slow
def test_bundled_greedy_continuations_match_mlx_lm(smollm_float32, mlx_lm_bundled):
    """Our decode loop with GreedySampler gives the same tokens as mlx-lm's
    `stream_generate` (greedy) on mlx-lm's model, for several prompts."""
    from mlx_lm import stream_generate

    (model, tokenizer), (_, theirs) = smollm_float32, mlx_lm_bundled
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, 9.11"]
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        expected = [
            r.token for r in stream_generate(theirs, tokenizer, ids, max_tokens=12) if r.finish_reason != "stop"
        ]
        ours = [event.token for event in generate(model, tokenizer, ids, GreedySampler(), max_tokens=12)]
        assert len(ours) == 12
        assert ours == expected, prompt


# --------------------------------------------------------------------------
# The plain decode loop on the tiny model
# --------------------------------------------------------------------------


def greedy_by_full_forward(model, prompt, n):
    """Greedy continuation recomputed from scratch at each step (no cache)."""
    tokens = list(prompt)
    for _ in range(n):
        logits, _ = model(mx.array([tokens]))
        tokens.append(mx.argmax(logits[0, -1]).item())
    return tokens[len(prompt) :]


def test_generate_stops_at_max_tokens(tiny_model, tiny_tokenizer):
    prompt = tiny_tokenizer.encode("Hello there")
    expected = greedy_by_full_forward(tiny_model, prompt, 9)
    assert tiny_tokenizer.eos_token_ids.isdisjoint(expected), "pick another prompt or seed"
    generation = generate(tiny_model, tiny_tokenizer, prompt, GreedySampler(), max_tokens=9)
    assert generation.summary().finish_reason == "running"
    events = list(generation)
    assert [e.token for e in events] == expected
    assert "".join(e.text for e in events) == tiny_tokenizer.decode(expected)
    assert all(e.strategy == "argmax" and e.logprob <= 0.0 for e in events)
    summary = generation.summary()
    assert summary.finish_reason == "length"
    assert summary.tokens == 9 and summary.prompt_tokens == len(prompt)
    assert summary.strategy_counts == {"argmax": 9}
    assert summary.thinking_insertions == 0
    assert summary.prompt_tps > 0 and summary.generation_tps > 0 and summary.peak_memory_gb > 0


def test_generate_stops_at_eos(tiny_model):
    """Declare the 5th greedy token an end-of-sequence token: the loop stops
    there, without emitting it."""
    tokenizer = make_tiny_tokenizer()
    prompt = tokenizer.encode("Hello there")
    continuation = greedy_by_full_forward(tiny_model, prompt, 8)
    stop = continuation[4]
    tokenizer.add_eos_token(str(stop))
    expected = continuation[: continuation.index(stop)]
    generation = generate(tiny_model, tokenizer, prompt, GreedySampler(), max_tokens=50)
    assert [e.token for e in generation] == expected
    summary = generation.summary()
    assert summary.finish_reason == "eos"
    assert summary.tokens == len(expected) and summary.strategy_counts.get("argmax", 0) == len(expected)
