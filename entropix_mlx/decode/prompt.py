"""Prompt token ids. Text a user types is data: `<|im_end|>` in a message must not
end the turn, so it is tokenized as plain text, never as a control token."""

import re

# Private-use code points: no chat template trims or rewrites them.
_OPEN, _CLOSE = "\ue000", "\ue001"


_SENTINEL = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


def _has_special_text(tokenizer, text: str) -> bool:
    return any(t.special and t.content in text for t in tokenizer.added_tokens_decoder.values())


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True, tools=None) -> list[int]:
    """The chat template's token ids for `messages`.

    When no message contains special-token text this is exactly
    `tokenizer.apply_chat_template`. Otherwise each message body is replaced by a
    sentinel, the template is rendered to text, and the pieces are tokenized
    separately: template text with control tokens parsed, message bodies with
    `split_special_tokens=True` so `<|im_end|>` becomes ordinary characters.

    A model without a chat template (a base model) gets the messages' text, one
    paragraph each, after its BOS token, as mlx-lm does for such a model.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        text = "\n\n".join(m.get("content", "") for m in messages) + ("\n" if add_generation_prompt else "")
        return list(tokenizer.encode(text, split_special_tokens=True))
    extra = {"tools": tools} if tools else {}  # (a template that renders OpenAI's tools itself)
    if not any(_has_special_text(tokenizer, m.get("content") or "") for m in messages):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra))
    stand_ins = [{**m, "content": f"{_OPEN}{i}{_CLOSE}"} for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(
        stand_ins, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )
    ids, last = [], 0
    for match in _SENTINEL.finditer(rendered):
        ids += tokenizer.encode(rendered[last : match.start()], add_special_tokens=False)
        body = messages[int(match.group(1))]["content"]
        ids += tokenizer._tokenizer.encode(body, add_special_tokens=False, split_special_tokens=True)
        last = match.end()
    return ids + tokenizer.encode(rendered[last:], add_special_tokens=False)


def encode_raw(tokenizer, text: str) -> list[int]:
    """A raw prompt: the text as the model sees it, no template; control tokens written
    in it are parsed as control tokens (that is what raw asks for)."""
    return list(tokenizer.encode(text))
