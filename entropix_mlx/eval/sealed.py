"""Sealed task files: items nobody may look at before a configuration is frozen,
then scored once.

A task file is sealed when a `<file>.sealed` file lies beside it or its SHA-256 is
in SEALED_TASKS (files the project cannot mark, such as a shared data set). Each
scoring of a sealed file is logged, with each row's configuration hash, the
commit and the time, in the run's `scoring_log.jsonl` and in the machine's log
for that file (`sealed/<file hash>.jsonl` in the user cache). A sampler name
already scored there on the same model with another configuration is refused
before anything runs, unless the caller asks to rescore, which the log then says.
Another model may be scored under a frozen configuration's name: that is the
configuration tested again, not tuned.
"""

import hashlib
import json
import subprocess
import time
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from ..files import private_folder, user_cache_dir
from .store import settings_class

SEALED_TASKS = "sealed_tasks.txt"  # in entropix_mlx/data: one SHA-256 per line, `#` comments


def file_hash(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def listed_hashes() -> set[str]:
    text = (resources.files("entropix_mlx.data") / SEALED_TASKS).read_text()
    return {line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")}


def is_sealed(path) -> bool:
    if path is None:
        return False
    path = Path(path)
    return Path(f"{path}.sealed").exists() or file_hash(path) in listed_hashes()


def config_hash(identity: dict, name: str) -> str:
    """What a row's answers depend on: the model, the budget, the prompt and the
    sampler's settings (a frozen config file's fields among them)."""
    keys = ("model", "max_tokens", "prompt_version", "split", "cot")
    what = {k: identity.get(k) for k in keys} | {"sampler": name, "settings": identity["samplers"].get(name)}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def config_hashes(identity: dict, name: str) -> set[str]:
    """`config_hash` now, and as a log written before a setting's rename holds it:
    the same configuration under its earlier names."""
    settings = identity["samplers"].get(name)
    cls = settings_class(settings) if isinstance(settings, dict) else None
    if cls is None:
        return {config_hash(identity, name)}
    earlier = {**identity, "samplers": {**identity["samplers"], name: cls.earlier_names(settings)}}
    return {config_hash(identity, name), config_hash(earlier, name)}


def commit() -> str | None:
    """The checkout's commit, if the package runs from one."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def machine_log(task_hash: str) -> Path | None:
    """This machine's log of the file's scorings (None: no private cache folder)."""
    try:
        folder = user_cache_dir() / "sealed"
    except RuntimeError:  # no home folder
        return None
    return None if private_folder(folder) else folder / f"{task_hash}.jsonl"


def read_log(path: Path | None) -> list[dict]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SealedFile:
    """The scoring rules of one sealed task file."""

    def __init__(self, path, out_dir=None):
        self.path, self.hash = Path(path), file_hash(path)
        self.logs = [machine_log(self.hash)] + ([Path(out_dir) / "scoring_log.jsonl"] if out_dir else [])

    def earlier(self) -> list[dict]:
        seen, out = set(), []
        for entry in (e for log in self.logs for e in read_log(log)):
            key = json.dumps(entry, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(entry)
        return out

    def check(self, identity: dict, names, rescore: bool = False) -> None:
        """Refuse rows whose sampler name was scored on this file and model with another configuration."""
        if rescore:
            return
        # An entry that names no model (written before entries did) counts as this model's.
        same_model = [e for e in self.earlier() if e.get("model", identity["model"]) == identity["model"]]
        for name in names:
            mine = config_hashes(identity, name)
            other = next(
                (e for e in same_model for r in e.get("rows", []) if r["sampler"] == name and r["config"] not in mine),
                None,
            )
            if other is not None:
                raise ConfigError(
                    f"{self.path.name} is sealed and sampler '{name}' was scored on it with this model at "
                    f"{other['time']} with another configuration; score a frozen configuration once, or pass rescore_sealed "
                    "to score this one too (the log will say so)",
                    settings=("rescore_sealed",),
                )

    def log(self, identity: dict, names, items: str, rescore: bool = False) -> dict:
        entry = {
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "file": self.path.name,
            "file_sha256": self.hash,
            "model": identity["model"],
            "items": items,
            "commit": commit(),
            "rows": [{"sampler": n, "config": config_hash(identity, n)} for n in names],
            "rescore": rescore,
        }
        for log in self.logs:
            if log is not None:
                with open(log, "a") as f:
                    f.write(json.dumps(entry) + "\n")
        return entry


def log_offline_scoring(folder, tasks_path, rows: list[str], items: str, by: str) -> None:
    """A script that scores an eval result folder's stored answers again (research/pairs.py,
    research/deliberate_budget.py, ...) logs it in the folder's `scoring_log.jsonl` as `eval`
    logs its own, unless the folder holds dev items; a sealed task file is refused, since
    only `eval` keeps the sealed log."""
    if is_sealed(tasks_path):
        raise ConfigError(f"{tasks_path} is sealed: score it with entropix-mlx eval, which logs each scoring once")
    folder = Path(folder)
    config = folder / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("split") == "dev":
        return
    entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "items": items, "rows": rows, "by": by, "commit": commit()}
    with open(folder / "scoring_log.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
