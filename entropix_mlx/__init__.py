"""entropix-mlx: entropy-aware sampling for Llama-family models on MLX."""

from .errors import EntropixError, ModelLoadError, UnsupportedModelError, ContextOverflowError, ConfigError
from .loading import load

__all__ = ["load", "EntropixError", "ModelLoadError", "UnsupportedModelError",
           "ContextOverflowError", "ConfigError"]
