"""Every results table in README.md and docs/ from what docs/records/ holds, and the charts.

A table is marked in its file by the line `<!-- table: NAME -->` right above it; TABLES says
where its rows come from. A records folder (`research/run_records.py pack`) is scored again
here with today's extractor and summarised as `eval` summarises its `--out` folder; a
summary kept of a printed table whose records were lost gives rows marked *no records*. A
table whose rows all have no records is listed in NO_RECORDS and must say so on every row.
The cost table takes research/sampler_costs.py's runs as they were measured and scored
(research/cost_records.py).

    python -m research.tables           # rewrite the tables and charts in place
    python -m research.tables --check   # exit 1, naming each table that differs from its records

GSM8K's questions are not in the records; a record keeps its expected answer, and a number
is all the scorer reads of a GSM8K item, so the tasks are rebuilt from the records.
"""

import argparse
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from entropix_mlx.data.make_builtin import generate
from entropix_mlx.eval.opentext import OpenConfig, builtin_prompts_path, load_prompts, summarize_open
from entropix_mlx.eval.report import (
    format_p,
    generated_tokens,
    markdown_table,
    open_table_rows,
    pct,
    plot,
    strategy_text,
)
from entropix_mlx.eval.runner import EvalConfig, summarize
from entropix_mlx.eval.stats import holm
from entropix_mlx.eval.tasks import Task, builtin_tasks_path, load_tasks, parse_task
from entropix_mlx.sampling.deliberate_config import shipped_reasoning

from .acceptance import markdown as acceptance_markdown
from .code_check import summarize as summarize_code
from .confidence_fit import markdown as confidence_markdown
from .confidence_gate import markdown as gate_markdown
from .cost_records import markdown as costs_markdown
from .cost_records import summarize as summarize_costs
from .gated_replay import (
    fixable,
    fixable_markdown,
    held_out,
    held_out_markdown,
    live_against_replay,
    live_markdown,
    pool_records,
    ranking,
    ranking_markdown,
    results_per_model,
)
from .gated_replay import markdown as replay_markdown
from .gated_replay import results as replay_results

ROOT = Path(__file__).resolve().parents[1]

NO_RECORDS = "*no records*"
MARK = re.compile(r"^<!-- table: (\S+) -->$")
# The header of a table of accuracy figures (the speed and layout tables are not read here).
RESULTS_HEADER = re.compile(
    r"^\| ((sampler|rule|against|category|candidates|deliberate|target) \||selector \| (δ|2 first))|^\|.*(accuracy|W/L)"
)


replay_results_once = functools.cache(replay_results)  # two tables read one pool
per_model_once = functools.cache(results_per_model)


@dataclass
class Source:
    path: str  # docs/records/NAME (records) or a summary's .json (its rows: no records)
    suffix: str = ""  # added to a row name an earlier source has already
    names: dict = field(default_factory=dict)  # row -> label
    tasks: str = "records"  # "records" (rebuilt from each record's answer), "builtin" or "fresh"
    label: str = ""  # kinds "ranking" and "fixable": the row's name
    sampler: str = ""  # kinds "ranking" and "fixable": whose records hold the greedy chains


@dataclass
class Table:
    sources: list[Source]
    columns: list[str]  # for kind "categories": the samplers, one column each
    chart: str | None = None
    # the rows shown (Holm's correction over these), else all; kind "held-out": rules replayed beside the choice
    rows: list[str] | None = None
    # for kind "pairs": (row, against); "cisc ~" / "self_consistency ~" is the vote row nearest in tokens to row
    pairs: list[tuple[str, str]] = field(default_factory=list)
    targets: tuple[float, str] = (0.04, "sc-staged")  # kind "acceptance": research/acceptance.py's targets
    # "confidence": an answer confidence's candidates (research/confidence_fit.py --json);
    # "categories": by the tasks' category; "open": open-text figures; "costs": per answer; "code": code prompts;
    # "replay" / "replay-all": gated deliberate rules over one pool, a summary / every rule;
    # "replay-after-sealed": the rules replayed after the sealed scoring (outside the choice);
    # "replay-per-model" / "-all": the rules live staged pools (as one) replay at their model's own quantiles;
    # "held-out": the rules chosen on the first sources' pool (as one), their thresholds fixed, on the last `checks`';
    # "live-replay": a gated setting run live (the first source) against its replay from a staged pool (the second);
    # "ranking": how each gate signal ranks the wrong greedy answers, a pool a row;
    # "fixable": where the shipped gate spends, and the wrong answers `staged` puts right there;
    # "speed", "speed-readme", "speed-schema": `bench --json` runs, quiet and busy; "pairs": rows against rows
    kind: str = "samplers"
    # the accuracy column's split, where the run's own says "test" of train items (a dev check)
    split: str | None = None
    checks: int = 1  # kind "held-out": how many of the last sources are the check (read as one pool)


