"""Answer extraction: what a model's output answers, and whether it is right.

An item is a *number* item when its answer parses as a number, a *choice* item
when it has `choices` (the answer is a letter or one choice's text), otherwise
a *text* item. `score` applies to the generated text:

- number: the number after the last "####" if there is one; else the first
  number after the last "answer is" / "answer:"; else the LAST number in the
  output (the GSM8K convention). Numbers may carry a sign (-3, +3, \u22123), a
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

Chain of thought (`cot=True`): the model reasons first and ends
with a line "Answer: ...". A number item's answer is the number in the last
`\\boxed{...}`; else the first number after the last "Answer:" / "answer is"
mark ("Answer: 18 (after 3 days)" is 18); else the output's last number. There
is no "####" rule under chain of thought: models write "#### Step 3:" headers.
LaTeX thousands separators (`1{,}250`, `1\\,250`) read as 1250. Text and choice
items are read from the last line that has "Answer:" (the text after it), else
from the last non-empty line.
"""

import re
import unicodedata
from fractions import Fraction

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_NUMBER = re.compile(
    r"(?<![\w.])([-+\u2212]?)[$€£]?"  # sign, currency
    r"(\d+/\d+|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"  # fraction, 1,250.5, 42, .5
    r"(?![\d/]|\.\d)"
)
_WORDS = {
    w: i
    for i, w in enumerate(
        [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
        ]
    )
}
_TENS = {
    w: 10 * i for i, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], 2)
}
_WORD_NUMBER = re.compile(
    rf"\b(?:({'|'.join(_TENS)})(?:[- ]({'|'.join(list(_WORDS)[1:10])}))?|({'|'.join(_WORDS)}))\b", re.IGNORECASE
)
_ANSWER_MARK = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)
_COT_MARK = re.compile(r"\banswer\s*(?:is\s*:?|:|=)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|\\,|\\!|\\ )(?=\d{3}(?!\d))")


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


def plain_latex(text: str) -> str:
    """Thousands separators of LaTeX (`1{,}250`, `1\\,250`) as commas, `\\frac{3}{4}` as 3/4."""
    return _FRAC.sub(r"\1/\2", _LATEX_THOUSANDS.sub(",", text))


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces inside it balanced), or None."""
    found = None
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found = text[m.end() : i - 1] if depth == 0 else text[m.end() :]
    return found


def extract_cot_number(output: str) -> Fraction | None:
    """A chain of thought's number: the last `\\boxed{}`'s, else the first after
    the last answer mark, else the last one (see the module's docstring)."""
    text = plain_latex(output)
    boxed = last_boxed(text)
    if boxed is not None:
        found = list(_numbers(boxed))
        if found:
            return found[0][0]
    marks = list(_COT_MARK.finditer(text))
    if marks:
        after = [n for n in _numbers(text) if n[1] >= marks[-1].end()]
        if after:
            return after[0][0]
    return extract_number(text.replace("####", ""))


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
        marks = list(_COT_MARK.finditer(line))
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
