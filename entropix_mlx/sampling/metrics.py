"""The uncertainty metrics Entropix decides on, computed in MLX, in bits.

All information quantities use log base 2, so entropies are in **bits** (a
uniform choice among 2**n tokens has entropy n bits) and varentropies in
**bits squared**. The two logits metrics describe the next-token distribution;
the four attention metrics describe the last query position's attention
pattern in each layer, over the keys the query can really see (the cache holds
exactly the written positions; padded keys arrive as -inf scores and are left
out), never over empty cache slots (reference defect 1).

Everything here is lazy MLX: callers build the whole step's graph and evaluate
it once (`step_metrics` returns scalars to stack, not Python floats).
"""

import math

import mlx.core as mx

LOG2E = 1.0 / math.log(2.0)


# Names as they appear in TokenChoice.metrics, TokenEvent.to_dict() and JSON output.
METRIC_NAMES = ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength")


ATTENTION_METRICS = METRIC_NAMES[2:]


def logits_entropy(logits: mx.array) -> tuple[mx.array, mx.array]:
    """Entropy H = -sum p log2 p (bits) and varentropy V = sum p (log2 p + H)^2
    (bits^2, the variance of the surprisal -log2 p under p) of softmax(logits),
    over the last axis."""
    logits = logits.astype(mx.float32)
    return logprobs_entropy(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


def logprobs_entropy(logp: mx.array) -> tuple[mx.array, mx.array]:
    """`logits_entropy` of log-probabilities a caller has already normalized."""
    p, log2p = mx.exp(logp), logp * LOG2E
    # p * log2p is 0 * -inf = nan for masked (-inf) logits: count them as 0.
    plogp = mx.where(p > 0, p * log2p, 0.0)
    entropy = -plogp.sum(axis=-1)
    varentropy = mx.where(p > 0, p * (log2p + entropy[..., None]) ** 2, 0.0).sum(axis=-1)
    return entropy, varentropy


def attention_metrics(scores) -> dict[str, mx.array]:
    """Per-layer attention metrics from pre-softmax scores of the last query.

    `scores`: a list with one `(heads, keys)` array per layer, or one array
    `(layers, heads, keys)`; -inf marks keys the query cannot see (padding).
    Returns arrays of shape `(layers,)`:

    - `attn_entropy`: entropy (bits) of each head's attention distribution
      over the visible keys, averaged over heads.
    - `attn_varentropy`: the variance across heads of those per-head entropies
      (bits^2). Not a varentropy in the logits sense: it measures how much the
      heads differ in focus; the reference's name is kept for compatibility.
    - `agreement`: mean over heads and visible keys of |P_h - mean_h P|, where
      P_h is head h's attention distribution. Despite the name, this measures
      DISagreement: 0 when all heads attend alike, larger when they differ.
    - `interaction_strength`: mean |score| over heads and visible keys (the
      scaled dot products q.k/sqrt(d), in the model's own score units).
    """
    if isinstance(scores, (list, tuple)):
        scores = mx.stack(scores)
    scores = scores.astype(mx.float32)
    visible = scores > -mx.inf  # (layers, heads, keys)
    n_visible = mx.maximum(visible[:, 0, :].sum(axis=-1), 1)  # (layers,) heads share one key mask
    logp = scores - mx.logsumexp(scores, axis=-1, keepdims=True)
    p = mx.where(visible, mx.exp(logp), 0.0)
    logp = logp * LOG2E
    head_entropy = -mx.where(visible, p * logp, 0.0).sum(axis=-1)  # (layers, heads)
    mean_p = p.mean(axis=1, keepdims=True)
    disagreement = mx.where(visible, mx.abs(p - mean_p), 0.0).sum(axis=(1, 2)) / (n_visible * p.shape[1])
    strength = mx.where(visible, mx.abs(scores), 0.0).sum(axis=(1, 2)) / (n_visible * p.shape[1])
    return {
        "attn_entropy": head_entropy.mean(axis=-1),
        "attn_varentropy": head_entropy.var(axis=-1),
        "agreement": disagreement,
        "interaction_strength": strength,
    }


def select_layers(n_layers: int, layers) -> list[int]:
    """Resolve a layer choice: "all", "last", or a list of indices (negative
    counts from the end)."""
    if layers == "all":
        return list(range(n_layers))
    if layers == "last":
        return [n_layers - 1]
    return sorted({i % n_layers for i in layers})


# Fixed shapes (vocabulary): compiled once, its element-wise ops fused.
_logits_entropy = mx.compile(logits_entropy)
fused_logprobs_entropy = mx.compile(logprobs_entropy)


def step_metrics(logits: mx.array, scores, layers="all") -> dict[str, mx.array]:
    """The six metrics of one decoding step as lazy scalars: logits entropy and
    varentropy of `logits` (vocab,), and the attention metrics averaged over
    the chosen layers of `scores` (one `(heads, keys)` array per layer). A
    model that gives no scores gets 0 for the attention metrics."""
    entropy, varentropy = _logits_entropy(logits)
    out = {"entropy": entropy, "varentropy": varentropy}
    if scores:
        index = select_layers(len(scores), layers)
        per_layer = attention_metrics([scores[i] for i in index])
        out.update({name: value.mean() for name, value in per_layer.items()})
    else:
        out.update({name: mx.array(0.0) for name in ATTENTION_METRICS})
    return out
