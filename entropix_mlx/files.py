"""Files: writing them so that a crash or Ctrl-C mid-write never leaves a cut
file, and the one user cache folder (cards, the compiled shim, conversions)."""

import hashlib
import os
import stat
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


def owned_by_user(path: Path, folder: bool) -> str:
    """ "" when `path` is a folder (or a regular file) owned by this user that no group or
    others can write to; else why it is refused."""
    try:
        info = os.stat(path)
    except OSError as e:
        return f"cannot check {path}: {e.strerror or e}"
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(info.st_mode):
        return f"{path} is not a {'folder' if folder else 'regular file'}"
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"{path} is writable by its group or others (mode {stat.S_IMODE(info.st_mode):o}; chmod go-w fixes it)"
    return ""


def private_folder(folder: Path) -> str:
    """ "" when `folder` exists or was made (0700, each missing level) and is this
    user's own, writable by no one else; else why not. What the cache holds
    changes what runs (a library, a card's settings, a model's weights), so a
    folder that others could write is never read or written."""
    try:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir(mode=0o700)
    except OSError as e:
        return f"cannot create {folder}: {e.strerror or e}"
    return owned_by_user(folder, folder=True)


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
