"""The built-in tasks: the generator is deterministic and up to date, every
arithmetic answer is right (re-derived here from the question text, not from the
generator's own arithmetic), the dev/test split is stratified; task files'
`split` and `category` fields and `eval --split`."""

import json
import re
from collections import Counter
from fractions import Fraction

import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer, shelve
from test_cli_run import invoke, one_error_line

from entropix_mlx import eval as ev
from entropix_mlx.data import make_builtin
from entropix_mlx.errors import ConfigError

ITEMS = make_builtin.generate()
TASKS = ev.load_tasks(ev.builtin_tasks_path())


def test_the_shipped_file_is_what_the_generator_writes():
    assert ev.builtin_tasks_path().read_text(encoding="utf-8") == make_builtin.render(ITEMS)
    assert make_builtin.main(["--check"]) == 0


def test_the_generator_is_deterministic_and_its_seed_matters():
    assert make_builtin.generate() == ITEMS
    other = make_builtin.generate(seed=make_builtin.SEED + 1)
    assert [i["question"] for i in other] != [i["question"] for i in ITEMS]


def test_check_reports_a_stale_file(tmp_path):
    stale = tmp_path / "tasks.jsonl"
    stale.write_text(make_builtin.render(ITEMS[:-1]))
    assert make_builtin.main(["--check", "--out", str(stale)]) == 1


def test_size_categories_and_the_original_items():
    assert len(TASKS) >= 300
    assert len({t.question for t in TASKS}) == len(TASKS), "a question appears twice"
    counts = Counter(t.category for t in TASKS)
    assert set(counts) == set(make_builtin.CATEGORIES)
    assert min(counts.values()) >= 20
    # the 40 original built-in items come first, unchanged
    assert [t.question for t in TASKS[:40]] == [item["question"] for _, item in make_builtin.ORIGINAL]
    assert TASKS[13].question == "Which number is larger, 9.9 or 9.11?" and TASKS[13].expected == "9.9"


def test_the_split_is_about_half_and_stratified_by_category():
    for category in make_builtin.CATEGORIES:
        splits = Counter(t.split for t in TASKS if t.category == category)
        assert abs(splits["dev"] - splits["test"]) <= 1, (category, splits)
    assert {t.split for t in TASKS} == {"dev", "test"}


# -- re-deriving answers from the question text -----------------------------------

_NUM = r"-?\d[\d,]*(?:\.\d+)?"
_OPS = {"+": 1, "plus": 1, "-": -1, "minus": -1}


def _value(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def derive_arithmetic(question: str) -> Fraction:
    """The value of 'What is A op B (op C)?' with +, -, plus, minus, times,
    divided by, or 'half of N'."""
    body = re.fullmatch(r"What is (.+)\?", question).group(1)
    if m := re.fullmatch(rf"half of ({_NUM})", body):
        return _value(m.group(1)) / 2
    if m := re.fullmatch(rf"({_NUM}) times ({_NUM})", body):
        return _value(m.group(1)) * _value(m.group(2))
    if m := re.fullmatch(rf"({_NUM}) divided by ({_NUM})", body):
        return _value(m.group(1)) / _value(m.group(2))
    tokens = re.findall(rf"{_NUM}|\+|(?<= )-(?= )|plus|minus", body)
    assert " ".join(tokens) == body, f"cannot parse {question!r}"
    total = _value(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2], strict=False):
        total += _OPS[op] * _value(operand)
    return total


def derive_decimal(question: str) -> Fraction:
    m = re.fullmatch(rf"Which number is (larger|smaller), ({_NUM}) or ({_NUM})\?", question)
    a, b = _value(m.group(2)), _value(m.group(3))
    assert a != b
    return max(a, b) if m.group(1) == "larger" else min(a, b)


UNIT_FACTORS = {
    "centimeters/meter": 100,
    "millimeters/centimeter": 10,
    "meters/kilometer": 1000,
    "grams/kilogram": 1000,
    "milliliters/liter": 1000,
    "minutes/hour": 60,
    "seconds/minute": 60,
    "hours/day": 24,
    "days/week": 7,
    "months/year": 12,
    "cents/dollar": 100,
    "inches/foot": 12,
}
SINGULAR = {
    "meters": "meter",
    "centimeters": "centimeter",
    "kilometers": "kilometer",
    "kilograms": "kilogram",
    "liters": "liter",
    "hours": "hour",
    "minutes": "minute",
    "days": "day",
    "weeks": "week",
    "years": "year",
    "dollars": "dollar",
    "feet": "foot",
}


