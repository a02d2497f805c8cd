"""Repetition penalties as a logits processor, applied to a step's logits before
any sampler sees them (decode/rows.py and decode/generate.py), so every sampler,
its metrics included, decides on the penalised distribution, as mlx-lm's
logits processors do.

- `presence` and `frequency`: OpenAI's penalties over the tokens generated so
  far, logits -= presence * [count > 0] + frequency * count;
- `repetition`: llama.cpp's and Hugging Face's, over the last `window` tokens
  seen (the prompt's end, then the generated tokens, as llama.cpp's
  `repeat_last_n`): a positive logit is divided by it, a negative one multiplied.

The arithmetic is mlx-lm's own processors'."""

from dataclasses import dataclass, replace

import mlx.core as mx
from mlx_lm.sample_utils import make_frequency_penalty, make_presence_penalty, make_repetition_penalty

from ..errors import ConfigError

REPEAT_LAST_N = 64  # llama.cpp's default window for the repetition penalty


@dataclass(frozen=True)
class Penalties:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0  # 1 = off
    window: int = REPEAT_LAST_N
    prompt: tuple[int, ...] = ()  # the prompt's last `window` tokens (the repetition penalty sees them)
    # Tokens generated before the row's own, which its prompt holds: a gated branch
    # started from a chain's first tokens (decode/gated.py) is penalised as if spawned there.
    before: tuple[int, ...] = ()
    constrains = False  # they change logits, never which tokens are possible

    def __post_init__(self):
        if not self.repetition > 0:
            raise ConfigError(f"the repetition penalty must be above 0 (1 turns it off), got {self.repetition}")
        if self.window < 1:
            raise ConfigError(f"the repetition penalty's window must be at least 1 token, got {self.window}")

    @property
    def active(self) -> bool:
        return bool(self.presence or self.frequency or self.repetition != 1.0)

    def after(self, prompt) -> "Penalties":
        """These penalties for an answer to `prompt` (token ids)."""
        return replace(self, prompt=tuple(prompt[-self.window :]))

    def apply(self, logits: mx.array, generated: list[int]) -> mx.array:
        """`logits` (vocab,) after the penalties, given the tokens generated so
        far; lazy, and a new array (the row's own logits stay as they are)."""
        out = logits.astype(mx.float32)[None]
        generated = [*self.before, *generated] if self.before else generated
        if self.repetition != 1.0:
            seen = (list(self.prompt) + list(generated))[-self.window :]
            if seen:
                out = make_repetition_penalty(self.repetition, self.window)(mx.array(seen), out)
        if generated and (self.presence or self.frequency):
            tokens = mx.array(generated)
            if self.presence:
                out = make_presence_penalty(self.presence, len(generated))(tokens, out)
            if self.frequency:
                out = make_frequency_penalty(self.frequency, len(generated))(tokens, out)
        return out[0]


def make_penalties(
    presence: float | None = None, frequency: float | None = None, repetition: float | None = None, prompt=()
) -> Penalties | None:
    """The penalties asked for (None values: off) for an answer to `prompt`;
    None when they change nothing, so a step pays nothing for them."""
    penalties = Penalties(presence or 0.0, frequency or 0.0, 1.0 if repetition is None else repetition)
    return penalties.after(prompt) if penalties.active else None
