"""Writes `builtin_tasks.jsonl`, the built-in eval tasks, deterministically.

    python -m entropix_mlx.data.make_builtin            # rewrite the file
    python -m entropix_mlx.data.make_builtin --check    # exit 1 if the file is stale

The items are at the level of a ~135M-parameter instruct model (SmolLM2-135M gets
about half of them right with greedy decoding): one- and two-digit arithmetic,
negatives, two-step sums, small products, decimal comparisons (the 9.9-vs-9.11
trap), unit conversions, everyday facts and one-step word problems. Arithmetic
answers are computed here, never typed; `tests/test_eval_tasks.py` re-derives
them from the question text.

Every item has a `category` and a `split`: `dev` (for tuning samplers) or `test`
(for reporting). The split is stratified: within each category the items are
shuffled with a fixed seed and the first half (rounded up) is `dev`. The first 40
items are the original built-in tasks, unchanged and in their old order; the
generated ones follow in a seeded shuffle, so `--limit N` covers every category.
"""

import argparse
import json
import random
import sys
from fractions import Fraction
from pathlib import Path

SEED = 20261123
PATH = Path(__file__).with_name("builtin_tasks.jsonl")
CATEGORIES = ("addition", "subtraction", "negatives", "two_step", "multiplication", "decimals",
              "units", "facts", "word_problems")

# The original 40 built-in items (issue 6), kept verbatim so old results stay comparable.
ORIGINAL = [
    ("addition", {"question": "What is 2 + 3?", "answer": "5"}),
    ("addition", {"question": "What is 7 + 5?", "answer": "12"}),
    ("subtraction", {"question": "What is 10 - 4?", "answer": "6"}),
    ("addition", {"question": "What is 9 + 8?", "answer": "17"}),
    ("multiplication", {"question": "What is 6 times 7?", "answer": "42"}),
    ("addition", {"question": "What is 15 + 27?", "answer": "42"}),
    ("subtraction", {"question": "What is 100 - 37?", "answer": "63"}),
    ("multiplication", {"question": "What is 12 times 3?", "answer": "36"}),
    ("multiplication", {"question": "What is half of 50?", "answer": "25"}),
    ("multiplication", {"question": "What is 20 divided by 4?", "answer": "5"}),
    ("addition", {"question": "What is 1,000 plus 250?", "answer": "1,250"}),
    ("decimals", {"question": "What is 3.5 + 1.5?", "answer": "5.0"}),
    ("negatives", {"question": "What is 5 minus 8?", "answer": "-3"}),
    ("decimals", {"question": "Which number is larger, 9.9 or 9.11?", "answer": "9.9"}),
    ("word_problems", {"question": "Tom has 3 apples and buys 4 more. How many apples does he have now?",
                       "answer": "7"}),
    ("word_problems", {"question": "A box holds 12 eggs. 5 eggs break. How many eggs are left?", "answer": "7"}),
    ("word_problems", {"question": "Sara has 5 pencils and gives 2 to a friend. How many pencils does she have left?",
                       "answer": "3"}),
    ("word_problems", {"question": "There are 4 cars and each car has 4 wheels. How many wheels are there in total?",
                       "answer": "Each car has 4 wheels, so 4 cars have 4 * 4 = 16 wheels.\n#### 16"}),
    ("word_problems", {"question": "A shirt costs $15. How much do 3 shirts cost in dollars?",
                       "answer": "3 * 15 = 45\n#### 45"}),
    ("units", {"question": "How many days are in a week?", "answer": "7"}),
    ("units", {"question": "How many hours are in a day?", "answer": "24"}),
    ("units", {"question": "How many months are in a year?", "answer": "12"}),
    ("facts", {"question": "How many legs does a spider have?", "answer": "8"}),
    ("facts", {"question": "How many sides does a triangle have?", "answer": "3"}),
    ("facts", {"question": "What is the capital of France?", "answer": "Paris"}),
    ("facts", {"question": "What is the capital of Japan?", "answer": "Tokyo"}),
    ("facts", {"question": "What is the capital of Italy?", "answer": "Rome"}),
    ("facts", {"question": "What color is the sky on a clear day?", "answer": "blue"}),
    ("facts", {"question": "What is the largest planet in our solar system?", "answer": "Jupiter"}),
    ("facts", {"question": "Which planet is known as the Red Planet?", "answer": "Mars"}),
    ("facts", {"question": "What do bees make?", "answer": "honey"}),
    ("facts", {"question": "What is frozen water called?", "answer": "ice"}),
    ("facts", {"question": "Which gas do plants take in from the air to make food?",
               "answer": ["carbon dioxide", "CO2"]}),
    ("facts", {"question": "Who wrote Romeo and Juliet?", "answer": ["William Shakespeare", "Shakespeare"]}),
    ("facts", {"question": "What is the opposite of hot?", "answer": "cold"}),
    ("facts", {"question": "On which continent is Egypt?", "answer": "Africa"}),
    ("facts", {"question": "Which of these is a fruit?", "choices": ["carrot", "apple", "potato", "onion"],
               "answer": "B"}),
    ("facts", {"question": "Which animal can fly?", "choices": ["dog", "cat", "eagle", "horse"], "answer": "C"}),
    ("facts", {"question": "Which animal is the largest?", "choices": ["mouse", "elephant", "cat", "rabbit"],
               "answer": "B"}),
    ("facts", {"question": "At what temperature in degrees Celsius does water boil at sea level?",
               "choices": ["50", "100", "0", "200"], "answer": "100"}),
]

