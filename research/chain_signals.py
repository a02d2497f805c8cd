"""Read greedy chains of thought already on record back through their model in one
pass each, and keep what an answer's confidence can be fitted on: per-token
log-probability, entropy, varentropy and margin, and the residual stream at three
layers (at the last token, at the end of the extracted answer, and averaged over
the chain). Resumable: one `part-NNN.npz` per `--chunk` items.

    python -m research.chain_signals MODEL.gguf OUT_DIR docs/records/dev_q05_wide ...
"""

import argparse
import gzip
import hashlib
import json
from pathlib import Path

import numpy as np

import entropix_mlx.accel

TRAIN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k_train.jsonl"


def greedy_records(folders: list[Path]) -> list[dict]:
    """Every greedy record of the folders, by item index (the first one kept)."""
    out = {}
    for folder in folders:
        for part in sorted(folder.glob("items-*.jsonl.gz")) + sorted(folder.glob("items.jsonl")):
            with gzip.open(part, "rt") if part.suffix == ".gz" else open(part) as f:
                for line in f:
                    r = json.loads(line)
                    if r["sampler"] == "greedy":
                        out.setdefault(r["index"], r)
    return [out[i] for i in sorted(out)]


def answer_end(tokenizer, answer: list[int], extracted: str | None) -> int:
    """The index of the answer token where the last mention of the extracted
    answer ends (the last token when there is none)."""
    if not extracted:
        return len(answer) - 1
    pieces = [tokenizer.decode([t]) for t in answer]
    text = "".join(pieces)
    at = text.rfind(extracted)
    if at < 0:
        return len(answer) - 1
    end, seen = at + len(extracted), 0
    for i, piece in enumerate(pieces):
        seen += len(piece)
        if seen >= end:
            return i
    return len(answer) - 1


def item_signals(loaded, prompt: list[int], record: dict, layers: tuple[int, ...]) -> dict:
    answer = [top[0][0] for top in record["top"]]
    s = loaded.forced(prompt, answer, hidden_at=layers)
    end = answer_end(loaded.tokenizer, answer, record["extracted"])
    out = {k: s[k].astype(np.float16) for k in ("logprob", "entropy", "varentropy", "margin")}
    for i, h in s["hidden"].items():
        out[f"last_{i}"] = h[-1].astype(np.float16)
        out[f"answer_{i}"] = h[end].astype(np.float16)
        out[f"mean_{i}"] = h.mean(axis=0).astype(np.float16)
    out["answer_end"] = np.int32(end)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--tasks", type=Path, default=TRAIN, help="the items' task file, or builtin")
    args = parser.parse_args()
    entropix_mlx.accel.enable()  # before anything imports MLX
    from entropix_mlx import load_model
    from entropix_mlx.eval import builtin_tasks_path, load_tasks

    loaded = load_model(args.model)
    n = loaded.model.args.num_hidden_layers
    layers = (n // 2, (3 * n) // 4, n - 1)
    tasks = load_tasks(args.tasks if args.tasks != Path("builtin") else builtin_tasks_path())
    cot = json.loads((args.folders[0] / "config.json").read_text()).get("cot", False)
    records = greedy_records(args.folders)
    args.out.mkdir(parents=True, exist_ok=True)
    for c in range(0, len(records), args.chunk):
        path = args.out / f"part-{c // args.chunk:03d}.npz"
        if path.exists():
            continue
        arrays = {}
        for r in records[c : c + args.chunk]:
            task = tasks[r["index"]]
            prompt = loaded.encode([{"role": "user", "content": task.prompt_text(cot=cot)}])
            if hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:16] != r["prompt_sha256"]:
                raise SystemExit(f"item {r['index']}: the prompt differs from the one on record")
            for k, v in item_signals(loaded, prompt, r, layers).items():
                arrays[f"{r['index']}/{k}"] = v
            meta = {"correct": bool(r["correct"]), "finish": r["finish_reason"], "tokens": r["tokens"]}
            arrays[f"{r['index']}/meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez_compressed(path, **arrays)
        print(
            f"{path.name}: items {records[c]['index']}-{records[min(c + args.chunk, len(records)) - 1]['index']}",
            flush=True,
        )
    (args.out / "about.json").write_text(
        json.dumps(
            {
                "model": loaded.name,
                "layers": list(layers),
                "items": len(records),
                "sources": [str(f) for f in args.folders],
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
