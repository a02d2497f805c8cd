"""`eval --open` (open-text metrics on hand-written token sequences, the runner with
scripted samplers whose outputs are known, the command on the tiny model) and
`eval --cot` (chain-of-thought answer extraction and prompts)."""

import itertools
import json
import random

import mlx.core as mx
import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer, shelve
from entropix_mlx.cli import eval as eval_cmd
from test_cli_run import invoke, one_error_line

from entropix_mlx import eval as ev
from entropix_mlx.decode.engine import generate_batch
from entropix_mlx.decode.rows import Request
from entropix_mlx.errors import ConfigError
from entropix_mlx.front.registry import build
from entropix_mlx.sampling.samplers import TokenChoice

# -- metrics of one output ----------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, share",
    [
        ([1, 2, 3, 4, 1, 2, 3, 4], 1 / 5),  # 5 4-grams; the last repeats the first
        ([1, 1, 1, 1, 1, 1], 2 / 3),  # (1,1,1,1) three times: two repeats
        ([1, 2, 3, 4, 5, 6], 0.0),
        ([1, 2, 3, 4], 0.0),  # one 4-gram, nothing before it
        ([1, 2, 3], None),  # no 4-gram at all
        ([], None),
        ([7, 8, 9, 7, 8, 9, 7, 8, 9], 3 / 6),  # period 3: every 4-gram after the third repeats
    ],
)
def test_repeated_4gram_share(tokens, share):
    got = ev.repeated_ngram_share(tokens, 4)
    assert got == (pytest.approx(share) if share is not None else None)


@pytest.mark.parametrize(
    "tokens, value",
    [
        ([1, 2, 1, 2], 2 / 3),  # bigrams (1,2) (2,1) (1,2)
        ([1, 2, 3], 1.0),
        ([4, 4, 4, 4], 1 / 3),
        ([5], None),
    ],
)
def test_distinct_2(tokens, value):
    got = ev.distinct_n(tokens, 2)
    assert got == (pytest.approx(value) if value is not None else None)


LOOPS = [
    ([], 0),
    ([1], 0),
    ([1, 2, 3, 4], 0),
    ([1, 1], 2),  # one token twice
    ([1, 2, 3, 1, 2, 3], 6),  # "a b c a b c": the example
    ([1, 2, 3, 1, 2], 0),  # a partial second copy is no loop
    ([1, 2, 3, 1, 2, 3, 1], 6),  # whole copies only
    ([9, 1, 1, 1, 1], 4),
    ([1, 2, 1, 2, 1], 4),
    ([1, 2, 3] * 3, 9),
    ([5, 1, 2, 1, 2, 7, 7], 4),  # the longest of two loops
    (list(range(7)) * 2, 14),
    ([0, 1, 2, 3, 4, 5] + [8, 9] * 6 + [3], 12),  # a 12-token loop after 6 fresh tokens
]


@pytest.mark.parametrize("tokens, length", LOOPS)
def test_longest_loop(tokens, length):
    assert ev.longest_loop(tokens) == length


def naive_longest_loop(tokens):
    """Every start, unit length and number of whole copies, by brute force."""
    best = 0
    for i, p in itertools.product(range(len(tokens)), range(1, len(tokens) + 1)):
        unit, copies = tokens[i : i + p], 1
        while tokens[i + copies * p : i + (copies + 1) * p] == unit:
            copies += 1
        if copies >= 2:
            best = max(best, copies * p)
    return best


def test_longest_loop_matches_brute_force_on_random_sequences():
    rng = random.Random(7)
    for _ in range(400):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(0, 24))]
        assert ev.longest_loop(tokens) == naive_longest_loop(tokens), tokens


@pytest.mark.parametrize(
    "n, finish, early",
    [
        (0, "eos", True),
        (5, "eos", True),
        (15, "eos", True),
        (16, "eos", False),
        (5, "length", False),  # cut by --max-tokens, not ended by the model
    ],
)
def test_early_endings(n, finish, early):
    m = ev.text_metrics(list(range(n)), [-1.0] * n, finish)
    assert m["early_end"] is early
    assert m["mean_logprob"] == (-1.0 if n else None)


