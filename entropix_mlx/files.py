"""Files: writing them so that a crash or Ctrl-C mid-write never leaves a cut
file, and the one user cache folder (cards, the compiled shim, conversions)."""

import os
import sys
import tempfile
from pathlib import Path


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
