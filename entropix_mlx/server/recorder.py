"""What each sampler decision used and saw, kept per token for the server's
records and logprobs (batch.py and generate keep the strategy, metrics and
logprob, not the rest)."""

from collections import deque

import mlx.core as mx


class Recorder:
    """Wraps a sampler to record, token by token, what each decision used and
    saw: the sampling parameters, the note, and the k most likely next tokens
    with their log-probabilities under the model (natural log, before
    temperature or filtering: the distribution of `TokenEvent.logprob`). A
    choice of several tokens (a branch rollout, a thinking insertion) has
    alternatives only for its first token. batch.py keeps none of this."""

    def __init__(self, sampler, k: int):
        self.sampler, self.k = sampler, k
        self.pending: deque = deque()  # per chosen token: (params, note, top)

    def __getattr__(self, name):  # name, config, deliberates...: the wrapped sampler's
        if name == "sampler":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.sampler, name)

    def reset(self):
        self.sampler.reset()
        self.pending.clear()

    def choose(self, step, key):
        choice = self.sampler.choose(step, key)
        top = []
        if self.k:
            logprobs = step.logits.astype(mx.float32)
            logprobs = logprobs - mx.logsumexp(logprobs)
            k = min(self.k, logprobs.shape[-1])
            ids = mx.argpartition(-logprobs, k - 1)[:k]
            top = sorted(zip(ids.tolist(), logprobs[ids].tolist(), strict=False), key=lambda p: -p[1])
        for i, _ in enumerate(choice.tokens):  # alternatives only where the model chose
            self.pending.append((choice.params, choice.note, top if i == 0 else []))
        return choice
