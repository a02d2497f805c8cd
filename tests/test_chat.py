"""Conversation: the KV cache kept between turns must give exactly what a fresh
prefill of the whole history gives, while running only the new tokens."""

import json

import mlx.core as mx
import pytest
from conftest import make_loaded, make_tiny_model

from entropix_mlx.decode.chat import Conversation, common_prefix_length
from entropix_mlx.decode.generate import generate
from entropix_mlx.errors import ContextOverflowError
from entropix_mlx.model.cache import cache_length
from entropix_mlx.sampling.samplers import GreedySampler, TokenChoice


def byte_id(char: str) -> int:
    return 3 + ord(char)  # the tiny tokenizer: 3 special tokens, then one token per byte


class ScriptedSampler:
    """Answers `text` token by token, then <|im_end|> (the tiny tokenizer's EOS)."""

    name = "scripted"

    def __init__(self, text: str):
        self.ids = [byte_id(c) for c in text] + [2]

    def reset(self):
        self.i = 0

    def choose(self, step, key):
        token = self.ids[min(self.i, len(self.ids) - 1)]
        self.i += 1
        return TokenChoice([token], "scripted", [0.0])


def fresh_answer(model, tokenizer, prompt_tokens, max_tokens):
    generation = generate(model, tokenizer, prompt_tokens, GreedySampler(), max_tokens=max_tokens)
    list(generation)
    return generation.tokens


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([7], [8]) == 0


