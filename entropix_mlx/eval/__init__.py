"""`entropix-mlx eval`: how often each sampler answers a task file correctly.

Task file: JSON Lines, one object per item:

    {"question": "What is 7 + 5?", "answer": "12"}
    {"question": "...", "answer": "Tom has ... #### 42"}            GSM8K: the part after ####
    {"question": "Which is a fruit?", "choices": ["carrot", "apple"], "answer": "B"}
    {"question": "...", "answer": ["carbon dioxide", "CO2"]}         any of several answers
    {"question": "...", "answer": "Paris", "prompt": "Q: {question}\\nA:"}

An item is a *number* item when its answer parses as a number, a *choice* item
when it has `choices` (the answer is a letter or one choice's text), otherwise
a *text* item. Answer extraction (`score`), applied to the generated text:

- number: the number after the last "####" if there is one; else the first
  number after the last "answer is" / "answer:"; else the LAST number in the
  output (the GSM8K convention). Numbers may carry a sign (-3, +3, −3), a
  currency sign, thousands commas (1,250) and decimals, or be a fraction (3/4);
  they are compared as exact fractions, so 9.90 equals 9.9 and 5.0 equals 5.
  Number words ("eight", "twenty-one") count only when the output has no digit
  at all, since words like "one" are often not numbers.
- choice: a letter given as "answer is B" / "answer: (B)", or at the very start
  ("B", "B.", "(B)", "B)"), or anywhere as "(B)" / "B)"; otherwise the choice
  whose text occurs earliest in the output (whole words, normalized).
- text: the first non-empty line of the output, normalized (lower case, no
  punctuation, no articles a/an/the, single spaces); correct when a normalized
  accepted answer occurs in it as whole words ("The capital of France is Paris."
  answers "Paris").

Statistics: accuracy with a 95% Wilson score interval; for stochastic samplers
the mean and standard deviation over --seeds runs; a paired comparison against
greedy on the same items: per item, the sampler's share of correct runs minus
greedy's (0 or 1); wins / losses / ties count items where it is above / below /
equal, and the p-value is the exact two-sided sign test on wins vs losses (with
one seed this is the exact McNemar test).

Runner: greedy runs once (it is deterministic) and always (it is the
baseline); other samplers run once per seed. Each item's random key comes from
the run seed and the item's position (`item_seed`), never from the batch it
lands in, so results do not depend on --batch-size. Every (sampler, seed, item)
result is appended to DIR/items.jsonl as soon as it completes, with the question
and a hash of its prompt; DIR/config.json records the model, max tokens, prompt
version and sampler settings. Rerunning the same command after an interruption
checks both, skips what is done and continues; a larger --limit adds items.
DIR/results.json holds the summary.
"""

import hashlib
import json
import math
import os
import platform
import re
import statistics
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from fractions import Fraction
from importlib import resources
from pathlib import Path

from .batch import Request, generate_batch
from .errors import ConfigError

PROMPT_VERSION = 1     # bump when the default prompts change: old results then do not resume
NUMBER_PROMPT = "{question}\nAnswer with the number only."
TEXT_PROMPT = "{question}\nAnswer in a few words."
CHOICE_PROMPT = "{question}\n{choices}\nAnswer with the letter of the correct choice."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
SPLITS = ("dev", "test")
SPLIT_CHOICES = ("dev", "test", "all")
Z95 = 1.959963984540054   # the 97.5% quantile of the standard normal distribution


# -- tasks ----------------------------------------------------------------------

@dataclass
class Task:
    index: int                    # position in the task file (0-based), the item's identity
    question: str
    answers: list[str]            # accepted answers; for choice items, the correct letter
    choices: list[str] | None = None
    prompt: str | None = None     # template override: {question}, {choices}
    split: str = "test"           # "dev" (tune on it) or "test" (report it); a file without splits is all test
    category: str | None = None   # e.g. "negatives", "facts": for per-category breakdowns

    @property
    def kind(self) -> str:
        if self.choices:
            return "choice"
        return "number" if parse_number(self.answers[0]) is not None else "text"

    @property
    def expected(self) -> str:
        return self.answers[0]

    def prompt_text(self) -> str:
        if self.prompt is not None:
            template = self.prompt
        else:
            template = {"number": NUMBER_PROMPT, "text": TEXT_PROMPT, "choice": CHOICE_PROMPT}[self.kind]
        choices = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(self.choices or []))
        return template.format(question=self.question, choices=choices)


