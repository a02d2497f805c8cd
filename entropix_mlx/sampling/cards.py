"""Model cards: per-model settings (calibrated sampler thresholds, thinking text)
kept as TOML files. A model the project knows has its card in the repository's
top-level `models/` folder; any other model gets a user card, measured on its
first use (eval/usercard.py) and kept in the user's cache folder, named after
the model's identity so that another model never reads it."""

import hashlib
import importlib.resources
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..files import private_folder, user_cache_dir

CARDS_DIR_ENV = "ENTROPIX_CARDS_DIR"  # another folder for user cards (tests, a shared setup)


def cards_dir() -> Path:
    # Installed (editable or not), models/ is the package entropix_mlx.model_cards;
    # only a checkout used without installing reads models/ beside the package.
    try:
        return Path(str(importlib.resources.files("entropix_mlx.model_cards")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "models"


def shipped_card(model_name: str) -> Path:
    return cards_dir() / f"{model_name}.toml"


@dataclass(frozen=True)
class CardDocument:
    """A card file read once (the card a loaded model holds): settings resolved from
    it do not read the file again, however many requests build a sampler."""

    path: Path
    data: dict


def card_file(card) -> Path | None:
    """The card file that settings are read from: `card` itself (a path, or a
    CardDocument: the card `load` bound to a model), a model name's shipped card,
    or None (no such file)."""
    if not card:
        return None
    if isinstance(card, CardDocument):
        return card.path
    path = Path(card) if isinstance(card, Path) else shipped_card(card)
    return path if path.is_file() else None


def user_cards_dir() -> Path:
    """$ENTROPIX_CARDS_DIR, else `cards` in the user cache folder (files.user_cache_dir)."""
    given = os.environ.get(CARDS_DIR_ENV, "")
    if given:
        return Path(given).expanduser()
    return user_cache_dir() / "cards"


def checked_user_cards_dir() -> tuple[Path, str]:
    """(the user cards folder, "") when it exists or was created (0700, each
    missing level) and is this user's own, writable by no one else; else
    (folder, why not). A card sets what the sampler does, so one that others
    could write is never read."""
    folder = user_cards_dir()
    return folder, private_folder(folder)


def user_card_name(model_name: str, identity: str) -> str:
    """The file name of a model's user card: its name, made safe, and a hash of its identity."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.") or "model"
    return f"{slug[:60]}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.toml"


def user_card_path(folder: Path, model_name: str, identity: str) -> Path:
    """The model's user card in `folder`: the one measured on the same files
    under any name (a copy, a renamed file), else one named after `model_name`."""
    name = user_card_name(model_name, identity)
    found = sorted(folder.glob(f"*-{name.rsplit('-', 1)[1]}")) if folder.is_dir() else []
    return found[0] if found else folder / name
