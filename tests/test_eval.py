"""`entropix-mlx eval`: answer extraction, statistics, task files, the resumable
runner and the command. The runner and the command run on the tiny model; one
test runs the built-in tasks on the bundled model."""

import json
import math
import re
import sys
from pathlib import Path

import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer, shelve
from test_cli_run import invoke, one_error_line

from entropix_mlx import eval as ev
from entropix_mlx.errors import ConfigError

# -- answer extraction ------------------------------------------------------------

NUMBER = [
    # (model output, expected answer, extracted, correct)
    ("The answer is 1,250.", "1250", "1250", True),
    ("1,000 + 250 = 1,250", "1,250", "1250", True),
    ("It is 9.90", "9.9", "9.9", True),  # 9.90 == 9.9
    ("3.5 + 1.5 = 5.", "5.0", "5", True),  # 5 == 5.0, the full stop is not a decimal point
    ("5 - 8 = -3", "-3", "-3", True),  # a sign, not the minus of 5 - 8
    ("5 − 8 = −3", "-3", "-3", True),  # U+2212 minus
    ("The result is +3", "3", "3", True),
    ("It costs $45.", "45", "45", True),
    ("They cost $1,200.50 in all", "1200.5", "1200.5", True),
    ("3/4 of the cake", "0.75", "0.75", True),  # fractions compare exactly
    ("To add 7 and 5: 7 + 5 = 12", "12", "12", True),  # the LAST number
    ("12 times 3 is 32.", "36", "32", False),
    ("8. A spider has 8 legs and 2 body parts.", "8", "2", False),  # last number, as documented
    ("The answer is 8, since 4 + 4 is 8 and 2 * 4 = 8", "8", "8", True),
    ("The answer is 7. Check: 3 + 4 = 8", "7", "7", True),  # first number after the last 'answer is'
    ("Answer: 42\nsome more text 17", "42", "42", True),
    ("so 4 * 4 = 16\n#### 16", "16", "16", True),  # GSM8K style
    ("#### 42 and then 7", "42", "42", True),
    ("A spider has eight legs.", "8", "8", True),  # number words only without digits
    ("twenty-one", "21", "21", True),
    ("One of the 12 months", "12", "12", True),  # digits present: 'One' is not a number
    ("There are no numbers here.", "3", None, False),
    ("version v1.2.3", "1", None, False),
    ("", "0", None, False),
]


@pytest.mark.parametrize("output, answer, extracted, correct", NUMBER)
def test_number_answers(output, answer, extracted, correct):
    task = ev.Task(0, "q", [answer])
    assert task.kind == "number"
    assert ev.score(output, task) == (extracted, correct)


CHOICES = ["carrot", "apple", "potato", "onion"]
CHOICE = [
    ("B", "B", True),
    ("B. apple", "B", True),
    ("(B)", "B", True),
    ("B) apple", "B", True),
    ("The answer is B.", "B", True),
    ("answer: (b)", "B", True),
    ("I think (C) is right", "C", False),
    ("A. carrot", "A", False),
    ("An apple.", "B", True),  # no letter: the choice text
    ("A carrot is a vegetable, an apple a fruit.", "A", False),  # the earliest choice named
    ("Apples are fruits", None, False),  # whole words only: 'apples' is not 'apple'
    ("E", None, False),  # not a choice letter
    ("A. apple\n\nThe correct answer is C. apple.", "C", False),  # 'answer is' comes first
]


@pytest.mark.parametrize("output, extracted, correct", CHOICE)
def test_choice_answers(output, extracted, correct):
    task = ev.parse_task({"question": "Which is a fruit?", "choices": CHOICES, "answer": "B"}, 0, "x")
    assert task.kind == "choice" and task.expected == "B"
    assert ev.score(output, task) == (extracted, correct)