def derive_units(question: str) -> Fraction:
    m = re.fullmatch(r"How many (\w+) are in (an?|\d+) (\w+)\?", question)
    small, count, large = m.groups()
    factor = UNIT_FACTORS[f"{small}/{SINGULAR.get(large, large)}"]
    return Fraction(factor * (1 if count in ("a", "an") else int(count)))


def derive_word_problem(question: str) -> Fraction:
    """One-step word problems: the operation follows from the wording."""
    a, b = (_value(n) for n in re.findall(r"\d+", question.replace("$", ""))[:2])
    if "equally among" in question:
        return a / b
    if "more" in question:
        return a + b
    if "left" in question:
        return a - b
    if "each" in question or "cost" in question:
        return a * b
    raise AssertionError(f"unknown word problem {question!r}")


DERIVE = {
    "addition": derive_arithmetic,
    "subtraction": derive_arithmetic,
    "negatives": derive_arithmetic,
    "two_step": derive_arithmetic,
    "multiplication": derive_arithmetic,
}


@pytest.mark.parametrize("task", [t for t in TASKS if t.category != "facts"], ids=lambda t: t.question[:40])
def test_every_arithmetic_answer_is_right(task):
    if task.category == "decimals":
        expected = (
            derive_arithmetic(task.question) if task.question.startswith("What is") else derive_decimal(task.question)
        )
    elif task.category == "units":
        expected = derive_units(task.question)
    elif task.category == "word_problems":
        expected = derive_word_problem(task.question)
    else:
        expected = DERIVE[task.category](task.question)
    assert ev.parse_number(task.expected) == expected
    assert ev.score(f"The answer is {task.expected}.", task)[1]


def test_categories_hold_what_their_names_say():
    by = {c: [t for t in TASKS if t.category == c] for c in make_builtin.CATEGORIES}
    assert sum(ev.parse_number(t.expected) < 0 for t in by["negatives"]) >= 0.7 * len(by["negatives"])
    assert all(len(re.findall(r" [-+] ", t.question)) == 2 for t in by["two_step"])
    traps = [
        t
        for t in by["decimals"]
        if "larger" in t.question
        and len(t.expected.split(".")[-1]) < max(len(n.split(".")[-1]) for n in re.findall(_NUM, t.question))
    ]
    assert len(traps) >= 8, "the 9.9-vs-9.11 trap: the shorter decimal is the larger"
    assert all(t.kind == "number" for c in make_builtin.CATEGORIES if c != "facts" for t in by[c])


def test_the_builtin_answers_are_graded_correct_and_wrong_answers_are_not():
    for t in TASKS:
        perfect = {
            "number": f"The answer is {t.expected}.",
            "text": t.expected,
            "choice": f"The answer is {t.expected}.",
        }[t.kind]
        assert ev.score(perfect, t)[1], t
        assert not ev.score("I do not know.", t)[1], t


# -- split and category fields in task files ---------------------------------------


def write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_split_filtering_keeps_file_positions(tmp_path):
    path = write(
        tmp_path / "t.jsonl",
        [
            {"question": "a", "answer": "1", "split": "dev"},
            {"question": "b", "answer": "2"},  # no split: test
            {"question": "c", "answer": "3", "split": "test", "category": "x"},
            {"question": "d", "answer": "4", "split": "dev"},
        ],
    )
    tasks = ev.load_tasks(path)
    assert [t.index for t in ev.select_split(tasks, "dev")] == [0, 3]
    assert [t.index for t in ev.select_split(tasks, "test")] == [1, 2]
    assert [t.index for t in ev.select_split(tasks, "all")] == [0, 1, 2, 3]
    assert tasks[2].category == "x" and tasks[0].category is None
    with pytest.raises(ConfigError, match="give dev, test or all"):
        ev.select_split(tasks, "train")


