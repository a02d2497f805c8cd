"""Model cards: per-model settings (calibrated sampler thresholds, thinking text)
kept as TOML files in the repository's top-level `models/` folder."""

import importlib.resources
from pathlib import Path


def cards_dir() -> Path:
    # A checkout or editable install reads models/ beside the package; a regular
    # install ships the same files as the package entropix_mlx.model_cards.
    checkout = Path(__file__).resolve().parent.parent / "models"
    if checkout.is_dir():
        return checkout
    return Path(str(importlib.resources.files("entropix_mlx.model_cards")))


def card_path(model_name: str) -> Path:
    return cards_dir() / f"{model_name}.toml"
