"""research/tables.py: the published results tables are what the committed records give,
rows whose records were lost say so, joining runs pairs and corrects them as one, and
the cost table compares each sampler's answers with greedy's on the same items."""

import json
from pathlib import Path

import pytest

from research import cost_records, tables

ROOT = Path(__file__).resolve().parents[2]

COLUMNS = ["accuracy", "gen tokens", "W/L/T vs greedy", "p Holm", "records"]


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


def results(samplers, item_range="0-9"):
    return {"model": "m", "split": "test", "items": 10, "item_range": item_range, "samplers": samplers}


@pytest.fixture
def summaries(tmp_path):
    new = results({"greedy": row(0.5, 100.0), "deliberate": row(0.6, 300.0, 3, 1, 0.625)})
    old = results(
        {"greedy": row(0.5, 100.0), "deliberate": row(0.7, 250.0, 4, 0, 0.125), "cisc k=2": row(0.6, 200.0, 2, 1, 1.0)}
    )
    paths = tmp_path / "new.json", tmp_path / "old.json"
    for path, r in zip(paths, (new, old), strict=True):
        path.write_text(json.dumps(r))
    return [str(p) for p in paths]


def table_of(*sources):
    return tables.Table([tables.Source(path, suffix=suffix) for path, suffix in sources], COLUMNS)


@pytest.mark.slow
def test_every_published_table_is_what_the_committed_records_give():
    assert tables.problems(write=False) == []


def test_rows_of_both_runs_with_holm_over_all_of_them(summaries):
    rows = tables.merged(table_of((summaries[0], ""), (summaries[1], "earlier")))["samplers"]
    assert list(rows) == ["greedy", "deliberate", "deliberate (earlier)", "cisc k=2"]
    holm = {name: s["vs_greedy"]["p_holm"] for name, s in rows.items() if name != "greedy"}
    assert holm == {"deliberate (earlier)": 0.375, "deliberate": 1.0, "cisc k=2": 1.0}  # 3 × 0.125, then capped
    assert {s["records"] for s in rows.values()} == {tables.NO_RECORDS}


def test_runs_over_other_items_are_refused(summaries, tmp_path):
    other = json.loads(Path(summaries[1]).read_text()) | {"item_range": "0-4", "items": 5}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="covers items 0-4"):
        tables.merged(table_of((summaries[0], ""), (str(tmp_path / "other.json"), "")))


def test_a_greedy_rerun_that_differs_shows_beside_the_first(summaries):
    same = tables.merged(table_of((summaries[0], ""), (summaries[1], "")))["samplers"]
    assert [n for n in same if n.startswith("greedy")] == ["greedy"]
    old = json.loads(Path(summaries[1]).read_text())
    old["samplers"]["greedy"]["accuracy"] = 0.4
    Path(summaries[1]).write_text(json.dumps(old))
    rows = tables.merged(table_of((summaries[0], ""), (summaries[1], "earlier")))["samplers"]
    assert rows["greedy"]["accuracy"] == 0.5 and rows["greedy (earlier)"]["accuracy"] == 0.4


def test_a_changed_figure_an_unmarked_table_an_unplaced_table_and_a_no_records_row_without_the_mark_are_found(
    summaries, tmp_path
):
    table = table_of((summaries[0], ""))
    doc = tmp_path / "doc.md"
    good = tables.markdown(table, tables.merged(table))
    doc.write_text(f"<!-- table: t -->\n{good}\n\ntext\n")
    assert tables.problems(write=False, paths=[doc], tables={"t": table}) == []
    assert tables.problems(write=False, paths=[doc], tables={"t": table, "u": table}) == [
        "table u is in research/tables.py's TABLES but in no document"
    ]
    doc.write_text(f"<!-- table: t -->\n{good.replace('60.0%', '61.0%')}\n\n| sampler | x |\n| --- | --- |\n")
    found = tables.problems(write=True, paths=[doc], tables={"t": table})
    assert found == [
        "doc.md:7: a results table without a <!-- table: NAME --> line",
        "doc.md: table t differs from what its records give",
    ]
    assert good in doc.read_text()  # rewritten from its sources
    name = next(iter(tables.NO_RECORDS_TABLES))
    doc.write_text(f"<!-- table: {name} -->\n| sampler | a | records |\n| --- | --- | --- |\n| greedy | 1 | docs/x |\n")
    assert tables.problems(write=False, paths=[doc], tables={}) == [
        f"doc.md: table {name}: 1 rows do not say *no records*"
    ]