CAPITALS = [
    ("Germany", ["Berlin"]), ("Spain", ["Madrid"]), ("the United Kingdom", ["London"]), ("Russia", ["Moscow"]),
    ("China", ["Beijing", "Peking"]), ("Egypt", ["Cairo"]), ("Canada", ["Ottawa"]), ("Greece", ["Athens"]),
    ("Portugal", ["Lisbon"]), ("Ireland", ["Dublin"]), ("Norway", ["Oslo"]), ("Sweden", ["Stockholm"]),
    ("Poland", ["Warsaw"]), ("Austria", ["Vienna"]), ("Mexico", ["Mexico City"]), ("India", ["New Delhi", "Delhi"]),
    ("Argentina", ["Buenos Aires"]), ("Kenya", ["Nairobi"]), ("Thailand", ["Bangkok"]), ("South Korea", ["Seoul"]),
    ("the United States", ["Washington", "Washington D.C."]), ("Australia", ["Canberra"]),
]
FACTS = [
    # colours
    ("What color is grass?", ["green"]),
    ("What color is snow?", ["white"]),
    ("What color is a ripe banana?", ["yellow"]),
    ("What color is coal?", ["black"]),
    ("What color is a ripe strawberry?", ["red"]),
    ("What color do you get when you mix blue and yellow?", ["green"]),
    ("What color do you get when you mix red and white?", ["pink"]),
    ("What color do you get when you mix red and yellow?", ["orange"]),
    ("What color do you get when you mix red and blue?", ["purple", "violet"]),
    ("What color is blood?", ["red"]),
    # animals
    ("Which animal says moo?", ["cow", "cows"]),
    ("Which animal barks?", ["dog", "dogs"]),
    ("Which animal has a long trunk?", ["elephant", "elephants"]),
    ("What is a baby cat called?", ["kitten", "kitty"]),
    ("What is a baby dog called?", ["puppy", "pup"]),
    ("What is a baby sheep called?", ["lamb"]),
    ("What is a baby cow called?", ["calf"]),
    ("Which animal is called the king of the jungle?", ["lion", "lions"]),
    ("Which black and white bird cannot fly and lives in Antarctica?", ["penguin", "penguins"]),
    ("Which animal has black and white stripes?", ["zebra", "zebras"]),
    ("What does a caterpillar turn into?", ["butterfly", "butterflies", "moth"]),
    ("Which animal is the tallest in the world?", ["giraffe", "giraffes"]),
    ("How many legs does a dog have?", ["4"]),
    ("How many legs does a bird have?", ["2"]),
    ("How many legs does an insect have?", ["6"]),
    # opposites
    ("What is the opposite of big?", ["small", "little", "tiny"]),
    ("What is the opposite of up?", ["down"]),
    ("What is the opposite of day?", ["night"]),
    ("What is the opposite of fast?", ["slow"]),
    ("What is the opposite of happy?", ["sad", "unhappy"]),
    ("What is the opposite of open?", ["closed", "close", "shut"]),
    ("What is the opposite of tall?", ["short"]),
    ("What is the opposite of wet?", ["dry"]),
    ("What is the opposite of full?", ["empty"]),
    ("What is the opposite of early?", ["late"]),
    ("What is the opposite of left?", ["right"]),
    ("What is the opposite of old?", ["young", "new"]),
    ("What is the opposite of light?", ["dark", "heavy"]),
    # everyday and science
    ("Which planet do we live on?", ["Earth"]),
    ("What is the largest ocean on Earth?", ["Pacific", "Pacific Ocean"]),
    ("Which star is closest to Earth?", ["Sun"]),
    ("Which season comes after winter?", ["spring"]),
    ("Which season comes after summer?", ["autumn", "fall"]),
    ("What shape has four equal sides and four right angles?", ["square"]),
    ("How many sides does a hexagon have?", ["6"]),
    ("How many sides does a square have?", ["4"]),
    ("At what temperature in degrees Celsius does water freeze?", ["0"]),
    ("What do cows give us to drink?", ["milk"]),
    ("What do you call the meal you eat in the morning?", ["breakfast"]),
    ("Which body part do you use to see?", ["eye", "eyes"]),
    ("Which body part do you use to hear?", ["ear", "ears"]),
    ("What do plants need from the sun to grow?", ["light", "sunlight"]),
    ("What is the first day of the weekend?", ["Saturday"]),
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
# (small unit, plural; large unit, plural; small units per large unit)
UNITS = [
    ("centimeter", "centimeters", "meter", "meters", 100),
    ("millimeter", "millimeters", "centimeter", "centimeters", 10),
    ("meter", "meters", "kilometer", "kilometers", 1000),
    ("gram", "grams", "kilogram", "kilograms", 1000),
    ("milliliter", "milliliters", "liter", "liters", 1000),
    ("minute", "minutes", "hour", "hours", 60),
    ("second", "seconds", "minute", "minutes", 60),
    ("hour", "hours", "day", "days", 24),
    ("day", "days", "week", "weeks", 7),
    ("month", "months", "year", "years", 12),
    ("cent", "cents", "dollar", "dollars", 100),
    ("inch", "inches", "foot", "feet", 12),
]
PEOPLE = [("Tom", "he"), ("Sara", "she"), ("Ali", "he"), ("Mia", "she"), ("Ben", "he"), ("Lena", "she"),
          ("Sam", "he"), ("Nora", "she"), ("Omar", "he"), ("Eva", "she")]
THINGS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "balloons", "cards", "shells", "toy cars"]


