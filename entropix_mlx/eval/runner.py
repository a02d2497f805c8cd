"""The accuracy runner: every (sampler, seed) over the tasks, resumable (`store`),
then a summary.

Greedy runs once (it is deterministic) and always (it is the baseline); other
samplers run once per seed. Each item's random key comes from the run seed and
the item's position (`item_seed`), never from the batch it lands in, so results
do not depend on the batch size. DIR/config.json records the model, max tokens,
prompt version, split and sampler settings; `store` describes the rest of DIR.
"""

import os
import platform
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

import mlx.core as mx

from ..decode.generate import as_decoder
from ..front import encode_prompt
from ..front.registry import BASELINE
from ..sampling.recorder import KEPT_ALTERNATIVES, recording
from .scoring import score
from .store import default_sampler_factory, run_items, settings_by_sampler
from .summary import split_label, summarize_rows, with_budget
from .tasks import PROMPT_VERSION, Task


@dataclass
class EvalConfig:
    samplers: list[str]
    seeds: int = 1
    seed: int = 0  # the first run seed; runs use seed, seed + 1, ...
    max_tokens: int | list[int] = 32  # a list: every sampler runs at each budget, rows `name@budget`
    batch_size: int = 8
    model_name: str = "model"
    tasks_name: str = "tasks"
    split: str = "all"  # which split the tasks are (a label: the caller filters with select_split)
    cot: bool = False  # chain of thought: reasoning prompts, the answer read from the last line
    sealed: object = None  # a sealed task file's rules (sealed.SealedFile), or None
    rescore_sealed: bool = False  # score a sealed file with another configuration all the same (logged)

    @property
    def budgets(self) -> list[int | None]:
        """The token limits, or [None] for a single one (rows are then plain names)."""
        return list(self.max_tokens) if isinstance(self.max_tokens, list) else [None]

    def budget(self, label: str) -> int:
        return split_label(label)[1] or (self.max_tokens if isinstance(self.max_tokens, int) else self.max_tokens[0])

    def runs(self) -> list[tuple[str, int]]:
        """(run label, run seed) pairs; a label is the sampler's name, with
        `@budget` when there are several budgets. Greedy is deterministic: one
        run per budget, and it always runs, as the baseline."""
        out = []
        for budget in self.budgets:
            out.append((with_budget("greedy", budget), self.seed))
            for name in self.samplers:
                if name != BASELINE:
                    out += [(with_budget(name, budget), self.seed + s) for s in range(self.seeds)]
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

    `make_sampler(name)` builds one sampler (default: `front.registry.build`
    with the model's shipped card; the CLI passes its `LoadedModel.sampler`). `progress` is called
    after every item (`store.run_items` says with what). `on_record(record)` sees each new record after it is
    saved (tests use it to interrupt a run)."""
    named = make_sampler or default_sampler_factory(tokenizer, config)
    make_sampler = lambda label: named(split_label(label)[0])  # noqa: E731  (a run's label may carry @budget)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": t.prompt_text(config.cot)}]) for t in tasks]
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
        # Each slot's sampler records its alternatives: a vote or a margin is then recomputed from the records.
        make = lambda: recording(make_sampler(name), KEPT_ALTERNATIVES)  # noqa: E731
        return rows_for(make_sampler(name), make, model, tokenizer, requests, todo, config, prefix)

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
            "prompt_tokens": result.prompt_tokens,  # more than the prompt where it ran again (deliberate's stages)
            "logprobs": [None if lp is None else round(lp, 4) for lp in result.logprobs],
            "top": [[[t, round(lp, 3)] for t, lp in top] for top in result.tops],
            **result.extra,
        }

    if config.sealed is not None:  # refused before anything runs
        config.sealed.check(identity, list(identity["samplers"]), config.rescore_sealed)
    store = run_items(
        tasks, prompts, identity, runs, config.budget, rows, fields, out_dir, progress, on_record, config.batch_size
    )
    if store is None:  # a rank other than 0 under a launcher: rank 0 holds the records
        return None
    results = summarize(store.records, tasks, config, identity["samplers"])
    if config.sealed is not None:
        entry = config.sealed.log(identity, list(identity["samplers"]), results["item_range"], config.rescore_sealed)
        results["scorings"] = store.log_scoring(entry, written=True)
    elif config.split != "dev":  # the protocol: every scoring of held-out items is on record
        results["scorings"] = store.log_scoring(
            {
                "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                "items": results["item_range"],
                "rows": list(results["samplers"]),
            }
        )
    store.write_results(results)
    return results


def summarize(records: dict, tasks: list[Task], config: EvalConfig, settings: dict | None = None) -> dict:
    """The results of `records` over `tasks`: rows, pairs and warnings (`summary`),
    with what the eval was about."""
    rows, pairs, warnings = summarize_rows(records, tasks, config, settings)
    return {
        "model": config.model_name,
        "tasks": config.tasks_name,
        "split": config.split,
        "cot": config.cot,
        "items": len(tasks),
        "item_range": item_range([t.index for t in tasks]),
        "max_tokens": config.max_tokens,
        "batch_size": config.batch_size,
        "date": date.today().isoformat(),
        "machine": machine_description(),
        "samplers": rows,
        "pairs": pairs,
        "warnings": warnings,
    }


def item_range(indices: list[int]) -> str:
    """Which items, as runs of consecutive task-file positions: "200-499", "0-9, 20"."""
    runs, out = [], []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    for a, b in runs:
        out.append(f"{a}-{b}" if b > a else str(a))
    return ", ".join(out)


def machine_description() -> str:
    device = mx.default_device()
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), MLX {mx.__version__} on {device}"