def builtin_tasks_path() -> Path:
    return Path(str(resources.files("entropix_mlx").joinpath("data/builtin_tasks.jsonl")))


def _gsm8k(answer: str) -> str:
    """GSM8K answers end with '#### 42' after the worked solution."""
    return answer.rsplit("####", 1)[1].strip() if "####" in answer else answer.strip()


def parse_task(data, index: int, where: str) -> Task:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} is not a JSON object; each line needs {{\"question\": ..., \"answer\": ...}}")
    question, answer = data.get("question"), data.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ConfigError(f"{where} has no \"question\" text")
    raw = answer if isinstance(answer, list) else [answer]
    if not raw or any(isinstance(a, bool) or not isinstance(a, (str, int, float)) for a in raw):
        raise ConfigError(f"{where} needs an \"answer\": a string, a number, or a list of them")
    answers = [_gsm8k(str(a)) for a in raw]
    if not all(answers):
        raise ConfigError(f"{where} has an empty answer")
    choices = data.get("choices")
    if choices is not None:
        if (not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS)
                or not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices)):
            raise ConfigError(f"{where}: \"choices\" must be a list of 2 to {len(LETTERS)} strings")
        choices = [str(c) for c in choices]
        letters = {_choice_letter(a, choices) for a in answers} - {None}
        if len(letters) != 1:
            raise ConfigError(f"{where}: the answer {answer!r} is neither a choice letter "
                              f"(A-{LETTERS[len(choices) - 1]}) nor the text of one choice")
        answers = [letters.pop()]
    prompt = data.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ConfigError(f"{where}: \"prompt\" must be a template string with {{question}}")
        try:
            prompt.format(question="", choices="")
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"{where}: the prompt template is invalid ({type(e).__name__}: {e}); "
                              "it may use {question} and {choices}, and {{ }} for literal braces") from None
    split = data.get("split", "test")
    if split not in SPLITS:
        raise ConfigError(f"{where}: \"split\" must be \"dev\" or \"test\", got {split!r}")
    category = data.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise ConfigError(f"{where}: \"category\" must be a non-empty string")
    return Task(index, question, answers, choices, prompt, split, category)


def select_split(tasks: list[Task], split: str) -> list[Task]:
    """The items of one split ("dev" or "test"), or all of them ("all"). Items
    keep their index (file position), so results stay keyed the same way."""
    if split not in SPLIT_CHOICES:
        raise ConfigError(f"--split {split!r}: give dev, test or all")
    return list(tasks) if split == "all" else [t for t in tasks if t.split == split]


def load_tasks(path) -> list[Task]:
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"task file {path} {what}; give a JSON Lines file, or use --builtin")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"task file {path} is not UTF-8 text; give a JSON Lines file") from None
    tasks = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where} is not valid JSON ({e.msg} at column {e.colno})") from None
        tasks.append(parse_task(data, len(tasks), where))
    if not tasks:
        raise ConfigError(f"task file {path} has no items; each line needs {{\"question\": ..., \"answer\": ...}}")
    return tasks


# -- answer extraction ----------------------------------------------------------

_NUMBER = re.compile(
    r"(?<![\w.])([-+\u2212]?)[$€£]?"                     # sign, currency
    r"(\d+/\d+|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"  # fraction, 1,250.5, 42, .5
    r"(?![\d/]|\.\d)")
_WORDS = {w: i for i, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"])}
_TENS = {w: 10 * i for i, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], 2)}
_WORD_NUMBER = re.compile(
    rf"\b(?:({'|'.join(_TENS)})(?:[- ]({'|'.join(list(_WORDS)[1:10])}))?|({'|'.join(_WORDS)}))\b", re.IGNORECASE)
_ANSWER_MARK = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)


def parse_number(text: str) -> Fraction | None:
    """The value of a text that is one number (with sign, commas, decimals or a
    fraction), else None."""
    found = list(_numbers(text.strip()))
    if len(found) != 1 or found[0][1] != 0 or found[0][2] != len(text.strip()):
        return None
    return found[0][0]


