"""The resumable part of an eval, shared by the accuracy eval (`runner`) and the
open-text eval (`opentext`): the result directory and the loop over runs.

Every (sampler, seed, item) record is appended to DIR/items.jsonl as soon as it
completes, with the question and a hash of its prompt; DIR/config.json records
what the results are about (model, max tokens, sampler settings, ...). Rerunning
the same command after an interruption checks both, skips what is done and
continues; more items add to it. DIR/results.json holds the summary.
"""

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path

from ..decode.rows import Request
from ..distributed import World, agree, all_gather_json, run_on_root, world
from ..errors import ConfigError
from ..front.registry import BASELINE, build
from ..sampling.config import SamplerConfig
from ..sampling.deliberate_config import DeliberateConfig
from ..sampling.voting import VoteConfig


def item_seed(run_seed: int, index: int) -> int:
    """The seed of one item's answer: fixed by the run's seed and the item, not by
    the batch it lands in, so results do not depend on the batch size."""
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


def settings_class(settings: dict):
    """The settings class whose fields `settings` (a sampler's, as a record holds them) has; None: a baseline's."""
    return next(
        (c for c in (SamplerConfig, DeliberateConfig, VoteConfig) if set(settings) == {f.name for f in fields(c)}), None
    )


def settings_changed(saved: dict, now: dict) -> bool:
    """Whether a sampler's settings differ from those a folder was written with.
    A setting added to the code since then resumes at its default, which keeps
    the earlier behaviour (e.g. deliberate's stop_share 0: no early stop); one
    renamed since (or a value) is compared under its name now."""
    cls = settings_class(now)
    defaults, saved = (cls().to_dict(), cls.current_names(saved)) if cls else ({}, saved)
    missing = object()
    return any(k not in now for k in saved) or any(saved.get(k, defaults.get(k, missing)) != v for k, v in now.items())


def settings_by_sampler(make_sampler: Callable, runs: list[tuple[str, int]]) -> dict:
    """Each sampler the runs use, by name, with its settings: part of a run's identity."""
    return {name: sampler_settings(make_sampler(name)) for name in dict.fromkeys(n for n, _ in runs)}


def default_sampler_factory(tokenizer, config) -> Callable:
    """`make_sampler(name)` with the model's card and metrics off for baselines:
    the records hold each token's log-probability, never its metrics."""
    return lambda name: build(name, tokenizer, card=config.model_name, metrics=False)