# -- log-probabilities under the model ------------------------------------------------


def test_sequence_logprobs_equal_what_the_sampler_saw():
    """Teacher forcing over prompt + output gives, token for token, the log p the
    sampler read from the model while generating: for greedy and for sampled text
    (samplers report the unmodified model's log p, whatever their temperature)."""
    model, tokenizer = make_tiny_model(), make_tiny_tokenizer()
    prompt = tokenizer.encode("Once upon a time")
    for name in ("greedy", "temperature"):
        [(_, result, _)] = list(
            generate_batch(
                model,
                tokenizer,
                [Request(prompt, seed=3, max_tokens=12)],
                lambda: build(name, tokenizer=tokenizer, metrics=False),
            )
        )
        assert len(result.tokens) >= 2
        rescored = ev.sequence_logprobs(model, prompt, result.tokens)
        assert rescored == pytest.approx(result.logprobs, abs=2e-4)
    assert ev.sequence_logprobs(model, prompt, []) == []


def test_sequence_logprobs_by_hand():
    model = make_tiny_model()
    prompt, output = [5, 6, 7], [8, 9]
    logits, _ = model(mx.array([[5, 6, 7, 8]]))
    logp = logits[0] - mx.logsumexp(logits[0], axis=-1, keepdims=True)
    expected = [logp[2, 8].item(), logp[3, 9].item()]
    assert ev.sequence_logprobs(model, prompt, output) == pytest.approx(expected, abs=1e-5)


# -- the runner, with scripted samplers -------------------------------------------------


class Scripted:
    """Writes a fixed text, then ends the turn."""

    def __init__(self, tokens, eos):
        self.name, self.script, self.eos = "scripted", tokens, eos

    def reset(self):
        self.pos = 0

    def choose(self, step, key):
        token = self.script[self.pos] if self.pos < len(self.script) else self.eos
        self.pos += 1
        return TokenChoice([token], "script", [0.0])


@pytest.fixture
def tiny():
    return make_tiny_model(tie_word_embeddings=False), make_tiny_tokenizer()


def test_open_runner_measures_known_outputs(tiny, tmp_path):
    model, tokenizer = tiny
    eos = sorted(tokenizer.eos_token_ids)[0]
    loop = tokenizer.encode("ab" * 20)  # 40 tokens of "abab..."
    varied = tokenizer.encode("The quick brown fox jumps over a lazy dog")
    short = tokenizer.encode("Hi.")
    scripts = {"greedy": loop, "temperature": varied, "min_p": short}
    prompts = [ev.OpenPrompt(i, t) for i, t in enumerate(["Write a poem.", "Tell a story.", "Explain rain."])]
    config = ev.OpenConfig(
        samplers=["greedy", "temperature", "min_p"], seeds=2, max_tokens=30, batch_size=2, model_name="tiny"
    )
    results = ev.run_open(
        model,
        tokenizer,
        prompts,
        config,
        out_dir=tmp_path / "o",
        make_sampler=lambda name: Scripted(scripts[name], eos),
    )
    s = results["samplers"]
    g = s["greedy"]
    # 30 tokens of "abab...": 27 4-grams, all but the first two repeat; one 30-token loop (15 copies of "ab")
    assert g["repeated_4gram_share"] == pytest.approx(25 / 27)
    assert g["longest_loop_max"] == 30 and g["loops_at_least_alert"] == 3
    assert g["distinct_2"] == pytest.approx(2 / 29) and g["early_endings"] == 0 and g["mean_tokens"] == 30
    assert g["mean_logprob"] < 0  # rescored under the model, not the script's 0.0
    t = s["temperature"]
    assert t["outputs"] == 6 and t["longest_loop_max"] < ev.LOOP_ALERT and t["early_endings"] == 0
    assert t["repeated_4gram_share"] == 0 and t["vs_greedy"] == {
        "wins": 3,
        "losses": 0,
        "ties": 0,
        "p_value": ev.sign_test(3, 0),
    }
    m = s["min_p"]
    # 3 tokens: no 4-gram, so no share to compare with greedy's
    assert m["early_endings"] == 6 and m["repeated_4gram_share"] is None and m["mean_tokens"] == 3
    assert m["vs_greedy"]["ties"] == m["vs_greedy"]["wins"] == m["vs_greedy"]["losses"] == 0
    saved = [json.loads(line) for line in (tmp_path / "o" / "items.jsonl").read_text().splitlines()]
    assert len(saved) == 3 * (1 + 2 + 2)
    first = next(r for r in saved if r["sampler"] == "greedy" and r["index"] == 1)
    assert first["output"] == "ab" * 15 and first["question"] == "Tell a story." and first["finish_reason"] == "length"
    assert first["token_ids"] == loop[:30] and first["longest_loop"] == 30
    assert json.loads((tmp_path / "o" / "results.json").read_text())["mode"] == "open"
    # the same directory resumes without running anything; an accuracy eval there is refused
    again = []
    ev.run_open(
        model,
        tokenizer,
        prompts,
        config,
        out_dir=tmp_path / "o",
        on_record=again.append,
        make_sampler=lambda name: Scripted(scripts[name], eos),
    )
    assert again == []
    with pytest.raises(ConfigError, match="different eval"):
        ev.run_eval(
            model, tokenizer, [ev.Task(0, "q", ["1"])], ev.EvalConfig(samplers=["greedy"]), out_dir=tmp_path / "o"
        )
    assert "rep-4 %" in ev.open_table_rows(results)[0]


