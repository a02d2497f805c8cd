"""`--sampler deliberate` in `run` and `chat` on a tiny model: the branches
shown as they finish, the chosen answer, --json with every branch, --budget,
and one-line errors."""

import json

import pytest
from test_cli_run import invoke, one_error_line


def test_run_reports_every_branch_in_json_and_stays_in_the_budget(tiny_ref):
    code, out, err = invoke(
        "run",
        "What is 7 + 5?",
        "-m",
        tiny_ref,
        "--sampler",
        "deliberate",
        "--max-tokens",
        "6",
        "--budget",
        "3",
        "--json",
    )
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    summary = lines[-1]["summary"]
    tokens = [line for line in lines[:-1]]
    d = summary["deliberation"]
    assert summary["branches"] == len(d["candidates"]) - 1 == 2  # budget 3: greedy + 2
    assert summary["tokens_spent"] == d["tokens_spent"] <= 3 * max(len(c["tokens"]) for c in d["candidates"])
    winner = d["candidates"][d["chosen"]]
    assert [t["token"] for t in tokens] == winner["tokens"] and summary["winner"] == d["chosen"]
    assert d["candidates"][0]["parent"] is None and d["reason"]
    for c in d["candidates"][1:]:
        assert c["split"] == 0 and {"answer", "answer_margin", "mean_logprob", "text"} <= set(c)
    assert tokens[0]["strategy"] == ("split" if d["chosen"] == 0 else "branch")
    # Nothing a row did not record is written as an empty list (alternatives, measures).
    assert not any(c.get(k) == [] or c.get(k) == {} for c in d["candidates"] for k in ("top", "measures"))
    # Why: one row per candidate, in the candidates' order, the chosen one's answer the answer.
    assert [r["candidate"] for r in d["table"]] == ["greedy", "branch 1", "branch 2"]
    assert d["table"][d["chosen"]]["answer"] == winner["answer"]
    assert all(
        0 <= r["confidence"] <= 1 and r["tokens"] == c["own_tokens"]
        for r, c in zip(d["table"], d["candidates"], strict=True)
    )


def test_run_ends_a_deliberate_answer_with_why_it_chose(tiny_ref, tmp_path):
    config = tmp_path / "vote.toml"
    config.write_text('[deliberate]\nselector = "confidence_vote"\nfirst_alternatives = 2\nclean_first = "off"\n')
    args = ["run", "What is 7 + 5?", "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "6", "--no-color"]
    code, out, err = invoke(*args, "--config", config)
    assert code == 0, err
    table = err[err.index("candidate ") :]
    header, *rows = [line for line in table.splitlines() if line.strip()]
    assert header.split() == ["candidate", "answer", "confidence", "score", "tokens", "ended"]
    assert [r.split()[0] for r in rows[:3]] == ["greedy", "branch", "branch"]
    assert sum("(chosen)" in r for r in rows) == 1 and rows[-1].startswith("rule: ")


def test_run_shows_the_branches_then_the_answer(tiny_ref):
    code, out, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "5")
    assert code == 0, err
    assert "sampler deliberate" in err and "greedy ·" in err and err.count(" at token 0 (") == 2
    assert "2 branches" in err and "tokens spent" in err and "chose" in err
    assert out.endswith("\n") and len(out) > 1  # the chosen answer, then the newline


def test_chat_answers_with_deliberate_and_keeps_the_conversation(tiny_ref):
    code, out, err = invoke(
        "chat", "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "4", input="hello\nand again\n/stats\n"
    )
    assert code == 0, err
    assert out.count(">>> ") == 3 and "tokens spent" in out + err
    assert (out + err).count("greedy ·") == 2 and (out + err).count(" at token 0 (") == 4  # both answers


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--sampler", "greedy", "--budget", "2"], "--budget sets the deliberate sampler"),
        (["--sampler", "deliberate", "--temperature", "0.5"], "no effect with --sampler deliberate"),
        (["--sampler", "deliberate", "--budget", "0.5"], "--budget"),
        (["--sampler", "deliberate", "--config", "nope.toml"], "is not a file"),
        (["--sampler", "deliberate", "--config", "reference"], "give a .toml file with a [deliberate] table"),
        # cot_decoding is a fixed preset: a --config file would change nothing.
        (["--sampler", "cot_decoding", "--config", "reference"], "--sampler cot_decoding does not use it"),
    ],
)
def test_bad_deliberate_options_are_one_line_errors(tiny_ref, args, needle):
    code, out, err = invoke("run", "hi", "-m", tiny_ref, *args)
    assert code == 2 and needle in one_error_line(err)


def test_chat_takes_a_budget_and_switches_samplers(tiny_ref):
    code, out, err = invoke(
        "chat",
        "-m",
        tiny_ref,
        "--sampler",
        "deliberate",
        "--budget",
        "2",
        "--max-tokens",
        "3",
        input="hello\n/sampler greedy\nagain\n",
    )
    assert code == 0, err
    assert "1 branch," in out + err and "sampler greedy" in out + err


def test_eval_open_refuses_deliberate(tiny_ref):
    code, out, err = invoke("eval", "--open", "-m", tiny_ref, "--samplers", "greedy,deliberate")
    assert code == 2 and "deliberate is for task files" in one_error_line(err)


def test_the_progress_line_says_a_row_stopped_because_the_vote_was_decided(tiny_tokenizer):
    from entropix_mlx.cli.deliberation import deliberation_progress
    from rich.console import Console

    from entropix_mlx.decode.rows import RowResult

    console = Console(record=True, width=200)
    show = deliberation_progress(console, tiny_tokenizer, color=False)
    show(RowResult(tokens=[72, 105], finish_reason="eos", row=0))
    show(RowResult(tokens=[72, 33, 33], finish_reason="stopped", row=1, parent=0, split=1))
    show(RowResult(tokens=[72, 33, 33], finish_reason="length", row=2, parent=0, split=1))
    lines = console.export_text().splitlines()
    assert "(stopped" not in lines[0] and "stopped early: the vote was decided" in lines[1]
    assert "(stopped: length)" in lines[2]


@pytest.mark.parametrize("name", ["deliberate_staged", "cot_decoding"])
def test_eval_presets_answer_in_run_with_evals_own_settings(tiny_ref, name):
    from entropix_mlx.front import registry
    from entropix_mlx.sampling.deliberate_config import DeliberateConfig

    code, out, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", name, "--max-tokens", "3", "--json")
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])["summary"]
    assert summary["deliberation"]["candidates"] and f"sampler {name}" not in err  # --json: no header
    code, _, err = invoke("run", "hi", "-m", tiny_ref, "--sampler", name, "--max-tokens", "3")
    assert code == 0 and f"sampler {name}" in err.splitlines()[0]
    # One spec builds it for run, chat, serve and eval: the preset, or the defaults with the rule's fields.
    spec = registry.SAMPLERS[name]
    expected = spec.preset if spec.preset is not None else DeliberateConfig().replace(**spec.rule)
    assert registry.build(name).config == expected and name in registry.SAMPLER_NAMES
