"""An answer read back through the model in one pass (teacher forcing): what the
model thought at each of its tokens, for fitting and checking an answer's
confidence on chains already generated."""

import mlx.core as mx
import numpy as np

from ..model.transformer import Segment
from ..sampling.metrics import logprobs_entropy


def forced_signals(model, prompt: list[int], answer: list[int], hidden_at: tuple[int, ...] = ()) -> dict:
    """Per answer token: `logprob` (of the token taken), `entropy` and
    `varentropy` (bits) and `margin` (top-1 minus top-2 log-probability) of the
    distribution it was drawn from; with `hidden_at`, `hidden[layer]` the
    residual stream (answer tokens, hidden) after those layers, at each answer
    token's position. NumPy arrays."""
    ids = mx.array([list(prompt) + list(answer)])
    outs = model.packed([Segment(ids)], last_only=False, hidden_at=hidden_at)[0]
    logits = outs[0][0, len(prompt) - 1 : -1].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    entropy, varentropy = logprobs_entropy(logp)
    taken = mx.take_along_axis(logp, mx.array(answer)[:, None], axis=-1)[:, 0]
    top2 = mx.topk(logp, 2, axis=-1)
    margin = mx.abs(top2[:, 1] - top2[:, 0])
    out = {"logprob": taken, "entropy": entropy, "varentropy": varentropy, "margin": margin}
    if hidden_at:
        out["hidden"] = {i: h[0, len(prompt) :].astype(mx.float32) for i, h in outs[2].items()}
    mx.eval(out)
    return {k: ({i: np.array(h) for i, h in v.items()} if k == "hidden" else np.array(v)) for k, v in out.items()}