def test_second_turn_prefills_only_the_closing_and_new_message(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    first = conversation.reply("hi", ScriptedSampler("ok"), max_tokens=10)
    assert first.answer == "ok" and first.finish_reason == "eos"
    assert first.prefilled == len(first.prompt_tokens)  # nothing cached yet
    # The cache holds the first prompt and both answer tokens (the EOS was never fed).
    assert conversation.cached_tokens == first.prompt_tokens + [byte_id("o"), byte_id("k")]

    second = conversation.reply("more", ScriptedSampler("yes"), max_tokens=10)
    # New: "<|im_end|>" "\n" "<|im_start|>" "user" "\n" "more" "<|im_end|>" "\n" "<|im_start|>" "assistant" "\n"
    assert second.prefilled == 1 + 1 + 1 + 4 + 1 + 4 + 1 + 1 + 1 + 9 + 1
    assert len(second.prompt_tokens) == len(first.prompt_tokens) + 2 + second.prefilled
    assert cache_length(conversation.cache) == len(conversation.cached_tokens) == len(second.prompt_tokens) + 3
    assert [m["role"] for m in conversation.messages] == ["user", "assistant", "user", "assistant"]
    assert conversation.messages[-1]["content"] == "yes"
    assert conversation.strategy_counts == {"scripted": 5}


def test_reused_cache_answers_like_a_fresh_prefill(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    first = conversation.reply("hello", GreedySampler(), max_tokens=6)
    second = conversation.reply("and then?", GreedySampler(), max_tokens=6)
    # Stopped by length: 5 of the 6 answer tokens went through the model, the last did not.
    assert second.prefilled == len(second.prompt_tokens) - len(first.prompt_tokens) - 5
    assert second.generation.tokens == fresh_answer(tiny_model, tiny_tokenizer, second.prompt_tokens, 6)


def test_cache_keys_match_a_fresh_prefill_of_the_history(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    conversation.reply("abc", GreedySampler(), max_tokens=4)
    conversation.reply("defg", GreedySampler(), max_tokens=4)
    fresh = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    ids = conversation.cached_tokens
    fresh_generation = generate(tiny_model, tiny_tokenizer, ids, GreedySampler(), max_tokens=1, cache=fresh.cache)
    list(fresh_generation)
    for reused, full in zip(conversation.cache, fresh.cache, strict=False):
        n = len(ids)
        assert mx.allclose(reused.keys[..., :n, :], full.keys[..., :n, :], atol=1e-4).item()
        assert mx.allclose(reused.values[..., :n, :], full.values[..., :n, :], atol=1e-4).item()


def test_changed_system_prompt_trims_the_cache_and_still_matches(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    conversation.reply("hello", GreedySampler(), max_tokens=5)
    conversation.system = "be brief"  # the history now starts differently
    turn = conversation.reply("again", GreedySampler(), max_tokens=5)
    # Only "<|im_start|>" is shared ("system" vs "user" follows it).
    assert turn.prefilled == len(turn.prompt_tokens) - 1
    assert tiny_tokenizer.decode(turn.prompt_tokens).startswith("<|im_start|>system\nbe brief<|im_end|>")
    assert turn.generation.tokens == fresh_answer(tiny_model, tiny_tokenizer, turn.prompt_tokens, 5)


def test_interrupted_answer_keeps_the_conversation_usable(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    turn = conversation.ask("tell me", GreedySampler(), max_tokens=20)
    events = []
    for event in turn:
        events.append(event)
        if len(events) == 3:
            break  # what a Ctrl-C between tokens leaves behind
    conversation.finish(turn, interrupted=True)
    assert turn.finish_reason == "interrupted"
    assert len(turn.generation.tokens) == 3
    assert conversation.turns == [turn]
    assert cache_length(conversation.cache) == len(conversation.cached_tokens)
    next_turn = conversation.reply("go on", GreedySampler(), max_tokens=5)
    assert next_turn.prefilled < len(next_turn.prompt_tokens)
    assert next_turn.generation.tokens == fresh_answer(tiny_model, tiny_tokenizer, next_turn.prompt_tokens, 5)


def test_layers_out_of_step_are_trimmed_to_the_shortest(tiny_model, tiny_tokenizer):
    """An interrupt inside a forward pass can leave layer 0 one position ahead."""
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    turn = conversation.ask("xy", GreedySampler(), max_tokens=4)
    list(turn)
    k = conversation.cache[0]
    k.update_and_fetch(k.keys[..., :1, :], k.values[..., :1, :])  # layer 0 ran, layer 1 did not
    conversation.finish(turn, interrupted=True)
    lengths = {c.offset for c in conversation.cache}
    assert len(lengths) == 1
    # prompt + 3 fed answer tokens, minus the one position dropped for safety after an interrupt
    assert lengths.pop() == len(turn.prompt_tokens) + 3 - 1 == len(conversation.cached_tokens)


def test_reset_starts_over_and_keeps_the_system_prompt(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"), system="sys")
    conversation.reply("one", GreedySampler(), max_tokens=3)
    conversation.reset()
    assert conversation.turns == [] and cache_length(conversation.cache) == 0
    turn = conversation.reply("two", GreedySampler(), max_tokens=3)
    assert turn.prefilled == len(turn.prompt_tokens)
    assert conversation.messages[0] == {"role": "system", "content": "sys"}


def test_history_longer_than_the_context_is_refused_before_touching_the_cache(tiny_tokenizer):
    conversation = Conversation(make_loaded(make_tiny_model(max_position_embeddings=64), tiny_tokenizer, "tiny.gguf"))
    conversation.reply("hi", ScriptedSampler("ok"), max_tokens=4)
    cached = list(conversation.cached_tokens)
    with pytest.raises(ContextOverflowError, match="/reset"):
        conversation.ask("x" * 80, GreedySampler(), max_tokens=4)
    assert conversation.cached_tokens == cached and len(conversation.turns) == 1
    assert cache_length(conversation.cache) == len(cached)


def test_an_answer_stops_where_the_context_ends_as_in_run(tiny_tokenizer):
    # The turn is prepared as `run` prepares its prompt: max_tokens within what the context leaves.
    conversation = Conversation(make_loaded(make_tiny_model(max_position_embeddings=40), tiny_tokenizer, "tiny.gguf"))
    turn = conversation.reply("hello there", GreedySampler(), max_tokens=100)
    assert turn.finish_reason == turn.generation.summary().finish_reason == "context"
    assert len(turn.prompt_tokens) + len(turn.generation.tokens) == 40
    # The cache holds all of it but the last answer token, which never ran through the model.
    assert cache_length(conversation.cache) == len(conversation.cached_tokens) == 39
    with pytest.raises(ContextOverflowError, match="/reset"):
        conversation.ask("more", GreedySampler())
    conversation.reset()
    assert conversation.reply("ok", GreedySampler(), max_tokens=2).prefilled > 0


def test_an_answer_within_the_context_keeps_its_own_finish(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    assert conversation.reply("hi", GreedySampler(), max_tokens=3).finish_reason == "length"
    assert conversation.reply("ok", ScriptedSampler("a"), max_tokens=300).finish_reason == "eos"


def test_the_penalties_see_the_whole_conversation(tiny_model, tiny_tokenizer):
    # Repetition 50 over the conversation: no answer token repeats one of the history's.
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    for user in ("abcabc", "more"):
        turn = conversation.ask(user, GreedySampler(), max_tokens=6, penalties={"repetition": 50.0})
        list(turn)
        conversation.finish(turn)
    assert turn.prepared.penalties.prompt == tuple(turn.prompt_tokens[-64:])
    assert not set(turn.generation.tokens) & set(turn.prompt_tokens[-64:])


def test_transcript_lists_each_tokens_strategy(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"), system="s")
    conversation.reply("hi", ScriptedSampler("ab"), max_tokens=5)
    data = json.loads(json.dumps(conversation.transcript()))
    assert data["system"] == "s"
    (turn,) = data["turns"]
    assert turn["user"] == "hi" and turn["assistant"] == "ab"
    assert [(t["text"], t["strategy"]) for t in turn["tokens"]] == [("a", "scripted"), ("b", "scripted")]


def test_recover_realigns_the_layers_after_an_interrupt_outside_a_turn(tiny_model, tiny_tokenizer):
    conversation = Conversation(make_loaded(tiny_model, tiny_tokenizer, "tiny.gguf"))
    first = conversation.reply("abc", GreedySampler(), max_tokens=3)
    conversation.cache[0].trim(5)  # as if Ctrl-C stopped `ask` after trimming layer 0 only
    conversation.recover()
    assert {c.offset for c in conversation.cache} == {len(conversation.cached_tokens)}
    assert len(conversation.cached_tokens) == len(first.prompt_tokens) + 2 - 5 - 1
    turn = conversation.reply("d", GreedySampler(), max_tokens=4)
    assert turn.generation.tokens == fresh_answer(tiny_model, tiny_tokenizer, turn.prompt_tokens, 4)


@pytest.mark.slow
def test_an_answer_a_branch_rollout_ended_stays_in_the_cache(smollm):
    # On the bundled model the card's entropix answers "Thanks" with one confidence
    # rollout that ends the turn: its tokens never went through the step's own cache.
    from entropix_mlx.front.registry import build

    model, tokenizer = smollm
    conversation = Conversation(make_loaded(model, tokenizer, "smollm2-135m.gguf"))
    for user in ("Hi", "Thanks", "Bye"):
        turn = conversation.reply(user, build("entropix", tokenizer=tokenizer, card="smollm2-135m"), max_tokens=64)
        assert turn.finish_reason == "eos"
        assert cache_length(conversation.cache) == len(conversation.cached_tokens)
        assert conversation.cached_tokens == turn.prompt_tokens + turn.generation.tokens
    branched = [t for t in conversation.turns if any(e.strategy == "branch" for e in t.events)]
    assert branched, "no turn branched: the test no longer covers a rollout"
    second, third = conversation.turns[1:]
    assert third.prefilled == len(third.prompt_tokens) - len(second.prompt_tokens) - len(second.generation.tokens)