def test_a_choice_answer_may_be_the_choice_text():
    task = ev.parse_task({"question": "Boils at?", "choices": ["50", "100", "0"], "answer": "100"}, 0, "x")
    assert task.expected == "B"
    assert ev.score("B. 100", task) == ("B", True)
    assert ev.score("It boils at 100 degrees.", task) == ("B", True)


TEXT = [
    (["Paris"], "The capital of France is Paris.", True),
    (["Paris"], "Answer: paris", True),
    (["Paris"], "\n\n  PARIS!  ", True),
    (["Paris"], "Parisian food is good.", False),  # whole words
    (["Paris"], "It is Lyon.\nNo wait, Paris.", False),  # the first line only
    (["Jupiter"], "The largest planet is Neptune.", False),
    (["carbon dioxide", "CO2"], "Plants take in CO2.", True),  # any accepted answer
    (["carbon dioxide", "CO2"], "They take in carbon  dioxide.", True),
    (["the Nile"], "It is Nile", True),  # articles are dropped on both sides
    (["William Shakespeare", "Shakespeare"], "Shakespeare wrote it.", True),
    (["blue"], "", False),
]


@pytest.mark.parametrize("answers, output, correct", TEXT)
def test_text_answers(answers, output, correct):
    task = ev.Task(0, "q", answers)
    assert task.kind == "text"
    assert ev.score(output, task)[1] is correct


def test_normalize():
    assert ev.normalize("  The Capital,   of FRANCE! ") == "capital of france"
    assert ev.normalize("An apple—a day") == "apple day"


# -- statistics -----------------------------------------------------------------

# Wilson score intervals (no continuity correction) published in Newcombe (1998),
# "Two-sided confidence intervals for the single proportion", Statistics in
# Medicine 17: 857-872, Table I, method 3.
NEWCOMBE = [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)]


@pytest.mark.parametrize("k, n, lo, hi", NEWCOMBE)
def test_wilson_interval_matches_published_values(k, n, lo, hi):
    got = ev.wilson_interval(k, n)
    assert got[0] == pytest.approx(lo, abs=5e-5) and got[1] == pytest.approx(hi, abs=5e-5)


def test_wilson_interval_edges():
    assert ev.wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = ev.wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)  # mirror of 0/10 -> (0, 0.2775)
    assert ev.wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)


@pytest.mark.parametrize(
    "wins, losses, p",
    [
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10
        (9, 1, 22 / 1024),
        (0, 5, 2 / 32),
        (10, 0, 2 / 1024),
        (3, 10, 2 * (1 + 13 + 78 + 286) / 8192),
        (2, 2, 1.0),
        (0, 0, 1.0),
    ],
)
def test_exact_sign_test(wins, losses, p):
    assert ev.sign_test(wins, losses) == pytest.approx(p, rel=1e-12)


def test_sign_test_is_exact_for_large_counts():
    # 2 * P(X <= 100) for X ~ Binomial(300, 1/2): tiny, but not rounded to zero.
    p = ev.sign_test(100, 200)
    assert 0 < p < 1e-8
    assert math.isclose(p, 2 * sum(math.comb(300, i) for i in range(101)) / 2**300, rel_tol=1e-12)


def test_paired_comparison_counts_items():
    greedy = {0: 1, 1: 0, 2: 1, 3: 0, 4: 1}
    sampler = {0: 1, 1: 1, 2: 0.5, 3: 0, 4: 0}
    assert ev.paired_comparison(sampler, greedy) == {"wins": 1, "losses": 2, "ties": 2, "p_value": ev.sign_test(1, 2)}


def record(sampler, seed, index, correct, tokens=4, strategies=None):
    return {
        "sampler": sampler,
        "seed": seed,
        "index": index,
        "correct": correct,
        "tokens": tokens,
        "seconds": 1.0,
        "strategies": strategies or {"argmax": tokens},
        "thinking_insertions": 0,
    }


