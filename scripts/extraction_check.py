"""Structured answers on 20 extraction prompts of our own: with each sampler, does
every answer parse and validate against its schema, and do the values'
confidences differ? Writes one record per answer (JSON Lines) and prints a table.

    python scripts/extraction_check.py OUT.jsonl [-m MODEL] [--samplers greedy,entropix,deliberate]
"""

import argparse
import json
import sys
import time

from entropix_mlx import accel

accel.enable()

from entropix_mlx import load_model  # noqa: E402
from entropix_mlx.decode.fields import json_fields  # noqa: E402
from entropix_mlx.front import choose  # noqa: E402


def obj(props: dict, required=None) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(required or props),
        "additionalProperties": False,
    }


STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}

PROMPTS = [
    ("Ada Lovelace, 36, lives in London.", obj({"name": STR, "age": INT, "city": STR})),
    ("Order #4411: 3 blue mugs at 7.50 each.", obj({"order": INT, "item": STR, "quantity": INT, "unit_price": NUM})),
    ("The meeting is on Tuesday at 10am in room B.", obj({"day": STR, "time": STR, "room": STR})),
    ("Paris is the capital of France.", obj({"city": STR, "country": STR, "is_capital": BOOL})),
    ("Tom bought apples, pears and plums.", obj({"buyer": STR, "fruits": {"type": "array", "items": STR}})),
    ("The Eiffel Tower is 330 metres tall.", obj({"landmark": STR, "height_m": INT})),
    ("Flight BA117 leaves London at 08:40 for New York.", obj({"flight": STR, "from": STR, "to": STR, "departs": STR})),
    ("Maria's email is maria@example.com and her phone is 555-0199.", obj({"name": STR, "email": STR, "phone": STR})),
    ("The book '1984' was written by George Orwell in 1949.", obj({"title": STR, "author": STR, "year": INT})),
    (
        "It is 21 degrees and sunny in Rome.",
        obj({"city": STR, "celsius": INT, "sky": {"enum": ["sunny", "cloudy", "rainy"]}}),
    ),
    ("The package weighs 2.5 kg and ships to Berlin.", obj({"weight_kg": NUM, "destination": STR})),
    (
        "Sam is a nurse and Lee is a teacher.",
        obj({"people": {"type": "array", "items": obj({"name": STR, "job": STR})}}),
    ),
    ("The laptop costs 999 dollars and is in stock.", obj({"product": STR, "price": INT, "in_stock": BOOL})),
    ("Water boils at 100 degrees Celsius at sea level.", obj({"substance": STR, "boiling_point_c": INT})),
    (
        "Jane, born 1990, speaks English and Spanish.",
        obj({"name": STR, "born": INT, "languages": {"type": "array", "items": STR}}),
    ),
    ("The train from Madrid to Seville takes 2 hours 30 minutes.", obj({"from": STR, "to": STR, "minutes": INT})),
    ("Review: 4 out of 5 stars, 'great battery, weak camera'.", obj({"stars": INT, "pros": STR, "cons": STR})),
    ("The recipe needs 2 eggs, 200 g flour and 1 cup of milk.", obj({"ingredients": {"type": "array", "items": STR}})),
    ("Invoice 2024-17 is due on March 3 for 1200 euros.", obj({"invoice": STR, "due": STR, "amount_eur": INT})),
    ("The cat Mittens is 3 years old and likes fish.", obj({"name": STR, "species": STR, "age": INT, "likes": STR})),
]


def valid(value, schema) -> bool:
    """The subset of JSON Schema the prompts above use."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        return (
            isinstance(value, dict)
            and set(schema["required"]) <= set(value)
            and set(value) <= set(schema["properties"])
            and all(valid(value[k], schema["properties"][k]) for k in value)
        )
    if kind == "array":
        return isinstance(value, list) and all(valid(v, schema["items"]) for v in value)
    checks = {"string": str, "boolean": bool}
    if kind in checks:
        return isinstance(value, checks[kind])
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--samplers", default="greedy,entropix,deliberate")
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args(argv)
    loaded = load_model(args.model)
    rows = []
    with open(args.out, "w") as out:
        for sampler in args.samplers.split(","):
            for i, (text, schema) in enumerate(PROMPTS):
                ids = loaded.encode([{"role": "user", "content": f"Extract the facts as JSON: {text}"}])
                prepared = loaded.prepare(ids, choose(sampler), args.max_tokens, 0, json_schema=schema)
                start = time.perf_counter()
                generation = loaded.generate(prepared)
                events = list(generation)
                answer = "".join(e.text for e in events)
                try:
                    parsed, ok = json.loads(answer), None
                    ok = valid(parsed, schema)
                except json.JSONDecodeError:
                    ok = False
                fields = json_fields([e.text for e in events], [e.logprob for e in events])
                row = {
                    "model": loaded.name,
                    "sampler": sampler,
                    "prompt": i,
                    "valid": ok,
                    "finish_reason": generation.finish_reason,
                    "tokens": len(events),
                    "seconds": round(time.perf_counter() - start, 2),
                    "answer": answer,
                    "fields": fields,
                }
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
    print(f"{'sampler':<12} {'valid':>6} {'fields':>7} {'differ':>7} {'tokens':>7}")
    for sampler in args.samplers.split(","):
        mine = [r for r in rows if r["sampler"] == sampler]
        differ = sum(len({f["mean_confidence"] for f in r["fields"]}) > 1 for r in mine)
        present = sum(bool(r["fields"]) for r in mine)
        tokens = sum(r["tokens"] for r in mine)
        print(
            f"{sampler:<12} {sum(r['valid'] for r in mine):>3}/{len(mine)} {present:>4}/{len(mine)} {differ:>4}/{len(mine)} {tokens:>7}"
        )
    return 0 if all(r["valid"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
