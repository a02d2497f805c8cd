"""The accuracy runner: every (sampler, seed) over the tasks, resumable, then a summary.

Greedy runs once (it is deterministic) and always (it is the baseline); other
samplers run once per seed. Each item's random key comes from the run seed and
the item's position (`item_seed`), never from the batch it lands in, so results
do not depend on --batch-size. Every (sampler, seed, item) result is appended to
DIR/items.jsonl as soon as it completes, with the question and a hash of its
prompt; DIR/config.json records the model, max tokens, prompt version, split and
sampler settings. Rerunning the same command after an interruption checks both,
skips what is done and continues; a larger --limit adds items. DIR/results.json
holds the summary.
"""

import hashlib
import json
import os
import platform
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from ..decode.generate import as_decoder
from ..decode.rows import Request
from ..errors import ConfigError
from .scoring import score
from .stats import paired_comparison, wilson_interval
from .tasks import PROMPT_VERSION, Task


def item_seed(run_seed: int, index: int) -> int:
    """The seed of one item's answer: fixed by the run's seed and the item, not by
    the batch it lands in, so results do not depend on --batch-size."""
    return (run_seed * 1_000_003 + index) % 2**63


def common_prefix(prompts: list[list[int]]) -> list[int]:
    """The tokens every prompt starts with, kept shorter than the shortest prompt."""
    if not prompts:
        return []
    prefix = os.path.commonprefix(prompts)
    return list(prefix[: min(len(p) for p in prompts) - 1])


