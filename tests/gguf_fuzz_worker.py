"""Run by tests/test_gguf_fuzz.py in a subprocess, so that a native crash of the
loader shows up as a failed test instead of killing pytest.

argv: BASE.gguf N_CASES SEED WORKDIR. Mutates 1-4 bytes of the header region per
case, loads the result with `load_gguf`, and prints one JSON line of counts.
Any exception other than EntropixError is printed and exits 1.
"""

import json
import random
import sys
import traceback
from pathlib import Path

from entropix_mlx.errors import EntropixError
from entropix_mlx.model.loading import load_gguf

base, n_cases, seed, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
data = Path(base).read_bytes()
header_end = int(sys.argv[5]) if len(sys.argv) > 5 else len(data)
rng = random.Random(seed)
counts = {"cases": 0, "rejected": 0, "loaded": 0}
for i in range(n_cases):
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        mutated[rng.randrange(header_end)] = rng.randrange(256)
    if rng.random() < 0.1:  # sometimes also truncate
        mutated = mutated[: rng.randrange(len(mutated))]
    path = workdir / "case.gguf"
    path.write_bytes(mutated)
    (workdir / "progress").write_text(str(i))  # which case was running if the process dies
    counts["cases"] += 1
    try:
        load_gguf(path)
        counts["loaded"] += 1
    except EntropixError as e:
        assert "\n" not in str(e), f"multi-line error: {e!r}"
        counts["rejected"] += 1
    except Exception:
        (workdir / "failing.gguf").write_bytes(mutated)
        traceback.print_exc()
        print(json.dumps(counts))
        sys.exit(1)
print(json.dumps(counts))
