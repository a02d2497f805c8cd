"""entropix-mlx: entropy-aware sampling for Llama-family models on MLX.

Importing the package loads no native library and does not import MLX: `load` is imported
on first use, so a program can turn on the CPU fast path first, before mlx binds its BLAS
(`entropix_mlx.accel.enable()`, see accel/__init__.py).
"""

from .errors import ConfigError, ContextOverflowError, EntropixError, ModelLoadError, UnsupportedModelError


def __getattr__(name: str):
    if name == "load":
        from .model.loading import load

        globals()["load"] = load
        return load
    raise AttributeError(f"module 'entropix_mlx' has no attribute {name!r}")


__all__ = ["load", "EntropixError", "ModelLoadError", "UnsupportedModelError", "ContextOverflowError", "ConfigError"]
