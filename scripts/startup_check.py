"""Time to one token from a cold process, the second start and later (the load
cache filled by the first): `entropix-mlx run --sampler greedy --max-tokens 1 "Hi"`
on each model, and, for a GGUF file, mlx-lm's own load + one token on the same
file converted to an MLX directory (`entropix-mlx convert`), in the same script.

    python scripts/startup_check.py MODEL.gguf [MODEL.gguf ...] [--repeats 3]

Each figure is the median wall time of `--repeats` runs of a fresh process; the
first run of each model (which fills the cache, or finds it filled) is reported
apart, and `--no-cache` runs show every start as it was without the cache.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = ["run", "--sampler", "greedy", "--max-tokens", "1", "Hi"]
MLX_LM = """
import sys, mlx_lm
model, tokenizer = mlx_lm.load(sys.argv[1])
messages = [{"role": "user", "content": "Hi"}]
prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True) if tokenizer.chat_template else "Hi"
mlx_lm.generate(model, tokenizer, prompt, max_tokens=1)
"""


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ours = [str(Path(sys.executable).with_name("entropix-mlx"))]  # the console script, as a user starts it
    print(
        "| model | first start | later starts (median) | every start without the cache (`--no-cache`, median) "
        "| mlx-lm load + one token, converted (median) | later start / mlx-lm |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for model in args.models:
        first = wall([*ours, *RUN, "-m", model])
        later = statistics.median(wall([*ours, *RUN, "-m", model]) for _ in range(args.repeats))
        uncached = statistics.median(wall([*ours, *RUN, "-m", model, "--no-cache"]) for _ in range(args.repeats))
        theirs, ratio = "", ""
        if model.endswith(".gguf"):
            with tempfile.TemporaryDirectory() as tmp:
                converted = Path(tmp) / "converted"
                subprocess.run([*ours, "convert", model, str(converted)], check=True, capture_output=True)
                t = statistics.median(wall([sys.executable, "-c", MLX_LM, str(converted)]) for _ in range(args.repeats))
            theirs, ratio = f"{t:.1f} s", f"{later / t:.2f}"
        print(f"| {Path(model).name} | {first:.1f} s | {later:.1f} s | {uncached:.1f} s | {theirs} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