def _numbers(text: str):
    """(value, start, end) of every number written with digits."""
    for m in _NUMBER.finditer(text):
        sign, digits = m.group(1), m.group(2).replace(",", "")
        if "/" in digits:
            num, den = digits.split("/")
            if int(den) == 0:
                continue
            value = Fraction(int(num), int(den))
        else:
            value = Fraction(digits)
        yield (-value if sign in ("-", "\u2212") else value), m.start(), m.end()


def _word_numbers(text: str):
    for m in _WORD_NUMBER.finditer(text):
        if m.group(3):
            value = _WORDS[m.group(3).lower()]
        else:
            value = _TENS[m.group(1).lower()] + (_WORDS[m.group(2).lower()] if m.group(2) else 0)
        yield Fraction(value), m.start(), m.end()


def extract_number(output: str) -> Fraction | None:
    found = list(_numbers(output))
    if not found and not re.search(r"\d", output):
        found = list(_word_numbers(output))
    if not found:
        return None
    if "####" in output:
        cut = output.rindex("####")
        after = [n for n in found if n[1] >= cut]
        if after:
            return after[0][0]
    marks = list(_ANSWER_MARK.finditer(output))
    if marks:
        after = [n for n in found if n[1] >= marks[-1].end()]
        if after:
            return after[0][0]
    return found[-1][0]


def normalize(text: str) -> str:
    """Lower case, punctuation to spaces, no articles, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(ch).startswith(("P", "S")) else ch for ch in text)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def _contains_words(haystack: str, needle: str) -> int:
    """Index (in words) where the words of `needle` occur in `haystack`, or -1."""
    h, n = haystack.split(), needle.split()
    if not n:
        return -1
    for i in range(len(h) - len(n) + 1):
        if h[i:i + len(n)] == n:
            return i
    return -1


def _choice_letter(answer: str, choices: list[str]) -> str | None:
    """The letter an expected answer names: a letter in range, or a choice's text."""
    a = answer.strip().strip(".()")
    if len(a) == 1 and a.upper() in LETTERS[:len(choices)]:
        return a.upper()
    matches = [LETTERS[i] for i, c in enumerate(choices) if normalize(c) == normalize(answer)]
    return matches[0] if len(matches) == 1 else None


def extract_choice(output: str, choices: list[str]) -> str | None:
    valid = LETTERS[:len(choices)]
    cls = f"[{valid}]"
    patterns = [
        rf"answer\s*(?:is|:)?\s*\(?({cls})\)?(?![\w])",     # "the answer is B", "Answer: (B)"
        rf"^\s*\(?({cls})(?:[.):]|\s*$)",                    # "B", "B.", "(B)", "B)" at the start
        rf"\(({cls})\)|(?<![\w])({cls})\)",                  # "(B)" or "B)" anywhere
    ]
    for flags, pattern in zip((re.IGNORECASE, 0, 0), patterns):
        for m in re.finditer(pattern, output, flags):
            letter = next(g for g in m.groups() if g).upper()
            if letter in valid:
                return letter
    text = normalize(output)
    found = [(_contains_words(text, normalize(c)), LETTERS[i]) for i, c in enumerate(choices)]
    found = [f for f in found if f[0] >= 0]
    return min(found)[1] if found else None


def first_line(output: str) -> str:
    for line in output.splitlines():
        line = re.sub(r"^\s*(?:final\s+)?answer\s*:\s*", "", line.strip(), flags=re.IGNORECASE)
        if line:
            return line
    return ""


def score(output: str, task: Task) -> tuple[str | None, bool]:
    """(what was extracted, as text; whether it is correct)."""
    kind = task.kind
    if kind == "number":
        value = extract_number(output)
        if value is None:
            return None, False
        expected = {parse_number(a) for a in task.answers} - {None}
        return _format_number(value), value in expected
    if kind == "choice":
        letter = extract_choice(output, task.choices)
        return letter, letter == task.expected
    line = normalize(first_line(output))
    return (line or None), any(_contains_words(line, normalize(a)) >= 0 for a in task.answers)


