"""The six metrics against NumPy references written from their definitions (bits)."""

import mlx.core as mx
import numpy as np
import pytest

from entropix_mlx.sampling.metrics import METRIC_NAMES, attention_metrics, logits_entropy, select_layers, step_metrics


def np_logits_entropy(logits):
    z = logits - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    surprisal = -np.log2(p)
    h = (p * surprisal).sum()
    return h, (p * (surprisal - h) ** 2).sum()


def np_attention(scores, n_visible):
    """scores (heads, keys); only the first n_visible keys are visible."""
    s = scores[:, :n_visible].astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    head_h = -(p * np.log2(p)).sum(-1)
    return {
        "attn_entropy": head_h.mean(),
        "attn_varentropy": head_h.var(),
        "agreement": np.abs(p - p.mean(0, keepdims=True)).mean(),
        "interaction_strength": np.abs(s).mean(),
    }


@pytest.mark.parametrize("seed", range(5))
def test_logits_entropy_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, rng.uniform(0.5, 6), size=1000).astype(np.float32)
    h, v = logits_entropy(mx.array(logits))
    ref_h, ref_v = np_logits_entropy(logits.astype(np.float64))
    assert h.item() == pytest.approx(ref_h, rel=1e-4, abs=1e-5)
    assert v.item() == pytest.approx(ref_v, rel=1e-3, abs=1e-4)


def test_logits_entropy_known_values_in_bits():
    h, v = logits_entropy(mx.zeros(256))  # uniform over 2**8 tokens
    assert h.item() == pytest.approx(8.0, abs=1e-4)
    assert v.item() == pytest.approx(0.0, abs=1e-4)
    two_peaks = mx.array([0.0, 0.0] + [-1e9] * 10)  # two equal tokens, rest impossible
    h, v = logits_entropy(two_peaks)
    assert h.item() == pytest.approx(1.0, abs=1e-5)
    assert v.item() == pytest.approx(0.0, abs=1e-5)
    masked = mx.array([0.0, 0.0, -mx.inf, -mx.inf])  # -inf logits (filtered) contribute nothing
    h, v = logits_entropy(masked)
    assert (h.item(), v.item()) == pytest.approx((1.0, 0.0), abs=1e-5)


def test_varentropy_is_high_for_a_peak_with_a_long_tail():
    logits = mx.array([10.0] + [0.0] * 5000)
    h, v = logits_entropy(logits)
    ref_h, ref_v = np_logits_entropy(np.array([10.0] + [0.0] * 5000))
    assert v.item() > 5 and v.item() == pytest.approx(ref_v, rel=1e-3)
    assert h.item() == pytest.approx(ref_h, rel=1e-4)


@pytest.mark.parametrize("seed", range(5))
def test_attention_metrics_match_numpy_per_layer(seed):
    rng = np.random.default_rng(seed)
    layers, heads, keys = 3, 4, int(rng.integers(1, 40))
    scores = rng.normal(0, rng.uniform(0.5, 5), size=(layers, heads, keys)).astype(np.float32)
    got = attention_metrics([mx.array(s) for s in scores])
    for name in ("attn_entropy", "attn_varentropy", "agreement", "interaction_strength"):
        assert got[name].shape == (layers,)
        ref = [np_attention(scores[i], keys)[name] for i in range(layers)]
        np.testing.assert_allclose(np.array(got[name]), ref, rtol=2e-4, atol=1e-5, err_msg=name)


def test_padded_keys_are_left_out():
    rng = np.random.default_rng(7)
    scores = rng.normal(size=(2, 4, 10)).astype(np.float32)
    padded = scores.copy()
    padded[:, :, 6:] = -np.inf  # keys 6..9 are padding
    got = attention_metrics(mx.array(padded))
    for name in ("attn_entropy", "attn_varentropy", "agreement", "interaction_strength"):
        ref = [np_attention(scores[i], 6)[name] for i in range(2)]
        np.testing.assert_allclose(np.array(got[name]), ref, rtol=2e-4, atol=1e-6, err_msg=name)


def test_agreement_measures_disagreement():
    same = mx.broadcast_to(mx.array([3.0, 0.0, 0.0, 0.0]), (4, 4))
    different = mx.array(np.eye(4, dtype=np.float32) * 8)  # each head looks at another key
    assert attention_metrics(same[None])["agreement"].item() == pytest.approx(0.0, abs=1e-7)
    assert attention_metrics(different[None])["agreement"].item() > 0.3
    # Uniform attention over 16 keys: 4 bits in every head, no spread across heads.
    flat = attention_metrics(mx.zeros((1, 5, 16)))
    assert flat["attn_entropy"].item() == pytest.approx(4.0, abs=1e-5)
    assert flat["attn_varentropy"].item() == pytest.approx(0.0, abs=1e-6)


def test_layer_choice_picks_the_layers_averaged():
    rng = np.random.default_rng(3)
    scores = [mx.array(rng.normal(0, 1 + i, size=(4, 12)).astype(np.float32)) for i in range(4)]
    per_layer = {k: np.array(v) for k, v in attention_metrics(scores).items()}
    logits = mx.array(rng.normal(size=50).astype(np.float32))
    for layers, index in (("all", [0, 1, 2, 3]), ("last", [3]), ((0, -1), [0, 3])):
        assert select_layers(4, layers) == index
        got = step_metrics(logits, scores, layers)
        assert list(got) == list(METRIC_NAMES)
        for name, values in per_layer.items():
            assert got[name].item() == pytest.approx(values[index].mean(), rel=1e-5), (layers, name)


def test_no_attention_scores_gives_zero_attention_metrics():
    got = step_metrics(mx.zeros(8), [])
    assert got["entropy"].item() == pytest.approx(3.0, abs=1e-5)
    assert all(got[n].item() == 0.0 for n in METRIC_NAMES[2:])
