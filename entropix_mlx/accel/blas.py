"""A system OpenBLAS, and the shim in front of it, put where MLX's CPU backend finds them.

MLX calls `cblas_sgemm` from whichever library comes first in the process's global symbol
scope when `mlx.core` is first imported. `load_blas()` (what `entropix_mlx.accel.enable()`
runs) loads OpenBLAS with `RTLD_GLOBAL` before that, with the shim (blas_shim.c, built by
build.py) ahead of it: no `LD_PRELOAD`, no rebuild of MLX. Once mlx.core is imported its
BLAS is bound, so a later call loads nothing and its reason says so. Nothing here runs on
import: loading native code into the whole process and running the compiler are the
caller's decision. Never fails: without OpenBLAS, MLX keeps its own BLAS.
"""

import ctypes
import ctypes.util
import os
import platform
import sys
from contextlib import contextmanager
from pathlib import Path

from .build import build_shim
from .openblas_core import forced_core

# Where distributions put OpenBLAS (the pthread build first: it uses every core).
_ARCH = platform.machine()


OPENBLAS_CANDIDATES = (
    f"/usr/lib/{_ARCH}-linux-gnu/openblas-pthread/libopenblas.so.0",  # Debian, Ubuntu
    f"/usr/lib/{_ARCH}-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",  # Fedora (pthread)
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",  # Arch
    "/usr/lib/libopenblas.so",
)


NOT_ENABLED = "entropix_mlx.accel.enable() was not called"
MLX_FIRST = "mlx.core was imported before entropix_mlx.accel.enable(); MLX's own BLAS is already bound"

_blas: dict = {
    "name": None,
    "path": None,
    "reason": NOT_ENABLED,
    "shim": None,
    "shim_reason": "",
    "thin_gemm": False,
    "core": None,
    "core_reason": "",
}


_shim_library = None  # the loaded shim (its call counter, for tests)


_OFF = ("none", "off", "0", "false")


def load_blas() -> dict:
    """Load a system OpenBLAS (and the shim) into the global symbol scope, once, before
    MLX. Returns `blas_info()`: what runs, or why nothing was loaded."""
    if _blas["reason"] != NOT_ENABLED:
        return blas_info()
    if sys.platform != "linux":
        _blas.update(reason="not Linux: MLX uses the platform's BLAS (Accelerate on macOS)")
        return blas_info()
    if "mlx.core" in sys.modules:
        _blas.update(reason=MLX_FIRST)
        return blas_info()
    wanted = os.environ.get("ENTROPIX_BLAS", "").strip()
    if wanted.lower() in _OFF:
        _blas.update(reason="ENTROPIX_BLAS=none")
        return blas_info()
    candidates = [wanted] if wanted else [*OPENBLAS_CANDIDATES, ctypes.util.find_library("openblas")]
    for path in candidates:
        if not path or (os.sep in path and not Path(path).exists()):
            continue
        forced, core_reason = forced_core(path)
        try:
            # Local first: the shim's cblas_sgemm must come before OpenBLAS's in the global scope.
            with _coretype(forced):
                library = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            library.cblas_sgemm  # noqa: B018  (an OpenBLAS without CBLAS would not help)
        except (OSError, AttributeError):
            continue
        core = _core_name(library)
        if forced and (core or "").lower() != forced.lower():
            core_reason = f"chosen by OpenBLAS for this CPU (OPENBLAS_CORETYPE={forced} was ignored)"
        shim, shim_reason = _load_shim(library)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # now global: MLX's other BLAS calls resolve to it
        thin = bool(shim and _shim_library.entropix_thin_gemm_active())
        _blas.update(name="OpenBLAS", path=path, reason="", shim=shim, shim_reason=shim_reason, thin_gemm=thin)
        _blas.update(core=core, core_reason=core_reason if core else "")
        return blas_info()
    _blas.update(
        reason=f"ENTROPIX_BLAS={wanted} could not be loaded"
        if wanted
        else "no system OpenBLAS found (Debian/Ubuntu: apt install libopenblas0-pthread)"
    )
    return blas_info()


@contextmanager
def _coretype(name: str | None):
    """OPENBLAS_CORETYPE=name while OpenBLAS loads (it reads it then, once); the
    environment is left as it was."""
    if name is None:
        yield
        return
    os.environ["OPENBLAS_CORETYPE"] = name
    try:
        yield
    finally:
        del os.environ["OPENBLAS_CORETYPE"]


