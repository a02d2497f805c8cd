"""A card for a model that ships without one: measured on its first use.

`ensure_card` finds the model's user card (cards.user_cards_dir(), named after
the model's identity, model.loading.model_identity: a copy or a renamed file
finds the card its bytes already have) or, on first use, measures
the metrics on the calibration prompts (calibrate.PROMPTS, about 400 steps) and
writes one there with the new-model settings (entropix_mlx/data/new_model.toml). `load` binds the card it returns to the model. A card
that cannot be read, does not validate, or names another model is measured again.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..distributed import all_gather_json, world
from ..errors import ConfigError
from ..model.loading import ModelSource, model_identity
from ..sampling.cards import checked_user_cards_dir, shipped_card, user_card_path
from ..sampling.config import SamplerConfig
from ..sampling.deliberate_config import DeliberateConfig
from ..sampling.settings import read_toml
from .calibrate import PROMPTS, calibrate


@dataclass
class CardStatus:
    path: Path | None  # the card in use; None: none (the defaults run)
    kind: str  # "shipped", "user", "measured" (written now) or "none"
    note: str = ""  # one line for the user: what was done, or why no card
    seconds: float = 0.0  # spent measuring


def card_problem(path: Path, identity: str) -> str | None:
    """Why the user card at `path` cannot be used, or None."""
    try:
        data = read_toml(path)
        SamplerConfig.from_document(data, path)
        DeliberateConfig.from_document(data, path)
    except (ConfigError, OSError, UnicodeDecodeError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    if "sampler" not in data:
        return f"{path} has no [sampler] table"
    if data.get("identity") != identity:
        return f"{path} was measured on another model ({data.get('identity')!r})"
    return None


def ensure_card(
    model,
    tokenizer,
    source: ModelSource,
    progress: Callable[[int, int], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> CardStatus:
    """The card this model's settings come from, measured now if it has none.
    `progress(i, n)` before each calibration prompt; `warn(line)` for a corrupt
    card about to be measured again."""
    if shipped_card(source.name).is_file():
        return CardStatus(shipped_card(source.name), "shipped")
    identity = model_identity(source)
    folder, why = checked_user_cards_dir()
    if why:
        return CardStatus(None, "none", f"no card for {source.name} (user cards folder refused: {why}); defaults run")
    path = user_card_path(folder, source.name, identity)
    problem = card_problem(path, identity) if path.exists() else None
    needed = problem is not None or not path.exists()
    w = world()
    if w.size > 1:  # every rank measures together (the samples are gathered) if any rank lacks the card
        needed = any(all_gather_json(w, needed))
    if not needed:
        return CardStatus(path, "user")
    if problem is not None:
        if warn:
            warn(f"warning: the card {path} cannot be used ({problem}); measuring it again")
        path.unlink(missing_ok=True)  # its kept tables would carry the damage over
    start = time.perf_counter()
    where = source.ref if source.kind == "hub" else str(source.path)
    calibrate(model, tokenizer, source.name, path, PROMPTS, progress=progress, identity=identity, model_path=where)
    seconds = time.perf_counter() - start
    note = (
        f"{source.name} has no card: measured one on {len(PROMPTS)} prompts in {seconds:.0f} s, "
        f"used from now on: {path}"
    )
    return CardStatus(path, "measured", note, seconds)
