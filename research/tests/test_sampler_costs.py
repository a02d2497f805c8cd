"""research/sampler_costs.py: what one answer costs, sampler by sampler, with every
candidate's tokens counted, kept as records without the questions that resume where
they stopped, beside a neighbour that always ends."""

import contextlib
import json
from pathlib import Path

import pytest

from entropix_mlx.eval import load_tasks, score
from research import sampler_costs
from tests.conftest import make_loaded, make_tiny_model, make_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 4 + 4?", "8")]
SAMPLERS = ["greedy", "entropix", "deliberate", "deliberate_staged", "self_consistency", "cisc"]
MAX_TOKENS = 6
OPTIONS = sampler_costs.Options(cot=True, reasoning=True, max_tokens=MAX_TOKENS, seed=0, k=2)


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    return path


@pytest.fixture
def loaded(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    return make_loaded(make_tiny_model(), make_tiny_tokenizer(), path)


def test_every_sampler_answers_every_item_and_every_candidate_is_counted(loaded, tasks_file, tmp_path):
    tasks, out = load_tasks(tasks_file), tmp_path / "run.jsonl.gz"
    records = sampler_costs.measure(loaded, tasks, SAMPLERS, OPTIONS, "quiet", out, progress=lambda _: None)
    assert sampler_costs.read_records(out) == records
    assert [(r["index"], r["sampler"]) for r in records] == [(t.index, n) for t in tasks for n in SAMPLERS]
    for r in records:
        assert "question" not in r and r["condition"] == "quiet" and r["seconds"] > 0
        assert r["tokens"] == sum(r["candidate_tokens"]) and r["candidates"] == len(r["candidate_tokens"])
        assert 1 <= r["answer_tokens"] <= MAX_TOKENS and r["tokens"] >= r["answer_tokens"]
        assert r["cut_off"] == (r["finish_reason"] == "length")
        task = tasks[r["index"]]
        assert (r["extracted"], r["correct"]) == score(r["output"], task, cot=True) and r["expected"] == task.expected
    by = {(r["sampler"], r["index"]): r for r in records}
    for t in tasks:
        greedy = by["greedy", t.index]
        assert greedy["candidates"] == 1 and greedy["tokens"] == greedy["answer_tokens"]
        for vote in ("self_consistency", "cisc"):  # k=2 samples, both counted: about twice greedy's tokens
            r = by[vote, t.index]
            assert r["k"] == 2 and r["candidates"] == 2 and r["tokens"] == 2 * MAX_TOKENS == 2 * greedy["tokens"]
        staged = by["deliberate_staged", t.index]  # the greedy answer and at least one branch
        assert staged["candidates"] >= 2 and staged["tokens"] > staged["answer_tokens"]
    assert {r["reasoning"] for r in records if r["sampler"] in ("entropix", "deliberate")} == {True}
    assert not any(r["reasoning"] for r in records if r["sampler"] not in ("entropix", "deliberate"))


def test_a_run_resumes_with_what_it_lacks_and_refuses_other_settings(loaded, tasks_file, tmp_path, monkeypatch):
    tasks, out = load_tasks(tasks_file), tmp_path / "run.jsonl.gz"
    first = sampler_costs.measure(loaded, tasks[:1], ["greedy"], OPTIONS, "quiet", out, progress=lambda _: None)
    asked = []
    real = sampler_costs.answer
    monkeypatch.setattr(sampler_costs, "answer", lambda *a: asked.append(a[2].index) or real(*a))
    again = sampler_costs.measure(loaded, tasks, ["greedy"], OPTIONS, "quiet", out, progress=lambda _: None)
    assert again[:1] == first and [r["index"] for r in again] == [0, 1]
    assert asked == [0, 1]  # the warm-up on the first item, then only the item it lacked
    now = sampler_costs.run_settings(loaded, tasks, ["greedy"], OPTIONS, "quiet", "tasks.jsonl", "test")
    settings = tmp_path / "run.json"
    settings.write_text(json.dumps(now))
    more = sampler_costs.run_settings(loaded, tasks, SAMPLERS, OPTIONS, "quiet", "tasks.jsonl", "test")
    assert set(sampler_costs.resumed_settings(settings, more)["samplers"]) == set(SAMPLERS)
    # without a card, deliberate reasons with the frozen gated rule, not the staged one
    assert sampler_costs.same_settings(more["samplers"]) == []
    twins = {**more["samplers"], "deliberate": more["samplers"]["deliberate_staged"]}
    assert sampler_costs.same_settings(twins) == [["deliberate", "deliberate_staged"]]  # said, not hidden
    other = sampler_costs.run_settings(loaded, tasks, ["greedy"], OPTIONS, "busy", "tasks.jsonl", "test")
    with pytest.raises(SystemExit, match="other condition"):
        sampler_costs.resumed_settings(settings, other)


def test_busy_runs_beside_one_spinning_process_that_ends_also_on_ctrl_c(loaded, tasks_file, tmp_path, monkeypatch):
    started = []
    real = sampler_costs.busy_neighbour

    @contextlib.contextmanager
    def watched(*args, **kwargs):
        with real(*args, **kwargs) as procs:
            started.extend(procs)
            yield procs

    made = []
    real_record = sampler_costs.record

    def record_then_ctrl_c(*args):
        made.append(real_record(*args))
        assert all(p.poll() is None for p in started)  # spinning while the answers are made
        if len(made) == 2:
            raise KeyboardInterrupt
        return made[-1]

    monkeypatch.setattr(sampler_costs, "busy_neighbour", watched)
    monkeypatch.setattr(sampler_costs, "record", record_then_ctrl_c)
    monkeypatch.setattr(sampler_costs, "load_model", lambda ref, weights: loaded)
    out = tmp_path / "costs" / "busy.jsonl.gz"
    argv = [str(loaded.source.path), str(tasks_file), "--cot", "--busy", "--out", str(out)]
    code = sampler_costs.main([*argv, "--samplers", "greedy,cisc", "--k", "2", "--max-tokens", str(MAX_TOKENS)])
    assert code == 130
    assert len(started) == 1 and started[0].returncode is not None  # one neighbour, ended
    assert [(r["sampler"], r["condition"]) for r in sampler_costs.read_records(out)] == [("greedy", "busy")]
    settings = json.loads((tmp_path / "costs" / "busy.json").read_text())
    assert settings["condition"] == "busy" and "spinning on one core" in settings["neighbour"]
    assert settings["items"] == "0-1" and settings["k"] == 2 and settings["reasoning"] is True
    assert set(settings["samplers"]) == {"greedy", "cisc"} and settings["model_sha256"] is not None