def _core_name(library) -> str | None:
    """The kernel set the loaded OpenBLAS runs (None if it cannot say)."""
    try:
        name = library.openblas_get_corename
    except AttributeError:
        return None
    name.restype = ctypes.c_char_p
    return (name() or b"").decode() or None


def _load_shim(openblas) -> tuple[str | None, str]:
    """Build and load the shim in front of `openblas` (loaded, not yet global).
    Returns (its path, "") or (None, why plain OpenBLAS runs)."""
    if os.environ.get("ENTROPIX_BLAS_SHIM", "").strip().lower() in _OFF:
        return None, "ENTROPIX_BLAS_SHIM=off"
    try:
        sgemm, sgemv = openblas.cblas_sgemm, openblas.cblas_sgemv
    except AttributeError:
        return None, "this OpenBLAS has no cblas_sgemv"
    path, why = build_shim()
    if path is None:
        return None, why
    set_threads = getattr(openblas, "openblas_set_num_threads", None)  # the shim's threads replace them
    global _shim_library
    try:
        shim = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        if not shim.entropix_blas_shim_init(
            ctypes.cast(sgemm, ctypes.c_void_p),
            ctypes.cast(sgemv, ctypes.c_void_p),
            ctypes.cast(set_threads, ctypes.c_void_p) if set_threads else None,
            ctypes.c_int(shim_threads()),
        ):
            return None, "the shim did not get OpenBLAS's functions"
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # first in the global scope: MLX's cblas_sgemm is the shim's
    except (OSError, AttributeError) as e:
        return None, f"cannot load {path}: {e}"
    _shim_library = shim
    return path, ""


def shim_threads() -> int:
    """How many threads one product may use, the calling one included: `ENTROPIX_THREADS`,
    else `OMP_NUM_THREADS` (its first number, as OpenMP reads it), else the cores this
    process may run on."""
    for name in ("ENTROPIX_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_stats() -> dict:
    """{"threads": how many threads a product may use, "worker_chunks": the chunks the shim's
    workers have computed in this process, "solo_products": the products the calling thread ran
    alone because a worker had lost its core}."""
    if _shim_library is None:
        return {"threads": 1, "worker_chunks": 0, "solo_products": 0}
    for name in ("entropix_worker_chunks", "entropix_solo_products"):
        getattr(_shim_library, name).restype = ctypes.c_long
    return {
        "threads": _shim_library.entropix_threads(),
        "worker_chunks": _shim_library.entropix_worker_chunks(),
        "solo_products": _shim_library.entropix_solo_products(),
    }


def blas_info() -> dict:
    """{"name": "OpenBLAS" or None, "path": ..., "reason": why none, "",
    "shim": the shim's path or None, "shim_reason": why none, "",
    "thin_gemm": whether the shim's few-row kernel runs,
    "core": the kernel set OpenBLAS runs (e.g. "Haswell") or None, "core_reason": why that one}."""
    return dict(_blas)


def blas_refused() -> str:
    """Why the fast path could not run although it was asked for (for headers), or ""."""
    return "OpenBLAS not loaded: mlx.core was imported before enable()" if _blas["reason"] == MLX_FIRST else ""


def blas_name() -> str:
    """What MLX's float32 matmul calls: 'OpenBLAS + thin kernels' (the shim's
    GEMV and few-row kernel), 'OpenBLAS + GEMV' (the shim without its kernel:
    built without threads, or a CPU without AVX2), 'OpenBLAS', 'MLX's BLAS' or 'Accelerate'."""
    if _blas["name"]:
        if not _blas["shim"]:
            return _blas["name"]
        return _blas["name"] + (" + thin kernels" if _blas["thin_gemm"] else " + GEMV")
    return "Accelerate" if sys.platform == "darwin" else "MLX's BLAS"


def thin_gemm_calls() -> int:
    """How many products the shim's few-row kernel has run in this process."""
    return _shim_library.entropix_thin_gemm_calls() if _shim_library is not None else 0


def wide_thin_tiles(on: bool) -> tuple[bool, int]:
    """Tests: let the shim's few-row kernel use its AVX-512VL tiles (on) or only its
    AVX2 ones (off). Returns (whether the AVX-512VL tiles run now, how many products
    they have taken in this process)."""
    if _shim_library is None:
        return False, 0
    return bool(_shim_library.entropix_thin_gemm_wide(int(on))), _shim_library.entropix_thin_gemm_wide_calls()
