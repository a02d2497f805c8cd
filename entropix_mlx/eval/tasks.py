"""Task files: loading, validation, prompts and the dev/test split.

Task file: JSON Lines, one object per item:

    {"question": "What is 7 + 5?", "answer": "12"}
    {"question": "...", "answer": "Tom has ... #### 42"}            GSM8K: the part after ####
    {"question": "Which is a fruit?", "choices": ["carrot", "apple"], "answer": "B"}
    {"question": "...", "answer": ["carbon dioxide", "CO2"]}         any of several answers
    {"question": "...", "answer": "Paris", "prompt": "Q: {question}\\nA:"}
    {"question": "...", "answer": "4", "split": "dev", "category": "addition"}

`split` is "dev" (the items samplers are tuned on) or "test" (the items results
are reported on); an item without one is "test", so a file without splits is all
test. `category` is a free label. An item's identity is its position in the file,
whichever split is selected, so results of one split never shift another's.
"""

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from .scoring import LETTERS, choice_letter, parse_number

PROMPT_VERSION = 1  # bump when the default prompts change: old results then do not resume
NUMBER_PROMPT = "{question}\nAnswer with the number only."
TEXT_PROMPT = "{question}\nAnswer in a few words."
CHOICE_PROMPT = "{question}\n{choices}\nAnswer with the letter of the correct choice."
# Chain of thought (`cot`): reasoning first, the answer on a last line the scorer reads.
COT_PROMPTS = {
    "number": '{question}\nThink step by step. Then write the final answer on the last line as "Answer: <number>".',
    "text": '{question}\nThink step by step. Then write the final answer on the last line as "Answer: <answer>".',
    "choice": "{question}\n{choices}\nThink step by step. Then write the letter of the correct choice "
    'on the last line as "Answer: <letter>".',
}
SPLITS = ("dev", "test")
SPLIT_CHOICES = ("dev", "test", "all")


@dataclass
class Task:
    index: int  # position in the task file (0-based), the item's identity
    question: str
    answers: list[str]  # accepted answers; for choice items, the correct letter
    choices: list[str] | None = None
    prompt: str | None = None  # template override: {question}, {choices}
    split: str = "test"  # "dev" (tune on it) or "test" (report it); a file without splits is all test
    category: str | None = None  # e.g. "negatives", "facts": for per-category breakdowns

    @property
    def kind(self) -> str:
        if self.choices:
            return "choice"
        return "number" if parse_number(self.answers[0]) is not None else "text"

    @property
    def expected(self) -> str:
        return self.answers[0]

    def prompt_text(self, cot: bool = False) -> str:
        """The user turn: the item's own template if it has one, else the default
        for its kind (with `cot`, the chain-of-thought one)."""
        if self.prompt is not None:
            template = self.prompt
        elif cot:
            template = COT_PROMPTS[self.kind]
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
        raise ConfigError(f'{where} is not a JSON object; each line needs {{"question": ..., "answer": ...}}')
    question, answer = data.get("question"), data.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ConfigError(f'{where} has no "question" text')
    raw = answer if isinstance(answer, list) else [answer]
    if not raw or any(isinstance(a, bool) or not isinstance(a, (str, int, float)) for a in raw):
        raise ConfigError(f'{where} needs an "answer": a string, a number, or a list of them')
    answers = [_gsm8k(str(a)) for a in raw]
    if not all(answers):
        raise ConfigError(f"{where} has an empty answer")
    choices = data.get("choices")
    if choices is not None:
        if (
            not isinstance(choices, list)
            or not 2 <= len(choices) <= len(LETTERS)
            or not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices)
        ):
            raise ConfigError(f'{where}: "choices" must be a list of 2 to {len(LETTERS)} strings')
        choices = [str(c) for c in choices]
        letters = {choice_letter(a, choices) for a in answers} - {None}
        if len(letters) != 1:
            raise ConfigError(
                f"{where}: the answer {answer!r} is neither a choice letter "
                f"(A-{LETTERS[len(choices) - 1]}) nor the text of one choice"
            )
        answers = [letters.pop()]
    prompt = data.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ConfigError(f'{where}: "prompt" must be a template string with {{question}}')
        try:
            prompt.format(question="", choices="")
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                f"{where}: the prompt template is invalid ({type(e).__name__}: {e}); "
                "it may use {question} and {choices}, and {{ }} for literal braces"
            ) from None
    split = data.get("split", "test")
    if split not in SPLITS:
        raise ConfigError(f'{where}: "split" must be "dev" or "test", got {split!r}')
    category = data.get("category")
    if category is not None and (not isinstance(category, str) or not category.strip()):
        raise ConfigError(f'{where}: "category" must be a non-empty string')
    return Task(index, question, answers, choices, prompt, split, category)


def select_split(tasks: list[Task], split: str) -> list[Task]:
    """The items of one split ("dev" or "test"), or all of them ("all"). Items
    keep their index (file position), so results stay keyed the same way."""
    if split not in SPLIT_CHOICES:
        raise ConfigError(f"split {split!r}: give dev, test or all", settings=("split",))
    return list(tasks) if split == "all" else [t for t in tasks if t.split == split]


def load_tasks(path) -> list[Task]:
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"task file {path} {what}; give a JSON Lines file, or use builtin", settings=("builtin",))
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
        raise ConfigError(f'task file {path} has no items; each line needs {{"question": ..., "answer": ...}}')
    return tasks
