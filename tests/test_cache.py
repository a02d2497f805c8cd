"""KV cache: grows in steps, trims, forks cheaply and independently, keeps
positions contiguous (cached passes equal one full pass), honours max_size."""

import mlx.core as mx
import numpy as np
import pytest

from entropix_mlx.decode import prefill as prefill_module
from entropix_mlx.decode.generate import generate
from entropix_mlx.errors import ContextOverflowError
from entropix_mlx.model.cache import (
    KVCache,
    PromptCache,
    SharedPrefixBatchCache,
    SharedPrefixCache,
    cache_length,
    fork_cache,
    make_cache,
    visible_columns,
)
from entropix_mlx.sampling.samplers import GreedySampler


def kv(n, start=0, heads=2, dim=8):
    """n distinct positions: value at (head, position, d) encodes the position."""
    pos = mx.arange(start, start + n, dtype=mx.float32)[None, None, :, None]
    keys = mx.broadcast_to(pos, (1, heads, n, dim)) + mx.arange(heads, dtype=mx.float32)[None, :, None, None] * 1000
    return keys, -keys


def positions(cache):
    """The positions a cache holds, read back from what `update_and_fetch` returns."""
    keys, _ = cache.keys_and_values()
    return np.array(keys[0, 0, :, 0]).astype(int).tolist()


def test_grows_in_steps_and_returns_only_written_keys():
    cache = KVCache()
    keys, values = cache.update_and_fetch(*kv(10))
    assert keys.shape == (1, 2, 10, 8) and values.shape == (1, 2, 10, 8)
    assert cache.keys.shape[2] == 256  # one step preallocated, never returned
    for p in range(10, 257):
        keys, values = cache.update_and_fetch(*kv(1, start=p))
        assert keys.shape[2] == p + 1
    assert cache.keys.shape[2] == 512
    assert positions(cache) == list(range(257))
    assert mx.array_equal(values, -keys)


def test_trim_then_write_continues_at_the_trimmed_position():
    cache = KVCache()
    cache.update_and_fetch(*kv(20))
    assert cache.trim(5) == 5 and cache.offset == 15
    keys, _ = cache.update_and_fetch(*kv(2, start=100))
    assert keys.shape[2] == 17
    assert positions(cache) == list(range(15)) + [100, 101]
    assert cache.trim(1000) == 17 and cache.offset == 0  # never below empty


def test_cache_length_on_all_layers(tiny_model):
    cache = make_cache(tiny_model)
    assert len(cache) == len(tiny_model.layers) and cache_length(cache) == 0
    tiny_model(mx.array([[5, 6, 7, 8, 9]]), cache)
    assert cache_length(cache) == 5
    assert [c.trim(2) for c in cache] == [2, 2]
    assert [c.offset for c in cache] == [3, 3] and cache_length(cache) == 3
    assert cache_length([]) == 0


def test_fork_is_independent_both_ways():
    original = KVCache()
    original.update_and_fetch(*kv(30))
    fork = original.fork()
    assert fork.offset == 30 and positions(fork) == list(range(30))

    fork.update_and_fetch(*kv(3, start=500))
    original.trim(4)  # the original overwrites positions the fork still holds
    original.update_and_fetch(*kv(2, start=900))
    mx.eval(fork.keys, original.keys)
    assert positions(fork) == list(range(30)) + [500, 501, 502]
    assert positions(original) == list(range(26)) + [900, 901]

    fork2 = original.fork()
    fork2.trim(10)
    fork2.update_and_fetch(*kv(1, start=7000))
    assert positions(original) == list(range(26)) + [900, 901]
    assert positions(fork2) == list(range(18)) + [7000]


def test_fork_of_empty_cache():
    fork = KVCache(max_size=8).fork()
    assert fork.offset == 0 and fork.keys is None and fork.max_size == 8
    fork.update_and_fetch(*kv(3))
    assert positions(fork) == [0, 1, 2]


def test_fork_does_not_copy_the_prefix():
    """A fork shares the written prefix: forking a cache that holds 16 MiB of keys
    and values allocates (almost) nothing until one side grows."""
    cache = KVCache()
    cache.update_and_fetch(*kv(2000, heads=8, dim=128))
    mx.eval(cache.keys, cache.values)
    held = cache.keys.nbytes + cache.values.nbytes
    before = mx.get_active_memory()
    forks = [cache.fork() for _ in range(4)]
    mx.eval([(f.keys, f.values) for f in forks])
    assert mx.get_active_memory() - before < held / 10
    assert all(f.keys.shape[2] == 2000 for f in forks)


def full_forward_last(model, tokens):
    logits, scores = model(mx.array([tokens]))
    return logits[:, -1:], scores


def assert_same(a, b, atol=1e-4):
    (logits_a, scores_a), (logits_b, scores_b) = a, b
    np.testing.assert_allclose(np.array(logits_a[:, -1]), np.array(logits_b[:, -1]), atol=atol, rtol=atol)
    for s, t in zip(scores_a, scores_b, strict=False):
        assert s.shape == t.shape
        np.testing.assert_allclose(np.array(s), np.array(t), atol=atol, rtol=atol)


