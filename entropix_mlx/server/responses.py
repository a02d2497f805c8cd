"""OpenAI response objects, plus the `entropix` token records.

A record is the per-token JSON record (`TokenEvent.to_dict()`: token,
text, strategy, the six metrics, the sampling parameters, logprob), made
JSON-safe: MLX scalars become numbers, NaN and infinities null.
"""

import time
import uuid

from ..decode.events import plain
from ..decode.fields import json_fields
from ..decode.tools import CALL_OPEN, parse_calls, tag_start


def record(event) -> dict:
    return plain(event.to_dict())


def _token_entry(tokenizer, token: int, logprob) -> dict:
    text = tokenizer.decode([token])
    return {"token": text, "logprob": plain(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprob(tokenizer, event, top) -> dict:
    """One entry of OpenAI's `logprobs.content`."""
    entry = _token_entry(tokenizer, event.token, event.logprob)
    entry["top_logprobs"] = [_token_entry(tokenizer, t, lp) for t, lp in (top or [])]
    return entry


def same_choices(answers: list) -> list[str]:
    """A warning for each choice that gave an earlier choice's answer, where
    the sampler samples (one that never does was warned of with the request)."""
    if not answers[0].seeded:
        return []
    out, first = [], {}
    for a in answers:
        if a.text in first:
            out.append(
                f"choice {a.index} gave choice {first[a.text]}'s answer: no token drawn or branch taken set them apart"
            )
        first.setdefault(a.text, a.index)
    return out


class Answer:
    """What a request has produced so far, in both the streamed and the whole
    form: text, token records, logprobs, usage."""

    def __init__(self, kind: str, model: str, seed: int, warnings: list[str], index: int = 0):
        self.kind, self.model, self.seed, self.warnings, self.index = kind, model, seed, warnings, index
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.text, self.records, self.logprobs = "", [], []
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.finish_reason = None
        self.structured = False  # held to a JSON schema: the end names each value's confidence
        self.candidate = None  # deliberate's row for this choice (its answer, confidence, score)
        self.deliberation = None  # deliberate's table and rule line, for the chosen answer's end
        self.confidence = None  # how likely the answer is right (LoadedModel.confidence), at its end
        self.sure_at = None  # the request's threshold for that (None: the card's)
        self.tools = ()  # the names of the tools it was told of: its calls are read from the answer
        self.no_calls = False  # tool_choice "none": call markup written anyway is dropped, never a call
        self.seeded = ()  # the strategies whose tokens the seed draws (registry.seeded_strategies)
        self._streamed = 0  # characters of `text` streamed as content (tools: never a call's)

    @property
    def deterministic(self) -> bool:
        """Whether every seed gives this answer: no token of it was drawn."""
        return not any(r.get("strategy") in self.seeded for r in self.records)

    @property
    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _logprobs_field(self, entries: list[dict]):
        if self.kind == "chat":
            return {"content": entries}
        offsets, at = [], len(self.text) - sum(len(e["token"]) for e in entries)
        for e in entries:
            offsets.append(at)
            at += len(e["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets,
        }

    @property
    def reads_calls(self) -> bool:
        return bool(self.tools) or self.no_calls

    def _calls(self) -> tuple[str, list[dict], bool]:
        """(content, tool_calls, whether the last call was cut short) of the answer so far."""
        text = self.text
        if self.finish_reason == "length":  # cut inside a call's opening tag: that is no content either
            text = text[: len(text) - tag_start(text, CALL_OPEN)]
        content, calls, cut = parse_calls(text, self.tools)
        return (content, [], False) if self.no_calls else (content, calls, cut)

    def content_delta(self) -> str:
        """The text not streamed yet that is surely no part of a tool call: up to a
        call's opening, less an end that may begin one."""
        limit = len(self.text)
        at = self.text.find(CALL_OPEN)
        if self.finish_reason is not None:
            limit = len(self._calls()[0])
        elif at >= 0:
            limit = at
        elif self.tools and self.text.lstrip().startswith("{"):
            limit = 0  # it may be a call without its tags: it is known at the end
        else:
            limit -= tag_start(self.text, CALL_OPEN)
        out = self.text[self._streamed : max(limit, self._streamed)]
        self._streamed = max(limit, self._streamed)
        return out

    def _choice(self, text: str, records: list, logprobs: list | None, finish, delta: bool) -> dict:
        choice = {"index": self.index}
        calls = []
        if self.reads_calls and finish is not None:
            content, calls, cut = self._calls()
            text = text if delta else content
            if calls and not cut:
                finish = "tool_calls"
        if self.kind == "chat" and delta:
            choice["delta"] = {"content": text} if text else {}
            if calls:
                choice["delta"]["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        elif self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": (text or None) if calls else text}
            if calls:
                choice["message"]["tool_calls"] = calls
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs_field(logprobs) if logprobs is not None else None
        choice["finish_reason"] = finish
        choice["entropix"] = records
        if self.structured and finish is not None:
            choice["entropix_fields"] = self.fields()
        if self.candidate is not None:
            choice["entropix_candidate"] = self.candidate
        if self.deliberation is not None and finish is not None:
            choice["entropix_deliberation"] = self.deliberation
        if self.confidence is not None and finish is not None:
            choice["entropix_confidence"] = self.confidence
        return choice

    def end(self, finish: str, tail: str, summary, loaded) -> None:
        """The answer's last text and its finish, how likely it is right and, for
        deliberate, why it chose (what `run` prints under the answer)."""
        self.text += tail
        self.finish_reason = finish if finish != "cancelled" else "stop"
        self.confidence = loaded.confidence(self.records, self.finish_reason, self.sure_at)
        deliberation = getattr(summary, "deliberation", None)
        if deliberation is not None:
            self.deliberation = {k: deliberation[k] for k in ("chosen", "reason", "table")}

    def fields(self) -> list[dict]:
        """Each complete value of the JSON answer with its tokens and confidence (decode/fields.py)."""
        return json_fields([r["text"] for r in self.records], [r["logprob"] for r in self.records])

    def _envelope(self, chunk: bool) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        out = {
            "id": self.id,
            "object": obj + (".chunk" if chunk and self.kind == "chat" else ""),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"entropix-seed-{self.seed}",
        }
        return out

    def chunk(self, text: str, records: list, logprobs: list | None, finish=None) -> dict:
        out = self._envelope(True)
        out["choices"] = [self._choice(text, records, logprobs, finish, delta=True)]
        return out

    def first_chunk(self) -> dict:
        """Chat streams open with the assistant's role, as OpenAI's do."""
        out = self._envelope(True)
        out["choices"] = [
            {
                "index": self.index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
                "entropix": [],
            }
        ]
        out["seed"], out["warnings"] = self.seed, self.warnings
        out["deterministic"] = not self.seeded  # the sampler never samples (the answer's own fact: in whole ones)
        return out

    def usage_chunk(self) -> dict:
        out = self._envelope(True)
        out["choices"], out["usage"] = [], self.usage
        return out

    def whole(self, want_logprobs: bool, others: list | None = None) -> dict:
        """The response; `others`: the answers of the request's other choices."""
        answers = [self, *(others or [])]
        out = self._envelope(False)
        out["choices"] = [
            a._choice(a.text, a.records, a.logprobs if want_logprobs else None, a.finish_reason, delta=False)
            for a in answers
        ]
        usage = self.usage
        usage["completion_tokens"] = sum(a.completion_tokens for a in answers)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        out["usage"], out["seed"], out["warnings"] = usage, self.seed, self.warnings + same_choices(answers)
        out["deterministic"] = all(a.deterministic for a in answers)
        return out

    def candidates(self, deliberation: dict, tokenizer, n: int) -> list["Answer"]:
        """Deliberate's other candidates (its `Deliberation.to_dict()`) as choices 1 to
        n - 1: the chosen answer is this one (choice 0), the rest follow by their
        score, then their confidence."""
        rows = list(zip(deliberation["candidates"], deliberation["table"], strict=True))
        self.candidate = rows[deliberation["chosen"]][1]
        rest = [r for i, r in enumerate(rows) if i != deliberation["chosen"]]
        rest.sort(key=lambda r: (r[1]["score"] is None, -(r[1]["score"] or 0), -r[1]["confidence"]))
        out = []
        for i, (c, row) in enumerate(rest[: n - 1], 1):
            other = Answer(self.kind, self.model, self.seed, self.warnings, index=i)
            other.text = tokenizer.decode(c["tokens"])
            other.completion_tokens = c["own_tokens"]
            other.finish_reason = {"eos": "stop"}.get(c["finish_reason"], "length")
            other.candidate = row
            out.append(other)
        return out
