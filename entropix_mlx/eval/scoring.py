"""Answer extraction: what a model's output answers, and whether it is right.

An item is a *number* item when its answer parses as a number, a *choice* item
when it has `choices` (the answer is a letter or one choice's text), otherwise
a *text* item. `score` applies to the generated text:

- number: `extract_number`, a number as sampling/answers.py reads one (the
  number after the last "####", else the first after the last "answer is" /
  "answer:", else the LAST one: the GSM8K convention), compared with the
  accepted answers as an exact fraction (9.90 equals 9.9).
- choice: a letter given as "answer is B" / "answer: (B)", or at the very start
  ("B", "B.", "(B)", "B)"), or anywhere as "(B)" / "B)"; otherwise the choice
  whose text occurs earliest in the output (whole words, normalized).
- text: the first non-empty line of the output, normalized (lower case, no
  punctuation, no articles a/an/the, single spaces); correct when a normalized
  accepted answer occurs in it as whole words ("The capital of France is Paris."
  answers "Paris").

Chain of thought (`cot=True`): the model reasons first and ends with a line
"Answer: ...". A number item's answer is `extract_cot_number`'s (the last
`\\boxed{...}`, else the first number after the last answer mark, else the last
number; sampling/answers.py). Text and choice items are read from the last line
that has "Answer:" (the text after it), else from the last non-empty line.
"""

import re
import unicodedata

from ..sampling.answers import COT_MARK, extract_cot_number, extract_number, format_number, parse_number

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


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
        if h[i : i + len(n)] == n:
            return i
    return -1


def choice_letter(answer: str, choices: list[str]) -> str | None:
    """The letter an expected answer names: a letter in range, or a choice's text."""
    a = answer.strip().strip(".()")
    if len(a) == 1 and a.upper() in LETTERS[: len(choices)]:
        return a.upper()
    matches = [LETTERS[i] for i, c in enumerate(choices) if normalize(c) == normalize(answer)]
    return matches[0] if len(matches) == 1 else None


def extract_choice(output: str, choices: list[str]) -> str | None:
    valid = LETTERS[: len(choices)]
    cls = f"[{valid}]"
    patterns = [
        rf"answer\s*(?:is|:)?\s*\(?({cls})\)?(?![\w])",  # "the answer is B", "Answer: (B)"
        rf"^\s*\(?({cls})(?:[.):]|\s*$)",  # "B", "B.", "(B)", "B)" at the start
        rf"\(({cls})\)|(?<![\w])({cls})\)",  # "(B)" or "B)" anywhere
    ]
    for flags, pattern in zip((re.IGNORECASE, 0, 0), patterns, strict=False):
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


def cot_answer_line(output: str) -> str:
    """The part of a chain-of-thought output that holds its answer: the text after
    "Answer:" on the last line that has it, else the last non-empty line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        marks = list(COT_MARK.finditer(line))
        if marks:
            return line[marks[-1].end() :].strip()
    return lines[-1] if lines else ""


def score(output: str, task, cot: bool = False) -> tuple[str | None, bool]:
    """(what was extracted, as text; whether it is correct) for a `tasks.Task`
    (scoring reads only its kind, answers and choices; tasks builds on scoring,
    never the other way). With `cot`, from the answer line of a chain of
    thought (`cot_answer_line`)."""
    kind = task.kind
    if cot and kind != "number":
        output = cot_answer_line(output)
    if kind == "number":
        value = extract_cot_number(output) if cot else extract_number(output)
        if value is None:
            return None, False
        expected = {parse_number(a) for a in task.answers} - {None}
        return format_number(value), value in expected
    if kind == "choice":
        letter = extract_choice(output, task.choices)
        return letter, letter == task.expected
    line = normalize(first_line(output))
    return (line or None), any(_contains_words(line, normalize(a)) >= 0 for a in task.answers)
