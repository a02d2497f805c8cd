"""What one answer costs a user, sampler by sampler: the tokens it generates with every
candidate counted, the wall seconds from the request to the final answer, whether it was
cut off and whether it is right, on a quiet machine or beside a busy neighbour.

    python -m research.sampler_costs MODEL TASKS --cot --items 0-1 --max-tokens 768
    python -m research.sampler_costs MODEL TASKS --cot --items 0-1 --max-tokens 768 --busy

One question at a time, as `entropix-mlx run` answers. The model loads once (its start is
not counted; docs/speed.md has start times) and each sampler answers the first item with a
few tokens to warm up, unrecorded; then each item is answered by every sampler in turn. The
samplers `run` takes go its way (`LoadedModel.prepare`, then `generate`); self_consistency
and cisc, which only `eval` takes, go through eval's decoder with the question's k samples
in one batch. Prompts and scoring are eval's (`--cot` as `eval --cot`), and `--reasoning`
(on with `--cot`) gives entropix and deliberate their reasoning settings, as `eval` does.
`--busy` runs one Python process spinning on one core for the whole run. An answer's tokens
are every candidate's (deliberate's branches, the votes' k samples); Entropix's look-ahead
rollouts are not candidate answers, so they show in its seconds, not in its tokens.

Records: docs/records/sampler_costs/MODEL-CONDITION.jsonl.gz, one answer a line with the
item's index (never its question), and the run's settings in the .json beside it
(research/cost_records.py). The same command again resumes after Ctrl-C.
"""

# ruff: noqa: E402  (the imports after enable())
import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

from entropix_mlx.accel.weights import default_weights, describe
from entropix_mlx.api import load_model, prompt_ids
from entropix_mlx.decode.rows import Request
from entropix_mlx.errors import EntropixError
from entropix_mlx.eval import EvalConfig, item_seed, load_tasks, machine_description, rows_for, score, select_split
from entropix_mlx.eval.neighbour import SPIN_CODE, busy_neighbour
from entropix_mlx.eval.runner import item_range
from entropix_mlx.eval.store import sampler_settings, settings_changed
from entropix_mlx.front import EVAL_SAMPLER_NAMES, choose

from .cost_records import markdown, read_records, settings_path, table_rows, write_records, write_settings

RECORDS = ROOT / "docs" / "records" / "sampler_costs"
SAMPLERS = "greedy,entropix,deliberate,deliberate_staged,self_consistency,cisc"
WARM_UP_TOKENS = 4
NEIGHBOUR = "one Python process spinning on one core for the whole run (entropix_mlx.eval.neighbour.SPIN_CODE)"
# What a resumed run must share with the records already written.
IDENTITY = ("model", "model_sha256", "tasks", "split", "cot", "reasoning", "max_tokens", "seed", "k", "condition")
HASHED_BYTES = 8 << 30  # a model file larger than this is named, not hashed (minutes of reading)


@dataclass
class Options:
    cot: bool = True
    reasoning: bool = True
    max_tokens: int = 768
    seed: int = 0
    k: int = 8


@dataclass
class Spent:
    """What one answer took."""

    tokens: int  # generated, every candidate counted, as the decoder reports it
    candidate_tokens: list[int]  # each candidate's own tokens (a branch's after its split)
    answer: list[int]  # the final answer's tokens
    finish_reason: str
    seconds: float


def overrides(choice, options: Options) -> dict:
    """The request's settings: the votes' k, and the reasoning setting where the sampler has one."""
    return {
        "reasoning": options.reasoning and choice.spec.reasoning,
        **({"k": options.k} if choice.spec.votes else {}),
    }


