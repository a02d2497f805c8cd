"""Which of its kernels a system OpenBLAS runs on this CPU.

A distribution's OpenBLAS is built with kernels for many x86-64 CPUs and picks one set by
the CPU's model when it is loaded. A CPU newer than the library is a model it does not know,
and it falls back to its oldest set (Prescott: SSE3), several times slower than its own
AVX2 or AVX-512 kernels on the products of a prompt or of a wide batch. `OPENBLAS_CORETYPE`
names the set to use instead. `forced_core` asks the library what it would pick (in a child
process: the pick is made once, when the library is loaded) and names the set that this
CPU's instructions allow when the library's own pick uses fewer of them. A
`OPENBLAS_CORETYPE` set by the user is never overridden.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

# OpenBLAS's x86-64 kernel sets by the widest vector instructions they use:
# 3 AVX-512, 2 AVX2 + FMA, 1 AVX; every other name (Prescott, Nehalem, ...) 0.
CORE_LEVELS = {
    "skylakex": 3,
    "cooperlake": 3,
    "sapphirerapids": 3,
    "haswell": 2,
    "zen": 2,
    "sandybridge": 1,
    "bulldozer": 1,
    "piledriver": 1,
    "steamroller": 1,
    "excavator": 1,
}
# The set OpenBLAS is told to use for each level: the one every CPU of that level runs.
CORE_FOR_LEVEL = {3: "SkylakeX", 2: "Haswell", 1: "Sandybridge"}
LEVEL_NAMES = {3: "AVX-512", 2: "AVX2", 1: "AVX"}
AVX512 = {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}  # what SkylakeX's kernels use

_ASK = (
    "import ctypes, sys\n"
    "name = ctypes.CDLL(sys.argv[1]).openblas_get_corename\n"
    "name.restype = ctypes.c_char_p\n"
    "print(name().decode())\n"
)


def cpu_level(flags: set[str]) -> int:
    """The widest kernel level the CPU (as the OS reports it) can run."""
    if AVX512 <= flags:
        return 3
    if {"avx2", "fma"} <= flags:
        return 2
    return 1 if "avx" in flags else 0


def core_level(name: str) -> int:
    return CORE_LEVELS.get(name.lower(), 0)


def cpu_flags() -> set[str]:
    """The instruction flags /proc/cpuinfo lists for the first CPU (empty if none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def own_core(path: str) -> str | None:
    """The kernel set OpenBLAS at `path` picks for this CPU by itself, or None if it
    cannot say (no `openblas_get_corename`, or the child failed)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["OPENBLAS_NUM_THREADS"] = "1"  # the child needs no thread pool
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _ASK, path], capture_output=True, text=True, env=env, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    name = out.stdout.strip()
    return name if out.returncode == 0 and name else None


# Plain words for `doctor`: OpenBLAS chose the kernels, and the CPU offers nothing wider.
OWN_PICK = "chosen by OpenBLAS for this CPU (nothing wider to switch to)"


def better_core(own: str | None, flags: set[str]) -> str | None:
    """The kernel set to force, given OpenBLAS's own pick and the CPU's flags; None keeps its pick."""
    if own is None:
        return None
    level = cpu_level(flags)
    return CORE_FOR_LEVEL[level] if level > core_level(own) else None


def forced_core(path: str) -> tuple[str | None, str]:
    """(the kernel set to load OpenBLAS at `path` with, or None for its own pick; why)."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None, f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} (your setting)"
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None, OWN_PICK
    flags = cpu_flags()
    level = cpu_level(flags)
    if level == 0:
        return None, OWN_PICK
    own = own_core(path)
    forced = better_core(own, flags)
    if forced is None:
        return None, OWN_PICK
    return forced, f"OpenBLAS took this CPU for {own}, whose kernels leave its {LEVEL_NAMES[level]} unused"