def test_open_table_rows():
    results = {
        "loop_alert": 12,
        "early_tokens": 16,
        "samplers": {
            "greedy": {
                "seeds": 1,
                "outputs": 4,
                "repeated_4gram_share": 0.25,
                "repeated_4gram_share_std": 0.0,
                "distinct_2": 0.5,
                "longest_loop_max": 14,
                "longest_loop_mean": 7.25,
                "loops_at_least_alert": 1,
                "mean_logprob": -1.5,
                "early_endings": 0,
                "mean_tokens": 64.0,
            },
            "min_p": {
                "seeds": 2,
                "outputs": 8,
                "repeated_4gram_share": None,
                "repeated_4gram_share_std": 0.0,
                "distinct_2": None,
                "longest_loop_max": 0,
                "longest_loop_mean": 0.0,
                "loops_at_least_alert": 0,
                "mean_logprob": None,
                "early_endings": 8,
                "mean_tokens": 0.0,
                "vs_greedy": {"wins": 3, "losses": 1, "ties": 0, "p_value": 0.625},
            },
        },
    }
    greedy, min_p = ev.open_table_rows(results)
    assert greedy["rep-4 %"] == "25.0" and greedy["loop max/mean"] == "14 / 7.2" and greedy["loops >= 12"] == "1/4"
    assert greedy["W/L/T rep-4 vs greedy"] == ""
    assert min_p["rep-4 %"] == "n/a" and min_p["early (< 16)"] == "8/8" and min_p["p"] == "0.625"


# -- prompt files and the command -----------------------------------------------------


def test_builtin_prompts():
    prompts = ev.load_prompts(ev.builtin_prompts_path())
    assert len(prompts) >= 20 and [p.index for p in prompts] == list(range(len(prompts)))
    assert not any(p.question.startswith("#") for p in prompts)
    assert eval_cmd.DEFAULT_OPEN_TOKENS == ev.DEFAULT_OPEN_TOKENS


