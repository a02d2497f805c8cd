"""entropix-mlx: entropy-aware sampling for Llama-family models on MLX."""

# Before anything imports mlx.core: a system OpenBLAS loaded now is the BLAS
# MLX's CPU backend calls (see backend.py).
from .backend import load_blas

load_blas()

from .errors import EntropixError, ModelLoadError, UnsupportedModelError, ContextOverflowError, ConfigError  # noqa: E402
from .loading import load  # noqa: E402

__all__ = ["load", "EntropixError", "ModelLoadError", "UnsupportedModelError",
           "ContextOverflowError", "ConfigError"]