def _number(value: Fraction | int) -> str:
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.10f}".rstrip("0")
    if Fraction(text) != value:
        raise ValueError(f"{value} has no short decimal form")
    return text


def addition(rng):
    out = []
    for _ in range(24):                                     # one digit + one digit
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        out.append((f"What is {a} + {b}?", a + b))
    for _ in range(16):                                     # two digits + one or two digits
        a, b = rng.randint(10, 60), rng.randint(2, 39)
        out.append((f"What is {a} + {b}?", a + b))
    return out


def subtraction(rng):
    out = []
    for _ in range(16):
        a = rng.randint(5, 19)
        b = rng.randint(1, a - 1)
        out.append((f"What is {a} - {b}?", a - b))
    for _ in range(14):
        a = rng.randint(20, 99)
        b = rng.randint(2, a - 5)
        out.append((f"What is {a} - {b}?", a - b))
    return out


def negatives(rng):
    out = []
    for _ in range(14):                                     # a smaller minus a larger
        a = rng.randint(1, 9)
        b = rng.randint(a + 1, 15)
        out.append((f"What is {a} - {b}?", a - b))
    for _ in range(12):                                     # a negative plus a positive
        a, b = -rng.randint(1, 12), rng.randint(1, 15)
        out.append((f"What is {a} + {b}?", a + b))
    for _ in range(8):                                      # a negative minus a positive
        a, b = -rng.randint(1, 9), rng.randint(1, 9)
        out.append((f"What is {a} - {b}?", a - b))
    return out


def two_step(rng):
    out = []
    for _ in range(20):                                     # a + b - c
        a, b = rng.randint(2, 20), rng.randint(2, 15)
        c = rng.randint(1, a + b - 1)
        out.append((f"What is {a} + {b} - {c}?", a + b - c))
    for _ in range(10):                                     # a - b + c
        a = rng.randint(5, 20)
        b, c = rng.randint(1, a - 1), rng.randint(1, 12)
        out.append((f"What is {a} - {b} + {c}?", a - b + c))
    for _ in range(6):                                      # a + b + c
        a, b, c = rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 12)
        out.append((f"What is {a} + {b} + {c}?", a + b + c))
    return out


def multiplication(rng):
    out = []
    for _ in range(24):
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        out.append((f"What is {a} times {b}?", a * b))
    for _ in range(8):
        a, b = rng.randint(2, 9), rng.randint(2, 6)
        out.append((f"What is {a * b} divided by {b}?", a))
    return out


