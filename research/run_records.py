"""Keep an `eval --out` folder in the repository, and bring it back to resume.

The figures in docs/evaluation.md come from runs that take longer than one working
session, on machines that do not keep files between sessions. `pack` writes a folder's
records to docs/records/NAME/ (config.json, scoring_log.jsonl, results.json and the records as gzipped
parts) without the question texts, which are the data set's and not ours to ship; `unpack`
puts them back from the task file, so that `eval --out` resumes the run or re-scores it.
Each `pack` adds parts holding only the records the earlier parts lack, so the
repository's history holds each record once however often a growing run is packed.
A part stays under PART_BYTES, so no file the repository tracks grows past 2 MB.

    python -m research.run_records pack runs/q15 docs/records/q15
    python -m research.run_records unpack docs/records/q15 runs/q15 ../shared/data/gsm8k_test.jsonl
"""

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

from entropix_mlx.eval.tasks import load_tasks  # noqa: E402

KEPT_FILES = ("config.json", "scoring_log.jsonl", "results.json")  # results.json: the summary eval wrote
PART_BYTES = 1_500_000


def key(record: dict) -> tuple:
    return record["sampler"], record["seed"], record["index"]


def parts(folder: Path) -> list[Path]:
    return sorted(folder.glob("items-*.jsonl.gz"))


def packed_records(folder: Path) -> list[dict]:
    records = []
    for part in parts(folder):
        with gzip.open(part, "rt") as f:
            records += [json.loads(line) for line in f]
    return records


def split(lines: list[str], part_bytes: int) -> list[list[str]]:
    """Consecutive runs of lines whose gzipped sizes, each line on its own, sum to at most
    `part_bytes`. Lines compress no worse together than apart (each apart pays a header
    too), so a part's file stays under it; a line larger than that is a part of its own."""
    groups, size = [], 0
    for line in lines:
        n = len(gzip.compress(line.encode(), mtime=0))
        if not groups or size + n > part_bytes:
            groups.append([])
            size = 0
        groups[-1].append(line)
        size += n
    return groups


def pack(run_dir: Path, dest: Path, part_bytes: int = PART_BYTES) -> int:
    """Add the records of `run_dir` that `dest` lacks as new parts; how many."""
    if not (run_dir / "items.jsonl").is_file():
        raise SystemExit(f"{run_dir} holds no items.jsonl; give the folder an eval wrote with --out")
    dest.mkdir(parents=True, exist_ok=True)
    have = {key(r) for r in packed_records(dest)}
    lines = []
    for line in (run_dir / "items.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interruption: that item runs again
        if key(record) not in have:
            record.pop("question", None)
            lines.append(json.dumps(record) + "\n")
    for name in KEPT_FILES:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, dest / name)
    for group in split(lines, part_bytes):
        part = dest / f"items-{len(parts(dest)) + 1:03d}.jsonl.gz"
        # mtime 0: the same records give the same bytes.
        with open(part, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write("".join(group).encode())
    return len(lines)


def unpack(src: Path, run_dir: Path, tasks_file: Path) -> int:
    if not parts(src):
        raise SystemExit(f"{src} holds no packed records (items-*.jsonl.gz); give a folder `pack` wrote")
    questions = {task.index: task.question for task in load_tasks(tasks_file)}
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "items.jsonl").exists():
        raise SystemExit(f"{run_dir} already holds records; unpack into a new folder")
    lines = []
    for record in packed_records(src):
        if record["index"] not in questions:
            raise SystemExit(f"{tasks_file} has no item {record['index']}; give the task file the run used")
        lines.append(json.dumps({**record, "question": questions[record["index"]]}) + "\n")
    (run_dir / "items.jsonl").write_text("".join(lines))
    for name in KEPT_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, run_dir / name)
    return len(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="an eval --out folder into the repository")
    p.add_argument("run_dir", type=Path)
    p.add_argument("dest", type=Path)
    u = sub.add_parser("unpack", help="records from the repository into an eval --out folder")
    u.add_argument("src", type=Path)
    u.add_argument("run_dir", type=Path)
    u.add_argument("tasks_file", type=Path)
    args = parser.parse_args()
    if args.command == "pack":
        n = pack(args.run_dir, args.dest)
        print(f"{n} records from {args.run_dir} into {args.dest}")
    else:
        n = unpack(args.src, args.run_dir, args.tasks_file)
        print(f"{n} records from {args.src} into {args.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
