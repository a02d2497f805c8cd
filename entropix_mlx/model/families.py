"""Which model architectures the port runs, by the `model_type` of their
config, and the classes that build them (a config's hyper-parameters are read
by mlx-lm's own `ModelArgs` of the family, with its defaults)."""

from mlx_lm.models import qwen2, qwen3

from ..errors import UnsupportedModelError
from . import gemma3, llama, phi3, qwen

FAMILIES = {
    "llama": (llama.Model, llama.ModelArgs),
    "mistral": (llama.Model, llama.ModelArgs),  # mlx-lm runs Mistral as Llama
    "qwen2": (qwen.Qwen2, qwen2.ModelArgs),
    "qwen3": (qwen.Qwen3, qwen3.ModelArgs),
    "phi3": (phi3.Model, phi3.ModelArgs),
    "gemma3_text": (gemma3.Model, gemma3.ModelArgs),
}


def model_classes(config: dict, where: str = "the model") -> tuple[type, type]:
    """(model class, args class) for an HF-style config; one line naming the
    architecture and the supported ones if it is not covered."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"{where} holds a '{model_type}' model; entropix-mlx runs these architectures: {', '.join(FAMILIES)}"
        )
    return FAMILIES[model_type]
