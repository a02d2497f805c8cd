"""The accuracy runner: every (sampler, seed) over the tasks, resumable (`store`),
then a summary.

Greedy runs once (it is deterministic) and always (it is the baseline); other
samplers run once per seed. Each item's random key comes from the run seed and
the item's position (`item_seed`), never from the batch it lands in, so results
do not depend on --batch-size. DIR/config.json records the model, max tokens,
prompt version, split and sampler settings; `store` describes the rest of DIR.
"""

import os
import platform
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from functools import partial

import mlx.core as mx

from ..decode.generate import as_decoder
from ..decode.prompt import encode_chat
from .scoring import score
from .stats import paired_comparison, wilson_interval
from .store import default_sampler_factory, run_items, settings_by_sampler
from .tasks import PROMPT_VERSION, Task


@dataclass
class EvalConfig:
    samplers: list[str]
    seeds: int = 1
    seed: int = 0  # the first run seed; runs use seed, seed + 1, ...
    max_tokens: int = 32
    batch_size: int = 8
    model_name: str = "model"
    tasks_name: str = "tasks"
    split: str = "all"  # which split the tasks are (a label: the caller filters with select_split)
    cot: bool = False  # chain of thought: reasoning prompts, the answer read from the last line

    def runs(self) -> list[tuple[str, int]]:
        """(sampler, run seed) pairs. Greedy is deterministic: one run, and it
        always runs, as the baseline of the paired comparison."""
        out = [("greedy", self.seed)]
        for name in self.samplers:
            if name != "greedy":
                out += [(name, self.seed + s) for s in range(self.seeds)]
        return out


def rows_for(sampler, make, model, tokenizer, requests, todo: list[Task], config: EvalConfig, prefix: list[int]):
    """How one sampler's answers are produced: (i, result, seconds) for each of
    `requests`, the answer to todo[i], by the sampler's decoder. A decoder that
    compares whole answers (deliberate) reads each candidate's answer as scoring
    does; a per-step sampler runs in the batch engine, `make()` giving each row
    its own sampler."""
    decoder = as_decoder(sampler, make)
    answer_of = lambda i, text: score(text, todo[i], cot=config.cot)[0]  # noqa: E731
    return decoder.answer_rows(model, tokenizer, requests, config.batch_size, prefix, answer_of)


def run_eval(
    model,
    tokenizer,
    tasks: list[Task],
    config: EvalConfig,
    out_dir=None,
    make_sampler: Callable | None = None,
    progress=None,
    on_record: Callable[[dict], None] | None = None,
) -> dict | None:
    """Run every (sampler, seed) over the tasks and summarize. Under a launcher
    with several ranks the items are shared out (`store.run_items_sharded`);
    rank 0 returns the results, the others None.

    `make_sampler(name)` builds one sampler (default: `samplers.make_sampler`
    with the model's card). `progress(done, total, description)` is called
    after every item. `on_record(record)` sees each new record after it is
    saved (tests use it to interrupt a run)."""
    make_sampler = make_sampler or default_sampler_factory(tokenizer, config)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": t.prompt_text(config.cot)}]) for t in tasks]
    runs = config.runs()
    identity = {
        "model": config.model_name,
        "max_tokens": config.max_tokens,
        "prompt_version": PROMPT_VERSION,
        "split": config.split,
        "samplers": settings_by_sampler(make_sampler, runs),
    }
    if config.cot:  # only when on: a directory written without the key still resumes
        identity["cot"] = True

    def rows(name, todo, requests, prefix):
        return rows_for(
            make_sampler(name), partial(make_sampler, name), model, tokenizer, requests, todo, config, prefix
        )

    def fields(task, prompt, result, seconds):
        output = tokenizer.decode(result.tokens)
        extracted, correct = score(output, task, cot=config.cot)
        return {
            "expected": task.expected,
            "extracted": extracted,
            "correct": correct,
            "output": output,
            "tokens": len(result.tokens),
            "strategies": dict(Counter(result.strategies)),
            "thinking_insertions": result.thinking_insertions,
            "finish_reason": result.finish_reason,
            "seconds": round(seconds, 4),
            **getattr(result, "extra", {}),
        }

    store = run_items(
        tasks, prompts, identity, runs, config.max_tokens, rows, fields, out_dir, progress, on_record, config.batch_size
    )
    if store is None:  # a rank other than 0 under a launcher: rank 0 holds the records
        return None
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
            run_stats.append(
                {
                    "seed": seed,
                    "correct": k,
                    "n": n,
                    "accuracy": k / n,
                    "ci95": list(wilson_interval(k, n)),
                    "mean_tokens": tokens / n,
                    "tokens_per_second": tokens / seconds if seconds else 0.0,
                }
            )
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
        shares, categories = share_correct(runs), {}
        for t in tasks:
            if t.category is not None:
                categories.setdefault(t.category, []).append(shares[t.index])
        if categories:
            entry["categories"] = {
                c: {"n": len(v), "accuracy": statistics.fmean(v)} for c, v in sorted(categories.items())
            }
        if name != "greedy":
            entry["vs_greedy"] = paired_comparison(shares, greedy_share)
        out[name] = entry
    return {
        "model": config.model_name,
        "tasks": config.tasks_name,
        "split": config.split,
        "cot": config.cot,
        "items": len(indices),
        "max_tokens": config.max_tokens,
        "batch_size": config.batch_size,
        "date": date.today().isoformat(),
        "machine": machine_description(),
        "samplers": out,
    }


def machine_description() -> str:
    device = mx.default_device()
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), MLX {mx.__version__} on {device}"