def test_summary_of_several_seeds():
    tasks = [ev.Task(i, f"q{i}", ["1"]) for i in range(4)]
    config = ev.EvalConfig(samplers=["greedy", "temperature"], seeds=2)
    records = {}
    for name, seed, correct in [
        ("greedy", 0, [1, 0, 1, 0]),
        ("temperature", 0, [1, 1, 0, 0]),
        ("temperature", 1, [1, 1, 1, 0]),
    ]:
        for i, c in enumerate(correct):
            records[(name, seed, i)] = record(name, seed, i, bool(c), strategies={"sample": 4})
    s = ev.summarize(records, tasks, config)["samplers"]
    assert s["greedy"]["accuracy"] == 0.5 and s["greedy"]["seeds"] == 1 and "vs_greedy" not in s["greedy"]
    t = s["temperature"]
    assert [r["accuracy"] for r in t["runs"]] == [0.5, 0.75]
    assert t["accuracy"] == 0.625 and t["accuracy_std"] == pytest.approx(math.sqrt(0.03125))
    assert t["ci95"] == pytest.approx(list(ev.wilson_interval(2.5, 4)))
    # per item: sampler shares 1, 1, 0.5, 0 against greedy 1, 0, 1, 0
    vs = t["vs_greedy"]
    assert {k: vs[k] for k in ("wins", "losses", "ties", "p_value", "p_holm")} == {
        "wins": 1,
        "losses": 1,
        "ties": 2,
        "p_value": 1.0,
        "p_holm": 1.0,
    }
    # per-item differences 0, 1, -0.5, 0: mean 0.125, sd 0.6292, half-width 1.96 * 0.629 / 2
    assert vs["difference"] == 0.125
    assert vs["difference_ci95"] == pytest.approx([0.125 - 0.6166, 0.125 + 0.6166], abs=1e-4)
    assert t["tokens_per_second"] == 4.0 and t["strategy_share"] == {"sample": 1.0}


# -- task files -----------------------------------------------------------------


def test_builtin_tasks_have_every_kind():
    # size, answers and splits of the built-in tasks: tests/test_eval_tasks.py
    tasks = ev.load_tasks(ev.builtin_tasks_path())
    assert {t.kind for t in tasks} == {"number", "text", "choice"}


def test_gsm8k_answers(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "She has 2 + 3 = <<2+3=5>>5 apples.\n#### 5"}) + "\n")
    (task,) = ev.load_tasks(path)
    assert task.expected == "5" and task.kind == "number"


def test_prompt_templates():
    task = ev.parse_task({"question": "2+2?", "answer": "4", "prompt": "Q: {question}\nA:"}, 0, "x")
    assert task.prompt_text() == "Q: 2+2?\nA:"
    choice = ev.parse_task({"question": "Pick", "choices": ["x", "y"], "answer": "y"}, 0, "x")
    assert "A. x\nB. y" in choice.prompt_text()


BAD_FILES = [
    ("{not json", "not valid JSON"),
    ('{"answer": "4"}', 'no "question"'),
    ('{"question": "q"}', 'needs an "answer"'),
    ('{"question": "q", "answer": true}', 'needs an "answer"'),
    ('{"question": "q", "answer": ""}', "empty answer"),
    ('["q", "a"]', "not a JSON object"),
    ('{"question": "q", "answer": "Z", "choices": ["a", "b"]}', "neither a choice letter"),
    ('{"question": "q", "answer": "A", "choices": ["a"]}', "list of 2 to 26"),
    ('{"question": "q", "answer": "4", "prompt": "{answer}"}', "prompt template is invalid"),
    ("", "has no items"),
]


@pytest.mark.parametrize("text, message", BAD_FILES)
def test_bad_task_files_say_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"question": "ok", "answer": "1"}\n' * (message != "has no items") + text + "\n")
    with pytest.raises(ConfigError, match=message) as e:
        ev.load_tasks(path)
    assert "\n" not in str(e.value)
    if message != "has no items":
        assert "tasks.jsonl line 2" in str(e.value)  # the bad line, after one good one