def from_records(folder: Path, tasks: str) -> dict:
    config = json.loads((folder / "config.json").read_text())
    records = {(r["sampler"], r["seed"], r["index"]): r for r in pool_records(folder)}
    seeds = {seed for (name, seed, _) in records if name != "greedy"} or {0}  # config.json does not keep them
    common = {
        "samplers": list(config["samplers"]),
        "seeds": len(seeds),
        "seed": min(seeds),
        "max_tokens": config["max_tokens"],
    }
    if config.get("mode") == "open":  # an open-text run over the built-in prompts
        open_config = OpenConfig(**common, early_tokens=config["early_tokens"])
        return summarize_open(records, load_prompts(builtin_prompts_path()), open_config)
    indices = sorted({i for (name, _, i) in records if name == "greedy"})
    if tasks in ("builtin", "fresh"):
        by_index = {t.index: t for t in (load_tasks(builtin_tasks_path()) if tasks == "builtin" else fresh_tasks())}
        task_list = [by_index[i] for i in indices]
    else:
        expected = {i: r["expected"] for (_, _, i), r in records.items()}
        task_list = [Task(index=i, question="", answers=[expected[i]]) for i in indices]
    eval_config = EvalConfig(**common, split=config.get("split", "all"), cot=config.get("cot", False))
    return summarize(records, task_list, eval_config, config["samplers"])


def same_as_eval(where: str, results: dict, logged: dict) -> None:
    """Refuse records that score today other than eval scored them (its results.json):
    a changed extractor must not change a sealed scoring's table in silence."""
    for name, s in logged["samplers"].items():
        mine = results["samplers"].get(name)
        if mine is None or mine["accuracy"] != s["accuracy"] or mine.get("vs_greedy") != s.get("vs_greedy"):
            raise SystemExit(f"{where}: row {name} scores today other than in the results.json eval wrote")


def fresh_tasks() -> list[Task]:
    """docs/evaluation.md's 225 fresh items: the built-in generator's seed 777, less every
    question the built-in file has (the items are not shipped; they are made again)."""
    seen = {t.question for t in load_tasks(builtin_tasks_path())}
    items = [{k: v for k, v in i.items() if k != "split"} for i in generate(seed=777) if i["question"] not in seen]
    return [parse_task(item, n, f"fresh item {n}") for n, item in enumerate(items)]


def same_greedy(a: dict, b: dict) -> bool:
    """Two runs' greedy rows agree to the precision a printed table keeps: one row."""
    if "accuracy" not in a:  # open text: the same answers give the same figures
        return all(a[k] == b[k] for k in ("repeated_4gram_share", "mean_logprob", "longest_loop_max", "mean_tokens"))
    return a["accuracy"] == b["accuracy"] and abs(generated_tokens(a) - generated_tokens(b)) < 0.05


def code_results(table: Table) -> dict:
    """research/code_check.py's records: greedy, then each source's entropix row against it."""
    rows = {}
    for source in table.sources:
        s = summarize_code(ROOT / source.path)
        if not rows:
            rows["greedy"] = {"pass": s["passes"]["greedy"], "defs": s["defs_passes"]["greedy"], "records": source.path}
        elif s["passes"]["greedy"] != rows["greedy"]["pass"] or s["tasks"] != rows["greedy"]["tasks"]:
            raise SystemExit(f"{source.path}: another greedy run or other tasks than the first source's")
        rows["greedy"]["tasks"] = s["tasks"]
        rows[source.names["entropix"]] = {
            "pass": s["passes"]["entropix"],
            "defs": s["defs_passes"]["entropix"],
            "wlt": f"{s['wins']}/{s['losses']}/{s['ties']}",
            "p": format_p(s["p"]),
            "changed": f"{s['answers_changed']}/{s['tasks']}",
            "argmax": s["divergence_strategy"].get("argmax", 0),
            "records": source.path,
        }
    return {"samplers": rows}