def cost_run(folder, condition, rows):
    """A research/sampler_costs.py run: rows of (sampler, index, tokens, seconds, correct, cut off, extra)."""
    folder.mkdir(exist_ok=True)
    records = [
        {"sampler": s, "index": i, "tokens": t, "seconds": sec, "correct": ok, "cut_off": cut, "condition": condition}
        | extra
        for s, i, t, sec, ok, cut, extra in rows
    ]
    cost_records.write_records(folder / f"m-{condition}.jsonl.gz", records)
    settings = {"model": "m", "tasks": "t.jsonl", "max_tokens": 768, "cot": True}
    cost_records.write_settings(folder / f"m-{condition}.json", settings)


def test_the_cost_table_gives_each_samplers_tokens_against_greedys_and_its_seconds_quiet_and_busy(tmp_path):
    folder = tmp_path / "costs"
    reasoning, votes = {"reasoning": True}, {"reasoning": False, "k": 8}
    cost_run(
        folder,
        "quiet",
        [
            ("greedy", 0, 100, 10.0, True, False, {}),
            ("greedy", 1, 300, 14.0, False, True, {}),
            ("deliberate", 0, 250, 20.0, True, False, reasoning),
            ("deliberate", 1, 950, 60.0, True, False, reasoning),
            ("self_consistency", 0, 800, 80.0, True, False, votes),
        ],
    )
    cost_run(folder, "busy", [("greedy", 0, 100, 19.0, True, False, {}), ("greedy", 1, 300, 31.0, False, True, {})])
    table = tables.Table([tables.Source(str(folder))], [], kind="costs")
    rows = tables.markdown(table, tables.merged(table)).splitlines()
    where = str(folder)
    assert rows[2:] == [
        f"| greedy | 200.0 (1.00) | 12.0 (12.0) | 25.0 (25.0) | 2/4 | 2/4 | {where} |",
        f"| deliberate --reasoning | 600.0 (3.00) | 40.0 (40.0) |  | 2/2 | 0/2 | {where} |",
        # on the item it has: 800 against greedy's 100 there, not against greedy's mean of 200
        f"| self_consistency k=8 | 800.0 (8.00) | 80.0 (80.0) |  | 1/1 | 0/1 | {where} |",
    ]
    assert rows[0].startswith("| sampler | gen tokens / answer (× greedy) | s / answer quiet: median (mean) |")
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table: costs -->\n" + "\n".join(rows).replace("40.0 (40.0)", "41.0 (40.0)") + "\n")
    assert tables.problems(write=False, paths=[doc], tables={"costs": table}) == [
        "doc.md: table costs differs from what its records give"
    ]


def test_the_cost_table_says_when_it_has_no_records_and_refuses_runs_that_do_not_compare(tmp_path):
    table = tables.Table([tables.Source(str(tmp_path / "none"))], [], kind="costs")
    assert "*no records yet" in tables.markdown(table, tables.merged(table)).splitlines()[2]
    folder = tmp_path / "costs"
    cost_run(folder, "quiet", [("greedy", 0, 100, 10.0, True, False, {})])
    settings = json.loads((folder / "m-quiet.json").read_text())
    (folder / "m-busy.json").write_text(json.dumps(settings | {"max_tokens": 512}))
    (folder / "m-busy.jsonl.gz").write_bytes((folder / "m-quiet.jsonl.gz").read_bytes())
    with pytest.raises(SystemExit, match="different models, tasks or limits"):
        tables.merged(tables.Table([tables.Source(str(folder))], [], kind="costs"))