def decimals(rng):
    """Larger/smaller of two decimals. The trap: a shorter decimal that is larger
    (9.9 against 9.11), which a model comparing digit strings gets wrong."""
    out = []
    for k in range(36):
        whole = rng.randint(0, 12)
        tenth = rng.randint(2, 9)
        short = Fraction(10 * whole + tenth, 10)
        if k % 3 == 2:
            # not a trap: the longer decimal is the larger (4.3 against 4.35)
            long = short + Fraction(rng.randint(1, 9), 100)
        else:
            # the trap: the longer decimal has more digits but is smaller (9.9 against 9.11)
            long = Fraction(whole) + Fraction(rng.randint(10, 10 * tenth - 1), 100)
            if long.denominator <= 10:                      # 9.20 would print as 9.2
                long += Fraction(1, 100)
        pair = [short, long]
        rng.shuffle(pair)
        larger = k % 2 == 0
        word = "larger" if larger else "smaller"
        answer = max(pair) if larger else min(pair)
        out.append((f"Which number is {word}, {_number(pair[0])} or {_number(pair[1])}?", answer))
    return out


def units(rng):
    out = []
    for small, smalls, large, _larges, factor in UNITS:
        out.append((f"How many {smalls} are in a {large}?" if large != "hour" else
                     f"How many {smalls} are in an {large}?", factor))
    for small, smalls, large, larges, factor in UNITS:
        n = rng.randint(2, 5)
        out.append((f"How many {smalls} are in {n} {larges}?", n * factor))
    return out


def facts(rng):
    out = [(f"What is the capital of {country}?", answers) for country, answers in CAPITALS]
    out += FACTS
    for i, day in enumerate(DAYS):
        out.append((f"Which day of the week comes after {day}?", [DAYS[(i + 1) % 7]]))
    for i, month in enumerate(MONTHS[:-1]):
        out.append((f"Which month comes after {month}?", [MONTHS[i + 1]]))
    return out


def word_problems(rng):
    out = []
    for k in range(40):
        name, he = PEOPLE[k % len(PEOPLE)]
        things = THINGS[rng.randrange(len(THINGS))]
        kind = k % 5
        if kind == 0:
            a, b = rng.randint(2, 12), rng.randint(2, 9)
            q = f"{name} has {a} {things} and gets {b} more. How many {things} does {he} have now?"
            answer = a + b
        elif kind == 1:
            a = rng.randint(5, 15)
            b = rng.randint(1, a - 1)
            q = f"{name} has {a} {things} and gives {b} to a friend. How many {things} does {he} have left?"
            answer = a - b
        elif kind == 2:
            a, b = rng.randint(2, 6), rng.randint(2, 6)
            q = f"There are {a} bags and each bag has {b} {things}. How many {things} are there in total?"
            answer = a * b
        elif kind == 3:
            a, b = rng.randint(2, 9), rng.randint(2, 5)
            q = f"One notebook costs {a} dollars. How many dollars do {b} notebooks cost?"
            answer = a * b
        else:
            b, each = rng.randint(2, 5), rng.randint(2, 6)
            q = f"{name} shares {b * each} {things} equally among {b} friends. How many {things} does each friend get?"
            answer = each
        out.append((q, answer))
    return out


def generate(seed: int = SEED) -> list[dict]:
    """Every item, in file order, with its category and split."""
    rng = random.Random(seed)
    makers = {"addition": addition, "subtraction": subtraction, "negatives": negatives, "two_step": two_step,
              "multiplication": multiplication, "decimals": decimals, "units": units, "facts": facts,
              "word_problems": word_problems}
    items = [{**item, "category": cat} for cat, item in ORIGINAL]
    seen = {item["question"] for item in items}
    generated = []
    for category in CATEGORIES:
        for question, answer in makers[category](rng):
            if question in seen:
                continue                                    # a repeated draw: skipped, deterministically
            seen.add(question)
            if isinstance(answer, list):
                answer = answer[0] if len(answer) == 1 else answer
            else:
                answer = _number(answer)
            generated.append({"question": question, "answer": answer, "category": category})
    rng.shuffle(generated)
    items += generated

    # Stratified split: within each category, half (rounded up) of a seeded shuffle is dev.
    for category in CATEGORIES:
        members = [i for i, item in enumerate(items) if item["category"] == category]
        rng.shuffle(members)
        dev = set(members[: (len(members) + 1) // 2])
        for i in members:
            items[i]["split"] = "dev" if i in dev else "test"
    return items


def render(items: list[dict]) -> str:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from a fresh generation")
    parser.add_argument("--out", type=Path, default=PATH)
    args = parser.parse_args(argv)
    text = render(generate())
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python -m entropix_mlx.data.make_builtin", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({text.count(chr(10))} items)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
