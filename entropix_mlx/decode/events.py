"""What a decoder hands out: `TokenEvent` per token (the per-token JSON record the CLI and
the server write), `Summary` per answer, `TextStream` (token ids to text as they
come), and `plain` (their values as JSON-safe Python ones)."""

import math
from dataclasses import asdict, dataclass, field


@dataclass
class TokenEvent:
    token: int
    text: str  # the text this token completes (may be "" mid UTF-8 sequence)
    strategy: str
    logprob: float  # natural log of the model's probability of this token
    metrics: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    note: str = ""  # what the sampler repaired (NaN logits...), "" when nothing
    # The most likely tokens where the sampler chose this one, when recorded
    # (the server's top_logprobs): (token, logprob) pairs; not part of the record.
    top: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = {
            "token": self.token,
            "text": self.text,
            "strategy": self.strategy,
            **self.metrics,
            **self.params,
            "logprob": self.logprob,
        }
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class Summary:
    tokens: int
    prompt_tokens: int
    strategy_counts: dict
    thinking_insertions: int
    prompt_tps: float
    generation_tps: float
    peak_memory_gb: float
    finish_reason: str  # "eos", "length", "interrupted", "running"; the CLI adds "context"

    def to_dict(self) -> dict:
        return asdict(self)


def plain(value):
    """MLX/NumPy scalars as numbers, NaN and ±inf as null (JSON has no such
    numbers, and a reader of JSON Lines must never meet one), other objects as
    their text."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


class TextStream:
    """Token ids to text as they come, with mlx-lm's streaming detokenizer: a
    token may complete no text yet (the middle of a UTF-8 sequence), and the
    last one flushes what is held back."""

    def __init__(self, tokenizer):
        self.detokenizer = tokenizer.detokenizer  # a fresh copy per caller (mlx-lm)
        self.detokenizer.reset()

    def add(self, token: int, last: bool = False) -> str:
        self.detokenizer.add_token(token)
        if last:
            self.detokenizer.finalize()
        return self.detokenizer.last_segment

    def flush(self) -> str:
        """What is still held back, at the end of an answer cut short."""
        before = self.detokenizer.text
        self.detokenizer.finalize()
        return self.detokenizer.text[len(before) :]