def answer(loaded, choice, task, options: Options, max_tokens: int) -> Spent:
    """One question answered as a user gets it; the clock runs from the request to the answer."""
    start = time.perf_counter()
    ids = prompt_ids(loaded.tokenizer, task.prompt_text(options.cot))
    seed = item_seed(options.seed, task.index)
    prepared = loaded.prepare(ids, choice, max_tokens, seed, **overrides(choice, options))
    if not choice.spec.everywhere:  # the votes: their answer is in once all k samples are
        config = EvalConfig(samplers=[choice.name], cot=options.cot, batch_size=prepared.sampler.config.k)
        request = Request(prepared.ids, seed, prepared.max_tokens)
        # One question: all of its prompt but the last token is the prefix its k rows share.
        rows = rows_for(prepared.sampler, None, loaded.model, loaded.tokenizer, [request], [task], config, ids[:-1])
        [(_, result, _)] = list(rows)
        seconds, own = time.perf_counter() - start, [s["tokens"] for s in result.extra["samples"]]
        return Spent(result.extra["tokens_spent"], own, result.tokens, result.finish_reason, seconds)
    generation = loaded.generate(prepared)
    for _ in generation:
        pass
    seconds = time.perf_counter() - start
    summary = generation.summary()
    deliberation = getattr(generation, "deliberation", None)  # deliberate: every candidate it wrote
    own = [c.own_tokens for c in deliberation.candidates] if deliberation else [len(generation.tokens)]
    spent = getattr(summary, "tokens_spent", summary.tokens)
    return Spent(spent, own, list(generation.tokens), prepared.finish(summary.finish_reason), seconds)


def record(loaded, choice, task, spent: Spent, condition: str, options: Options) -> dict:
    output = loaded.tokenizer.decode(spent.answer)
    extracted, correct = score(output, task, cot=options.cot)
    settings = overrides(choice, options)
    return {
        "sampler": choice.name,
        "reasoning": settings["reasoning"],
        **({"k": settings["k"]} if "k" in settings else {}),
        "index": task.index,
        "condition": condition,
        "seed": item_seed(options.seed, task.index),
        "tokens": spent.tokens,
        "candidates": len(spent.candidate_tokens),
        "candidate_tokens": spent.candidate_tokens,
        "answer_tokens": len(spent.answer),
        "seconds": round(spent.seconds, 3),
        "finish_reason": spent.finish_reason,
        "cut_off": spent.finish_reason in ("length", "context"),
        "expected": task.expected,
        "extracted": extracted,
        "correct": correct,
        "output": output,
        "load_average": round(os.getloadavg()[0], 2),  # the last minute's, as the answer ends
    }


def measure(loaded, tasks, names: list[str], options: Options, condition: str, out: Path, progress=print) -> list:
    """Every (item, sampler) `out` lacks, answered and added to it one by one; all its records."""
    records = read_records(out)
    done = {(r["sampler"], r["index"]) for r in records}
    choices = [choose(name, {}, EVAL_SAMPLER_NAMES) for name in names]
    todo = [(t, c) for t in tasks for c in choices if (c.name, t.index) not in done]
    for choice in [c for c in choices if any(c is d for _, d in todo)]:  # what a first answer pays once, not counted
        answer(loaded, choice, tasks[0], options, WARM_UP_TOKENS)
    for task, choice in todo:
        spent = answer(loaded, choice, task, options, options.max_tokens)
        records.append(record(loaded, choice, task, spent, condition, options))
        write_records(out, records)
        r = records[-1]
        progress(f"{condition} item {task.index} {choice.name}: {r['tokens']} tokens, {r['seconds']:.1f} s")
    return records


def model_sha256(path: Path) -> str | None:
    """The model file's hash (seconds for a small model); None for a folder or a very large file."""
    if not path.is_file() or path.stat().st_size > HASHED_BYTES:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def run_settings(loaded, tasks, names, options: Options, condition: str, tasks_name: str, split: str) -> dict:
    samplers = {}
    for name in names:
        choice = choose(name, {}, EVAL_SAMPLER_NAMES)
        samplers[name] = sampler_settings(loaded.sampler(choice.name, **overrides(choice, options)))
    return {
        "script": "research/sampler_costs.py",
        "model": loaded.name,
        "model_file": loaded.source.path.name,
        "model_sha256": model_sha256(loaded.source.path),
        "compute": describe(loaded.model),
        "tasks": tasks_name,
        "split": split,
        "items": item_range([t.index for t in tasks]),
        "cot": options.cot,
        "reasoning": options.reasoning,
        "max_tokens": options.max_tokens,
        "seed": options.seed,
        "k": options.k,
        "condition": condition,
        "neighbour": NEIGHBOUR if condition == "busy" else None,
        "warm_up": f"each sampler first answers the first item with {WARM_UP_TOKENS} tokens, not recorded",
        "samplers": samplers,
        "commits": [commit()],
        "machine": f"{machine_description()}; CPU: {cpu_model()}",
        "date": date.today().isoformat(),
    }