def digest(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def sampler_settings(sampler) -> dict:
    config = getattr(sampler, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(getattr(sampler, "params", {}))


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


class ResultStore:
    """DIR/config.json, DIR/items.jsonl (append-only), DIR/results.json."""

    def __init__(self, out_dir, identity: dict):
        self.dir = Path(out_dir) if out_dir is not None else None
        self.records: dict[tuple, dict] = {}
        if self.dir is None:
            return
        if self.dir.exists() and not self.dir.is_dir():
            raise ConfigError(f"--out {self.dir} is a file; give a directory")
        self.dir.mkdir(parents=True, exist_ok=True)
        config_file = self.dir / "config.json"
        if config_file.exists():
            try:
                saved = json.loads(config_file.read_text())
            except json.JSONDecodeError:
                saved = None
            if not isinstance(saved, dict):
                raise ConfigError(f"{config_file} is not an eval config; use another --out directory")
            differ = [k.replace("_", " ") for k in identity if k != "samplers" and saved.get(k) != identity[k]]
            differ += [
                f"settings of sampler '{n}'"
                for n, s in identity["samplers"].items()
                if n in saved.get("samplers", {}) and saved["samplers"][n] != s
            ]
            if differ:
                raise ConfigError(
                    f"{self.dir} holds results of a different eval ({', '.join(differ)} changed); "
                    "use another --out directory, or delete it to start over"
                )
            identity = {**identity, "samplers": {**saved.get("samplers", {}), **identity["samplers"]}}
        config_file.write_text(json.dumps(identity, indent=2) + "\n")
        items = self.dir / "items.jsonl"
        if items.exists():
            for line in items.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self.records[(r["sampler"], r["seed"], r["index"])] = r
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short by an interruption: that item runs again
            # Drop a partial last line so appended records start on a line of their own.
            text = items.read_text()
            if text and not text.endswith("\n"):
                items.write_text(text[: text.rfind("\n") + 1])

    def check_items(self, tasks: list[Task], prompts: list[list[int]]):
        """Saved records must be about the same items with the same prompts."""
        by_index = {t.index: (t, digest(p)) for t, p in zip(tasks, prompts, strict=False)}
        for r in self.records.values():
            task, prompt_digest = by_index.get(r["index"], (None, None))
            if task is not None and (r.get("question") != task.question or r.get("prompt_sha256") != prompt_digest):
                raise ConfigError(
                    f"{self.dir} holds results for other questions or prompts (item {r['index'] + 1} differs); "
                    "use another --out directory, or delete it to start over"
                )

    def add(self, record: dict):
        self.records[(record["sampler"], record["seed"], record["index"])] = record
        if self.dir is not None:
            with open(self.dir / "items.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def write_results(self, results: dict):
        if self.dir is not None:
            (self.dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def default_sampler_factory(tokenizer, config: EvalConfig) -> Callable:
    """`make_sampler(name)` with the model's card, metrics off for baselines, and
    greedy's log-probabilities too: the records never hold them."""
    from ..decode.registry import make_sampler

    return lambda name: make_sampler(
        name, tokenizer=tokenizer, model_name=config.model_name, metrics=False, logprobs=False
    )


def open_store(out_dir, identity: dict, items: list, prompts: list[list[int]], runs, progress=None):
    """The result store for these items (resumed when `out_dir` holds one for the
    same identity), the number of answers the run needs and how many are done."""
    store = ResultStore(out_dir, identity)
    store.check_items(items, prompts)
    total = len(runs) * len(items)
    done = sum((name, seed, item.index) in store.records for name, seed in runs for item in items)
    if progress:
        progress(done, total, "resuming" if done else "starting")
    return store, total, done


def run_eval(
    model,
    tokenizer,
    tasks: list[Task],
    config: EvalConfig,
    out_dir=None,
    make_sampler: Callable | None = None,
    progress=None,
    on_record: Callable[[dict], None] | None = None,
) -> dict:
    """Run every (sampler, seed) over the tasks and summarize.

    `make_sampler(name)` builds one sampler (default: `samplers.make_sampler`
    with the model's card). `progress(done, total, description)` is called
    after every item. `on_record(record)` sees each new record after it is
    saved (tests use it to interrupt a run)."""
    from ..decode.prompt import encode_chat

    make_sampler = make_sampler or default_sampler_factory(tokenizer, config)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": t.prompt_text(config.cot)}]) for t in tasks]
    prompt_of = {t.index: p for t, p in zip(tasks, prompts, strict=False)}
    runs = config.runs()
    identity = {
        "model": config.model_name,
        "max_tokens": config.max_tokens,
        "prompt_version": PROMPT_VERSION,
        "split": config.split,
        "samplers": {name: sampler_settings(make_sampler(name)) for name in dict.fromkeys(n for n, _ in runs)},
    }
    if config.cot:  # only when on: directories written before --cot existed still resume
        identity["cot"] = True
    store, total, done = open_store(out_dir, identity, tasks, prompts, runs, progress)
    prefix = common_prefix(prompts)

    for name, seed in runs:
        todo = [t for t in tasks if (name, seed, t.index) not in store.records]
        if not todo:
            continue
        requests = [Request(prompt_of[t.index], item_seed(seed, t.index), config.max_tokens) for t in todo]
        decoder = as_decoder(make_sampler(name), lambda name=name: make_sampler(name))
        # A decoder that compares whole answers (deliberate) reads each candidate's answer as scoring does.
        rows = decoder.answer_rows(
            model,
            tokenizer,
            requests,
            config.batch_size,
            prefix,
            lambda i, text, todo=todo: score(text, todo[i], cot=config.cot)[0],
        )
        for i, result, seconds in rows:
            task = todo[i]
            output = tokenizer.decode(result.tokens)
            extracted, correct = score(output, task, cot=config.cot)
            record = {
                "sampler": name,
                "seed": seed,
                "index": task.index,
                "question": task.question,
                "prompt_sha256": digest(prompt_of[task.index]),
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
            store.add(record)
            done += 1
            if progress:
                progress(done, total, f"{name} seed {seed}" if name != "greedy" else name)
            if on_record:
                on_record(record)

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
    import mlx.core as mx

    device = mx.default_device()
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), MLX {mx.__version__} on {device}"
