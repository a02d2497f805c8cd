"""A prompt through the model into a cache: the step before the first decision."""

import mlx.core as mx

PREFILL_CHUNK = 2048


# Prompts up to this many tokens run in one pass: each pass reads every weight
# once, so for a short prompt the split below (the body, then the last token
# alone) would cost a second pass. Up to this length the pending last-row
# scores stay small.
SINGLE_PASS_TOKENS = 256


def prefill(model, tokens: list[int], cache):
    """Run the prompt through the model; returns the last position's (logits, scores).

    A short prompt runs in one pass (logits of the last position only). A
    longer one goes as in mlx-lm: every token but the last only fills the
    cache, in chunks so peak memory stays bounded (only the cache is evaluated;
    MLX is lazy, so those positions' logits and attention scores are never
    computed), then the last token runs alone for the logits and scores. In one
    pass, the pending last-row scores would hold every layer's full query block
    until the end.
    """
    if len(tokens) <= SINGLE_PASS_TOKENS:
        return model(mx.array([tokens]), cache, last_only=True)
    for start in range(0, len(tokens) - 1, PREFILL_CHUNK):
        chunk = tokens[start : min(start + PREFILL_CHUNK, len(tokens) - 1)]
        model(mx.array([chunk]), cache, last_only=True)
        mx.eval([(c.keys, c.values) for c in cache])
    return model(mx.array([tokens[-1:]]), cache)
