"""Files: writing them so that a crash or Ctrl-C mid-write never leaves a cut
file, and the one user cache folder (cards, the compiled shim, conversions)."""

import hashlib
import os
import sys
import tempfile
from pathlib import Path

IDENTITY_SAMPLE = 8 << 20  # bytes read from each end of a model file
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".model", ".gguf")


def model_files_identity(path) -> str:
    """What tells a model's files from any others (the one rule: a user card's
    model, every rank's model, a cached conversion's source): a hash of each
    file's size and first and last 8 MiB, and in a folder each file's name
    there. Where the file lies and what it is called do not count; reading a
    whole multi-GB file would take seconds at every start, and other weights
    or another tokenizer differ in those bytes."""
    path = Path(path)
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)
    key = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        key.update(f"\0{f.name if f != path else ''}\0{size}\0".encode())
        with open(f, "rb") as data:
            key.update(data.read(IDENTITY_SAMPLE))
            if size > 2 * IDENTITY_SAMPLE:
                data.seek(size - IDENTITY_SAMPLE)
            key.update(data.read())
    return key.hexdigest()


def user_cache_dir() -> Path:
    """entropix-mlx's folder in the user's cache: under $XDG_CACHE_HOME (an
    absolute path; the XDG rule ignores a relative one), else ~/Library/Caches on
    macOS and ~/.cache elsewhere. RuntimeError when there is no home folder."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = Path.home() / ("Library/Caches" if sys.platform == "darwin" else ".cache")
    return Path(base) / "entropix-mlx"


def write_atomic(path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over
    `path`: a reader sees the old file or the whole new one, never part of it.
    The folder must exist (OSError otherwise, as for a plain write)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); keep an existing file's mode, else the usual one.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