def test_prompt_file_lines(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("# a comment\n\nWrite a haiku.\n  Two lines:\\nthen this  \n")
    assert [p.question for p in ev.load_prompts(path)] == ["Write a haiku.", "Two lines:\nthen this"]
    path.write_text("# only a comment\n\n")
    with pytest.raises(ConfigError, match="has no prompts"):
        ev.load_prompts(path)
    path.write_bytes(b"\xff\xfe bad")
    with pytest.raises(ConfigError, match="not UTF-8"):
        ev.load_prompts(path)


@pytest.fixture
def tiny_ref(tmp_path, monkeypatch, tiny):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    return shelve(monkeypatch, path, make_loaded(*tiny, path))


def test_open_command_end_to_end(tiny_ref, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Write a haiku about the sea.\nExplain rain.\nList three fruits.\n")
    png = tmp_path / "open.png"
    code, out, err = invoke(
        "eval",
        "--open",
        prompts,
        "-m",
        tiny_ref,
        "--samplers",
        "greedy,min_p",
        "--seeds",
        "2",
        "--max-tokens",
        "20",
        "--json",
        "--out",
        tmp_path / "o",
        "--plot",
        png,
    )
    assert code == 0, err
    results = json.loads(out)
    assert results["mode"] == "open" and results["items"] == 3 and results["max_tokens"] == 20
    assert results["prompts"] == "prompts.txt"
    greedy, min_p = results["samplers"]["greedy"], results["samplers"]["min_p"]
    assert greedy["outputs"] == 3 and min_p["outputs"] == 6 and min_p["seeds"] == 2
    assert 0 < greedy["mean_tokens"] <= 20 and greedy["mean_logprob"] < 0
    assert set(min_p["vs_greedy"]) == {"wins", "losses", "ties", "p_value"}
    assert len((tmp_path / "o" / "items.jsonl").read_text().splitlines()) == 9
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the table, on the built-in prompts (64 tokens by default: here only 2 prompts, 4 tokens)
    code, out, err = invoke(
        "eval", "--open", "-m", tiny_ref, "--samplers", "greedy", "--limit", "2", "--max-tokens", "4"
    )
    assert code == 0, err
    assert "builtin prompts" in out and "rep-4" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--open", "--cot"], "--cot is for task files"),
        (["--open", "--split", "dev"], "--open prompts have no split"),
        (["--open", "--builtin", "p.txt"], "give a prompt file or --builtin"),
        (["--open", "missing.txt"], "prompt file missing.txt does not exist"),
        (["--open", "--samplers", "greedy,bogus"], "unknown bogus"),
    ],
)
def test_open_command_errors_are_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("Write.\n")
    code, _, err = invoke("eval", *args)
    assert code == 2
    assert message in one_error_line(err)


# -- chain of thought --------------------------------------------------------------------

GSM = ev.Task(0, "Janet's ducks lay 16 eggs ...", ["18"])
COT = [
    ("16 - 3 - 4 = 9 eggs are left.\n9 * 2 = 18 dollars.\nAnswer: 18", "18", True),
    ("16 - 3 - 4 = 9.\n9 * 2 = 18\nAnswer: $18.", "18", True),
    ("Step 1: 16 - 7 = 9\nThe answer is: 18\n", "18", True),
    ("Answer: 9\nHmm, 9 * 2 = 18, so that was wrong.", "9", False),  # the last line with "Answer:" counts
    ("16 - 3 - 4 = 9\n9 * 2 = 18", "18", True),  # no Answer line: the last line
    ("She sells 9 eggs for 2 dollars each, 18 in all.\nAnswer: see above", "18", True),  # no number there: last number
    ("She makes 18 dollars.\nThen 4 more", "4", False),  # last line, as documented
    ("", None, False),
    # What models write (the equal-cost evaluation issue's cases): the first number
    # after the last answer mark, \\boxed{} before anything, no "####" rule, LaTeX commas.
    ("9 * 2 = 18\nAnswer: 18 (after 3 days)", "18", True),
    ("Answer: 18 eggs/day \u00d7 7 days", "18", True),
    ("#### Step 3: add them up\n9 + 9 = 18\n\\boxed{18}", "18", True),
    ("So she makes $\\boxed{18}$ dollars.\nThat is 2 dollars for each of 9 eggs.", "18", True),
    ("\\boxed{12} is wrong; the total is \\boxed{18}.", "18", True),
    ("The total is 1{,}250 dollars.\nAnswer: 1{,}250", "1250", False),
    ("Answer: \\frac{3}{4}", "0.75", False),
]