def test_prefill_then_decode_equals_one_full_pass(tiny_model):
    """No hole after prefill: prefill N, then decode, equals one forward on the
    N+1 tokens; also when the prompt goes in two pieces."""
    tokens = [int(t) for t in np.random.default_rng(1).integers(3, 259, size=12)]
    cache = make_cache(tiny_model)
    tiny_model(mx.array([tokens[:11]]), cache)
    assert_same(tiny_model(mx.array([tokens[11:]]), cache), full_forward_last(tiny_model, tokens))

    cache = make_cache(tiny_model)
    tiny_model(mx.array([tokens[:5]]), cache)
    assert_same(tiny_model(mx.array([tokens[5:]]), cache), full_forward_last(tiny_model, tokens))


def test_decode_across_the_growth_boundary_equals_full_pass(tiny_model):
    """Decoding from position 250 to 262 crosses the cache's 256-slot step."""
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 259, size=262)]
    cache = make_cache(tiny_model)
    tiny_model(mx.array([tokens[:250]]), cache)
    for n in range(250, 262):
        out = tiny_model(mx.array([[tokens[n]]]), cache)
    assert cache[0].keys.shape[2] == 512
    assert_same(out, full_forward_last(tiny_model, tokens))


def test_chunked_prefill_equals_full_pass(tiny_model, monkeypatch):
    """prefill (decode/prefill.py) feeds long prompts in chunks; positions stay contiguous."""
    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 4)
    monkeypatch.setattr(prefill_module, "SINGLE_PASS_TOKENS", 2)
    tokens = [int(t) for t in np.random.default_rng(3).integers(3, 259, size=11)]
    for n in (8, 9, 11):  # a multiple of the chunk, one past it, and a remainder
        cache = make_cache(tiny_model)
        logits, scores = prefill_module.prefill(tiny_model, tokens[:n], cache)
        assert cache_length(cache) == n
        assert_same((logits, scores), full_forward_last(tiny_model, tokens[:n]))


def test_short_prompt_prefills_in_one_pass(tiny_model, monkeypatch):
    """A prompt up to SINGLE_PASS_TOKENS is one forward pass (each pass reads
    every weight), with the same logits, scores and cache as the full pass."""
    monkeypatch.setattr(prefill_module, "SINGLE_PASS_TOKENS", 9)
    calls = []
    counting = lambda *a, **k: calls.append(a[0].shape) or type(tiny_model).__call__(tiny_model, *a, **k)  # noqa: E731
    tokens = [int(t) for t in np.random.default_rng(4).integers(3, 259, size=10)]
    for n, passes in ((1, 1), (9, 1), (10, 2)):
        calls.clear()
        cache = make_cache(tiny_model)
        out = prefill_module.prefill(counting, tokens[:n], cache)
        assert len(calls) == passes and cache_length(cache) == n
        assert_same(out, full_forward_last(tiny_model, tokens[:n]))


def test_max_size_raises_and_leaves_the_cache_intact():
    cache = KVCache(max_size=8)
    cache.update_and_fetch(*kv(6))
    with pytest.raises(ContextOverflowError) as err:
        cache.update_and_fetch(*kv(3, start=6))
    assert "\n" not in str(err.value) and "9" in str(err.value) and "8" in str(err.value)
    assert cache.offset == 6 and positions(cache) == list(range(6))
    cache.update_and_fetch(*kv(2, start=6))  # exactly full is fine
    assert cache.offset == 8
    with pytest.raises(ContextOverflowError):
        cache.update_and_fetch(*kv(1, start=8))


def test_model_context_is_the_default_limit(tiny_model, tiny_tokenizer):
    """make_cache uses the model's max_position_embeddings (512 for the tiny
    model); an overflow leaves every layer untouched, and generate raises the
    typed error."""
    cache = make_cache(tiny_model)
    assert all(c.max_size == 512 for c in cache)
    tiny_model(mx.array([[7] * 510]), cache)
    with pytest.raises(ContextOverflowError):
        tiny_model(mx.array([[7] * 3]), cache)
    assert [c.offset for c in cache] == [510, 510]
    tiny_model(mx.array([[7, 7]]), cache)
    assert cache_length(cache) == 512

    with pytest.raises(ContextOverflowError):
        list(generate(tiny_model, tiny_tokenizer, [7] * 513, GreedySampler(), max_tokens=2))
    short = make_cache(tiny_model, max_size=12)
    with pytest.raises(ContextOverflowError):  # the answer runs into the limit
        list(generate(tiny_model, tiny_tokenizer, [7] * 10, GreedySampler(), max_tokens=5, cache=short))


def test_fork_cache_list_forks_every_layer(tiny_model):
    cache = make_cache(tiny_model)
    tiny_model(mx.array([[1, 2, 3]]), cache)
    forked = fork_cache(cache)
    assert len(forked) == len(cache) and all(f is not c for f, c in zip(forked, cache, strict=False))
    tiny_model(mx.array([[4, 5]]), forked)
    assert cache_length(forked) == 5 and cache_length(cache) == 3
    assert all(f.max_size == c.max_size for f, c in zip(forked, cache, strict=False))


