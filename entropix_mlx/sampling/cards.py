"""Model cards: per-model settings (calibrated sampler thresholds, thinking text)
kept as TOML files in the repository's top-level `models/` folder."""

import importlib.resources
from pathlib import Path


def cards_dir() -> Path:
    # Installed (editable or not), models/ is the package entropix_mlx.model_cards;
    # only a checkout used without installing reads models/ beside the package.
    try:
        return Path(str(importlib.resources.files("entropix_mlx.model_cards")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "models"


def card_path(model_name: str) -> Path:
    return cards_dir() / f"{model_name}.toml"
