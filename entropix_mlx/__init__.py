"""entropix-mlx: entropy-aware sampling for Llama-family models on MLX."""

# Before anything imports mlx.core: a system OpenBLAS loaded now is the BLAS
# MLX's CPU backend calls (see backend.py).
from .accel.blas import load_blas

load_blas()

from .errors import ConfigError, ContextOverflowError, EntropixError, ModelLoadError, UnsupportedModelError  # noqa: E402
from .model.loading import load  # noqa: E402

__all__ = ["load", "EntropixError", "ModelLoadError", "UnsupportedModelError", "ContextOverflowError", "ConfigError"]
