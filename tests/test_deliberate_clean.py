"""deliberate never keeps a degenerate answer: a candidate that loops or runs into
the length limit loses to one that ended cleanly, whatever its score; and the
numbers the progress lines give the branches are the summary's."""

import json
from dataclasses import replace

import pytest
from test_cli_run import invoke
from test_deliberate import cand as deliberate_cand

from entropix_mlx.sampling.deliberate_config import DeliberateConfig
from entropix_mlx.sampling.repetition import LOOP_ALERT
from entropix_mlx.sampling.selection import select


def cand(answer, parent=0, logprob=-1.0, finish="eos", loop=0, margin=0.5):
    """test_deliberate's candidate, with an ending, a loop and the continuation margin."""
    c = deliberate_cand(answer, parent, margin, logprob)
    return replace(c, finish_reason=finish, loop=loop, continuation_margin=margin)


def test_a_looping_greedy_answer_loses_to_a_clean_branch_whatever_its_confidence():
    looping = cand("rain", None, logprob=-0.01, finish="length", loop=200, margin=0.99)
    cands = [looping, cand("7", logprob=-3.0, margin=0.01), cand("8", logprob=-2.0, margin=0.02)]
    for selector in ("margin", "logprob", "continuation_margin", "vote", "greedy"):
        chosen, reason, _ = select(cands, selector, margin=0.5)
        assert chosen in (1, 2) and "loops" in reason, selector
    assert select(cands, "logprob", 0.5)[0] == 2  # among the clean ones, the selector decides
    assert select(cands, "logprob", 0.5, clean_first="off")[0] == 0  # the old rule kept the loop


def test_an_answer_cut_off_by_the_length_limit_loses_to_one_that_ended():
    cands = [cand("9", None, logprob=-0.1, finish="length"), cand("7", logprob=-2.0)]
    chosen, reason, _ = select(cands, "continuation_margin", 0.1, clean_first="loop_or_length")
    assert chosen == 1 and "length limit" in reason
    assert select(cands, "continuation_margin", 0.1, clean_first="loop")[0] == 0  # loops only: kept


def test_an_answer_that_ended_at_once_never_wins_as_the_clean_one():
    empty = cand(None, logprob=-0.5)  # its first token ended the turn: no text, no answer
    cands = [cand("9", None, logprob=-0.1, finish="length"), empty]
    for rule in ("loop", "loop_or_length"):
        chosen, reason, _ = select(cands, "continuation_margin", 0.1, clean_first=rule)
        assert chosen == 0, rule


def test_a_degenerate_branch_never_replaces_a_clean_greedy_answer():
    cands = [cand("7", None, logprob=-2.0, margin=0.1), cand("8", logprob=-0.1, loop=LOOP_ALERT, margin=0.9)]
    assert select(cands, "logprob", 0.0)[0] == 0
    cands[1].loop = LOOP_ALERT - 1  # a short repeat is no loop: the better branch wins again
    assert select(cands, "logprob", 0.0)[0] == 1


def test_when_every_candidate_is_degenerate_the_selector_decides_as_before():
    cands = [cand("7", None, logprob=-2.0, finish="length"), cand("8", logprob=-0.1, finish="length")]
    for rule in ("loop", "loop_or_length"):
        assert select(cands, "logprob", 2.0, rule)[0] == 0 and select(cands, "logprob", 0.0, rule)[0] == 1


def test_the_rule_is_a_setting_with_a_one_line_error():
    assert DeliberateConfig().clean_first == "loop"
    with pytest.raises(Exception, match="clean_first"):
        DeliberateConfig(clean_first="sometimes")


def test_progress_lines_number_the_branches_as_the_summary_does(tiny_ref):
    args = ("run", "hi", "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "5", "--budget", "4")
    code, out, _ = invoke(*args, "--json")
    assert code == 0
    d = json.loads(out.splitlines()[-1])["summary"]["deliberation"]
    code, out, err = invoke(*args)
    assert code == 0, err
    lines = {
        line.split("] ")[1].split(" at token")[0].split(" · ")[0]: line
        for line in err.splitlines()
        if " done · " in line
    }
    assert set(lines) == {"greedy"} | {f"branch {n}" for n in range(1, len(d["candidates"]))}
    for number, c in enumerate(d["candidates"][1:], start=1):
        assert f"at token {c['split']} " in lines[f"branch {number}"]
        assert repr(" ".join(c["text"].split())[:20])[:-1] in lines[f"branch {number}"]
    chosen = "the greedy answer" if d["chosen"] == 0 else f"branch {d['chosen']}"
    assert f"chose {chosen}" in err


def test_the_bundled_model_never_keeps_a_loop(smollm):
    from entropix_mlx.decode.deliberate import deliberate_batch
    from entropix_mlx.decode.prompt import encode_chat
    from entropix_mlx.decode.rows import Request
    from entropix_mlx.sampling.deliberate_config import resolve_deliberate

    model, tokenizer = smollm
    config, _ = resolve_deliberate("smollm2-135m")
    prompts = [
        "Write a haiku about rain.",  # greedy loops "a gentle rain, a gentle rain, ..." to the 256-token limit
        "Tom has 3 apples, buys 5 more and gives 2 away. How many apples does he have?",
    ]
    requests = [Request(encode_chat(tokenizer, [{"role": "user", "content": p}]), 0, 256) for p in prompts]
    answers = {i: d for i, d, _ in deliberate_batch(model, tokenizer, requests, config, batch_size=2)}
    for i, prompt in enumerate(prompts):
        d = answers[i]
        assert d.winner.flaw() is None, (prompt, d.reason, d.winner.text)
    haiku = answers[0]  # the failure this rule fixes: the old rule kept greedy's loop
    before = select(haiku.candidates, config.selector, config.margin, clean_first="off")[0]
    assert before == 0 and haiku.candidates[0].loop >= LOOP_ALERT and haiku.chosen != 0


def test_the_length_rule_trusts_an_answer_that_ended_whatever_it_repeats():
    # "12,000 + 2,000 + 150,000" repeats "2,000 + " back to back: 14 of Qwen's digit tokens
    cands = [cand("118000", None, logprob=-0.1, loop=14), cand("150000", logprob=-0.3)]
    chosen, reason, _ = select(cands, "confidence_vote", 0.0, clean_first="loop_or_length")
    assert chosen == 1 and "loops" in reason
    assert select(cands, "confidence_vote", 0.0, clean_first="length")[0] == 0  # both clean: the vote decides
    cut = [cand("9", None, logprob=-0.1, finish="length", loop=40), cand("7", logprob=-2.0)]
    chosen, reason, _ = select(cut, "continuation_margin", 0.1, clean_first="length")
    assert chosen == 1 and "length limit" in reason
