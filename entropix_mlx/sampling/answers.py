"""Reading a number answer from a model's text: the one home of the rules that
eval's scoring applies to a task's number items and that the whole-answer
decoders (deliberate, the votes) apply without a task.

A number may carry a sign (-3, +3, \u22123), a currency sign, thousands commas
(1,250) and decimals, or be a fraction (3/4); values are exact fractions, so
9.90 equals 9.9 and 5.0 equals 5. Number words ("eight", "twenty-one") count
only when the text has no digit at all, since words like "one" are often not
numbers.

- `extract_number`: the number after the last "####" if there is one; else the
  first number after the last "answer is" / "answer:"; else the LAST number in
  the text (the GSM8K convention).
- `extract_cot_number` (a chain of thought): the number in the last
  `\\boxed{...}`; else the first number after the last "Answer:" / "answer is"
  mark ("Answer: 18 (after 3 days)" is 18); else the text's last number. There
  is no "####" rule: models write "#### Step 3:" headers. LaTeX thousands
  separators (`1{,}250`, `1\\,250`) read as 1250.
- `format_number`: the value as an answer's text, so that equal values are one
  answer in a vote.

Without a task, a decoder reads a candidate's answer with `default_answer`
(the last number, else the first line), or for a chain of thought with
`chain_of_thought_answer` (eval's reading of a number item under chain of thought).
`looks_like_chain_of_thought` says whether a prompt and its answer read as one.
"""

import re
from fractions import Fraction

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
# A chain of thought's answer mark ("Answer:", "the answer is"); eval's scoring
# also finds the answer line of a text or choice item with it.
COT_MARK = re.compile(r"\banswer\s*(?:is\s*:?|:|=)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\{,\}|\\,|\\!|\\ )(?=\d{3}(?!\d))")


def parse_number(text: str) -> Fraction | None:
    """The value of a text that is one number (with sign, commas, decimals or a
    fraction), else None."""
    found = list(numbers_in(text.strip()))
    if len(found) != 1 or found[0][1] != 0 or found[0][2] != len(text.strip()):
        return None
    return found[0][0]


def numbers_in(text: str):
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
    found = list(numbers_in(output))
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
        found = list(numbers_in(boxed))
        if found:
            return found[0][0]
    marks = list(COT_MARK.finditer(text))
    if marks:
        after = [n for n in numbers_in(text) if n[1] >= marks[-1].end()]
        if after:
            return after[0][0]
    return extract_number(text.replace("####", ""))


def format_number(value: Fraction) -> str:
    """A value as an answer's text: a whole number, else the shortest decimal
    that is exactly the value, else a fraction (7, 2.5, 1/3)."""
    if value.denominator == 1:
        return str(value.numerator)
    decimal = float(value)
    return repr(decimal) if Fraction(repr(decimal)) == value else f"{value.numerator}/{value.denominator}"


def chain_of_thought_answer(text: str) -> str | None:
    """A chain of thought's answer without a task: its number as eval's scoring
    reads a number item's under chain of thought, so that "1,000", "1000" and
    `\\boxed{1{,}000}` are one answer; None without a number (it does not vote)."""
    value = extract_cot_number(text)
    return None if value is None else format_number(value)


_PLAIN_NUMBER = re.compile(r"[-\u2212]?\d+(?:\.\d+)?")


def default_answer(text: str) -> str | None:
    """Without a task: the last number in the text (so that "5.0" and "5" agree),
    else its first non-empty line in lower case without punctuation."""
    numbers = _PLAIN_NUMBER.findall(text.replace(",", ""))
    if numbers:
        value = numbers[-1].replace("\u2212", "-")
        return value.rstrip("0").rstrip(".") if "." in value else value
    line = next((s for s in text.splitlines() if s.strip()), "")
    return " ".join(re.sub(r"[^\w\s]", " ", line.lower()).split()) or None


# A prompt that asks the model to reason before it answers, not one that asks for a list of steps.
_ASKS_FOR_STEPS = re.compile(
    r"\bstep[-\s]+by[-\s]+step\b|\bshow\s+(?:your|the|all)\s+(?:work|working|steps|reasoning)\b"
    r"|\bexplain\s+your\s+reasoning\b|\bthink\s+(?:it\s+)?through\b",
    re.IGNORECASE,
)
_ANSWER_LINE = re.compile(r"^\W*(?:final\s+)?answer\W*:", re.IGNORECASE)


def looks_like_chain_of_thought(prompt: str, answer: str) -> bool:
    """Whether the prompt asks for steps ("step by step", "show your work"), or the
    answer ends as a chain of thought does: its last line has a `\\boxed{}`, or is
    an "Answer:" line after lines of working (one line alone is a short answer)."""
    if _ASKS_FOR_STEPS.search(prompt):
        return True
    lines = [line for line in answer.splitlines() if line.strip()]
    if not lines:
        return False
    return _BOXED.search(lines[-1]) is not None or (len(lines) > 1 and _ANSWER_LINE.match(lines[-1]) is not None)
