"""The speed acceptance in one command: `python scripts/speed_check.py [--repeats 2] [--bench]`.

Quiet, then beside a busy neighbour (a NumPy matrix-product loop per core, as `bench
--contended` starts): `entropix-mlx run` with the default weights and with `--weights native`,
back to back, each pair repeated; the generation rate from each `--json` summary and the load
average with each figure. `--bench` adds `bench` (and `bench --contended`) in the same machine
states. Prints one line per figure with its command, and a JSON object at the end.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from contextlib import nullcontext

from entropix_mlx.eval.neighbour import busy_neighbour

PROMPT = "Write a Python function that checks if a string is a palindrome."
CLI = shutil.which("entropix-mlx") or "entropix-mlx"


def run_tps(weights: str, max_tokens: int) -> tuple[float, float]:
    command = [CLI, "run", PROMPT, "--sampler", "greedy", "--max-tokens", str(max_tokens), "--json"]
    command += ["--weights", weights]
    load = os.getloadavg()[0]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    return summary["generation_tps"], load


def bench(contended: bool, gen_tokens: int, repeats: int) -> dict:
    command = [CLI, "bench", "--json", "--gen-tokens", str(gen_tokens), "--repeats", str(repeats)]
    command += ["--contended"] if contended else []
    result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    return {
        "mlx_lm_decode": result["mlx_lm"]["decode_tps"],
        "greedy_decode": result["entropix_greedy"]["decode_tps"],
        "entropix_decode": result["entropix"]["decode_tps"],
        "ratios": result["ratios"],
        "load_average": result["machine"]["load_average"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--bench", action="store_true", help="also bench and bench --contended")
    parser.add_argument("--gen-tokens", type=int, default=64, help="bench's --gen-tokens")
    parser.add_argument("--bench-repeats", type=int, default=2, help="bench's --repeats")
    args = parser.parse_args()
    report = {}
    for state in ("quiet", "contended"):
        pairs = []
        with busy_neighbour() if state == "contended" else nullcontext():
            for _ in range(args.repeats):
                auto, auto_load = run_tps("auto", args.max_tokens)
                native, native_load = run_tps("native", args.max_tokens)
                pairs.append({"auto": auto, "native": native, "load": [auto_load, native_load]})
                print(
                    f"{state}: run --weights auto {auto:.2f} tok/s (load {auto_load:.2f}), "
                    f"--weights native {native:.2f} tok/s (load {native_load:.2f}): {auto / native:.2f}x",
                    flush=True,
                )
        if args.bench:  # right after the pairs; --contended starts the same neighbour itself
            b = bench(state == "contended", args.gen_tokens, args.bench_repeats)
            print(f"{state}: bench{' --contended' if state == 'contended' else ''} {json.dumps(b)}", flush=True)
            report[f"{state}_bench"] = b
        report[state] = pairs
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
