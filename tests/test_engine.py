"""The batch engine's public face, as the server drives it: requests added at any
time with their own samplers, a step at a time, cut or dropped by `cancel`; and
the server's recorder keeping the batch's one host sync per step."""

import mlx.core as mx
from test_batch import TEXTS, make_model, prompts_of, unbatched

from entropix_mlx.decode.engine import BatchEngine
from entropix_mlx.decode.rows import Request
from entropix_mlx.sampling.recorder import recording
from entropix_mlx.sampling.samplers import GREEDY_PARAMS, GreedySampler, Step, plans_in_two_phases


def run_to_end(engine, started=None):
    done = {}
    while not engine.idle:
        for row in engine.step():
            done[row.index] = row.result
        if started is not None:
            started.update(row.index for row in engine.rows)
    return done


def test_rows_added_with_their_own_samplers_equal_unbatched_runs(tiny_tokenizer):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS[:4])
    engine = BatchEngine(model, tiny_tokenizer, batch_size=2, groups=1, joins_per_step=1)
    for i, p in enumerate(prompts):
        engine.add(10 + i, Request(p, i, 5 + i), GreedySampler())
    assert engine.has_room is False  # four waiting for two slots
    done = run_to_end(engine)
    assert sorted(done) == [10, 11, 12, 13]
    for i, p in enumerate(prompts):
        assert done[10 + i].tokens == unbatched(model, tiny_tokenizer, p, GreedySampler(), 5 + i, i)


def test_cancel_drops_a_waiting_request_and_cuts_a_running_row(tiny_tokenizer):
    model = make_model()
    prompts = prompts_of(tiny_tokenizer, TEXTS[:3])
    engine = BatchEngine(model, tiny_tokenizer, batch_size=1, groups=1)
    first = Request(prompts[0], 0, 20)
    engine.add(0, first, GreedySampler())
    engine.add(1, Request(prompts[1], 0, 20), GreedySampler())
    assert engine.cancel(1) is True  # still waiting: it never runs
    engine.step()  # row 0 joins
    engine.step()  # its first token
    assert [row.index for row in engine.rows] == [0]
    assert engine.cancel(0) is False  # running: cut at its next decision
    done = run_to_end(engine)
    assert list(done) == [0] and len(done[0].tokens) == 2 and done[0].finish_reason == "length"
    assert first.max_tokens == 20  # the caller's request is left as it was (it may be sent again)


def test_per_token_records_hold_the_sampling_parameters_and_notes(tiny_tokenizer):
    model = make_model()
    engine = BatchEngine(model, tiny_tokenizer, batch_size=1, groups=1)
    engine.add(0, Request(prompts_of(tiny_tokenizer, TEXTS[:1])[0], 0, 3), GreedySampler())
    result = run_to_end(engine)[0]
    assert result.params == [GREEDY_PARAMS] * 3 and result.notes == [""] * 3


def test_the_servers_recorder_keeps_two_phase_decisions_and_adds_the_alternatives(tiny_tokenizer):
    model = make_model()
    prompt = prompts_of(tiny_tokenizer, TEXTS[:1])[0]
    logits, scores = model(mx.array([prompt]), None)
    step = Step(logits[0, -1], [s[0] for s in scores], [], model, None)
    wrapped = recording(GreedySampler(), 3)
    assert plans_in_two_phases(wrapped)  # the batch evaluates every row's plan in one host sync
    plain = GreedySampler().choose(step, mx.random.key(0))
    choice = wrapped.choose(step, mx.random.key(0))
    assert choice.tokens == plain.tokens and choice.logprobs == plain.logprobs
    assert len(choice.top) == 3 and choice.top[0][0] == plain.tokens[0]
    assert [lp for _, lp in choice.top] == sorted((lp for _, lp in choice.top), reverse=True)
