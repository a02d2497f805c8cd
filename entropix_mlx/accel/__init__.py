"""The Linux CPU fast path: a system OpenBLAS (and the shim's thin kernels) under MLX.

It is turned on by a call, `enable()`, never by importing entropix_mlx: it loads native code
into the whole process and may run the C compiler, which a program that uses entropix-mlx as
a library decides for itself. The CLI calls it first thing in `main()`. It must come before
anything imports mlx, because MLX binds its BLAS when mlx.core is first imported:

    import entropix_mlx.accel

    entropix_mlx.accel.enable()  # before the first `import mlx`

`ENTROPIX_BLAS` (a library path, or `none`) and `ENTROPIX_BLAS_SHIM=off` still steer it.
"""

from .blas import blas_info, load_blas


def enable() -> dict:
    """Turn the fast path on, once; later calls return the same. Never fails.

    Returns what runs and why (`blas_info()`): "name" ("OpenBLAS" or None), "path",
    "reason" (why nothing was loaded: not Linux, ENTROPIX_BLAS=none, no OpenBLAS found, or
    mlx.core imported before this call), "shim" (the shim's path or None), "shim_reason"
    (why plain OpenBLAS runs), "thin_gemm" (whether the shim's few-row kernel runs), and
    "core" and "core_reason" (OpenBLAS's kernel set and why that one: see openblas_core.py)."""
    return load_blas()


__all__ = ["enable", "blas_info"]