def test_missing_task_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ev.load_tasks(tmp_path / "nope.jsonl")


# -- the runner on the tiny model --------------------------------------------------

TASK_LINES = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "Capital of France?", "answer": "Paris"},
    {"question": "Pick one", "choices": ["x", "y"], "answer": "A"},
    {"question": "What is 10 - 4?", "answer": "6"},
    {"question": "Colour of the sky?", "answer": "blue"},
    {"question": "What is 1 + 1?", "answer": "2"},
]


def write_tasks(path: Path, lines=TASK_LINES) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def tiny():
    return make_tiny_model(tie_word_embeddings=False), make_tiny_tokenizer()


CONFIG = {"samplers": ["temperature"], "seeds": 2, "max_tokens": 6, "batch_size": 3, "model_name": "tiny"}


def outputs(records):
    return {k: (r["output"], r["correct"], r["tokens"]) for k, r in records.items()}


def read_items(out_dir: Path) -> dict:
    recs = [json.loads(line) for line in (out_dir / "items.jsonl").read_text().splitlines()]
    keyed = {(r["sampler"], r["seed"], r["index"]): r for r in recs}
    assert len(keyed) == len(recs), "an item was saved twice"
    return keyed


def test_an_interrupted_eval_resumes_where_it_stopped(tiny, tmp_path):
    model, tokenizer = tiny
    tasks = ev.load_tasks(write_tasks(tmp_path / "t.jsonl"))
    config = ev.EvalConfig(**CONFIG)
    total = 3 * len(tasks)  # greedy once + temperature with 2 seeds

    seen = []

    def stop_after_7(record):
        seen.append(record)
        if len(seen) == 7:
            raise KeyboardInterrupt

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        ev.run_eval(model, tokenizer, tasks, config, out_dir=out, on_record=stop_after_7)
    assert len(read_items(out)) == 7 and not (out / "results.json").exists()
    # a write cut short by the interruption: ignored, and that item runs again
    with open(out / "items.jsonl", "a") as f:
        f.write('{"sampler": "temperature", "seed": 1, "ind')

    resumed, progress = [], []
    results = ev.run_eval(
        model,
        tokenizer,
        tasks,
        config,
        out_dir=out,
        on_record=resumed.append,
        progress=lambda done, total, what, run_done, run_items: progress.append((done, total)),
    )
    assert len(resumed) == total - 7  # only what was missing ran
    assert progress[0] == (7, total) and progress[-1] == (total, total)
    saved = read_items(out)
    assert len(saved) == total

    fresh = tmp_path / "fresh"
    uninterrupted = ev.run_eval(model, tokenizer, tasks, config, out_dir=fresh)
    assert outputs(saved) == outputs(read_items(fresh))
    for name in ("greedy", "temperature"):
        a, b = results["samplers"][name], uninterrupted["samplers"][name]
        assert (a["accuracy"], a["ci95"], a["mean_tokens"]) == (b["accuracy"], b["ci95"], b["mean_tokens"])
    assert json.loads((out / "results.json").read_text())["samplers"].keys() == {"greedy", "temperature"}


def test_nothing_runs_again_when_everything_is_done(tiny, tmp_path):
    model, tokenizer = tiny
    tasks = ev.load_tasks(write_tasks(tmp_path / "t.jsonl"))[:2]
    config = ev.EvalConfig(**CONFIG)
    ev.run_eval(model, tokenizer, tasks, config, out_dir=tmp_path / "o")
    again = []
    ev.run_eval(model, tokenizer, tasks, config, out_dir=tmp_path / "o", on_record=again.append)
    assert again == []
    # a larger --limit adds items, keeping the ones already done
    more = ev.load_tasks(write_tasks(tmp_path / "t.jsonl"))[:3]
    ev.run_eval(model, tokenizer, more, config, out_dir=tmp_path / "o", on_record=again.append)
    assert sorted({r["index"] for r in again}) == [2] and len(again) == 3