def bench_run(folder, name, contended, decode):
    def part(prefill, first, tps):
        return {"prefill_tps": prefill, "first_token_s": first, "decode_tps": tps, "peak_memory_gb": 0.5}

    run = {
        "mlx_lm": part(10.0, 4.0, 10.0),
        "entropix_greedy": part(400.0, 0.5, 2 * decode),
        "entropix": part(500.0, 0.4, decode),
        "ratios": {
            "prefill": 50.0,
            "first_token": 10.0,
            "decode": decode / 10,
            "decode_greedy": decode / 5,
            "memory": 5.0,
        },
        "machine": {"contended": contended},
    }
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(run))


def test_the_speed_tables_read_a_quiet_and_a_busy_bench_run_and_refuse_one_alone(tmp_path):
    folder = tmp_path / "bench"
    bench_run(folder, "b-busy", True, 12.0)
    table = tables.Table([tables.Source(str(folder))], [], kind="speed-readme")
    with pytest.raises(SystemExit, match="one quiet and one busy"):
        tables.merged(table)
    bench_run(folder, "a-quiet", False, 36.0)
    rows = tables.markdown(table, tables.merged(table)).splitlines()
    assert rows[2:] == [
        f"| quiet | 72.00 tok/s, 7.20× | 36.00 tok/s, 3.60× | 500.0 tok/s, 50.0× | 0.40 s, 10.00× sooner | 0.500 GB, 5.00× | {folder} |",
        f"| busy | 24.00 tok/s, 2.40× | 12.00 tok/s, 1.20× | 500.0 tok/s, 50.0× | 0.40 s, 10.00× sooner | 0.500 GB, 5.00× | {folder} |",
    ]
    full = tables.Table([tables.Source(str(folder))], [], kind="speed")
    quiet = tables.markdown(full, tables.merged(full)).splitlines()[2]
    assert quiet.startswith(
        "| quiet | 10.00 tok/s | 72.00 tok/s, **7.20×** | 36.00 tok/s, **3.60×** | 500.0 tok/s (mlx-lm 10.0)"
    )


def test_the_pairs_table_turns_a_pair_round_and_finds_the_vote_row_matched_in_tokens(tmp_path):
    samplers = {
        "greedy": row(0.5, 100.0),
        "deliberate": row(0.6, 300.0, 3, 1, 0.625),
        "cisc k=2": row(0.5, 200.0, 1, 1, 1.0) | {"matches": []},
        "cisc k=4": row(0.7, 400.0, 2, 0, 0.5) | {"matches": ["deliberate"]},
    }
    pair = {"wins": 1, "losses": 3, "ties": 6, "p_value": 0.625, "difference": -0.2, "difference_ci95": [-0.5, 0.1]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results(samplers) | {"pairs": {"cisc k=4 vs deliberate": pair}}))
    table = tables.Table([tables.Source(str(path))], [], kind="pairs", pairs=[("deliberate", "cisc ~")])
    lines = tables.markdown(table, tables.merged(table)).splitlines()
    assert (
        lines[2]
        == "| deliberate | 300.0 | cisc k=4 | 400.0 (1.33×) | 3/1/6 | +20.0 [-10.0, +50.0] | 0.625 | *no records* |"
    )


def test_records_that_score_today_other_than_eval_scored_them_are_refused(tmp_path):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(ROOT / "docs/records/builtin_test", folder)
    table = tables.Table([tables.Source(str(folder), tasks="builtin")], COLUMNS)
    logged = tables.from_records(folder, "builtin")
    (folder / "results.json").write_text(json.dumps(logged))
    assert tables.merged(table)["samplers"]["entropix"]["accuracy"] == logged["samplers"]["entropix"]["accuracy"]
    logged["samplers"]["entropix"]["accuracy"] += 0.01  # eval's own scoring, as another extractor gave it
    (folder / "results.json").write_text(json.dumps(logged))
    with pytest.raises(SystemExit, match="row entropix scores today other than in the results.json"):
        tables.merged(table)


