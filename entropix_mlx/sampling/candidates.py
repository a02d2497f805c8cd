"""The candidate pool: the most likely tokens of a step, and the top-k / top-p /
min-p filter on them, for samplers whose parameters are lazy MLX arrays."""

import mlx.core as mx


def top_candidates(logprobs: mx.array, m: int) -> tuple[mx.array, mx.array]:
    """The m most likely tokens, most likely first: (logprobs (m,), ids (m,)).

    Every strategy filters with top-k (k <= m), so the rest of the vocabulary
    can never be sampled; working on these m values keeps each filter and draw
    to a few hundred elements instead of the whole vocabulary (a full sort of
    49k logits costs ~10 ms on CPU)."""
    vocab = logprobs.shape[-1]
    if m >= vocab:
        ids = mx.argsort(-logprobs)
    else:
        ids = mx.argpartition(-logprobs, m - 1)[:m]
        ids = ids[mx.argsort(-logprobs[ids])]
    return logprobs[ids], ids


def filter_sorted(sorted_logprobs: mx.array, temperature, top_k, top_p, min_p) -> mx.array:
    """Tempered log-weights of the kept tokens (-inf for removed ones), for
    log-probabilities sorted most likely first. Same rules and order as
    mlx-lm's apply_top_k -> apply_top_p -> apply_min_p -> temperature:

    - top-k keeps the k most likely (k = 0: all);
    - top-p keeps the most likely tokens until their mass, within the top-k
      set, reaches top_p (the token that crosses it is kept);
    - min-p keeps tokens with p >= min_p * p_max.

    Written here rather than calling mlx-lm's helpers because the parameters
    are MLX arrays computed from this step's metrics: mlx-lm's helpers are
    compiled with Python-number parameters, so they would need the metrics on
    the host first (a second sync per step) and recompile for every new value.
    The most likely token is always kept.
    """
    m = sorted_logprobs.shape[-1]
    rank = mx.arange(m)
    top_k = mx.array(top_k)
    keep = (top_k <= 0) | (rank < top_k)
    probs = mx.where(keep, mx.exp(sorted_logprobs), 0.0)
    mass_before = mx.cumsum(probs) - probs
    top_p = mx.array(top_p)
    keep = keep & ((top_p >= 1.0) | (mass_before < top_p * probs.sum()))
    keep = keep & (sorted_logprobs >= sorted_logprobs[0] + mx.log(mx.array(min_p, mx.float32)))
    keep = keep | (rank == 0)
    return mx.where(keep, sorted_logprobs / temperature, -mx.inf)