def code_markdown(results: dict) -> str:
    lines = [
        "| sampler | pass | defs pass | W/L/T (pass) vs greedy | p | answers changed | argmax first divergences | records |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results["samplers"].items():
        cells = [r["pass"], r["defs"], r.get("wlt", ""), r.get("p", ""), r.get("changed", ""), r.get("argmax", "")]
        lines.append("| " + " | ".join([name, *map(str, cells), r["records"]]) + " |")
    return "\n".join(lines)


def bench_results(folder: str) -> dict:
    """`entropix-mlx bench --json` runs, one a file: the quiet one and the busy one (`--contended`)."""
    runs = {}
    for path in sorted((ROOT / folder).glob("*.json")):
        run = json.loads(path.read_text())
        runs["busy" if run["machine"]["contended"] else "quiet"] = run
    if set(runs) != {"quiet", "busy"}:
        raise SystemExit(f"{folder}: needs one quiet and one busy (--contended) bench run")
    return {"runs": runs, "records": folder}


def speed_markdown(kind: str, results: dict) -> str:
    """speed: docs/speed.md's figures; speed-readme: their short form (docs/results.md); speed-schema: under a JSON schema."""
    heads = {
        "speed": "| `--weights auto` (float32, OpenBLAS + thin kernels) | mlx-lm decode | engine greedy decode "
        "| full Entropix decode | prefill | Entropix first token | peak memory |",
        "speed-readme": "| `--weights auto` (float32 + OpenBLAS) | decode, engine with greedy | decode, full Entropix "
        "| prefill | first token (Entropix) | peak memory |",
        "speed-schema": "| | Entropix decode tok/s | Entropix under the schema | ratio |",
    }
    head = heads[kind][:-1] + "| records |"
    lines = [head, "| --- |" + " --- |" * (head.count("|") - 2)]
    for when in ("quiet", "busy"):
        run = results["runs"][when]
        m, g, e, x = run["mlx_lm"], run["entropix_greedy"], run["entropix"], run["ratios"]
        if kind == "speed-schema":
            label = "quiet" if when == "quiet" else "beside a NumPy product loop on every core (`--contended`)"
            cells = [label, f"{e['decode_tps']:.2f}", f"{run['entropix_schema']['decode_tps']:.2f}"]
            cells.append(f"{x['decode_schema']:.3f}")
        else:
            first = f"{e['first_token_s']:.2f} s"
            cells = [
                when,
                f"{g['decode_tps']:.2f} tok/s, **{x['decode_greedy']:.2f}×**",
                f"{e['decode_tps']:.2f} tok/s, **{x['decode']:.2f}×**",
                f"{e['prefill_tps']:.1f} tok/s (mlx-lm {m['prefill_tps']:.1f}), **{x['prefill']:.1f}×**",
                f"{first} against {m['first_token_s']:.2f} s, {x['first_token']:.2f}× sooner",
                f"{e['peak_memory_gb']:.3f} GB, {x['memory']:.2f}×",
            ]
            if kind == "speed":
                cells.insert(1, f"{m['decode_tps']:.2f} tok/s")
            else:  # the short form
                cells = [c.replace("**", "") for c in cells]
                cells[3] = f"{e['prefill_tps']:.1f} tok/s, {x['prefill']:.1f}×"
                cells[4] = f"{first}, {x['first_token']:.2f}× sooner"
        lines.append("| " + " | ".join([*cells, results["records"]]) + " |")
    return "\n".join(lines)


def pool_rows(table: Table) -> dict:
    """The greedy chains of several pools, a row each: how each signal ranks the wrong
    answers ("ranking"), or where the shipped gate spends ("fixable")."""
    gate = shipped_reasoning()
    shipped = (gate["gate_signal"], gate["gate_threshold"])
    read = {"ranking": ranking, "fixable": lambda folder, sampler: fixable(folder, sampler, *shipped)}[table.kind]
    return {"pools": [(s.label, read(ROOT / s.path, s.sampler), s.path) for s in table.sources]}


def read_by_kind(table: Table) -> dict | None:
    """The results of a table that is not rows of samplers (None for one that is)."""
    folder = ROOT / table.sources[0].path
    if table.kind.startswith("confidence"):  # research/confidence_fit.py's or _gate.py's figures, as written
        return json.loads((ROOT / table.sources[0].path).read_text())
    if table.kind == "costs":  # research/sampler_costs.py's runs, every one in the folder
        return summarize_costs(folder, ROOT)
    if table.kind == "code":
        return code_results(table)
    if table.kind.startswith("replay-per-model"):  # per_model()'s rules over live staged pools as one
        return per_model_once(*(ROOT / s.path for s in table.sources))
    if table.kind == "held-out":  # the rules chosen on the first pools, replayed on the last
        choice, check = table.sources[: -table.checks], table.sources[-table.checks :]
        chosen = per_model_once(*(ROOT / s.path for s in choice))
        return held_out(chosen, *(ROOT / s.path for s in check), also=tuple(table.rows or ()))
    if table.kind == "live-replay":
        return live_against_replay(folder, ROOT / table.sources[1].path)
    if table.kind.startswith("replay"):  # research/gated_replay.py's rules over one pool
        return replay_results_once(folder)
    if table.kind in ("ranking", "fixable"):
        return pool_rows(table)
    if table.kind.startswith("speed"):
        return bench_results(table.sources[0].path)
    return None


def merged(table: Table) -> dict:
    """The rows of every source over the same items, each with where its records are;
    Holm's correction over all rows compared with greedy."""
    own = read_by_kind(table)
    if own is not None:
        return own
    out = None
    for source in table.sources:
        path = ROOT / source.path
        if not path.exists():
            raise SystemExit(f"{source.path}: no records folder or summary there; pack the run first")
        has_records = path.is_dir()
        results = from_records(path, source.tasks) if has_records else json.loads(path.read_text())
        if has_records and (path / "results.json").is_file():
            same_as_eval(source.path, results, json.loads((path / "results.json").read_text()))
        where = source.path if has_records else NO_RECORDS
        rows = {source.names.get(k, k): {**v, "records": where} for k, v in results["samplers"].items()}
        if out is None:
            out = {**results, "samplers": rows}
            continue
        if (results.get("item_range"), results["items"]) != (out.get("item_range"), out["items"]):
            raise SystemExit(f"{source.path} covers items {results.get('item_range')}, not {out.get('item_range')}")
        for name, s in rows.items():
            greedy = out["samplers"]["greedy"]
            if name == "greedy" and same_greedy(s, greedy):
                if has_records and greedy["records"] == NO_RECORDS:
                    greedy["records"] = where  # this run's answers give the row
                continue
            out["samplers"][f"{name} ({source.suffix})" if name in out["samplers"] else name] = s
    if table.rows is not None:
        out["samplers"] = {n: out["samplers"][n] for n in table.rows}
    paired = {n: s["vs_greedy"] for n, s in out["samplers"].items() if "vs_greedy" in s}
    for name, p in holm({n: vs["p_value"] for n, vs in paired.items()}).items():
        out["samplers"][name]["vs_greedy"] = {**paired[name], "p_holm": p}
    return out


def cell(column: str, s: dict, greedy: dict) -> str:
    vs = s.get("vs_greedy")
    tokens = generated_tokens(s)
    if column == "accuracy":
        lo, hi = s["ci95"]
        spread = f" sd {100 * s['accuracy_std']:.1f}" if s["seeds"] > 1 else ""
        return f"{100 * s['accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]{spread}"
    if column == "diff [95% CI]":
        if not vs or "difference" not in vs:
            return ""
        d, (lo, hi) = vs["difference"], vs["difference_ci95"]
        return f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    values = {
        "n": lambda: str(s["n"]),
        "per seed": lambda: ", ".join(f"{100 * r['accuracy']:.1f}" for r in s["runs"]) if s["seeds"] > 1 else "",
        "tokens": lambda: f"{s['mean_tokens']:.1f}",
        "gen tokens": lambda: f"{tokens:.1f}",
        "tokens (answer / generated)": lambda: f"{s['mean_tokens']:.1f} / {tokens:.1f}",
        "gen tokens (× greedy)": lambda: f"{tokens:.1f} ({tokens / generated_tokens(greedy):.2f})",
        "s/answer": lambda: f"{s['seconds_per_answer']:.2f}",
        "wall s / answer": lambda: f"{s['seconds_per_answer']:.1f}",
        "cut off": lambda: pct(s.get("cut_off")),
        "no answer": lambda: pct(s.get("no_answer")),
        "W/L/T vs greedy": lambda: f"{vs['wins']}/{vs['losses']}/{vs['ties']}" if vs else "",
        "p": lambda: format_p(vs["p_value"]) if vs else "",
        "p Holm": lambda: format_p(vs["p_holm"]) if vs else "",
        "strategies": lambda: strategy_text("", s),
        "records": lambda: s["records"],
    }
    return values[column]()


def markdown(table: Table, results: dict) -> str:
    if table.kind == "categories":
        return category_markdown(table, results)
    if table.kind.startswith("confidence"):
        mark = gate_markdown if table.kind == "confidence-gate" else confidence_markdown
        return mark(results, table.sources[0].path)
    if table.kind == "costs":
        return costs_markdown(results)
    if table.kind == "code":
        return code_markdown(results)
    if table.kind == "pairs":
        return pairs_markdown(table, results)
    if table.kind == "acceptance":
        return acceptance_markdown(results, *table.targets, where=table.sources[0].path)
    if table.kind.startswith("speed"):
        return speed_markdown(table.kind, results)
    if table.kind in ("ranking", "fixable"):
        return (ranking_markdown if table.kind == "ranking" else fixable_markdown)(results["pools"])
    if table.kind == "held-out":
        return held_out_markdown(results, where=", ".join(s.path for s in table.sources[-table.checks :]))
    if table.kind == "live-replay":
        return live_markdown(results, where=", ".join(s.path for s in table.sources))
    if table.kind.startswith("replay"):
        if table.kind == "replay-after-sealed":
            results = {**results, "rows": results["after_sealed"], "chosen": None}
        every = table.kind not in ("replay", "replay-per-model")
        return replay_markdown(results, every=every, where=", ".join(s.path for s in table.sources))
    if table.kind == "open":
        rows = [{**r, "records": results["samplers"][r["sampler"]]["records"]} for r in open_table_rows(results)]
        return markdown_table(rows)
    split = table.split or results.get("split", "all")
    head = [f"{split} accuracy [95% CI]" if c == "accuracy" and split != "all" else c for c in table.columns]
    greedy = results["samplers"]["greedy"]
    lines = ["| sampler | " + " | ".join(head) + " |", "| --- |" + " --- |" * len(head)]
    for name, s in results["samplers"].items():
        cells = [cell(c, s, greedy) for c in table.columns]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)