def test_resuming_a_different_eval_is_refused(tiny, tmp_path):
    model, tokenizer = tiny
    tasks = ev.load_tasks(write_tasks(tmp_path / "t.jsonl"))[:2]
    ev.run_eval(model, tokenizer, tasks, ev.EvalConfig(**CONFIG), out_dir=tmp_path / "o")
    with pytest.raises(ConfigError, match="max tokens changed"):
        ev.run_eval(model, tokenizer, tasks, ev.EvalConfig(**{**CONFIG, "max_tokens": 7}), out_dir=tmp_path / "o")
    changed = ev.load_tasks(write_tasks(tmp_path / "t2.jsonl", [{"question": "Other?", "answer": "1"}] * 2))
    with pytest.raises(ConfigError, match="other questions"):
        ev.run_eval(model, tokenizer, changed, ev.EvalConfig(**CONFIG), out_dir=tmp_path / "o")


def test_results_do_not_depend_on_the_batch_size(tiny, tmp_path):
    model, tokenizer = tiny
    tasks = ev.load_tasks(write_tasks(tmp_path / "t.jsonl"))
    runs = [
        ev.run_eval(model, tokenizer, tasks, ev.EvalConfig(**{**CONFIG, "batch_size": b}), out_dir=tmp_path / str(b))
        for b in (1, 4)
    ]
    assert outputs(read_items(tmp_path / "1")) == outputs(read_items(tmp_path / "4"))
    assert runs[0]["batch_size"] == 1 and runs[1]["batch_size"] == 4


def test_records_hold_what_is_needed_to_inspect_an_item(tiny, tmp_path):
    model, tokenizer = tiny
    tasks = ev.load_tasks(write_tasks(tmp_path / "t.jsonl"))[:2]
    ev.run_eval(model, tokenizer, tasks, ev.EvalConfig(**{**CONFIG, "samplers": ["greedy"]}), out_dir=tmp_path / "o")
    r = read_items(tmp_path / "o")[("greedy", 0, 1)]
    assert {"question", "expected", "extracted", "correct", "output", "strategies"} <= r.keys()
    assert r["question"] == "Capital of France?" and r["expected"] == "Paris"
    assert r["output"] == tokenizer.decode(tokenizer.encode(r["output"])) and 1 <= r["tokens"] <= 6
    assert r["strategies"] == {"argmax": r["tokens"]}


# -- the command -------------------------------------------------------------------


