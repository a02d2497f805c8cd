"""Sealed task files: every scoring logged with its configuration hash, commit and
time; a second configuration under the same sampler name refused unless asked."""

import json
from pathlib import Path

import pytest
from conftest import make_loaded, make_tiny_model, make_tiny_tokenizer, shelve
from test_cli_run import invoke, one_error_line

from entropix_mlx.eval import sealed
from entropix_mlx.sampling.deliberate_config import shipped_reasoning

RECORDS = Path(__file__).resolve().parents[1] / "docs" / "records"
TASKS = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]


@pytest.fixture
def tiny_ref(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    return shelve(monkeypatch, path, make_loaded(make_tiny_model(), make_tiny_tokenizer(), path))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "entropix-mlx" / "sealed"


def task_file(path, sealed_marker=True):
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    if sealed_marker:
        (path.parent / f"{path.name}.sealed").write_text("")
    return path


def entries(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_shared_sealed_file_is_known_by_its_hash(tmp_path):
    plain = task_file(tmp_path / "plain.jsonl", sealed_marker=False)
    assert not sealed.is_sealed(plain)
    (tmp_path / "plain.jsonl.sealed").write_text("")
    assert sealed.is_sealed(plain)
    assert len(sealed.listed_hashes()) >= 1 and all(len(h) == 64 for h in sealed.listed_hashes())


def test_each_scoring_is_logged_and_another_configuration_is_refused(tiny_ref, tmp_path, cache):
    tasks = task_file(tmp_path / "held.jsonl")
    args = ["eval", tasks, "-m", tiny_ref, "--samplers", "greedy,entropix", "--max-tokens", "3"]
    other = tmp_path / "other.toml"
    other.write_text("[sampler]\ntemperature = 0.5\n")
    code, _, err = invoke(*args, "--out", tmp_path / "a")
    assert code == 0, err
    (logged,) = entries(tmp_path / "a" / "scoring_log.jsonl")
    assert logged["file"] == "held.jsonl" and logged["file_sha256"] == sealed.file_hash(tasks)
    assert {r["sampler"] for r in logged["rows"]} == {"greedy", "entropix"} and logged["rescore"] is False
    assert logged["time"] and "commit" in logged
    assert entries(next(cache.glob("*.jsonl"))) == [logged]  # the machine's log too

    # The same configuration again (another folder): allowed, and logged again.
    code, _, err = invoke(*args, "--out", tmp_path / "b")
    assert code == 0, err
    assert len(entries(next(cache.glob("*.jsonl")))) == 2

    # entropix with another temperature: refused before anything runs, whatever the folder.
    code, _, err = invoke(*args, "--config", other, "--out", tmp_path / "c")
    assert code == 2 and "sealed" in one_error_line(err) and "--rescore-sealed" in err and "'entropix'" in err
    assert not (tmp_path / "c" / "items.jsonl").exists()

    code, _, err = invoke(*args, "--config", other, "--out", tmp_path / "c", "--rescore-sealed")
    assert code == 0, err
    last = entries(next(cache.glob("*.jsonl")))[-1]
    assert last["rescore"] is True
    configs = [{r["sampler"]: r["config"] for r in e["rows"]} for e in (logged, last)]
    assert configs[0]["greedy"] == configs[1]["greedy"] and configs[0]["entropix"] != configs[1]["entropix"]


def test_a_frozen_name_may_be_scored_on_another_model_but_not_retuned_on_one(tiny_ref, tmp_path, cache, monkeypatch):
    tasks = task_file(tmp_path / "held.jsonl")
    other_model = shelve(
        monkeypatch,
        tmp_path / "bigger.gguf",
        make_loaded(make_tiny_model(), make_tiny_tokenizer(), tmp_path / "bigger.gguf", name="bigger"),
    )
    (tmp_path / "bigger.gguf").write_bytes(b"")
    warmer = tmp_path / "warmer.toml"
    warmer.write_text("[sampler]\ntemperature = 0.5\n")
    args = ["eval", tasks, "--samplers", "entropix", "--max-tokens", "3"]

    code, _, err = invoke(*args, "-m", tiny_ref, "--out", tmp_path / "a")
    assert code == 0, err
    # Another model under the same name and another configuration: allowed, logged with its model.
    code, _, err = invoke(*args, "-m", other_model, "--config", warmer, "--out", tmp_path / "b")
    assert code == 0, err
    assert [e["model"] for e in entries(next(cache.glob("*.jsonl")))] == ["tiny", "bigger"]
    # Either model retuned under the name it was scored with: refused.
    for model, config in ((tiny_ref, warmer), (other_model, None)):
        extra = ["--config", config] if config else []
        code, _, err = invoke(*args, "-m", model, *extra, "--out", tmp_path / "c")
        assert code == 2 and "with this model" in one_error_line(err), err

    # A log entry written before entries named their model counts as every model's.
    log = next(cache.glob("*.jsonl"))
    old = [{k: v for k, v in e.items() if k != "model"} for e in entries(log)[:1]]
    log.write_text("".join(json.dumps(e) + "\n" for e in old))
    code, _, err = invoke(*args, "-m", other_model, "--config", warmer, "--out", tmp_path / "d")
    assert code == 2 and "sealed" in one_error_line(err), err


def test_a_file_that_is_not_sealed_keeps_the_plain_scoring_log(tiny_ref, tmp_path, cache):
    tasks = task_file(tmp_path / "open.jsonl", sealed_marker=False)
    code, _, err = invoke("eval", tasks, "-m", tiny_ref, "--samplers", "greedy", "--max-tokens", "2", "--out", tmp_path)
    assert code == 0, err
    (logged,) = entries(tmp_path / "scoring_log.jsonl")
    assert "file_sha256" not in logged and not cache.exists()


def test_a_script_scoring_stored_answers_again_is_logged_and_refused_a_sealed_file(tmp_path):
    test_run, dev_run = tmp_path / "test_run", tmp_path / "dev_run"
    for folder, split in ((test_run, "test"), (dev_run, "dev")):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"split": split}))
    plain = task_file(tmp_path / "plain.jsonl", sealed_marker=False)
    sealed.log_offline_scoring(test_run, plain, ["greedy", "cisc k=4"], "0-2", "docs/pairs.py")
    sealed.log_offline_scoring(dev_run, plain, ["greedy"], "0-2", "docs/pairs.py")
    (entry,) = entries(test_run / "scoring_log.jsonl")
    assert (entry["rows"], entry["items"], entry["by"]) == (["greedy", "cisc k=4"], "0-2", "docs/pairs.py")
    assert not (dev_run / "scoring_log.jsonl").exists()  # dev items are for choosing on
    with pytest.raises(sealed.ConfigError, match="is sealed: score it with entropix-mlx eval"):
        sealed.log_offline_scoring(test_run, task_file(tmp_path / "s.jsonl"), ["greedy"], "0-2", "docs/pairs.py")
    assert len(entries(test_run / "scoring_log.jsonl")) == 1


def scored_sealed_runs() -> list[Path]:
    return [f for f in sorted(RECORDS.glob("sealed_*")) if (f / "results.json").exists()]


def test_each_committed_sealed_scoring_has_one_scoring_per_row_under_its_committed_configuration():
    runs = scored_sealed_runs()
    assert runs, "no sealed scoring is committed"
    for run in runs:
        config = json.loads((run / "config.json").read_text())
        log = entries(run / "scoring_log.jsonl")
        rows = [row for entry in log for row in entry["rows"]]
        assert sorted(row["sampler"] for row in rows) == sorted(config["samplers"]), run.name
        assert not any(entry["rescore"] for entry in log), run.name
        assert all(row["config"] == sealed.config_hash(config, row["sampler"]) for row in rows), run.name


def test_the_sealed_deliberate_row_ran_what_reasoning_ships():
    # what `--reasoning --sampler deliberate` and the server's reasoning run, without a card's own table
    for run in scored_sealed_runs():
        assert json.loads((run / "config.json").read_text())["samplers"]["deliberate"] == shipped_reasoning(), run.name
