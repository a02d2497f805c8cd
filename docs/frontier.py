"""One cost/accuracy chart and table from several `eval --out` folders over the
same items (docs/evaluation.md): e.g. the baselines' run and a later run of
settings chosen since, whose rows would otherwise sit on two charts.

    python docs/frontier.py OUT.png DIR[=SUFFIX] DIR[=SUFFIX] ... [--name ROW=LABEL ...]

DIR is an `eval --out` folder (its results.json: the last run's rows) or the file
an `eval --json` run wrote, for runs that shared one folder. Each must cover the
same items; a sampler name that is in an earlier folder too gets the folder's
SUFFIX (default: the folder's name) so both rows show (`--name` relabels a row).
Greedy is drawn once, from the first folder, unless a later folder's greedy
differs (a rerun that decoded otherwise): then that one shows too, with its
SUFFIX. Holm's correction runs again over all the rows.
"""

import argparse
import json
from pathlib import Path

from entropix_mlx.eval.report import generated_tokens, markdown_table, plot, table_rows
from entropix_mlx.eval.stats import holm


def same_greedy(a: dict, b: dict) -> bool:
    """Two runs' greedy rows agree to the precision a printed table keeps; if not,
    both are shown, since each run's rows are paired with their own greedy."""
    return a["accuracy"] == b["accuracy"] and abs(generated_tokens(a) - generated_tokens(b)) < 0.05


def merged(folders: list[str]) -> dict:
    out = None
    for spec in folders:
        folder, _, suffix = spec.partition("=")
        path = Path(folder)
        if path.is_file():  # an `eval --json` output
            results, name_of_source = json.loads(path.read_text()), path.stem
        else:
            results, name_of_source = json.loads((path / "results.json").read_text()), path.name
        if out is None:
            out = {**results, "samplers": dict(results["samplers"])}
            continue
        if (results["item_range"], results["items"]) != (out["item_range"], out["items"]):
            raise SystemExit(f"{folder} covers items {results['item_range']}, not {out['item_range']}: run its summary")
        for name, s in results["samplers"].items():
            if name == "greedy" and same_greedy(s, out["samplers"]["greedy"]):
                continue
            label = f"{name} ({suffix or name_of_source})" if name in out["samplers"] else name
            out["samplers"][label] = s
    # Holm's correction over every row compared with greedy, across the folders
    rows = {n: s["vs_greedy"] for n, s in out["samplers"].items() if "vs_greedy" in s}
    for name, p in holm({n: vs["p_value"] for n, vs in rows.items()}).items():
        out["samplers"][name] = {**out["samplers"][name], "vs_greedy": {**rows[name], "p_holm": p}}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("png")
    parser.add_argument("folders", nargs="+", help="eval --out folders or --json files, each DIR or DIR=SUFFIX")
    parser.add_argument("--name", action="append", default=[], help="ROW=LABEL: the row's label in the chart")
    args = parser.parse_args()
    results = merged(args.folders)
    names = dict(n.split("=", 1) for n in args.name)
    results["samplers"] = {names.get(k, k): v for k, v in results["samplers"].items()}
    plot(results, args.png)
    print(markdown_table(table_rows(results, strategies=False)))
