"""A busy neighbour for the contended bench: NumPy matrix products on every core.

One process per core, each looping `a @ a` on a 1000 x 1000 matrix with NumPy's own
multi-threaded BLAS, so every core has more runnable threads than it can run: what another
ML job, a build or a second entropix-mlx process does to a shared machine. Started before
the bench's first run and ended after its last, whatever happens in between. `SPIN_CODE`
is a milder neighbour: one Python loop, which keeps one core busy and leaves the others
free, as one other busy program does.
"""

import os
import subprocess
import sys
from contextlib import contextmanager

NEIGHBOUR_CODE = "import numpy as np\na = np.random.rand(1000, 1000)\nwhile True:\n    a @ a\n"
SPIN_CODE = "while True:\n    pass\n"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def busy_neighbour(processes: int | None = None, code: str = NEIGHBOUR_CODE):
    """Runs `processes` (default: one per core) Python processes of `code` (default: the
    NumPy product loop) for the duration of the `with` block; yields their `Popen`s. They
    are ended on the way out, also on an error or Ctrl-C."""
    procs = []
    try:
        for _ in range(processes or cores()):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
