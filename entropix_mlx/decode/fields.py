"""How sure the model was of each value of a JSON answer: for every leaf (string,
number, true, false, null) its path, the tokens it spans and their lowest and
mean confidence (the probability of each token as chosen), so an application
can flag the fields the model guessed.

The answer is read as far as it is complete: a value cut off by max_tokens is
left out."""

import json
import math

_DECODER = json.JSONDecoder()
_SPACE = " \t\n\r"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _pointer(path: list) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def leaves(text: str) -> list[tuple[str, int, int, object]]:
    """(JSON pointer, start, end, value) of each complete leaf value of `text`, in order."""
    found = []

    def value(i: int, path: list) -> int:
        i = _skip(text, i)
        if text[i] == "{":
            i = _skip(text, i + 1)
            while text[i] != "}":
                key, i = _DECODER.raw_decode(text, i)
                i = _skip(text, i)
                if text[i] != ":":
                    raise ValueError(i)
                i = _skip(text, value(i + 1, [*path, key]))
                if text[i] == ",":
                    i = _skip(text, i + 1)
            return i + 1
        if text[i] == "[":
            i, n = _skip(text, i + 1), 0
            while text[i] != "]":
                i = _skip(text, value(i, [*path, n]))
                n += 1
                if text[i] == ",":
                    i = _skip(text, i + 1)
            return i + 1
        leaf, end = _DECODER.raw_decode(text, i)
        if end == len(text) and isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            raise ValueError(i)  # a number at the very end may go on: "3" of "36"
        found.append((_pointer(path), i, end, leaf))
        return end

    try:
        value(0, [])
    except (ValueError, IndexError):
        pass  # the rest is cut off (or not JSON): the complete leaves stand
    return found


def json_fields(pieces: list[str], logprobs: list[float]) -> list[dict]:
    """Each complete leaf of the JSON answer whose tokens' texts are `pieces`
    (with each token's log-probability, nats): its path, value, the first and
    last token it spans, and the lowest and mean probability of those tokens."""
    starts, at = [], 0
    for piece in pieces:
        starts.append(at)
        at += len(piece)
    out = []
    for path, start, end, leaf in leaves("".join(pieces)):
        spans = [i for i, s in enumerate(starts) if s < end and s + len(pieces[i]) > start]
        if not spans:
            continue
        probs = [math.exp(logprobs[i]) for i in spans if logprobs[i] is not None]
        out.append(
            {
                "path": path,
                "value": leaf,
                "tokens": [spans[0], spans[-1]],
                "min_confidence": round(min(probs), 6) if probs else None,
                "mean_confidence": round(sum(probs) / len(probs), 6) if probs else None,
            }
        )
    return out