def acceptance_summary(path, deliberate, staged, sc8, vs_greedy, cisc=()):
    """A sealed run's summary: (accuracy, tokens) for deliberate, staged and SC k=8, CISC rows by k."""
    samplers = {
        "greedy": row(0.3, 100.0) | {"cut_off": 0.02},
        "deliberate": row(*deliberate) | {"vs_greedy": vs_greedy},
        "deliberate_staged": row(*staged),
        "self_consistency k=8": row(*sc8),
        **{f"cisc k={k}": row(a, t) for k, (a, t) in cisc},
    }
    pair = {"wins": 9, "losses": 4, "ties": 287, "p_value": 0.27, "difference": 0.017, "difference_ci95": [0, 0.03]}
    path.write_text(json.dumps(results(samplers) | {"pairs": {"deliberate vs deliberate_staged": pair}}))
    return str(path)


def test_the_acceptance_table_gives_each_target_its_figure_and_verdict(tmp_path):
    vs = {"wins": 30, "losses": 10, "ties": 260, "p_value": 0.002, "difference": 0.0667}
    path = acceptance_summary(tmp_path / "a.json", (0.367, 200.0), (0.35, 300.0), (0.36, 800.0), vs)
    table = tables.Table([tables.Source(path)], [], kind="acceptance", targets=(0.04, "sc-staged"))
    verdicts = [line.split(" | ")[2] for line in tables.markdown(table, tables.merged(table)).splitlines()[2:]]
    assert verdicts == ["**holds**"] * 4
    vs = {"wins": 20, "losses": 10, "ties": 270, "p_value": 0.098, "difference": 0.0333}
    path = acceptance_summary(tmp_path / "b.json", (0.333, 280.0), (0.35, 270.0), (0.36, 800.0), vs)
    table = tables.Table([tables.Source(path)], [], kind="acceptance", targets=(0.04, "sc-staged"))
    lines = tables.markdown(table, tables.merged(table)).splitlines()[2:]
    assert [line.split(" | ")[2] for line in lines] == ["**holds**"] + ["**missed**"] * 3
    assert "+3.3 points (33.3% against 30.0%), W/L 20/10, p 0.098" in lines[1]
    # 1.5B: CISC at equal tokens is the cheapest CISC row with at least 90% of deliberate's tokens
    cisc = [(1, (0.5, 100.0)), (2, (0.39, 190.0)), (3, (0.45, 290.0))]
    vs = {"wins": 30, "losses": 10, "ties": 260, "p_value": 0.002, "difference": 0.1}
    path = acceptance_summary(tmp_path / "c.json", (0.4, 200.0), (0.35, 300.0), (0.36, 800.0), vs, cisc)
    table = tables.Table([tables.Source(path)], [], kind="acceptance", targets=(0.05, "cisc"))
    lines = tables.markdown(table, tables.merged(table)).splitlines()[2:]
    assert [line.split(" | ")[2] for line in lines] == ["**holds**"] * 3
    assert "against cisc k=2 39.0%, which spends 0.95× deliberate's tokens" in lines[2]
    assert "within 10%" not in lines[2].split(" | ")[1]
    # no CISC row near deliberate's tokens: the next one up is named as such
    cisc = [(1, (0.5, 100.0)), (2, (0.39, 290.0))]
    path = acceptance_summary(tmp_path / "d.json", (0.4, 200.0), (0.35, 300.0), (0.36, 800.0), vs, cisc)
    table = tables.Table([tables.Source(path)], [], kind="acceptance", targets=(0.05, "cisc"))
    reached = tables.markdown(table, tables.merged(table)).splitlines()[4].split(" | ")[1]
    assert "which spends 1.45× deliberate's tokens (no CISC row lies within 10% of them" in reached