@pytest.mark.parametrize("output, extracted, correct", COT)
def test_cot_number_answers(output, extracted, correct):
    assert ev.score(output, GSM, cot=True) == (extracted, correct)


def test_cot_text_and_choice_answers_come_from_the_answer_line():
    capital = ev.Task(0, "Capital of France?", ["Paris"])
    output = "Let me think about French cities.\nThe capital is the largest city.\nAnswer: Paris"
    assert ev.score(output, capital, cot=True)[1] and not ev.score(output, capital)[1]
    fruit = ev.parse_task({"question": "Which is a fruit?", "choices": ["carrot", "apple"], "answer": "B"}, 0, "x")
    assert ev.score("A carrot is a root.\nAn apple grows on trees.\nAnswer: B", fruit, cot=True) == ("B", True)
    assert ev.cot_answer_line("x\nThe final answer is: 42\n\n") == "42"
    assert ev.cot_answer_line("first\nlast line  \n") == "last line"


def test_cot_prompts():
    number = ev.Task(0, "What is 2 + 2?", ["4"])
    assert "step by step" in number.prompt_text(cot=True) and '"Answer: <number>"' in number.prompt_text(cot=True)
    assert number.prompt_text() == "What is 2 + 2?\nAnswer with the number only."
    own = ev.Task(0, "q", ["4"], prompt="Q: {question}")
    assert own.prompt_text(cot=True) == "Q: q"  # an item's own template wins


def test_cot_command_on_a_tiny_gsm8k_file(tiny_ref, tmp_path):
    gsm = tmp_path / "gsm8k_tiny.jsonl"
    gsm.write_text(
        "".join(
            json.dumps(line) + "\n"
            for line in [
                {
                    "question": "Tom has 3 apples and buys 4 more. How many apples?",
                    "answer": "3 + 4 = <<3+4=7>>7\n#### 7",
                },
                {
                    "question": "A box has 12 eggs and 5 break. How many are left?",
                    "answer": "12 - 5 = <<12-5=7>>7\n#### 7",
                },
            ]
        )
    )
    code, out, err = invoke(
        "eval", gsm, "--cot", "-m", tiny_ref, "--samplers", "greedy", "--limit", "1", "--json", "--out", tmp_path / "o"
    )
    assert code == 0, err
    results = json.loads(out)
    record = json.loads((tmp_path / "o" / "items.jsonl").read_text().splitlines()[0])
    # the default room to reason (768 tokens) shrinks to what the tiny model's context leaves
    assert results["cot"] is True and results["max_tokens"] == 512 - record["prompt_tokens"] and results["items"] == 1
    assert record["expected"] == "7"
    assert record["extracted"] == ev.score(record["output"], ev.Task(0, "q", ["7"]), cot=True)[0]
    assert json.loads((tmp_path / "o" / "config.json").read_text())["cot"] is True
    # the same directory without --cot: other prompts, refused rather than mixed
    code, _, err = invoke(
        "eval",
        gsm,
        "-m",
        tiny_ref,
        "--samplers",
        "greedy",
        "--limit",
        "1",
        "--max-tokens",
        str(results["max_tokens"]),
        "--out",
        tmp_path / "o",
    )
    assert code == 2 and "other questions or prompts" in err
    # and a directory written without --cot is refused to --cot
    code, _, err = invoke(
        "eval",
        gsm,
        "-m",
        tiny_ref,
        "--samplers",
        "greedy",
        "--limit",
        "1",
        "--max-tokens",
        "3",
        "--out",
        tmp_path / "plain",
    )
    assert code == 0, err
    code, _, err = invoke(
        "eval",
        gsm,
        "--cot",
        "-m",
        tiny_ref,
        "--samplers",
        "greedy",
        "--limit",
        "1",
        "--max-tokens",
        "3",
        "--out",
        tmp_path / "plain",
    )
    assert code == 2 and "cot changed" in err