def _format_number(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    decimal = float(value)
    return repr(decimal) if Fraction(repr(decimal)) == value else f"{value.numerator}/{value.denominator}"


# -- statistics -----------------------------------------------------------------

def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (successes may be a mean, not an
    integer). n = 0 gives (0, 1): nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At p = 0 or 1 one end is exactly 0 or 1; say so rather than 1e-17 off.
    lo = 0.0 if successes <= 0 else max(0.0, center - half)
    hi = 1.0 if successes >= n else min(1.0, center + half)
    return lo, hi


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided binomial (sign / McNemar) test of wins vs losses under
    p = 1/2; ties do not count. Computed with integers, so it is exact."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, float(Fraction(2 * tail, 2 ** n)))


def paired_comparison(sampler: dict[int, float], greedy: dict[int, float]) -> dict:
    """Per item (index -> share of correct runs): wins, losses, ties, p-value."""
    items = sorted(set(sampler) & set(greedy))
    wins = sum(sampler[i] > greedy[i] for i in items)
    losses = sum(sampler[i] < greedy[i] for i in items)
    return {"wins": wins, "losses": losses, "ties": len(items) - wins - losses,
            "p_value": sign_test(wins, losses)}


# -- runner ---------------------------------------------------------------------

def item_seed(run_seed: int, index: int) -> int:
    """The seed of one item's answer: fixed by the run's seed and the item, not by
    the batch it lands in, so results do not depend on --batch-size."""
    return (run_seed * 1_000_003 + index) % 2**63


def common_prefix(prompts: list[list[int]]) -> list[int]:
    """The tokens every prompt starts with, kept shorter than the shortest prompt."""
    if not prompts:
        return []
    prefix = os.path.commonprefix(prompts)
    return list(prefix[:min(len(p) for p in prompts) - 1])


def _digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def sampler_settings(sampler) -> dict:
    config = getattr(sampler, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(getattr(sampler, "params", {}))


@dataclass
class EvalConfig:
    samplers: list[str]
    seeds: int = 1
    seed: int = 0                 # the first run seed; runs use seed, seed + 1, ...
    max_tokens: int = 32
    batch_size: int = 8
    model_name: str = "model"
    tasks_name: str = "tasks"
    split: str = "all"            # which split the tasks are (a label: the caller filters with select_split)

    def runs(self) -> list[tuple[str, int]]:
        """(sampler, run seed) pairs. Greedy is deterministic: one run, and it
        always runs, as the baseline of the paired comparison."""
        out = [("greedy", self.seed)]
        for name in self.samplers:
            if name != "greedy":
                out += [(name, self.seed + s) for s in range(self.seeds)]
        return out


class ResultStore:
    """DIR/config.json, DIR/items.jsonl (append-only), DIR/results.json."""

    def __init__(self, out_dir, identity: dict):
        self.dir = Path(out_dir) if out_dir is not None else None
        self.records: dict[tuple, dict] = {}
        if self.dir is None:
            return
        if self.dir.exists() and not self.dir.is_dir():
            raise ConfigError(f"--out {self.dir} is a file; give a directory")
        self.dir.mkdir(parents=True, exist_ok=True)
        config_file = self.dir / "config.json"
        if config_file.exists():
            try:
                saved = json.loads(config_file.read_text())
            except json.JSONDecodeError:
                saved = None
            if not isinstance(saved, dict):
                raise ConfigError(f"{config_file} is not an eval config; use another --out directory")
            differ = [k.replace("_", " ") for k in identity if k != "samplers" and saved.get(k) != identity[k]]
            differ += [f"settings of sampler '{n}'" for n, s in identity["samplers"].items()
                       if n in saved.get("samplers", {}) and saved["samplers"][n] != s]
            if differ:
                raise ConfigError(
                    f"{self.dir} holds results of a different eval ({', '.join(differ)} changed); "
                    "use another --out directory, or delete it to start over")
            identity = {**identity, "samplers": {**saved.get("samplers", {}), **identity["samplers"]}}
        config_file.write_text(json.dumps(identity, indent=2) + "\n")
        items = self.dir / "items.jsonl"
        if items.exists():
            for line in items.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self.records[(r["sampler"], r["seed"], r["index"])] = r
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue   # a line cut short by an interruption: that item runs again
            # Drop a partial last line so appended records start on a line of their own.
            text = items.read_text()
            if text and not text.endswith("\n"):
                items.write_text(text[: text.rfind("\n") + 1])

    def check_items(self, tasks: list[Task], prompts: list[list[int]]):
        """Saved records must be about the same items with the same prompts."""
        by_index = {t.index: (t, _digest(p)) for t, p in zip(tasks, prompts)}
        for r in self.records.values():
            task, digest = by_index.get(r["index"], (None, None))
            if task is not None and (r.get("question") != task.question or r.get("prompt_sha256") != digest):
                raise ConfigError(
                    f"{self.dir} holds results for other questions or prompts (item {r['index'] + 1} differs); "
                    "use another --out directory, or delete it to start over")

    def add(self, record: dict):
        self.records[(record["sampler"], record["seed"], record["index"])] = record
        if self.dir is not None:
            with open(self.dir / "items.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def write_results(self, results: dict):
        if self.dir is not None:
            (self.dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def run_eval(model, tokenizer, tasks: list[Task], config: EvalConfig, out_dir=None,
             make_sampler: Callable | None = None, progress=None,
             on_record: Callable[[dict], None] | None = None) -> dict:
    """Run every (sampler, seed) over the tasks and summarize.

    `make_sampler(name)` builds one sampler (default: `samplers.make_sampler`
    with the model's card). `progress(done, total, description)` is called
    after every item. `on_record(record)` sees each new record after it is
    saved (tests use it to interrupt a run)."""
    from .prompt import encode_chat
    from .sampler_registry import make_sampler as default_factory

    if make_sampler is None:
        def make_sampler(name):
            return default_factory(name, tokenizer=tokenizer, model_name=config.model_name, metrics=False)

    prompts = [encode_chat(tokenizer, [{"role": "user", "content": t.prompt_text()}]) for t in tasks]
    prompt_of = {t.index: p for t, p in zip(tasks, prompts)}
    runs = config.runs()
    identity = {
        "model": config.model_name,
        "max_tokens": config.max_tokens,
        "prompt_version": PROMPT_VERSION,
        "split": config.split,
        "samplers": {name: sampler_settings(make_sampler(name)) for name in dict.fromkeys(n for n, _ in runs)},
    }
    store = ResultStore(out_dir, identity)
    store.check_items(tasks, prompts)
    prefix = common_prefix(prompts)
    total = len(runs) * len(tasks)
    done = sum((name, seed, t.index) in store.records for name, seed in runs for t in tasks)
    if progress:
        progress(done, total, "resuming" if done else "starting")

    for name, seed in runs:
        todo = [t for t in tasks if (name, seed, t.index) not in store.records]
        if not todo:
            continue
        requests = [Request(prompt_of[t.index], item_seed(seed, t.index), config.max_tokens) for t in todo]
        for i, result, seconds in generate_batch(model, tokenizer, requests, lambda name=name: make_sampler(name),
                                                 config.batch_size, prefix=prefix):
            task = todo[i]
            output = tokenizer.decode(result.tokens)
            extracted, correct = score(output, task)
            record = {
                "sampler": name, "seed": seed, "index": task.index, "question": task.question,
                "prompt_sha256": _digest(prompt_of[task.index]),
                "expected": task.expected, "extracted": extracted, "correct": correct, "output": output,
                "tokens": len(result.tokens), "strategies": dict(Counter(result.strategies)),
                "thinking_insertions": result.thinking_insertions, "finish_reason": result.finish_reason,
                "seconds": round(seconds, 4),
            }
            store.add(record)
            done += 1
            if progress:
                progress(done, total, f"{name} seed {seed}" if name != "greedy" else name)
            if on_record:
                on_record(record)

    results = summarize(store.records, tasks, config)
    store.write_results(results)
    return results


def summarize(records: dict, tasks: list[Task], config: EvalConfig) -> dict:
    indices = [t.index for t in tasks]
    per_sampler: dict[str, list[tuple[int, list[dict]]]] = {}
    for name, seed in config.runs():
        per_sampler.setdefault(name, []).append((seed, [records[(name, seed, i)] for i in indices]))

    def share_correct(runs):
        return {i: sum(recs[k]["correct"] for _, recs in runs) / len(runs) for k, i in enumerate(indices)}

    greedy_share = share_correct(per_sampler["greedy"])
    out = {}
    for name, runs in per_sampler.items():
        run_stats = []
        for seed, recs in runs:
            k, n = sum(r["correct"] for r in recs), len(recs)
            tokens, seconds = sum(r["tokens"] for r in recs), sum(r["seconds"] for r in recs)
            run_stats.append({"seed": seed, "correct": k, "n": n, "accuracy": k / n,
                              "ci95": list(wilson_interval(k, n)), "mean_tokens": tokens / n,
                              "tokens_per_second": tokens / seconds if seconds else 0.0})
        accuracies = [r["accuracy"] for r in run_stats]
        all_recs = [r for _, recs in runs for r in recs]
        strategies = Counter()
        for r in all_recs:
            strategies.update(r["strategies"])
        n_tokens = sum(strategies.values())
        seconds = sum(r["seconds"] for r in all_recs)
        mean = statistics.fmean(accuracies)
        entry = {
            "runs": run_stats,
            "n": len(indices),
            "seeds": len(runs),
            "accuracy": mean,
            "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
            "ci95": list(wilson_interval(mean * len(indices), len(indices))),
            "mean_tokens": statistics.fmean(r["tokens"] for r in all_recs),
            "tokens_per_second": sum(r["tokens"] for r in all_recs) / seconds if seconds else 0.0,
            "strategy_share": {s: c / n_tokens for s, c in strategies.most_common()} if n_tokens else {},
            "thinking_insertions": sum(r["thinking_insertions"] for r in all_recs),
        }
        if name != "greedy":
            entry["vs_greedy"] = paired_comparison(share_correct(runs), greedy_share)
        out[name] = entry
    return {
        "model": config.model_name,
        "tasks": config.tasks_name,
        "split": config.split,
        "items": len(indices),
        "max_tokens": config.max_tokens,
        "batch_size": config.batch_size,
        "date": date.today().isoformat(),
        "machine": machine_description(),
        "samplers": out,
    }


def machine_description() -> str:
    import mlx.core as mx

    device = mx.default_device()
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), MLX {mx.__version__} on {device}"


# -- reporting ------------------------------------------------------------------

def format_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def table_rows(results: dict, strategies: bool = True) -> list[dict]:
    """One row of display strings per sampler (the CLI's table, the README's)."""
    rows = []
    for name, s in results["samplers"].items():
        lo, hi = s["ci95"]
        acc = f"{100 * s['accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
        if s["seeds"] > 1:
            acc += f" sd {100 * s['accuracy_std']:.1f} ({s['seeds']} seeds)"
        vs = s.get("vs_greedy")
        split = results.get("split", "all")
        row = {
            "sampler": name,
            f"{split} accuracy [95% CI]" if split != "all" else "accuracy [95% CI]": acc,
            "n": str(s["n"]),
            "tokens": f"{s['mean_tokens']:.1f}",
            "tok/s": f"{s['tokens_per_second']:.2f}",
            "W/L/T vs greedy": f"{vs['wins']}/{vs['losses']}/{vs['ties']}" if vs else "",
            "p": format_p(vs["p_value"]) if vs else "",
        }
        if strategies:
            row["strategies"] = strategy_text(name, s)
        rows.append(row)
    return rows


def strategy_text(name: str, summary: dict) -> str:
    """Shares of tokens per strategy, for samplers that have more than one."""
    shares = summary["strategy_share"]
    if len(shares) <= 1:
        return ""
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())


def markdown_table(results: dict) -> str:
    rows = table_rows(results)
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def plot(results: dict, path) -> None:
    """Accuracy with 95% intervals per sampler, as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["samplers"])
    acc = [100 * results["samplers"][n]["accuracy"] for n in names]
    lo = [a - 100 * results["samplers"][n]["ci95"][0] for a, n in zip(acc, names)]
    hi = [100 * results["samplers"][n]["ci95"][1] - a for a, n in zip(acc, names)]
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 4))
    ax.bar(names, acc, yerr=[lo, hi], capsize=6, color="#4c72b0")
    ax.set_ylabel("accuracy (%) with 95% Wilson interval")
    ax.set_ylim(0, 100)
    split = results.get("split", "all")
    where = f"{results['tasks']}, {split} split" if split != "all" else results["tasks"]
    ax.set_title(f"{results['model']} on {where} ({results['items']} items)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
