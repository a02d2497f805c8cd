"""docs/frontier.py: one chart and table from several runs over the same items,
including a summary rebuilt from a table whose records are gone."""

import importlib.util
import json
from pathlib import Path

import pytest

from entropix_mlx.eval.report import plot, table_rows

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("frontier", ROOT / "docs" / "frontier.py")
frontier = importlib.util.module_from_spec(spec)
spec.loader.exec_module(frontier)


def row(accuracy, tokens, wins=None, losses=None, p=None):
    s = {
        "n": 10,
        "seeds": 1,
        "accuracy": accuracy,
        "ci95": [accuracy - 0.2, accuracy + 0.2],
        "tokens_generated": tokens,
    }
    if p is not None:
        s["vs_greedy"] = {"wins": wins, "losses": losses, "ties": 10 - wins - losses, "p_value": p}
    return s


def results(samplers):
    return {"model": "m", "tasks": "t.jsonl", "split": "test", "items": 10, "item_range": "0-9", "samplers": samplers}


@pytest.fixture
def runs(tmp_path):
    # the first as `eval --json` writes it; the second rebuilt from a printed table
    # (no chosen-answer lengths, no strategy shares)
    first = results({"greedy": {**row(0.5, 100.0), "mean_tokens": 100.0}, "deliberate": row(0.6, 300.0, 3, 1, 0.625)})
    first["samplers"]["deliberate"]["mean_tokens"] = 90.0
    rebuilt = results(
        {"greedy": row(0.5, 100.0), "deliberate": row(0.7, 250.0, 4, 0, 0.125), "cisc k=2": row(0.6, 200.0, 2, 1, 1.0)}
    )
    paths = tmp_path / "new.json", tmp_path / "old.json"
    for path, r in zip(paths, (first, rebuilt), strict=True):
        path.write_text(json.dumps(r))
    return [str(p) for p in paths]


def test_rows_of_both_runs_with_holm_over_all_of_them(runs, tmp_path):
    merged = frontier.merged([runs[0], f"{runs[1]}=earlier"])
    rows = merged["samplers"]
    assert list(rows) == ["greedy", "deliberate", "deliberate (earlier)", "cisc k=2"]
    holm = {name: s["vs_greedy"]["p_holm"] for name, s in rows.items() if name != "greedy"}
    assert holm == {"deliberate (earlier)": 0.375, "deliberate": 1.0, "cisc k=2": 1.0}  # 3 × 0.125, then capped
    table = {r["sampler"]: r for r in table_rows(merged, strategies=False)}
    assert table["deliberate (earlier)"]["gen tokens"] == "250.0" and table["deliberate"]["gen tokens"] == "300.0"
    plot(merged, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_over_other_items_are_refused(runs, tmp_path):
    other = json.loads(Path(runs[1]).read_text()) | {"item_range": "0-4", "items": 5}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="covers items 0-4"):
        frontier.merged([runs[0], str(tmp_path / "other.json")])


def test_a_greedy_rerun_that_differs_shows_beside_the_first(runs):
    rebuilt = json.loads(Path(runs[1]).read_text())
    same = frontier.merged([runs[0], runs[1]])["samplers"]
    assert [n for n in same if n.startswith("greedy")] == ["greedy"]  # the same greedy: drawn once
    rebuilt["samplers"]["greedy"]["accuracy"] = 0.4
    Path(runs[1]).write_text(json.dumps(rebuilt))
    rows = frontier.merged([runs[0], f"{runs[1]}=earlier"])["samplers"]
    assert rows["greedy"]["accuracy"] == 0.5 and rows["greedy (earlier)"]["accuracy"] == 0.4
    assert "vs_greedy" not in rows["greedy (earlier)"]
