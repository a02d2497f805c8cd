"""entropix-mlx: entropy-aware sampling on MLX for Llama, Mistral, Qwen, Phi-3 and Gemma 3 models.

`load`, `make_sampler`, `stream_generate` and `generate` (api.py) have mlx-lm's shape;
`load_model` gives the front door itself (`front.LoadedModel`).
Importing the package loads no native library and does not import MLX: they are imported
on first use, so a program can turn on the CPU fast path first, before mlx binds its BLAS
(`entropix_mlx.accel.enable()`, see accel/__init__.py).
"""

from .errors import ConfigError, ContextOverflowError, EntropixError, ModelLoadError, UnsupportedModelError

API = ("load", "load_model", "make_sampler", "stream_generate", "generate", "mlx_lm_sampler")


def __getattr__(name: str):
    if name in API:
        from . import api

        globals()[name] = getattr(api, name)
        return globals()[name]
    raise AttributeError(f"module 'entropix_mlx' has no attribute {name!r}")


__all__ = [*API, "EntropixError", "ModelLoadError", "UnsupportedModelError", "ContextOverflowError", "ConfigError"]