@pytest.fixture
def tiny_ref(tmp_path, monkeypatch, tiny):
    """A --model reference the CLI resolves to the tiny model."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    return shelve(monkeypatch, path, make_loaded(*tiny, path))


def test_eval_command_json_and_out(tiny_ref, tmp_path):
    tasks = write_tasks(tmp_path / "t.jsonl")
    code, out, err = invoke(
        "eval",
        tasks,
        "-m",
        tiny_ref,
        "--samplers",
        "greedy,min_p",
        "--seeds",
        "2",
        "--max-tokens",
        "5",
        "--batch-size",
        "4",
        "--json",
        "--out",
        tmp_path / "o",
        "--limit",
        "4",
    )
    assert code == 0, err
    results = json.loads(out)
    assert results["items"] == 4 and results["max_tokens"] == 5 and results["batch_size"] == 4
    assert set(results["samplers"]) == {"greedy", "min_p"}
    assert len(results["samplers"]["min_p"]["runs"]) == 2 and "vs_greedy" in results["samplers"]["min_p"]
    assert json.loads((tmp_path / "o" / "results.json").read_text())["samplers"] == results["samplers"]
    assert len(read_items(tmp_path / "o")) == 4 * 3


def test_eval_command_table_and_plot(tiny_ref, tmp_path):
    tasks = write_tasks(tmp_path / "t.jsonl")
    png = tmp_path / "acc.png"
    code, out, err = invoke(
        "eval", tasks, "-m", tiny_ref, "--samplers", "greedy,temperature", "--max-tokens", "3", "--plot", png
    )
    assert code == 0, err
    assert "greedy" in out and "temperature" in out and "W/L/T" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "samplers, rows",
    [
        ("greedy", ["greedy 2/2 items"]),  # one run: its items are its answers
        ("greedy,temperature", ["temperature seed 0 2/2 items", "all runs 4/4 answers"]),
    ],
)
def test_eval_progress_counts_the_items_asked_for_per_sampler(tiny_ref, tmp_path, samplers, rows):
    tasks = write_tasks(tmp_path / "t.jsonl")
    code, _, err = invoke("eval", tasks, "-m", tiny_ref, "--samplers", samplers, "--max-tokens", "2", "--limit", "2")
    assert code == 0, err
    shown = [re.match(r"(.*?) +\S+ (\d+/\d+ \w+) ", line) for line in err.splitlines() if "ETA" in line]
    assert [" ".join(m.groups()) for m in shown] == rows, err


def test_eval_command_frontier_over_budgets_and_k(tiny_ref, tmp_path, monkeypatch):
    tasks = write_tasks(tmp_path / "t.jsonl")
    png, drawn = tmp_path / "frontier.png", {}
    real_plot = ev.plot

    def spy(results, path):
        drawn.update(results)
        real_plot(results, path)

    monkeypatch.setattr(ev, "plot", spy)
    args = ["--samplers", "greedy,self_consistency,cot_decoding", "--k", "2", "--max-tokens", "3,5", "--items", "1-3"]
    code, out, err = invoke("eval", tasks, "-m", tiny_ref, *args, "--plot", png, "--json")
    assert code == 0, err
    results = json.loads(out)
    assert results["items"] == 3 and results["item_range"] == "1-3" and results["max_tokens"] == [3, 5]
    rows = results["samplers"]
    for budget in (3, 5):
        assert {f"greedy@{budget}", f"cot_decoding@{budget}", f"cisc k=2@{budget}"} <= set(rows)
        assert rows[f"self_consistency k=2@{budget}"]["tokens_generated"] > rows[f"greedy@{budget}"]["tokens_generated"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and drawn["samplers"] == rows


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give a task file or --builtin"),
        (["--builtin", "--max-tokens", "512,x"], "--max-tokens"),
        (["--builtin", "--items", "9-3"], "--items"),
        (["--builtin", "--items", "500-600"], "the split has 195 items"),
        (["--open", "--samplers", "greedy,cisc"], "cisc is for task files"),
        (["--builtin", "TASKS"], "give a task file or --builtin"),
        (["--builtin", "--samplers", "greedy,nucleus"], "unknown nucleus"),
        (["--builtin", "--samplers", ","], "empty"),
        (["--builtin", "--plot", "out.jpg"], "ending in .png"),
        (["--builtin", "--samplers", "greedy", "--config", "reference"], "--config sets the entropix sampler"),
        (["--builtin", "--config", "no-such.toml"], "no-such.toml"),
        (["--builtin", "--max-tokens", "0"], "--max-tokens"),
        (["--builtin", "--batch-size", "0"], "--batch-size"),
        (["missing.jsonl"], "does not exist"),
    ],
)
def test_eval_command_errors_are_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "TASKS" in args:
        args = [a if a != "TASKS" else str(write_tasks(tmp_path / "t.jsonl")) for a in args]
    code, _, err = invoke("eval", *args)
    assert code == 2
    assert message in one_error_line(err)


def test_ctrl_c_says_how_to_resume(tiny_ref, tmp_path, monkeypatch):
    tasks = write_tasks(tmp_path / "t.jsonl")
    real = ev.run_eval

    def interrupted(*args, **kwargs):
        kwargs["on_record"] = lambda record: (_ for _ in ()).throw(KeyboardInterrupt())
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "run_eval", interrupted)
    code, _, err = invoke(
        "eval", tasks, "-m", tiny_ref, "--samplers", "greedy", "--max-tokens", "2", "--out", tmp_path / "o"
    )
    assert code == 130
    assert "run the same command again to continue" in err
    assert len(read_items(tmp_path / "o")) == 1


@pytest.mark.slow
def test_builtin_eval_on_the_bundled_model(tmp_path):
    code, out, err = invoke(
        "eval",
        "--builtin",
        "--split",
        "dev",
        "--samplers",
        "greedy,entropix",
        "--limit",
        "2",
        "--max-tokens",
        "4",
        "--json",
        "--out",
        tmp_path / "o",
    )
    assert code == 0, err
    results = json.loads(out)
    assert results["model"] == "smollm2-135m" and results["items"] == 2
    greedy = read_items(tmp_path / "o")[("greedy", 0, 0)]
    assert greedy["question"] == "What is 2 + 3?" and greedy["tokens"] >= 1
    shares = results["samplers"]["entropix"]["strategy_share"]
    assert shares and abs(sum(shares.values()) - 1) < 1e-9


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, _, err = invoke("eval", "--builtin", "--plot", "acc.png")
    assert code == 2
    assert "pip install 'entropix-mlx[plot]'" in one_error_line(err)


def test_a_config_files_deliberate_table_sets_deliberate(tiny_ref, tmp_path):
    tasks = write_tasks(tmp_path / "t.jsonl")
    config = tmp_path / "c.toml"
    config.write_text('[deliberate]\nbranch_gate = "attention"\nmax_branch_points = 1\n')
    code, _, err = invoke(
        "eval", tasks, "-m", tiny_ref, "--samplers", "greedy,deliberate", "--max-tokens", "2",
        "--config", config, "--out", tmp_path / "o",
    )  # fmt: skip
    assert code == 0, err
    settings = json.loads((tmp_path / "o" / "config.json").read_text())["samplers"]["deliberate"]
    assert settings["branch_gate"] == "attention" and settings["max_branch_points"] == 1
    # without such a table, --config is Entropix's alone
    config.write_text("[sampler]\nargmax_margin = 2.0\n")
    code, _, err = invoke("eval", tasks, "-m", tiny_ref, "--samplers", "greedy,deliberate", "--config", config)
    assert code == 2 and "--config sets the entropix sampler" in one_error_line(err)


def test_a_folder_resumes_when_only_settings_added_since_are_new_at_their_defaults(tmp_path):
    from entropix_mlx.eval.store import ResultStore, settings_changed
    from entropix_mlx.sampling.config import SamplerConfig
    from entropix_mlx.sampling.deliberate_config import DeliberateConfig

    now = DeliberateConfig(selector="continuation_margin").to_dict()
    before = {k: v for k, v in now.items() if k not in ("stop_share", "vote_temperature", "group_tokens")}
    assert not settings_changed(before, now)  # written before those settings existed
    assert settings_changed(before, {**now, "stop_share": 1.0})  # a new setting away from its default
    assert settings_changed({**before, "margin": 0.3}, now)  # an old setting changed
    assert settings_changed({**before, "gone": 1}, now)  # a setting the code no longer has
    entropix = SamplerConfig().to_dict()
    earlier = {("repetition_penalty" if k == "repetition_bits" else k): v for k, v in entropix.items()}
    assert not settings_changed(earlier, entropix)  # a folder written before a setting was renamed
    assert settings_changed({**earlier, "repetition_penalty": 0.0}, entropix)
    identity = {"model": "m", "samplers": {"deliberate": before}}
    ResultStore(tmp_path / "run", identity)
    ResultStore(tmp_path / "run", {**identity, "samplers": {"deliberate": now}})  # resumes
    with pytest.raises(ConfigError, match="settings of sampler 'deliberate' changed"):
        ResultStore(tmp_path / "run", {**identity, "samplers": {"deliberate": {**now, "stop_share": 1.0}}})
