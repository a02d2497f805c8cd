"""`--sampler deliberate` in `run` and `chat` on a tiny model: the branches
shown as they finish, the chosen answer, --json with every branch, --budget,
and one-line errors."""

import json
import re

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
    assert not any(k in c for c in d["candidates"] for k in ("top", "measures"))
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


# Why deliberate chose, as a reader checks it: the rule line's numbers are the table's.
QUESTION = "What is 7 + 5?"
LONG = "the whole first line of an answer without a number, read as its answer"
SUMMED = ("margin", "vote", "weighted_vote", "confidence_vote", "lowest_group_vote")  # the others take the best
TOLD = re.compile(r"(-?\d+\.\d{3}) for '([^']*)' \(([^)]*)\)")
MARGIN = re.compile(r"more than ([\d.]+)(?: \(([\d.]+) of the votes\))? above")
ROW = re.compile(r"(\S.*?) {2,}(.+?) {2,}\d\.\d{3} {2,}(?:(-?\d+\.\d{3}) {2,})?\d+ {2}")


def printed_table(text: str) -> tuple[list[dict], str]:
    """The last candidates table in `text` (each row's candidate, answer and score,
    and which is chosen) and its rule line."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("candidate "))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("rule: "):
            return rows, line.removeprefix("rule: ")
        if row := ROW.match(line):  # (not a cell wrapped onto the next line)
            name, answer, score = row.groups()
            rows.append(
                {
                    "candidate": name.removesuffix(" (chosen)"),
                    "chosen": name.endswith(" (chosen)"),
                    "answer": answer,
                    "score": float(score) if score else None,
                }
            )
    raise AssertionError(f"no rule line after the table:\n{text}")


def same_answer(told: str, cell: str) -> bool:
    return told == cell or (told.endswith("…") and cell.startswith(told[:-1]))


def assert_rule_reads_table(rule: str, rows: list[dict]) -> str:
    """Each answer the rule line scores has its rows' score (their sum for a summing
    selector, else their best) and names those rows; the winner is the chosen row and
    the best of all, the best other is the best of the rest, and the margin's verdict
    holds on the printed numbers. Returns the verdict ("kept" or "won")."""
    chosen = next(r for r in rows if r["chosen"])
    verdict, _, how = rule.rpartition(" won: ") if " won: " in rule else rule.partition(": ")
    assert how, f"no scores in the rule line: {rule}"
    combine = sum if how.split()[0] in SUMMED else max

    def score_of(answer):
        scored = [r for r in rows if same_answer(answer, r["answer"]) and r["score"] is not None]
        best = combine(r["score"] for r in scored)
        named = scored if combine is sum else [r for r in scored if r["score"] == best][:1]
        return round(best, 3), [r["candidate"] for r in named]

    told = []
    for value, answer, names in TOLD.findall(rule):
        assert score_of(answer) == (float(value), names.split(" + ")), (rule, rows)
        told.append((float(value), answer))
    assert told, rule
    best = {a: score_of(a)[0] for a in {r["answer"] for r in rows if r["score"] is not None}}
    (mine, answer), rest = told[0], told[1:]
    assert same_answer(answer, chosen["answer"]), (rule, rows)
    others = [v for a, v in best.items() if not same_answer(answer, a)]
    margin = MARGIN.search(rule)
    step = float(margin.group(2) or margin.group(1)) if margin else 0.0
    slack = 0.002  # the rule decides on the scores before the table rounds them
    if verdict == "greedy answer kept":
        assert chosen["candidate"] == "greedy", rule
        if not rest:
            assert rule.endswith("; no other answer") and not others, rule
            return "kept"
        ((other, _),) = rest
        assert other == max(others) and other - mine <= step + slack and "is not more than" in rule, (rule, rows)
        return "kept"
    assert chosen["candidate"] == verdict.rpartition("; ")[2] and mine == max(best.values()), (rule, rows)
    if "so it keeps no margin" in verdict:  # the greedy answer did not compete
        assert [v for v, _ in rest] == ([max(others)] if others else []), (rule, rows)
    elif not rule.endswith("; the greedy answer has none"):
        ((greedy, greedy_answer),) = rest
        assert same_answer(greedy_answer, rows[0]["answer"]) and mine - greedy > step - slack, (rule, rows)
    return "won"


def deliberate_config(tmp_path, selector, margin, clean_first="off"):
    path = tmp_path / f"{selector}.toml"
    path.write_text(
        f'[deliberate]\nselector = "{selector}"\nmargin = {margin}\nclean_first = "{clean_first}"\n'
        "first_alternatives = 3\nmax_branch_points = 0\nbudget = 6.0\nstop_share = 0.0\nfirst_stage = 0\n"
        'gate_signal = ""\n'
    )
    return path


# (selector, margin, clean_first, greedy's answer, a branch's answer, the verdict)
RULE_CASES = [
    ("vote", 0.0, "off", "12", LONG, "won"),  # three branches agree against the greedy answer
    ("vote", 5.0, "off", "12", LONG, "kept"),  # the margin holds: 5 votes, as a share of the 4 cast
    ("confidence_vote", 0.0, "off", "12", "262", "kept"),  # the greedy answer is the sure one
    ("continuation_margin", 0.1, "off", "12", "12", "kept"),  # one answer: the best of its rows
    ("logprob", 0.0, "loop", None, "262", "won"),  # the greedy answer says nothing: no margin
]


@pytest.mark.parametrize("selector, margin, clean_first, mine, theirs, verdict", RULE_CASES)
def test_run_prints_a_rule_line_that_reads_the_table(
    tiny_ref, tmp_path, answers, selector, margin, clean_first, mine, theirs, verdict
):
    answers(QUESTION, mine, theirs)
    config = deliberate_config(tmp_path, selector, margin, clean_first)
    args = ["run", QUESTION, "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "6", "--no-color"]
    code, _, err = invoke(*args, "--config", config)
    assert code == 0, err
    rows, rule = printed_table(err)
    assert len(rows) == 4 and assert_rule_reads_table(rule, rows) == verdict
    # The answer column holds the extracted answer cut to a short column, never wrapped.
    assert all(len(r["answer"]) <= 20 for r in rows) and any(r["answer"].endswith("…") for r in rows) == (
        theirs == LONG
    )
    code, out, _ = invoke(*args, "--config", config, "--json")
    d = json.loads(out.splitlines()[-1])["summary"]["deliberation"]
    assert d["reason"] == rule and [r["score"] for r in d["table"]] == [r["score"] for r in rows]


@pytest.mark.parametrize("selector, margin, clean_first, mine, theirs, verdict", [RULE_CASES[0], RULE_CASES[1]])
def test_chat_prints_a_rule_line_that_reads_the_table(
    tiny_ref, tmp_path, answers, selector, margin, clean_first, mine, theirs, verdict
):
    answers(QUESTION, mine, theirs)
    config = deliberate_config(tmp_path, selector, margin, clean_first)
    args = ["chat", "-m", tiny_ref, "--sampler", "deliberate", "--max-tokens", "6", "--no-color", "--config", config]
    code, out, err = invoke(*args, input=f"{QUESTION}\n")
    assert code == 0, err
    rows, rule = printed_table(out)
    assert len(rows) == 4 and assert_rule_reads_table(rule, rows) == verdict
