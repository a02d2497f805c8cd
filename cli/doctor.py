"""`entropix-mlx doctor`: which compute path runs on this machine, and why.

The fast path falls back quietly by design (no OpenBLAS, no compiler, an unsafe cache
folder: plain MLX or plain OpenBLAS runs and nothing fails), so this says what happened.
"""

import os
import platform
import stat
import sys

import mlx.core as mx
import typer

from entropix_mlx.accel.blas import blas_info, blas_name
from entropix_mlx.accel.build import cache_folder, compiler
from entropix_mlx.accel.weights import auto_rule, default_weights

from .cache_cmd import summary_line

SETTINGS = (
    "ENTROPIX_BLAS",
    "ENTROPIX_BLAS_SHIM",
    "OPENBLAS_CORETYPE",
    "ENTROPIX_WEIGHTS",
    "CC",
    "ENTROPIX_THREADS",
    "OMP_NUM_THREADS",
)


def shim_line(info: dict) -> str:
    if info["shim"]:
        kind = "thin kernels" if info["thin_gemm"] else "GEMV only (built without threads, or a CPU without AVX2)"
        return f"{kind}: {info['shim']}"
    if info["name"]:
        return f"not running: {info['shim_reason']}"
    return "not running: it goes in front of OpenBLAS, which is not loaded"


def kernels_line(info: dict) -> str:
    if info["core"]:
        return f"{info['core']}: {info['core_reason']}"
    return "OpenBLAS does not say which" if info["name"] else "none: OpenBLAS is not loaded"


def cache_line() -> str:
    folder, why = cache_folder(create=False)
    if why:
        return f"{folder}: {why}" if folder else why
    mode = stat.S_IMODE(os.stat(folder).st_mode)
    return f"{folder}: usable (yours, mode {mode:o}); shim builds with {' '.join(compiler())}"


def report() -> list[tuple[str, str]]:
    """(what, its state and why) for each part of the compute path."""
    info = blas_info()
    device = "cpu" if mx.default_device() == mx.cpu else "gpu"
    rows = [
        ("device", f"{device} (MLX {mx.__version__}, {sys.platform} {platform.machine()})"),
        ("BLAS", f"{blas_name()}: {info['path'] or info['reason'] or 'the platform BLAS'}"),
    ]
    if sys.platform == "linux":
        rows += [("kernels", kernels_line(info)), ("shim", shim_line(info)), ("cache", cache_line())]
    weights = default_weights()
    source = "ENTROPIX_WEIGHTS" if os.environ.get("ENTROPIX_WEIGHTS") else "default"
    rows.append(("weights", f"{weights} ({source})" + (f"; auto picks {auto_rule()}" if weights == "auto" else "")))
    rows.append(("load cache", summary_line()))
    settings = [f"{name}={os.environ[name]}" for name in SETTINGS if name in os.environ]
    rows.append(("settings", " ".join(settings) or "none set"))
    return rows


def doctor():
    """Print which compute path runs and why: device, BLAS, the shim, its cache folder, weights."""
    rows = report()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


def register(app: typer.Typer):
    app.command()(doctor)