def pairs_markdown(table: Table, results: dict) -> str:
    """Each pair of rows over the same items: W/L/T, the difference's interval and the exact p."""
    rows = results["samplers"]
    lines = [
        "| deliberate | its tokens | against | their tokens (× its) | W/L/T | diff [95% CI] | p | records |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a, b in table.pairs:
        if b.endswith(" ~"):  # the vote row eval matched to a's tokens
            b = next(n for n, s in rows.items() if n.startswith(b[:-1]) and a in s.get("matches", []))
        c = results["pairs"].get(f"{a} vs {b}")
        if c is None:  # kept once, as "b vs a": turned round
            c = results["pairs"][f"{b} vs {a}"]
            lo, hi = c["difference_ci95"]
            c = {**c, "wins": c["losses"], "losses": c["wins"], "difference": -c["difference"]}
            c["difference_ci95"] = [-hi, -lo]
        ta, tb = generated_tokens(rows[a]), generated_tokens(rows[b])
        lo, hi = c["difference_ci95"]
        cells = [
            a,
            f"{ta:,.1f}",
            b,
            f"{tb:,.1f} ({tb / ta:.2f}×)",
            f"{c['wins']}/{c['losses']}/{c['ties']}",
            f"{100 * c['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]",
            format_p(c["p_value"]),
            rows[a]["records"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def category_markdown(table: Table, results: dict) -> str:
    rows = results["samplers"]
    lines = [
        "| category | " + " | ".join(table.columns) + " | records |",
        "| --- |" + " --- |" * (len(table.columns) + 1),
    ]
    for category in rows[table.columns[0]]["categories"]:
        cells = [f"{100 * rows[c]['categories'][category]['accuracy']:.0f}%" for c in table.columns]
        name = category.replace("_", " ")
        lines.append("| " + " | ".join([name, *cells, rows[table.columns[0]]["records"]]) + " |")
    return "\n".join(lines)


Q05 = [Source("docs/records/q05/results.json"), Source("docs/records/q05_cot", suffix="cot")]
Q15 = [
    Source("docs/records/q15/results.json"),
    Source("docs/records/q15_card", suffix="card", names={"deliberate": "deliberate (vote + stop)"}),
]
BUILTIN = [Source("docs/records/builtin_test", tasks="builtin")]
FRESH = [Source("docs/records/fresh_items", tasks="fresh")]
SEEDS = [Source("docs/records/builtin_seeds", tasks="builtin")]
OPEN = [Source("docs/records/open_text")]
MLX_LM = [
    Source(
        "docs/records/mlx_lm_dev",
        tasks="builtin",
        names={
            "entropix": "entropix (attention scores, branch rollouts)",
            "entropix_no_attention": "entropix without attention scores (rollouts kept)",
            "entropix_logits_only": "entropix, logits only (as inside mlx-lm)",
        },
    )
]
CODE_RUNS = [
    ("card", "entropix (card)"),
    ("norep", "entropix (card, repetition_bits = 0)"),
    ("ngram8", "entropix (card, repetition_ngram = 8)"),
    ("loops", 'entropix (card, repetition_scope = "loops")'),
]
PAIRED = ["W/L/T vs greedy", "diff [95% CI]"]
# Tables whose runs' records were lost: kept as printed, every row marked.
NO_RECORDS_TABLES = {
    "deliberate-cost",
    "deliberate-dev-rules-gsm8k",
    "deliberate-dev-rules-short",
    "deliberate-gsm8k-first-200",
    "deliberate-selectors-dev",
    "deliberate-selectors-test",
    "deliberate-stop-dev",
    "deliberate-vote-dev",
    "q05-200-299",
    "q05-equal-cost-pairs",
    "q15-gsm8k-first-200",
    "q15-open-text",
    "q15-short-test-split",
    "q15-staged-pairs",
    "reasoning-profile-dev",
    "tuning-trials",
}
COSTS = [Source("docs/records/sampler_costs")]
WIDE_POOL = Source("docs/records/dev_q05_wide")
BENCH = Source("docs/records/bench")
SEALED_Q05 = Source("docs/records/sealed_q05")
DEV_COLUMNS = ["accuracy", "gen tokens (× greedy)", "cut off", *PAIRED, "p", "wall s / answer", "records"]
GSM8K_COLUMNS = ["accuracy", "gen tokens (× greedy)", "cut off", *PAIRED, "p", "p Holm", "wall s / answer", "records"]
DEV_Q15 = Source("docs/records/dev_q15")
SEALED_Q15 = Source("docs/records/sealed_q15")
STAGED_Q15 = Source("docs/records/dev_q15_staged")
STAGED_Q15_B = Source("docs/records/dev_q15_staged_b")  # the next 100 items: a held-out check
STAGED_Q15_C = Source("docs/records/dev_q15_staged_c")  # the 100 after: a second one
LIVE_Q15 = Source("docs/records/live_q15_gate")  # the rule chosen on 0-199, live on 200-215
STAGED_Q05_D = Source("docs/records/dev_q05_staged")  # 0.5B train 300-399: a held-out check of its per-model gate
STAGED_Q05_E = Source("docs/records/dev_q05_staged_e")  # 0.5B train 400-499: its second set
Q15_RULE = "tail_logprob>=q0.5 then staged"  # the 1.5B pools' choice, replayed beside the 0.5B one


def dev_table(source: Source) -> Table:
    """A dev run's samplers on GSM8K train items (the run's own split says "test")."""
    return Table([source], DEV_COLUMNS, split="dev (train items)")


def vote_pairs(k: int) -> list[tuple[str, str]]:
    """deliberate against the vote rows of k samples and against the vote rows matched to its tokens."""
    return [("deliberate", f"{vote} {size}") for size in (f"k={k}", "~") for vote in ("self_consistency", "cisc")]


TABLES = {
    "sampler-costs": Table(COSTS, [], kind="costs"),
    "confidence-q05": Table([Source("docs/records/confidence_q05/candidates.json")], [], kind="confidence"),
    "confidence-gate-q05": Table([Source("docs/records/confidence_q05/gate.json")], [], kind="confidence-gate"),
    "confidence-smollm2": Table([Source("docs/records/confidence_smollm2/candidates.json")], [], kind="confidence"),
    "confidence-smollm2-test": Table(
        [Source("docs/records/confidence_smollm2_test/applied.json")], [], kind="confidence"
    ),
    "test-split-readme": Table(
        BUILTIN,
        ["accuracy", "gen tokens", "cut off", *PAIRED, "p Holm", "records"],
        rows=["greedy", "entropix", "deliberate"],
    ),
    "test-split": Table(
        BUILTIN,
        [
            "accuracy",
            "n",
            "tokens",
            "gen tokens",
            "s/answer",
            "cut off",
            "no answer",
            *PAIRED,
            "p",
            "p Holm",
            "strategies",
            "records",
        ],
    ),
    "test-split-categories": Table(BUILTIN, ["greedy", "entropix", "deliberate"], kind="categories"),
    "test-split-seeds": Table(
        SEEDS, ["accuracy", "per seed", "n", "gen tokens", "cut off", "no answer", *PAIRED, "p", "p Holm", "records"]
    ),
    "open-text": Table(OPEN, [], kind="open"),
    "mlx-lm-dev": Table(MLX_LM, ["accuracy", "gen tokens", "cut off", *PAIRED, "p", "p Holm", "strategies", "records"]),
    "deliberate-test-split": Table(
        BUILTIN,
        ["accuracy", "n", "W/L/T vs greedy", "p", "tokens (answer / generated)", "s/answer", "records"],
        rows=["greedy", "deliberate"],
    ),
    "deliberate-test-categories": Table(BUILTIN, ["greedy", "deliberate"], kind="categories"),
    "fresh-items": Table(
        FRESH, ["accuracy", "n", "tokens", "gen tokens", "cut off", *PAIRED, "p", "p Holm", "records"]
    ),
    "fresh-items-categories": Table(FRESH, ["greedy", "entropix", "deliberate"], kind="categories"),
    "q05-open-text": Table(
        [
            Source("docs/records/open_q05_card", names={"entropix": "entropix (card)"}),
            Source("docs/records/open_q05_ngram8", names={"entropix": "entropix (card, repetition_ngram = 8)"}),
            Source("docs/records/open_q05_loops", names={"entropix": 'entropix (card, repetition_scope = "loops")'}),
        ],
        [],
        kind="open",
    ),
    "code-prompts": Table(
        [
            Source(f"docs/records/code_own/qwen2.5-coder-0.5b-{run}.jsonl.gz", names={"entropix": label})
            for run, label in CODE_RUNS
        ],
        [],
        kind="code",
    ),
    "gated-rules": Table([WIDE_POOL], [], kind="replay"),
    "speed": Table([BENCH], [], kind="speed"),
    "speed-readme": Table([BENCH], [], kind="speed-readme"),
    "speed-schema": Table([Source("docs/records/bench_schema")], [], kind="speed-schema"),
    "gated-rules-all": Table([WIDE_POOL], [], kind="replay-all"),
    "gated-rules-after-sealed": Table([WIDE_POOL], [], kind="replay-after-sealed"),
    "sealed-q05": Table([SEALED_Q05], GSM8K_COLUMNS),
    "sealed-q05-pairs": Table(
        [SEALED_Q05],
        [],
        kind="pairs",
        pairs=[("deliberate", "deliberate_staged"), *vote_pairs(8), ("deliberate_staged", "cisc ~")],
    ),
    "sealed-q05-acceptance": Table([SEALED_Q05], [], kind="acceptance", targets=(0.04, "sc-staged")),
    "sealed-q05-readme": Table(
        [SEALED_Q05],
        ["accuracy", "gen tokens (× greedy)", "cut off", *PAIRED, "p", "records"],
        rows=["greedy", "deliberate", "deliberate_staged", "self_consistency k=8", "cisc k=8"],
    ),
    "dev-q15": dev_table(DEV_Q15),
    "sealed-q15": Table([SEALED_Q15], GSM8K_COLUMNS),
    "gate-ranking": Table(
        [
            Source(WIDE_POOL.path, label="0.5B dev (train 0-299)", sampler="deliberate"),
            Source(SEALED_Q05.path, label="0.5B sealed", sampler="deliberate_staged"),
            Source(DEV_Q15.path, label="1.5B dev (train 0-99)", sampler="deliberate"),
            Source(SEALED_Q15.path, label="1.5B sealed", sampler="deliberate"),
            Source(STAGED_Q15_B.path, label="1.5B dev (train 100-199)", sampler="deliberate_staged"),
            Source(STAGED_Q15_C.path, label="1.5B dev (train 200-299)", sampler="deliberate_staged"),
            Source(STAGED_Q05_D.path, label="0.5B dev (train 300-399)", sampler="deliberate_staged"),
            Source(STAGED_Q05_E.path, label="0.5B dev (train 400-499)", sampler="deliberate_staged"),
        ],
        [],
        kind="ranking",
    ),
    "gate-fixable": Table(
        [
            Source(WIDE_POOL.path, label="0.5B dev (train 0-299)", sampler="deliberate"),
            Source(SEALED_Q05.path, label="0.5B sealed", sampler="deliberate_staged"),
            Source(STAGED_Q15.path, label="1.5B dev (train 0-99)", sampler="deliberate_staged"),
            Source(STAGED_Q15_B.path, label="1.5B dev (train 100-199)", sampler="deliberate_staged"),
            Source(STAGED_Q15_C.path, label="1.5B dev (train 200-299)", sampler="deliberate_staged"),
            Source(STAGED_Q05_D.path, label="0.5B dev (train 300-399)", sampler="deliberate_staged"),
            Source(STAGED_Q05_E.path, label="0.5B dev (train 400-499)", sampler="deliberate_staged"),
        ],
        [],
        kind="fixable",
    ),
    "staged-q15": dev_table(STAGED_Q15),
    "gated-rules-q15": Table([STAGED_Q15], [], kind="replay-per-model"),
    "gated-rules-q15-all": Table([STAGED_Q15], [], kind="replay-per-model-all"),
    "staged-q15-b": dev_table(STAGED_Q15_B),
    "gated-held-out-q15": Table([STAGED_Q15, STAGED_Q15_B], [], kind="held-out"),
    "gated-rules-q15-200": Table([STAGED_Q15, STAGED_Q15_B], [], kind="replay-per-model"),
    "gated-rules-q15-200-all": Table([STAGED_Q15, STAGED_Q15_B], [], kind="replay-per-model-all"),
    "gated-live-q15": Table([LIVE_Q15, STAGED_Q15_C], [], kind="live-replay"),
    "staged-q15-c": dev_table(STAGED_Q15_C),
    "gated-held-out-q15-c": Table([STAGED_Q15, STAGED_Q15_C], [], kind="held-out"),
    "gated-held-out-q15-c200": Table([STAGED_Q15, STAGED_Q15_B, STAGED_Q15_C], [], kind="held-out"),
    "gated-rules-q15-300": Table([STAGED_Q15, STAGED_Q15_B, STAGED_Q15_C], [], kind="replay-per-model"),
    "gated-rules-q15-300-all": Table([STAGED_Q15, STAGED_Q15_B, STAGED_Q15_C], [], kind="replay-per-model-all"),
    "gated-rules-q05-per-model": Table([WIDE_POOL], [], kind="replay-per-model"),
    "gated-rules-q05-per-model-all": Table([WIDE_POOL], [], kind="replay-per-model-all"),
    "staged-q05-d": dev_table(STAGED_Q05_D),
    "gated-held-out-q05": Table([WIDE_POOL, STAGED_Q05_D], [], kind="held-out", rows=[Q15_RULE]),
    "staged-q05-e": dev_table(STAGED_Q05_E),
    "gated-held-out-q05-e": Table([WIDE_POOL, STAGED_Q05_E], [], kind="held-out", rows=[Q15_RULE]),
    "gated-held-out-q05-200": Table(
        [WIDE_POOL, STAGED_Q05_D, STAGED_Q05_E], [], kind="held-out", rows=[Q15_RULE], checks=2
    ),
    "gated-rules-q05-400": Table([WIDE_POOL, STAGED_Q05_D], [], kind="replay-per-model"),
    "gated-rules-q05-500": Table([WIDE_POOL, STAGED_Q05_D, STAGED_Q05_E], [], kind="replay-per-model"),
    "gated-rules-q05-500-all": Table([WIDE_POOL, STAGED_Q05_D, STAGED_Q05_E], [], kind="replay-per-model-all"),
    "sealed-q15-pairs": Table(
        [SEALED_Q15],
        [],
        kind="pairs",
        pairs=[*vote_pairs(4), ("deliberate", "self_consistency k=2"), ("deliberate", "cisc k=2")],
    ),
    "sealed-q15-acceptance": Table([SEALED_Q15], [], kind="acceptance", targets=(0.05, "cisc")),
    "q05-readme": Table(Q05, ["accuracy", "gen tokens", "cut off", *PAIRED, "p Holm", "records"]),
    "q05": Table(
        Q05,
        ["accuracy", "n", "gen tokens", "s/answer", "cut off", "no answer", *PAIRED, "p", "p Holm", "records"],
        chart="docs/gsm8k_equal_cost_q05.png",
    ),
    "q15": Table(
        Q15,
        GSM8K_COLUMNS,
        chart="docs/gsm8k_equal_cost_q15.png",
    ),
}


def marked(path: Path) -> dict[str, tuple[int, int]]:
    """{name: (first line, end line)} of each marked table in a file."""
    lines, spans = path.read_text().splitlines(), {}
    for i, line in enumerate(lines):
        if m := MARK.match(line):
            end = i + 1
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            spans.setdefault(m.group(1), (i + 1, end))
    return spans


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def unmarked_result_tables(path: Path) -> list[int]:
    """Line numbers of results tables (RESULTS_HEADER) with no marker above."""
    lines = path.read_text().splitlines()
    return [
        i + 1
        for i, line in enumerate(lines)
        if RESULTS_HEADER.match(line) and not lines[i - 1].startswith("|") and not (i and MARK.match(lines[i - 1]))
    ]


def no_records_problems(path: Path, name: str, span: tuple[int, int]) -> list[str]:
    rows = path.read_text().splitlines()[span[0] + 2 : span[1]]
    bad = [r for r in rows if not r.rstrip().endswith(f"| {NO_RECORDS} |")]
    return [f"{path.name}: table {name}: {len(bad)} rows do not say {NO_RECORDS}"] if bad else []


def problems(write: bool, paths: list[Path] | None = None, tables: dict | None = None) -> list[str]:
    """What differs between the marked tables and their records (rewritten if `write`), and tables placed nowhere."""
    tables = TABLES if tables is None else tables
    built, out, placed = {}, [], set()
    for path in documents() if paths is None else paths:
        text, spans = path.read_text().splitlines(), marked(path)
        placed |= spans.keys()
        out += [
            f"{path.name}:{n}: a results table without a <!-- table: NAME --> line"
            for n in unmarked_result_tables(path)
        ]
        for name, span in sorted(spans.items(), key=lambda kv: -kv[1][0]):
            if name in NO_RECORDS_TABLES:
                out += no_records_problems(path, name, span)
                continue
            if name not in tables:
                out.append(f"{path.name}: table {name} is not in research/tables.py's TABLES")
                continue
            if name not in built:
                built[name] = merged(tables[name])
            want = markdown(tables[name], built[name]).splitlines()
            if text[span[0] : span[1]] != want:
                out.append(f"{path.name}: table {name} differs from what its records give")
                text[span[0] : span[1]] = want
        if write:
            path.write_text("\n".join(text) + "\n")
    out += [
        f"table {name} is in research/tables.py's TABLES but in no document" for name in tables if name not in placed
    ]
    if write:
        for name, results in built.items():
            if tables[name].chart:
                plot(results, ROOT / tables[name].chart)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    args = parser.parse_args()
    found = problems(write=not args.check)
    for line in found:
        print(line)
    return 1 if found and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
