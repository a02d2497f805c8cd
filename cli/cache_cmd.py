"""`entropix-mlx cache`: the loaded forms of GGUF files kept in the user cache
(entropix_mlx/model/load_cache.py), their sizes, and removing them."""

import shutil
from typing import Annotated

import typer

from entropix_mlx.errors import ConfigError
from entropix_mlx.model import load_cache


def size_text(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def summary_line() -> str:
    """Where the load cache is, how many entries it holds and their size (for `doctor`)."""
    entries = load_cache.entries()
    total = sum(e["bytes"] for e in entries)
    return f"{load_cache.cache_root()}: {len(entries)} loaded model(s), {size_text(total)}"


def cache(
    remove: Annotated[
        str | None,
        typer.Option("--remove", help="Remove the entry of this name (as listed), or 'all' of them."),
    ] = None,
):
    """List the models kept in their loaded form (a GGUF file's later starts read it), or remove them."""
    entries = load_cache.entries()
    if remove is not None:
        chosen = entries if remove == "all" else [e for e in entries if e["name"] == remove]
        if not chosen:
            names = ", ".join(e["name"] for e in entries) or "none"
            raise ConfigError(f"--remove {remove!r}: no such entry; the entries are: {names} (or 'all')")
        for e in chosen:
            shutil.rmtree(e["path"])
            print(f"removed {e['name']} ({size_text(e['bytes'])})")
        return
    for e in entries:
        print(f"{e['name']}  {size_text(e['bytes'])}  written {e['written']}")
    print(summary_line())


def register(app: typer.Typer):
    app.command()(cache)
