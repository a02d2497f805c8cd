"""`entropix-mlx models`: the bundled model and the model cards, with where each loads from."""

import tomllib
from pathlib import Path

import typer

from entropix_mlx.errors import ModelLoadError
from entropix_mlx.model.loading import BUNDLED, DEFAULT_MODEL, bundled_path, resolve
from entropix_mlx.sampling.cards import cards_dir, shipped_card, user_cards_dir

from . import render

SOURCE_KEYS = ("source", "repo", "path", "model")  # where a card may say its model comes from


def card_source(path: Path) -> str | None:
    """The model reference a card names, if it names one."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        return f"(unreadable card: {type(e).__name__})"
    for table in (data, data.get("model") if isinstance(data.get("model"), dict) else {}):
        for key in SOURCE_KEYS:
            if isinstance(table.get(key), str):
                return table[key]
    return None


def where(ref: str) -> str:
    try:
        source = resolve(ref)
    except ModelLoadError as e:
        return f"(not found: {e})"
    return f"{source.path}" if source.kind != "hub" else f"Hugging Face: {source.ref}"


def rows() -> list[tuple[str, str, str, str]]:
    """(name, kind, loads from, card) for the bundled models, then every other card."""
    table = []
    for alias in BUNDLED:
        try:
            path = str(bundled_path(alias))
        except ModelLoadError as e:
            path = f"(missing: {e})"
        card = shipped_card(alias)
        kind = "bundled, default" if alias == DEFAULT_MODEL else "bundled"
        table.append((alias, kind, path, str(card) if card.is_file() else "(none)"))
    directory = cards_dir()
    for card in sorted(directory.glob("*.toml")) if directory.is_dir() else []:
        if card.stem in BUNDLED:
            continue
        source = card_source(card)
        loads_from = (
            where(source)
            if source and not source.startswith("(")
            else (source or "(card only: run with --model FILE, DIRECTORY or REPO whose name is " + card.stem + ")")
        )
        table.append((card.stem, "card", loads_from, str(card)))
    return table + measured_rows()


def measured_rows() -> list[tuple[str, str, str, str]]:
    """(model, "measured DATE", where it was loaded from, card) for every card
    measured on a model's first use, in the user cards folder."""
    folder = user_cards_dir()
    out = []
    for card in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        try:
            data = tomllib.loads(card.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            out.append((card.stem, "measured (unreadable)", "", str(card)))
            continue
        date = data.get("calibration", {}).get("date", "?")
        source = data.get("source") or "(measured before cards named their model's path)"
        out.append((str(data.get("name", card.stem)), f"measured {date}", source, str(card)))
    return out


def models(no_color: bool = typer.Option(False, "--no-color", help="Plain text.")):
    """List the bundled model, the model cards under models/ and the cards measured on first use, with where each
    model loads from."""
    console = render.make_console(no_color=no_color)
    table = [("name", "kind", "loads from", "card"), *rows()]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    # Aligned columns that never wrap, so paths stay whole and the output greps well.
    for i, row in enumerate(table):
        line = "  ".join([cell.ljust(w) for cell, w in zip(row, widths, strict=False)] + [row[3]])
        console.print(line, style="bold" if i == 0 else None)


def register(app: typer.Typer):
    app.command()(models)