def same_settings(samplers: dict) -> list[list[str]]:
    """The samplers that would answer alike here: one decoder with the same settings under
    two names (a card's reasoning setting can be a preset's rule)."""
    groups: dict[str, list[str]] = {}
    for name, settings in samplers.items():
        if settings:
            groups.setdefault(json.dumps(settings, sort_keys=True), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def resumed_settings(path: Path, now: dict) -> dict:
    """The settings of a run resumed at `path`: refused if it measured something else;
    the samplers, items and commits of both."""
    if not path.is_file():
        return now
    saved = json.loads(path.read_text())
    changed = [k for k in IDENTITY if saved.get(k) != now[k]]
    both = sorted(set(saved["samplers"]) & set(now["samplers"]))
    # A record written before a setting's rename holds the same settings under its earlier name.
    changed += [f"{n} settings" for n in both if settings_changed(saved["samplers"][n], now["samplers"][n])]
    if changed:
        raise SystemExit(f"{path} holds a run with other {', '.join(changed)}; give another --out or remove it")
    items = sorted({*item_indices(saved["items"]), *item_indices(now["items"])})
    commits = list(dict.fromkeys(saved["commits"] + now["commits"]))
    samplers = {**saved["samplers"], **now["samplers"]}
    return {**saved, "samplers": samplers, "items": item_range(items), "commits": commits}


def item_indices(text: str) -> list[int]:
    """The positions an `item_range` text names ("0-9, 20")."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def item_slice(value: str | None, count: int) -> slice:
    """--items A-B: positions A to B of the split, both included (as eval's --items)."""
    if value is None:
        return slice(None)
    first, dash, last = value.partition("-")
    if not (first.strip().isdigit() and (not dash or last.strip().isdigit())) or int(first) >= count:
        raise SystemExit(f"--items {value!r}: give positions such as 0-1 (from 0, both included) below {count}")
    return slice(int(first), int(last if dash else first) + 1)


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # the same way out as Ctrl-C: the neighbour ends, the records stay


def arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("model", help="a GGUF file, a model directory, a Hugging Face repo id or smollm2-135m")
    parser.add_argument("tasks", help="a task file, as eval takes")
    parser.add_argument("--items", help="positions A-B of the split (from 0, both included), e.g. 0-1")
    parser.add_argument("--split", default="test", choices=("dev", "test", "all"))
    parser.add_argument("--samplers", default=SAMPLERS, help=f"comma-separated (default {SAMPLERS})")
    parser.add_argument("--cot", action="store_true", help="chain of thought, as eval --cot")
    parser.add_argument("--reasoning", action=argparse.BooleanOptionalAction, help="default: on with --cot")
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--k", type=int, default=8, help="samples self_consistency and cisc vote over")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights", default=default_weights())
    parser.add_argument("--busy", action="store_true", help="beside one process spinning on one core")
    parser.add_argument("--out", type=Path, help="default: docs/records/sampler_costs/MODEL-CONDITION.jsonl.gz")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = arguments(argv)
    names = [n.strip() for n in args.samplers.split(",") if n.strip()]
    reasoning = args.cot if args.reasoning is None else args.reasoning  # as eval: on with a chain of thought
    options = Options(args.cot, reasoning, args.max_tokens, args.seed, args.k)
    condition = "busy" if args.busy else "quiet"
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        for name in names:  # an unknown name fails before the model loads
            choose(name, {}, EVAL_SAMPLER_NAMES)
        loaded = load_model(args.model, weights=args.weights)
        tasks = select_split(load_tasks(args.tasks), args.split)
        tasks = tasks[item_slice(args.items, len(tasks))]
        out = args.out or RECORDS / f"{loaded.name}-{condition}.jsonl.gz"
        out.parent.mkdir(parents=True, exist_ok=True)
        now = run_settings(loaded, tasks, names, options, condition, Path(args.tasks).name, args.split)
        for alike in same_settings(now["samplers"]):
            print(f"note: {' and '.join(alike)} have the same settings here: the same decoder, measured twice")
        write_settings(settings_path(out), resumed_settings(settings_path(out), now))
        with busy_neighbour(1, SPIN_CODE) if args.busy else nullcontext():
            records = measure(loaded, tasks, names, options, condition, out)
    except EntropixError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; the finished answers are kept: the same command continues", file=sys.stderr)
        return 130
    print(markdown(table_rows([(out, json.loads(settings_path(out).read_text()), records)], ROOT)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
