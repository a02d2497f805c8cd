"""research/run_records.py: an eval folder kept in the repository without the data set's
questions, and brought back so that eval resumes from it."""

import gzip
import json
import random
from pathlib import Path

import pytest

from entropix_mlx.eval.store import ResultStore, digest
from entropix_mlx.eval.tasks import load_tasks
from research import run_records

ROOT = Path(__file__).resolve().parents[2]

IDENTITY = {"model": "m", "max_tokens": 8, "prompt_version": 1, "split": "test", "samplers": {"greedy": {}}}


@pytest.fixture
def run(tmp_path):
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(
        "".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(3))
    )
    tasks = load_tasks(tasks_file)
    prompts = [[1, 2, 3 + t.index] for t in tasks]
    out = tmp_path / "run"
    store = ResultStore(out, IDENTITY)
    for task, prompt in zip(tasks[:2], prompts, strict=False):
        store.add(
            {
                "sampler": "greedy",
                "seed": 0,
                "index": task.index,
                "question": task.question,
                "prompt_sha256": digest(prompt),
                "correct": True,
                "output": "Answer: 2",
                "logprobs": [-0.5],
            }
        )
    store.log_scoring({"items": "0-1", "rows": ["greedy"]})
    with open(out / "items.jsonl", "a") as f:
        f.write('{"sampler": "greedy", "se')  # an interrupted write
    return tasks_file, tasks, prompts, out


def test_packed_records_hold_no_question_and_unpack_to_a_folder_eval_resumes(run, tmp_path):
    tasks_file, tasks, prompts, out = run
    kept = tmp_path / "docs" / "records" / "r"
    assert run_records.pack(out, kept) == 2
    packed = gzip.open(kept / "items-001.jsonl.gz", "rt").read()
    assert "What is" not in packed and '"output": "Answer: 2"' in packed
    assert (kept / "scoring_log.jsonl").read_text() == (out / "scoring_log.jsonl").read_text()

    back = tmp_path / "back"
    assert run_records.unpack(kept, back, tasks_file) == 2
    resumed = ResultStore(back, IDENTITY)
    resumed.check_items(tasks, prompts)  # raises if a question or prompt differs
    assert resumed.records == ResultStore(out, IDENTITY).records
    assert sorted(i for _, _, i in resumed.records) == [0, 1]


def test_a_growing_run_packs_each_record_once(run, tmp_path):
    tasks_file, tasks, prompts, out = run
    kept = tmp_path / "kept"
    assert run_records.pack(out, kept) == 2
    first = (kept / "items-001.jsonl.gz").read_bytes()
    assert run_records.pack(out, kept) == 0 and sorted(p.name for p in kept.iterdir() if "items" in p.name) == [
        "items-001.jsonl.gz"
    ]
    store = ResultStore(out, IDENTITY)
    store.add(
        {
            "sampler": "greedy",
            "seed": 0,
            "index": 2,
            "question": tasks[2].question,
            "prompt_sha256": digest(prompts[2]),
            "correct": False,
            "output": "Answer: 5",
        }
    )
    assert run_records.pack(out, kept) == 1
    assert (kept / "items-001.jsonl.gz").read_bytes() == first
    assert gzip.open(kept / "items-002.jsonl.gz", "rt").read().count("\n") == 1
    back = tmp_path / "back"
    assert run_records.unpack(kept, back, tasks_file) == 3
    assert ResultStore(back, IDENTITY).records == ResultStore(out, IDENTITY).records


def test_unpack_and_pack_refuse_what_they_cannot_use(run, tmp_path):
    tasks_file, _, _, out = run
    kept = tmp_path / "kept"
    run_records.pack(out, kept)
    with pytest.raises(SystemExit, match="already holds records"):
        run_records.unpack(kept, out, tasks_file)
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"question": "What is 0 + 0?", "answer": "0"}) + "\n")
    with pytest.raises(SystemExit, match="has no item 1"):
        run_records.unpack(kept, tmp_path / "other", short)
    with pytest.raises(SystemExit, match="no packed records"):
        run_records.unpack(tmp_path, tmp_path / "other", tasks_file)
    with pytest.raises(SystemExit, match="holds no items.jsonl"):
        run_records.pack(tmp_path / "missing", kept)


def test_a_large_run_packs_into_parts_each_under_the_cap(run, tmp_path):
    tasks_file, tasks, prompts, out = run
    rng = random.Random(0)
    with open(out / "items.jsonl", "a") as f:
        f.write("\n")  # ends the interrupted write
        for seed in range(1, 40):
            record = {"sampler": "greedy", "seed": seed, "index": 0, "question": tasks[0].question}
            f.write(json.dumps({**record, "logprobs": [rng.random() for _ in range(60)]}) + "\n")
    kept = tmp_path / "kept"
    assert run_records.pack(out, kept, part_bytes=4000) == 41
    sizes = [p.stat().st_size for p in run_records.parts(kept)]
    assert len(sizes) > 2 and max(sizes) <= 4000
    assert run_records.unpack(kept, tmp_path / "back", tasks_file) == 41
    back = [json.loads(line) for line in (tmp_path / "back" / "items.jsonl").read_text().splitlines()]
    assert [run_records.key(r) for r in back][2:] == [("greedy", s, 0) for s in range(1, 40)]