def test_a_joining_cache_takes_a_rows_slot_in_place_and_shared_padding_is_dropped():
    """`RowsKVCache.place`: a batch-1 cache becomes one row's last positions, the
    rest of that row padding; the other rows keep their keys. `drop_padding`
    forgets columns every row pads, moving nobody's real keys."""
    from entropix_mlx.model.cache import RowsKVCache

    batch = RowsKVCache([1, 0, 2])
    k, v = kv(5)
    batch.update_and_fetch(mx.concatenate([k, k + 100, k + 200]), mx.concatenate([v, v - 100, v - 200]))
    joiner = KVCache()
    joiner.update_and_fetch(*kv(3, start=50))
    batch.place(1, joiner)

    keys, values = batch.keys_and_values()
    assert batch.left_padding.tolist() == [1, 2, 2] and batch.offset.tolist() == [4, 3, 3]
    assert np.array(keys[1, 0, 2:, 0]).tolist() == [50, 51, 52]  # the joiner's, right-aligned
    assert mx.array_equal(values[1, :, 2:], -keys[1, :, 2:])
    assert np.array(keys[0, 0, 1:, 0]).tolist() == [1, 2, 3, 4]  # other rows untouched
    assert np.array(keys[2, 0, 2:, 0]).tolist() == [202, 203, 204]

    batch.drop_padding(1)
    keys, _ = batch.keys_and_values()
    assert batch.left_padding.tolist() == [0, 1, 1] and keys.shape[2] == 4
    assert np.array(keys[1, 0, 1:, 0]).tolist() == [50, 51, 52]
    assert np.array(keys[2, 0, 1:, 0]).tolist() == [202, 203, 204]  # its padding was 2

    too_long = KVCache()
    too_long.update_and_fetch(*kv(5))
    with pytest.raises(ValueError, match="does not fit"):
        batch.place(0, too_long)


def test_a_prompt_cache_holds_exactly_the_prefix_then_its_writes(tiny_model):
    """A riding prompt's cache (decode/group.py): what the prefix holds, then each write in
    order, with no empty slots; the prefix's own cache is untouched."""
    prefix = make_cache(tiny_model)
    for layer in prefix:
        layer.update_and_fetch(*kv(5))
    caches = PromptCache.after(prefix, tiny_model)
    assert len(caches) == len(tiny_model.layers) and all(c.offset == 5 for c in caches)
    cache = caches[0]
    keys, values = cache.update_and_fetch(*kv(3, start=5))
    assert keys.shape[2] == 8 and cache.keys.shape[2] == 8 and cache.offset == 8
    assert positions(cache) == list(range(8)) and mx.array_equal(values, -keys)
    cache.update_and_fetch(*kv(2, start=8))
    assert positions(cache) == list(range(10))
    assert positions(prefix[0]) == list(range(5)) and prefix[0].offset == 5
    # Without a prefix it starts empty.
    empty = PromptCache.after(None, tiny_model)[0]
    empty.update_and_fetch(*kv(4))
    assert positions(empty) == list(range(4))


def test_a_prompt_cache_honours_the_models_context(tiny_model):
    cache = PromptCache.after(None, tiny_model)[0]
    cache.max_size = 6
    cache.update_and_fetch(*kv(4))
    with pytest.raises(ContextOverflowError):
        cache.update_and_fetch(*kv(3, start=4))
    assert positions(cache) == list(range(4))


def _filled(n: int, cache=None) -> KVCache:
    cache = cache if cache is not None else KVCache()
    cache.update_and_fetch(mx.zeros((1, 1, n, 2)), mx.zeros((1, 1, n, 2)))
    return cache


@pytest.mark.parametrize("window", [2, 3, 6, 9])
def test_shared_prefix_batch_windows_count_positions_not_columns(window):
    """A row's padding sits between the shared prefix and its own keys: its
    sliding window covers the same positions as in a cache of its own."""
    from mlx_lm.models.base import create_causal_mask

    prefix = _filled(4)
    rows = [_filled(n, prefix.fork()) for n in (2, 6)]
    merged = SharedPrefixBatchCache.merge_rows(prefix, rows)
    mask = merged.make_mask(1, window_size=window)
    pads = merged.left_padding.tolist()
    assert pads == [4, 0]
    for i, row in enumerate(rows):
        expected = create_causal_mask(1, row.offset, window_size=window)
        assert mx.array_equal(visible_columns(mask[i, 0], pads[i], prefix=4), expected)
        assert not mask[i, 0, :, 4 : 4 + pads[i]].any()  # padding stays hidden


def test_a_rollout_cache_windows_its_one_query():
    from mlx_lm.models.base import create_causal_mask

    parent = _filled(7)
    rollout = SharedPrefixCache(parent, 3, 4)
    rollout.update_and_fetch(mx.zeros((3, 1, 1, 2)), mx.zeros((3, 1, 1, 2)))
    assert rollout.make_mask(1) is None
    assert mx.array_equal(rollout.make_mask(1, window_size=3), create_causal_mask(1, 8, window_size=3))
