"""Files: writing them so that a crash or Ctrl-C mid-write never leaves a cut
file, the one user cache folder (cards, the compiled shim, conversions), and a
model file's identity: its content's hash, kept so that it is read once."""

import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".model", ".gguf")
HASHES_FILE_ENV = "ENTROPIX_HASHES_FILE"  # where known file hashes are kept (tests: a folder of their own)
# A file changed this recently may change again within its timestamp's resolution: its hash is not kept.
SETTLED_SECONDS = 2


def model_files_identity(path) -> str:
    """What tells a model's files from any others (the one rule: a user card's
    model, every rank's model, a load cache entry, a cached conversion's
    source): a file's sha256 (as `sha256sum` prints it); a folder's, the hash of
    each file's name and sha256. Where the file lies and what it is called do
    not count, so a copy or a renamed file is the same model."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    key = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES):
        key.update(f"\0{f.name}\0{file_sha256(f)}\0".encode())
    return key.hexdigest()


def hashes_file() -> Path:
    given = os.environ.get(HASHES_FILE_ENV, "")
    return Path(given).expanduser() if given else user_cache_dir() / "hashes.json"


def file_sha256(path: Path) -> str:
    """The sha256 of the file's bytes. Reading a multi-GB file takes seconds, so
    each hash is kept in hashes_file() under the file's path, size, inode and
    modification and change times (a write changes the change time, which no
    program can set back): a later start with the file unchanged reads none of
    it; a copy or a renamed file is read once."""
    path = Path(path).resolve()
    info = path.stat()
    stamp = [info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns]
    index = hashes_file()
    known = _read_hashes(index)
    entry = known.get(str(path))
    if isinstance(entry, dict) and entry.get("stat") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    with open(path, "rb") as data:
        digest = hashlib.file_digest(data, "sha256").hexdigest()
    settled = time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > SETTLED_SECONDS * 10**9
    if settled and not private_folder(index.parent):
        known = {k: v for k, v in known.items() if Path(k).exists()}
        known[str(path)] = {"stat": stamp, "sha256": digest}
        try:
            write_atomic(index, json.dumps(known, indent=1) + "\n")
        except OSError:
            pass  # not kept: hashed again next time
    return digest


def _read_hashes(index: Path) -> dict:
    # The hashes choose which cached weights and card a model gets: none are read from a folder others can write.
    if not index.is_file() or private_folder(index.parent):
        return {}
    try:
        known = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return known if isinstance(known, dict) else {}


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
