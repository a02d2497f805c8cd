"""The gated `deliberate` rules' measurements of a chain (docs/gated-deliberate.md):
pure functions over its per-token log-probabilities and measures, shared by the live
decoder (decode/gated.py) and the offline replay (research/gated_replay.py), so that
the two can never read a chain differently."""

WINDOW = 16  # DeepConf's group of consecutive tokens
TAIL = 32
SPIKE_BITS = 2.0
STOPPED = "low_confidence"  # the finish reason of a candidate the running stop ended
# Higher is surer for every signal: "stop at greedy" when the signal is at or above the gate.
SIGNALS = ("lowest_group", "answer_margin", "tail_logprob", "calm_tokens", "calm_varentropy", "head_agreement")


def windows(logprobs: list, width: int = WINDOW) -> list[float]:
    """The mean of every `width` consecutive tokens (the whole chain's mean when shorter)."""
    if len(logprobs) <= width:
        return [sum(logprobs) / len(logprobs)] if logprobs else [0.0]
    return [sum(logprobs[i : i + width]) / width for i in range(len(logprobs) - width + 1)]


def signals(logprobs: list, answer_margin: float, measures: dict, width: int = WINDOW) -> dict:
    """Every gate signal of one chain: its log-probabilities, the mean margin over its
    answer's tokens and its per-token measures (entropy, varentropy, agreement)."""
    m = measures
    tail = logprobs[-TAIL:]
    agreement = m.get("agreement", [0.0])
    return {
        "lowest_group": min(windows(logprobs, width)),
        "answer_margin": answer_margin,
        "tail_logprob": sum(tail) / max(1, len(tail)),
        "calm_tokens": -sum(e > SPIKE_BITS for e in m.get("entropy", [])),
        "calm_varentropy": -max(m.get("varentropy", [0.0])),
        "head_agreement": -sum(agreement) / max(1, len(agreement)),
    }


def sure(ended: bool, value: float, threshold: float) -> bool:
    """Whether a chain's answer stands: it ended before the limit and its signal is at
    or above the threshold."""
    return ended and value >= threshold


def stopped_at(own: list, floor: float, width: int = WINDOW) -> int | None:
    """DeepConf online: the token count at which a candidate's running `width`-token
    mean log-probability (over its own tokens) first falls below `floor` (None: never)."""
    for end in range(width, len(own) + 1):
        if below(own[end - width : end], floor, width):
            return end
    return None


def below(window: list, floor: float, width: int = WINDOW) -> bool:
    return sum(window) / width < floor


def stages(extra: list, staged: bool, first: int = 0) -> list[list]:
    """The candidates an unsure question adds, in the stages they start in: all at
    once, or (`staged`) the rest only when the `first` (0: half) disagree."""
    first = first or max(1, len(extra) // 2)
    if staged and len(extra) > first:
        return [extra[:first], extra[first:]]
    return [extra]


def settled(voters: list[tuple[bool, object]]) -> bool:
    """A later stage is not needed: every voter, (ended, answer), ended on one answer."""
    return all(ended and answer is not None for ended, answer in voters) and len({a for _, a in voters}) == 1
