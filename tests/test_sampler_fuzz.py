"""Property-based fuzz of every sampler: whatever the logits (NaN, ±inf, all
equal, one-hot, all but one masked) and whatever valid parameters (top_k beyond
the vocabulary, min_p that would remove everything), a sampler returns valid
token ids, finite metrics (so JSON output stays valid) and says what it did."""

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entropix_mlx.front.registry import build
from entropix_mlx.sampling.metrics import METRIC_NAMES
from entropix_mlx.sampling.samplers import Step

SHAPES = ("random", "nan", "posinf", "neginf_all_but_one", "all_equal", "one_hot", "all_nan", "all_neginf", "huge")


def make_logits(kind: str, vocab: int, rng: np.random.Generator) -> np.ndarray:
    logits = rng.normal(0, rng.uniform(0.1, 20), vocab).astype(np.float32)
    if kind == "nan":
        logits[rng.integers(0, vocab, max(1, vocab // 3))] = np.nan
    elif kind == "posinf":
        logits[rng.integers(0, vocab, rng.integers(1, 3))] = np.inf
    elif kind == "neginf_all_but_one":
        keep = rng.integers(0, vocab)
        logits[:] = -np.inf
        logits[keep] = rng.normal()
    elif kind == "all_equal":
        logits[:] = rng.normal()
    elif kind == "one_hot":
        logits[:] = -1e9
        logits[rng.integers(0, vocab)] = 0.0
    elif kind == "all_nan":
        logits[:] = np.nan
    elif kind == "all_neginf":
        logits[:] = -np.inf
    elif kind == "huge":
        logits *= 1e30
    return logits


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    vocab = draw(st.integers(1, 300))
    kind = draw(st.sampled_from(SHAPES))
    n_layers, heads, keys = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 12))
    scores = [rng.normal(0, 3, (heads, keys)).astype(np.float32) for _ in range(n_layers)]
    if draw(st.booleans()):
        scores[0][:, : max(0, keys - 1)] = -np.inf  # attention confined to one key
    name = draw(st.sampled_from(["greedy", "temperature", "min_p", "entropix"]))
    params = {
        "temperature": draw(st.floats(0.05, 3.0)),
        "top_p": draw(st.floats(0.01, 1.0)),
        "top_k": draw(st.integers(0, 1000)),  # often larger than the vocabulary
        "min_p": draw(st.sampled_from([0.0, 0.05, 0.5, 0.99, 0.999])),  # a high min_p keeps only the top token
    }
    return seed, make_logits(kind, vocab, rng), scores, name, params, kind


@pytest.fixture(scope="module", autouse=True)
def eager_mlx():
    """mx.compile traces anew for every sampler instance and shape; a thousand
    random configurations would spend minutes compiling. Compilation does not
    change results, so run eagerly here."""
    mx.disable_compile()
    yield
    mx.enable_compile()


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_samplers_always_return_a_valid_token(case):
    seed, logits, scores, name, params, kind = case
    if name == "greedy":
        params = {}
    sampler = build(name, **params)
    sampler.reset()
    step = Step(mx.array(logits), [mx.array(s) for s in scores], tokens=[])
    choice = sampler.choose(step, mx.random.key(seed))
    vocab = logits.shape[0]
    assert choice.tokens, "no token returned"
    assert all(isinstance(t, int) and 0 <= t < vocab for t in choice.tokens), choice.tokens
    assert len(choice.logprobs) == len(choice.tokens)
    for metric in METRIC_NAMES:
        if metric in choice.metrics:
            assert math.isfinite(choice.metrics[metric]), (metric, choice.metrics[metric], kind)
    for value in choice.logprobs:  # None: unknown (an inserted token without a model); never NaN
        assert value is None or not math.isnan(value), (choice.logprobs, kind)
    if kind in ("nan", "all_nan", "posinf", "all_neginf"):
        assert choice.note, f"{kind} logits were not recorded"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_greedy_without_logprobs_chooses_what_the_full_path_chooses(case):
    """The argmax-only greedy (eval's) must pick the sanitized argmax and say
    what it repaired, whatever the logits: NaN, infinities, all masked, huge."""
    seed, logits, scores, _, _, kind = case
    step = Step(mx.array(logits), [mx.array(s) for s in scores], tokens=[])
    full = build("greedy", metrics=False).choose(step, mx.random.key(seed))
    bare = build("greedy", metrics=False, logprobs=False).choose(step, mx.random.key(seed))
    assert bare.tokens == full.tokens and bare.note == full.note, kind
    assert bare.logprobs == [None] and bare.metrics == {}
    assert bare.params == full.params and bare.strategy == full.strategy


def test_greedy_keeps_its_logprobs_when_it_computes_metrics():
    sampler = build("greedy", logprobs=False)  # metrics on: the log-probability comes with them
    choice = sampler.choose(Step(mx.array([0.0, 2.0, 1.0]), [mx.zeros((1, 2))], []), mx.random.key(0))
    assert choice.tokens == [1] and choice.logprobs[0] == pytest.approx(2.0 - np.log(1 + np.e**2 + np.e))


@pytest.mark.parametrize("name", ["greedy", "temperature", "min_p", "entropix"])
class TestEdgeLogits:
    """Each edge case of issue 7, for every sampler, with the exact expected outcome."""

    scores = [mx.array(np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32))]

    def choose(self, name, logits, **params):
        sampler = build(name, **params)
        return sampler.choose(Step(mx.array(np.asarray(logits, np.float32)), self.scores, tokens=[]), mx.random.key(3))

    def test_all_but_one_masked_returns_the_survivor(self, name):
        logits = np.full(50, -np.inf)
        logits[17] = 0.3
        choice = self.choose(name, logits)
        assert choice.tokens[:1] == [17] and choice.note == ""
        assert choice.logprobs[0] == pytest.approx(0.0, abs=1e-6)

    def test_one_hot_returns_the_hot_token(self, name):
        logits = np.full(50, -1e9)
        logits[4] = 0.0
        assert self.choose(name, logits).tokens[:1] == [4]

    def test_positive_infinity_wins_and_is_recorded(self, name):
        logits = np.zeros(50)
        logits[[8, 9]] = np.inf
        choice = self.choose(name, logits)
        assert choice.tokens[0] in (8, 9)
        assert choice.note == "+inf logits: sampled among them only"

    def test_nan_entries_are_never_chosen(self, name):
        logits = np.linspace(0, 1, 50)
        logits[[49, 48]] = np.nan  # would be the two most likely
        choice = self.choose(name, logits)
        assert choice.tokens[0] not in (48, 49) and choice.note == "NaN logits ignored"

    def test_nothing_finite_gives_a_valid_token(self, name):
        for bad in (np.nan, -np.inf):
            choice = self.choose(name, np.full(50, bad))
            assert 0 <= choice.tokens[0] < 50
            assert choice.note == "no finite logits: sampled uniformly"

    def test_all_equal_logits(self, name):
        choice = self.choose(name, np.full(50, 2.5))
        assert 0 <= choice.tokens[0] < 50
        assert choice.metrics["entropy"] == pytest.approx(np.log2(50), rel=1e-4)
        assert choice.metrics["varentropy"] == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("name", ["temperature", "min_p", "entropix"])  # greedy takes no filter parameters
def test_top_k_beyond_vocabulary_and_min_p_near_one(name):
    logits = mx.array(np.linspace(0, 3, 20).astype(np.float32))
    choice = build(name, top_k=10_000, min_p=0.999).choose(Step(logits, TestEdgeLogits.scores, []), mx.random.key(1))
    assert choice.tokens[:1] == [19]  # min_p near 1 keeps only the most likely token
