"""Entropix inside mlx-lm: a sampler that `mlx_lm.generate` and
`mlx_lm.stream_generate` accept as `sampler=`, on any model mlx-lm loads.

mlx-lm hands a sampler the next token's log-probabilities, (1, vocab), and
feeds back the one token it returns. So this sampler sees the logits only: the
attention metrics are 0 (mlx-lm's models return no attention scores), `branch`
takes its best candidate without rolling paths out (there is no model to run),
and a thinking insertion goes out one token per call (the model reads each as
it would any token). It keeps the answer so far for the repetition scores:
make one per answer, or call `reset()` between answers.
"""

import mlx.core as mx

from .entropix import EntropixSampler
from .samplers import Step


class MlxLmSampler:
    """`sampler(logprobs) -> token` for mlx-lm, Entropix deciding each token.
    `strategies` holds the strategy of every token handed out, in order."""

    def __init__(self, sampler: EntropixSampler, seed: int = 0):
        self.sampler, self.seed = sampler, seed
        self.reset()

    def reset(self):
        self.sampler.reset()
        self.key = mx.random.key(self.seed)
        self.tokens: list[int] = []
        self.strategies: list[str] = []
        self.queue: list[int] = []  # the rest of a choice of several tokens (a thinking insertion)

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self.queue:
            token, strategy = self.queue.pop(0), self.strategies[-1]
        else:
            self.key, step_key = mx.random.split(self.key)
            choice = self.sampler.choose(Step(logprobs.reshape(-1), [], list(self.tokens)), step_key)
            token, self.queue, strategy = choice.tokens[0], list(choice.tokens[1:]), choice.strategy
        self.tokens.append(token)
        self.strategies.append(strategy)
        return mx.array([token])
