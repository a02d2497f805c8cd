"""The records of research/sampler_costs.py, and the table research/tables.py builds from them.

A run writes RUN.jsonl.gz (one answer a line: the sampler, the item's index, what it spent
and how long it took, whether it was cut off and right, the machine's condition) and
RUN.json beside it (the model, the task file, the limits, each sampler's settings, the
commit, the machine). The table reads every run in one folder: per sampler, the tokens
generated per answer with every candidate counted, the seconds per answer in each
condition, how many answers were right and how many were cut off.
"""

import gzip
import json
import os
import statistics
import tempfile
from pathlib import Path

CONDITIONS = ("quiet", "busy")
RECORDS_SUFFIX = ".jsonl.gz"
NOTHING_YET = "*no records yet: research/sampler_costs.py writes them*"
COLUMNS = [
    "gen tokens / answer (× greedy)",
    "s / answer quiet: median (mean)",
    "s / answer busy: median (mean)",
    "right",
    "cut off",
    "records",
]


def settings_path(records: Path) -> Path:
    return records.with_name(records.name.removesuffix(RECORDS_SUFFIX) + ".json")


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """A reader (or a resumed run after Ctrl-C) sees the old file or the new one, never a cut one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(path: Path, records: list[dict]) -> None:
    """The whole file again: a run's records are few (samplers x items), and mtime 0
    keeps the same records the same bytes."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    write_bytes_atomic(path, gzip.compress(text.encode("utf-8"), mtime=0))


def write_settings(path: Path, settings: dict) -> None:
    write_bytes_atomic(path, (json.dumps(settings, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def label(record: dict) -> str:
    """The row's name, as a user asks for it."""
    name = record["sampler"] + (" --reasoning" if record.get("reasoning") else "")
    return f"{name} k={record['k']}" if "k" in record else name


def runs(folder: Path) -> list[tuple[Path, dict, list[dict]]]:
    """(records file, settings, records) of every run in `folder`, by file name."""
    out = []
    for path in sorted(folder.glob(f"*{RECORDS_SUFFIX}")):
        if not settings_path(path).is_file():
            raise SystemExit(f"{path}: no {settings_path(path).name} beside it; keep a run's two files together")
        out.append((path, json.loads(settings_path(path).read_text()), read_records(path)))
    return out


def summarize(folder: Path, root: Path) -> dict:
    """The table's rows from every run in `folder` (none yet: no rows)."""
    return table_rows(runs(folder) if folder.is_dir() else [], root)


def table_rows(found: list[tuple[Path, dict, list[dict]]], root: Path) -> dict:
    """Per sampler (first-measured order), what its answers cost in these runs, which
    must be of one model, task file and token limit, so that their rows compare;
    each row names where its records are (from `root`)."""
    same = {(s["model"], s["tasks"], s["max_tokens"], s["cot"]) for _, s, _ in found}
    if len(same) > 1:
        raise SystemExit(f"runs of different models, tasks or limits ({sorted(same)}): one table each")
    rows: dict[str, dict] = {}
    for path, _, records in found:
        folder = path.resolve().parent
        where = folder.relative_to(root).as_posix() if folder.is_relative_to(root) else str(folder)
        for r in records:
            row = rows.setdefault(label(r), {"answers": [], "seconds": {c: [] for c in CONDITIONS}, "records": set()})
            row["answers"].append(r)
            row["seconds"][r["condition"]].append(r["seconds"])
            row["records"].add(where)
    return {"rows": rows}


def seconds_cell(seconds: list[float]) -> str:
    if not seconds:
        return ""
    return f"{statistics.median(seconds):.1f} ({statistics.fmean(seconds):.1f})"


def times_greedy(answers: list[dict], greedy: dict) -> float | None:
    """Tokens spent over greedy's on the same answers (condition and item): a run cut
    short compares on what both have."""
    keys = [(r["condition"], r["index"]) for r in answers]
    paired = [(r["tokens"], greedy[key]) for r, key in zip(answers, keys, strict=True) if key in greedy]
    base = sum(g for _, g in paired)
    return sum(t for t, _ in paired) / base if base else None


def markdown(summary: dict) -> str:
    rows = summary["rows"]
    lines = ["| sampler | " + " | ".join(COLUMNS) + " |", "| --- |" + " --- |" * len(COLUMNS)]
    if not rows:
        return "\n".join([*lines, "| " + " | ".join([NOTHING_YET] + [""] * len(COLUMNS)) + " |"])
    greedy = {(r["condition"], r["index"]): r["tokens"] for r in rows["greedy"]["answers"]} if "greedy" in rows else {}
    for name, row in rows.items():
        answers = row["answers"]
        tokens = statistics.fmean(r["tokens"] for r in answers)
        ratio = f" ({times_greedy(answers, greedy):.2f})" if times_greedy(answers, greedy) else ""
        cells = [
            f"{tokens:.1f}{ratio}",
            seconds_cell(row["seconds"]["quiet"]),
            seconds_cell(row["seconds"]["busy"]),
            f"{sum(r['correct'] for r in answers)}/{len(answers)}",
            f"{sum(r['cut_off'] for r in answers)}/{len(answers)}",
            ", ".join(sorted(row["records"])),
        ]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)
