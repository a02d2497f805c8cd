"""An answer's confidence: the probability that it is right, read from its own
tokens' signals in the pass that wrote it (no extra tokens), by a logistic model
fitted per model on labelled items and kept in its card's `[confidence]` table.
A model whose card has none is "uncalibrated": no number then stands for a
probability."""

import math
from dataclasses import dataclass

import numpy as np

from .answers import numbers_in

# The chain's own signals, in the order a fitted table's weights follow.
FEATURES = (
    "log_tokens",
    "cut_off",
    "logprob_mean",
    "logprob_min",
    "entropy_mean",
    "entropy_q90",
    "entropy_max",
    "varentropy_mean",
    "varentropy_max",
    "entropy_above_1",
    "logprob_below_minus_1",
    "lowest_window_16",
    "last_32_logprob",
    "last_32_entropy",
    "answer_logprob",
    "answer_entropy",
)
WINDOW = 16
TAIL = 32


def answer_end(pieces: list[str]) -> int:
    """The index of the token that completes the answer's last number (its last
    token when it has none): where a chain of thought states its result."""
    text = "".join(pieces)
    found = list(numbers_in(text))
    if not found:
        return len(pieces) - 1
    end, seen = found[-1][2], 0
    for i, piece in enumerate(pieces):
        seen += len(piece)
        if seen >= end:
            return i
    return len(pieces) - 1


def lowest_window(values: np.ndarray, width: int) -> float:
    if len(values) <= width:
        return float(values.mean())
    c = np.concatenate([[0.0], np.cumsum(values)])
    return float(((c[width:] - c[:-width]) / width).min())


def chain_features(logprob, entropy, varentropy, end: int, cut_off: bool) -> dict[str, float]:
    """FEATURES of one answer: per token, the natural-log probability of the token
    taken and the entropy and varentropy (bits) it was drawn from; `end` from
    `answer_end`; `cut_off`: it stopped at the token limit."""
    lp, h, v = (np.asarray(x, dtype=np.float64) for x in (logprob, entropy, varentropy))
    span = slice(max(0, end - 2), end + 1)
    values = (
        math.log(len(lp)),
        float(cut_off),
        lp.mean(),
        lp.min(),
        h.mean(),
        np.quantile(h, 0.9),
        h.max(),
        v.mean(),
        v.max(),
        (h > 1).mean(),
        (lp < -1).mean(),
        lowest_window(lp, WINDOW),
        lp[-TAIL:].mean(),
        h[-TAIL:].mean(),
        lp[span].min(),
        h[span].max(),
    )
    return dict(zip(FEATURES, (float(x) for x in values), strict=True))


@dataclass(frozen=True)
class AnswerConfidence:
    """A fitted `[confidence]` table: P(right) = sigmoid(bias + sum w (x - mean) / scale)."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    threshold: float  # below it an answer is flagged as unsure
    fitted_on: str = ""
    date: str = ""
    sure_error: float | None = None  # on the fitting items, out of fold: the error rate at or above threshold
    sure_share: float | None = None  # and the share of answers there

    def probability(self, values: dict[str, float]) -> float:
        z = self.bias + sum(
            w * (values[f] - m) / s
            for f, m, s, w in zip(self.features, self.mean, self.scale, self.weights, strict=True)
        )
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def verdict(self, p: float, sure_at: float | None = None) -> str:
        """ "likely right" at or above the threshold (the card's, or `sure_at`), else "unsure"."""
        return "likely right" if p >= (self.threshold if sure_at is None else sure_at) else "unsure"

    @classmethod
    def from_table(cls, table: dict) -> "AnswerConfidence":
        features = tuple(table["features"])
        unknown = sorted(set(features) - set(FEATURES))
        if unknown:
            raise ValueError(f"[confidence] names unknown features: {', '.join(unknown)}")
        arrays = [tuple(float(x) for x in table[k]) for k in ("mean", "scale", "weights")]
        if any(len(a) != len(features) for a in arrays):
            raise ValueError("[confidence] needs one mean, scale and weight per feature")
        return cls(
            features,
            *arrays,
            float(table["bias"]),
            float(table["threshold"]),
            table.get("fitted_on", ""),
            table.get("date", ""),
            table.get("sure_error"),
            table.get("sure_share"),
        )

    def to_table(self) -> dict:
        return {
            "features": list(self.features),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "weights": list(self.weights),
            "bias": self.bias,
            "threshold": self.threshold,
            "fitted_on": self.fitted_on,
            "date": self.date,
        } | ({"sure_error": self.sure_error, "sure_share": self.sure_share} if self.sure_error is not None else {})