class ResultStore:
    """DIR/config.json, DIR/items.jsonl (append-only), DIR/results.json."""

    def __init__(self, out_dir, identity: dict):
        self.dir = Path(out_dir) if out_dir is not None else None
        self.records: dict[tuple, dict] = {}
        if self.dir is None:
            return
        if self.dir.exists() and not self.dir.is_dir():
            raise ConfigError(f"the result directory {self.dir} is a file; give a directory")
        self.dir.mkdir(parents=True, exist_ok=True)
        config_file = self.dir / "config.json"
        if config_file.exists():
            try:
                saved = json.loads(config_file.read_text())
            except json.JSONDecodeError:
                saved = None
            if not isinstance(saved, dict):
                raise ConfigError(f"{config_file} is not an eval config; use another result directory")
            differ = [k.replace("_", " ") for k in identity if k != "samplers" and saved.get(k) != identity[k]]
            differ += [
                f"settings of sampler '{n}'"
                for n, s in identity["samplers"].items()
                if n in saved.get("samplers", {}) and settings_changed(saved["samplers"][n], s)
            ]
            if differ:
                raise ConfigError(
                    f"{self.dir} holds results of a different eval ({', '.join(differ)} changed); "
                    "use another result directory, or delete it to start over"
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

    def check_items(self, items: list, prompts: list[list[int]]):
        """Saved records must be about the same items with the same prompts."""
        by_index = {t.index: (t, digest(p)) for t, p in zip(items, prompts, strict=False)}
        for r in self.records.values():
            item, prompt_digest = by_index.get(r["index"], (None, None))
            if item is not None and (r.get("question") != item.question or r.get("prompt_sha256") != prompt_digest):
                raise ConfigError(
                    f"{self.dir} holds results for other questions or prompts (item {r['index'] + 1} differs); "
                    "use another result directory, or delete it to start over"
                )

    def add(self, record: dict):
        self.records[(record["sampler"], record["seed"], record["index"])] = record
        if self.dir is not None:
            with open(self.dir / "items.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def log_scoring(self, entry: dict, written: bool = False) -> list[dict]:
        """Append one scoring of these items to DIR/scoring_log.jsonl (unless
        `written` there already); every entry so far, this one last (just this one
        without a directory)."""
        if self.dir is None:
            return [entry]
        log = self.dir / "scoring_log.jsonl"
        if not written:
            with open(log, "a") as f:
                f.write(json.dumps(entry) + "\n")
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    def write_results(self, results: dict):
        if self.dir is not None:
            (self.dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def open_store(out_dir, identity: dict, items: list, prompts: list[list[int]], runs, progress=None):
    """The result store for these items (resumed when `out_dir` holds one for the
    same identity), the number of answers the run needs and how many are done."""
    store = ResultStore(out_dir, identity)
    store.check_items(items, prompts)
    total = len(runs) * len(items)
    done = sum((name, seed, item.index) in store.records for name, seed in runs for item in items)
    if progress:
        progress(done, total, "resuming" if done else "starting", 0, len(items))
    return store, total, done


def new_record(name: str, seed: int, item, prompt_of: dict, fields: dict) -> dict:
    """The fields every record starts with, then the mode's `fields`."""
    return {
        "sampler": name,
        "seed": seed,
        "index": item.index,
        "question": item.question,
        "prompt_sha256": digest(prompt_of[item.index]),
        **fields,
    }


def budget_of(max_tokens, name: str) -> int:
    """The token limit of run `name`: `max_tokens` itself, or its value for that run."""
    return max_tokens(name) if callable(max_tokens) else max_tokens


Rows = Callable[[str, list, list[Request], list[int]], Iterable[tuple[int, object, float]]]


def run_items(
    items: list,
    prompts: list[list[int]],
    identity: dict,
    runs: list[tuple[str, int]],
    max_tokens: int | Callable[[str], int],
    rows: Rows,
    fields: Callable[[object, list[int], object, float], dict],
    out_dir=None,
    progress=None,
    on_record: Callable[[dict], None] | None = None,
    batch_size: int = 8,
) -> ResultStore | None:
    """Every (sampler name, run seed) of `runs` over the items the store at
    `out_dir` does not hold yet; returns the store, every record in it.
    Under a launcher with several ranks, see `run_items_sharded`: rank 0 gets
    the store, the others None.

    Items have `.index` and `.question`; `prompts[k]` is items[k]'s prompt tokens.
    `rows(name, todo, requests, prefix)` yields (i, result, seconds) for todo[i],
    in any order. `fields(item, prompt, result, seconds)` is the mode's part of
    the record, after the fields every record starts with. `progress(done, total,
    description)` is called after every item; `on_record(record)` sees each new
    record after it is saved (tests use it to interrupt a run)."""
    w = world()
    if w.size > 1:
        return run_items_sharded(
            w, items, prompts, identity, runs, max_tokens, rows, fields, out_dir, progress, on_record, batch_size
        )
    store, total, done = open_store(out_dir, identity, items, prompts, runs, progress)
    prefix = common_prefix(prompts)
    prompt_of = {item.index: p for item, p in zip(items, prompts, strict=False)}

    for name, seed in runs:
        todo = [item for item in items if (name, seed, item.index) not in store.records]
        if not todo:
            continue
        requests = [
            Request(prompt_of[item.index], item_seed(seed, item.index), budget_of(max_tokens, name)) for item in todo
        ]
        run_done = len(items) - len(todo)
        if progress:  # the run starts: its first answers take a batch's time
            progress(done, total, run_label(name, seed), run_done, len(items))
        for i, result, seconds in rows(name, todo, requests, prefix):
            record = new_record(
                name, seed, todo[i], prompt_of, fields(todo[i], prompt_of[todo[i].index], result, seconds)
            )
            done, run_done = done + 1, run_done + 1
            keep(store, record, (done, total, run_done, len(items)), progress, on_record)
    return store


def keep(store: ResultStore, record: dict, counts: tuple, progress, on_record) -> None:
    """Save a new record, then report it (`run_items`' `progress` and `on_record`):
    `counts` are (answers done, answers in all, the run's items done, its items)."""
    store.add(record)
    if progress:
        done, total, run_done, run_items = counts
        progress(done, total, run_label(record["sampler"], record["seed"]), run_done, run_items)
    if on_record:
        on_record(record)


def run_label(name: str, seed: int) -> str:
    return f"{name} seed {seed}" if name != BASELINE else name


def run_items_sharded(
    w: World, items, prompts, identity, runs, max_tokens, rows, fields, out_dir, progress, on_record, batch_size
) -> ResultStore | None:
    """`run_items` over the ranks of `w`. Rank 0 alone opens the store (the
    others may run on machines without the result folder) and tells every rank
    what is done. Each run's remaining items go in chunks of a few batches per
    rank; each rank answers every size-th item of a chunk, and after each chunk
    rank 0 gathers the records and appends them to items.jsonl in item order.
    So a killed rank loses at most its current chunk, and a rerun with any
    number of ranks resumes from the file, as one process does. Answers do not
    depend on which rank or batch an item lands in (`item_seed`)."""
    digests = [digest(p) for p in prompts]
    mine = json.dumps([identity, [item.index for item in items], digests], sort_keys=True)
    agree(
        w,
        "eval items, prompts or settings",
        hashlib.sha256(mine.encode()).hexdigest(),
        "run the same command with the same files on every rank",
    )
    store, total, done = None, len(runs) * len(items), 0

    def open_root():
        nonlocal store, done
        store, _, done = open_store(out_dir, identity, items, prompts, runs, progress)
        return sorted(store.records)

    finished = {tuple(k) for k in run_on_root(w, open_root)}
    prefix = common_prefix(prompts)
    prompt_of = {item.index: p for item, p in zip(items, prompts, strict=False)}
    chunk = max(16, 2 * batch_size) * w.size
    for name, seed in runs:
        todo = [item for item in items if (name, seed, item.index) not in finished]
        run_done = len(items) - len(todo)
        if progress and todo and w.root:
            progress(done, total, run_label(name, seed), run_done, len(items))
        for start in range(0, len(todo), chunk):
            share = todo[start : start + chunk][w.rank :: w.size]
            requests = [
                Request(prompt_of[item.index], item_seed(seed, item.index), budget_of(max_tokens, name))
                for item in share
            ]
            records = []
            for i, result, seconds in rows(name, share, requests, prefix) if share else ():
                item = share[i]
                records.append(
                    new_record(name, seed, item, prompt_of, fields(item, prompt_of[item.index], result, seconds))
                )
            gathered = [r for part in all_gather_json(w, records) for r in part]
            if not w.root:
                continue
            for record in sorted(gathered, key=lambda r: r["index"]):
                done, run_done = done + 1, run_done + 1
                keep(store, record, (done, total, run_done, len(items)), progress, on_record)
    return store