@pytest.mark.parametrize(
    "line, message",
    [
        ({"question": "q", "answer": "1", "split": "train"}, '"split" must be "dev" or "test"'),
        ({"question": "q", "answer": "1", "split": "DEV"}, '"split" must be "dev" or "test"'),
        ({"question": "q", "answer": "1", "split": None}, '"split" must be "dev" or "test"'),
        ({"question": "q", "answer": "1", "category": 3}, '"category" must be a non-empty string'),
        ({"question": "q", "answer": "1", "category": " "}, '"category" must be a non-empty string'),
    ],
)
def test_bad_split_or_category_is_one_line(tmp_path, line, message):
    path = write(tmp_path / "t.jsonl", [{"question": "ok", "answer": "1"}, line])
    with pytest.raises(ConfigError, match=message) as e:
        ev.load_tasks(path)
    assert "t.jsonl line 2" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split", "train"], "--split 'train': give dev, test or all"),
        (["BAD"], '"split" must be "dev" or "test"'),
        (["DEVONLY"], "has no test items; try --split all"),
    ],
)
def test_split_errors_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1", "split": "training"}])
    write(tmp_path / "devonly.jsonl", [{"question": "q", "answer": "1", "split": "dev"}])
    args = [{"BAD": "bad.jsonl", "DEVONLY": "devonly.jsonl"}.get(a, a) for a in args]
    if args[0] == "--split":
        args = ["--builtin", *args]
    code, _, err = invoke("eval", *args)
    assert code == 2
    assert message in one_error_line(err)


@pytest.fixture
def tiny_ref(tmp_path, monkeypatch):
    """A --model reference the CLI resolves to a tiny model with room for chat prompts."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    model, tokenizer = make_tiny_model(tie_word_embeddings=False), make_tiny_tokenizer()
    return shelve(monkeypatch, path, make_loaded(model, tokenizer, path))


def test_accuracy_by_category():
    tasks = [
        ev.Task(0, "a", ["1"], category="x"),
        ev.Task(1, "b", ["1"], category="y"),
        ev.Task(2, "c", ["1"], category="x"),
        ev.Task(3, "d", ["1"]),
    ]
    config = ev.EvalConfig(samplers=["greedy", "temperature"], seeds=2)
    records = {}
    for name, seed, correct in [
        ("greedy", 0, [1, 0, 0, 1]),
        ("temperature", 0, [1, 1, 1, 0]),
        ("temperature", 1, [0, 1, 1, 0]),
    ]:
        for i, c in enumerate(correct):
            records[(name, seed, i)] = {
                "sampler": name,
                "seed": seed,
                "index": i,
                "correct": bool(c),
                "tokens": 1,
                "seconds": 1.0,
                "strategies": {"s": 1},
                "thinking_insertions": 0,
            }
    s = ev.summarize(records, tasks, config)["samplers"]
    assert s["greedy"]["categories"] == {"x": {"n": 2, "accuracy": 0.5}, "y": {"n": 1, "accuracy": 0.0}}
    # per item, the share of correct runs: x items 0.5 and 1, y item 1; the uncategorized item counts nowhere
    assert s["temperature"]["categories"] == {"x": {"n": 2, "accuracy": 0.75}, "y": {"n": 1, "accuracy": 1.0}}


def test_eval_split_on_the_tiny_model(tiny_ref, tmp_path):
    path = write(
        tmp_path / "t.jsonl",
        [
            {"question": "What is 1 + 1?", "answer": "2", "split": "dev", "category": "sums"},
            {"question": "What is 2 + 2?", "answer": "4", "category": "sums"},
            {"question": "What is 3 + 3?", "answer": "6", "split": "dev", "category": "sums"},
        ],
    )
    code, out, err = invoke(
        "eval",
        path,
        "-m",
        tiny_ref,
        "--samplers",
        "greedy",
        "--max-tokens",
        "2",
        "--split",
        "dev",
        "--json",
        "--out",
        tmp_path / "o",
    )
    assert code == 0, err
    results = json.loads(out)
    assert results["split"] == "dev" and results["items"] == 2
    assert results["samplers"]["greedy"]["categories"]["sums"]["n"] == 2
    assert json.loads((tmp_path / "o" / "config.json").read_text())["split"] == "dev"
    saved = [json.loads(line) for line in (tmp_path / "o" / "items.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in saved) == [0, 2]
    # the same --out with another split is a different eval: refused, not mixed
    code, _, err = invoke(
        "eval", path, "-m", tiny_ref, "--samplers", "greedy", "--max-tokens", "2", "--out", tmp_path / "o"
    )
    assert code == 2 and "split changed" in err
    # the default is test; the table names the split
    code, out, err = invoke("eval", path, "-m", tiny_ref, "--samplers", "greedy", "--max-tokens", "2")
    assert code == 0, err
    assert "test split" in out and "1 items" in out and "greedy by category: sums" in out
