"""Greedy against Entropix on our own small Python function tasks, execution-checked.

    python -m research.code_check --model MODEL --out records.jsonl [--prompts research/code_prompts.jsonl]
        [--only 0-9] [--config my.toml] [--set branch_decide_tokens=4 ...] [--samplers greedy,entropix]
    python -m research.code_check --summarize records.jsonl

Each answer's first ```python block (else the whole answer) runs with the task's
asserts in `python -I` in a fresh temporary directory (10 s); a pass is exit 0.
Records (one line per task and sampler): the answer, pass, and per token its
strategy, entropy and varentropy. The summary pairs each task's greedy and
Entropix answers: passes, W/L/T with the exact sign test, answers changed, and the
strategy, token and metrics at the first token where the two answers part.
"""

import argparse
import ast
import gzip
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

CODE_BLOCK = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(answer: str) -> str:
    m = CODE_BLOCK.search(answer)
    return m.group(1) if m else answer


def run_tests(code: str, tests: list[str], timeout: float = 10.0) -> tuple[bool, str]:
    program = code + "\n\n" + "\n".join(tests) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            p = subprocess.run(
                [sys.executable, "-I", "-c", program], cwd=tmp, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return False, "timeout"
    return p.returncode == 0, p.stderr.strip().splitlines()[-1] if p.returncode and p.stderr.strip() else ""


def parse_range(text: str | None, n: int) -> list[int]:
    if not text:
        return list(range(n))
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return [i for i in out if i < n]


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare string, e.g. branch_select=logprob


def definitions(code: str) -> str:
    """The code's imports, functions, classes and assignments only: the model's own
    example calls and self-tests (often wrong about the examples) left out."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    tree.body = [n for n in tree.body if isinstance(n, keep)]
    return ast.unparse(tree)


def answer(model, tokenizer, prompt: str, sampler, max_tokens: int, stop_after_code: bool) -> dict:
    from entropix_mlx import stream_generate

    tokens, t0, finish = [], time.time(), None
    for r in stream_generate(model, tokenizer, prompt, sampler, max_tokens):
        m = r.metrics or {}
        tokens.append(
            {
                "id": r.token,
                "text": r.text,
                "strategy": r.strategy,
                "entropy": round(float(m.get("entropy", math.nan)), 4),
                "varentropy": round(float(m.get("varentropy", math.nan)), 4),
            }
        )
        finish = r.finish_reason
        # the test reads only the first block: the prose after it would cost half the time
        if stop_after_code and re.search(r"```(?:python|py)?[^\n]*\n.*?```", "".join(t["text"] for t in tokens), re.S):
            finish = "code_closed"
            break
    text = "".join(t["text"] for t in tokens)
    return {"answer": text, "tokens": tokens, "finish": finish, "seconds": round(time.time() - t0, 1)}


def generate_all(args) -> None:
    # ruff: noqa: E402  (mlx only after enable(), as the CLI does)
    import entropix_mlx.accel

    entropix_mlx.accel.enable()
    from entropix_mlx import load, make_sampler

    tasks = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    settings = {k: parse_value(v) for k, _, v in (s.partition("=") for s in args.set)}
    model, tokenizer = load(args.model)
    out = Path(args.out)
    done = set()
    if out.exists():  # resume: a cut run keeps what it finished
        done = {(r["index"], r["sampler"]) for r in map(json.loads, out.read_text().splitlines())}
    with out.open("a") as f:
        for i in parse_range(args.only, len(tasks)):
            task = tasks[i]
            for name in args.samplers.split(","):
                if (i, name) in done:
                    continue
                extra = {} if name == "greedy" else dict(settings, **({"config": args.config} if args.config else {}))
                sampler = make_sampler(name, model=model, **extra)
                rec = answer(model, tokenizer, task["prompt"], sampler, args.max_tokens, not args.whole_answers)
                code = extract_code(rec["answer"])
                rec["passed"], rec["error"] = run_tests(code, task["tests"])
                rec["defs_passed"], rec["defs_error"] = run_tests(definitions(code), task["tests"])
                rec = {"index": i, "name": task["name"], "sampler": name, "settings": extra, **rec}
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(f"{i:3d} {task['name']:<20} {name:<9} {'pass' if rec['passed'] else 'FAIL'} "
                      f"{len(rec['tokens'])} tok {rec['seconds']} s", flush=True)  # fmt: skip


def sign_test(wins: int, losses: int) -> float:
    n, k = wins + losses, min(wins, losses)
    return 1.0 if n == 0 else min(1.0, float(Fraction(2 * sum(math.comb(n, i) for i in range(k + 1)), 2**n)))


def token_kind(text: str, before: str) -> str:
    """What kind of place in the code a token sits at, for the divergence table."""
    if before.endswith("\n") or text.startswith("\n"):
        return "line start" if not text.strip() or text.startswith((" ", "\t")) else "after newline"
    if before.rstrip("\n").endswith("```") or not before:
        return "answer start"
    if text.strip() == "":
        return "whitespace"
    if re.fullmatch(r"\s*[A-Za-z_]\w*", text):
        return "word"
    return "punctuation/number"


def region(before: str) -> str:
    """Where in the answer a token falls: prose, or in the code block a docstring, a comment or code."""
    if before.count("```") % 2 == 0:
        return "prose"
    code = before.rsplit("```", 1)[1]
    if (code.count('"""') + code.count("'''")) % 2:
        return "docstring"
    return "comment" if "#" in code.rsplit("\n", 1)[-1] else "code"


def summarize(path: str, base: str = "greedy", other: str = "entropix", ngram: int = 3) -> dict:
    from entropix_mlx.sampling.repetition import repeat_counts  # pure Python: no mlx

    text = gzip.open(path, "rt").read() if str(path).endswith(".gz") else Path(path).read_text()
    recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    by = {(r["index"], r["sampler"]): r for r in recs}
    pairs = [(by[i, base], by[i, other]) for i, s in sorted(by) if s == base and (i, other) in by]
    wins = sum(e["passed"] and not g["passed"] for g, e in pairs)
    losses = sum(g["passed"] and not e["passed"] for g, e in pairs)
    dwins = sum(e["defs_passed"] and not g["defs_passed"] for g, e in pairs)
    dlosses = sum(g["defs_passed"] and not e["defs_passed"] for g, e in pairs)
    div_strategy, div_kind, div_region, divs = Counter(), Counter(), Counter(), []
    for g, e in pairs:
        gi, ei = [t["id"] for t in g["tokens"]], [t["id"] for t in e["tokens"]]
        at = next((k for k, (a, b) in enumerate(zip(gi, ei, strict=False)) if a != b), None)
        if at is None and len(gi) != len(ei):
            at = min(len(gi), len(ei))
        if at is None or at >= len(ei):
            continue
        t = e["tokens"][at]
        before = "".join(x["text"] for x in e["tokens"][:at])
        kind = token_kind(t["text"], before)
        greedy_id = gi[at] if at < len(gi) else None
        # the units Entropix's score charges each token here (argmax takes the best score, not the likeliest)
        units = repeat_counts(ei[:at], ngram)
        div_strategy[t["strategy"]] += 1
        div_kind[kind] += 1
        div_region[region(before)] += 1
        divs.append(
            {
                "index": e["index"],
                "name": e["name"],
                "position": at,
                "strategy": t["strategy"],
                "entropy": t["entropy"],
                "varentropy": t["varentropy"],
                "kind": kind,
                "region": region(before),
                "greedy_token": g["tokens"][at]["text"] if at < len(g["tokens"]) else None,
                "entropix_token": t["text"],
                "context": before[-40:],
                "greedy_token_repeats": units.get(greedy_id, 0),
                "entropix_token_repeats": units.get(ei[at], 0),
                "greedy_passed": g["passed"],
                "entropix_passed": e["passed"],
            }
        )
    shares = Counter(t["strategy"] for _, e in pairs for t in e["tokens"])
    total = sum(shares.values())
    return {
        "tasks": len(pairs),
        "passes": {base: sum(g["passed"] for g, _ in pairs), other: sum(e["passed"] for _, e in pairs)},
        "wins": wins,
        "losses": losses,
        "ties": len(pairs) - wins - losses,
        "p": round(sign_test(wins, losses), 4),
        "answers_changed": sum(g["answer"] != e["answer"] for g, e in pairs),
        "code_changed": sum(extract_code(g["answer"]) != extract_code(e["answer"]) for g, e in pairs),
        "defs_passes": {base: sum(g["defs_passed"] for g, _ in pairs), other: sum(e["defs_passed"] for _, e in pairs)},
        "defs_wins": dwins,
        "defs_losses": dlosses,
        "defs_p": round(sign_test(dwins, dlosses), 4),
        "divergence_greedy_token_repeated": sum(d["greedy_token_repeats"] > 0 for d in divs),
        "divergence_strategy": dict(div_strategy.most_common()),
        "divergence_kind": dict(div_kind.most_common()),
        "divergence_region": dict(div_region.most_common()),
        "strategy_shares": {k: round(v / total, 4) for k, v in shares.most_common()} if total else {},
        "entropix_tokens": total,
        "divergences": divs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="/work/models-dev/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--prompts", default=str(Path(__file__).with_name("code_prompts.jsonl")))
    ap.add_argument("--out", help="records (JSONL); an existing file is resumed")
    ap.add_argument("--only", help="task indices, e.g. 0-9,12")
    ap.add_argument("--samplers", default="greedy,entropix")
    ap.add_argument("--config", help="a TOML laid over the card for entropix")
    ap.add_argument("--set", action="append", default=[], help="an entropix setting, key=value (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--whole-answers", action="store_true", help="do not stop once the first code block closes")
    ap.add_argument("--summarize", metavar="RECORDS", help="only summarize these records")
    ap.add_argument("--other", default="entropix", help="the sampler compared with greedy in the summary")
    args = ap.parse_args()
    if not args.summarize:
        if not args.out:
            ap.error("--out is needed to generate")
        generate_all(args)
    s = summarize(args.summarize or args.out, other=args.other)
    divs = s.pop("divergences")
    print(json.dumps(s, indent=1))
    for d in divs:
        print(
            f"{d['name']:<20} @{d['position']:<4} {d['strategy']:<8} H={d['entropy']:.2f} V={d['varentropy']:.2f} "
            f"{d['region']:<9} {d['kind']:<18} greedy {d['greedy_token']!r} / entropix {d['entropix_token']!r} "
            f"({'P' if d['greedy_passed'] else 'F'}->{'P' if d['entropix_passed'] else 'F'}) "
            f"repeats {d['greedy_token_repeats']}/{d['entropix_token_repeats']}"
        )


if __name__ == "__main__":
    main()
