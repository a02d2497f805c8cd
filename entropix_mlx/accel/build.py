"""blas_shim.c compiled once into the user's own cache folder, and found there again.

The shim is built when `enable()` first needs it, not at install time: the wheel stays pure
Python (the same one for macOS, which never needs it), `CC` can point the build at another
compiler, and an OpenBLAS installed later gets its shim without a reinstall.

A library loaded from the cache runs inside the process, so it is only ever loaded from, and
built into, a folder no one else can write to: the user cache folder (`files.user_cache_dir`:
`$XDG_CACHE_HOME/entropix-mlx`, else `~/.cache/entropix-mlx`, `~/Library/Caches/entropix-mlx`
on macOS), created 0700. The folder and the library must be owned by this user and writable by
no group or others, or nothing is loaded or written there and plain OpenBLAS runs. A shared
temp folder is never used: another user could put a library there first.

The file's name hashes the source, the machine, the compiler (its command, the file it
resolves to and that file's size and time) and the flags, so a changed source or another
compiler builds anew instead of reusing a stale library.
"""

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
from pathlib import Path

from ..files import owned_by_user, user_cache_dir

SHIM_SOURCE = Path(__file__).with_name("blas_shim.c")

# With threads first; where they cannot be built, the single-threaded GEMV part only.
FLAG_SETS = (("-O3", "-pthread"), ("-O3", "-DENTROPIX_NO_THREADS"))
BUILD_TIMEOUT_S = 120


def cache_folder(create: bool = True) -> tuple[Path | None, str]:
    """Where the shim is built and looked for: (folder, "") when it is safe to load from and
    write to, else (folder or None, why not). Creates it (0700) when missing and `create`."""
    try:
        folder = user_cache_dir()
    except RuntimeError as e:  # no HOME and no password entry
        return None, f"no home folder for a cache: {e}"
    if not create and not folder.exists():
        return folder, f"{folder} does not exist yet (the first build creates it)"
    if create:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            return folder, f"cannot create {folder}: {e.strerror or e}"
    return folder, owned_by_user(folder, folder=True)


def compiler() -> list[str]:
    """The command that builds the shim: `CC` (with its flags), else cc or gcc."""
    return shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or "cc"]


def library_name(command: list[str], flags: tuple[str, ...]) -> str:
    """The cached file's name for this source built by `command` with `flags`."""
    key = hashlib.sha256(SHIM_SOURCE.read_bytes())
    resolved = shutil.which(command[0])
    if resolved:
        real = os.path.realpath(resolved)
        info = os.stat(real)
        key.update(f"\0{real}\0{info.st_size}\0{info.st_mtime_ns}".encode())
    for part in (platform.machine(), *command, "--", *flags):
        key.update(b"\0" + part.encode())
    return f"blas_shim-{key.hexdigest()[:16]}.so"


def _first_error(stderr: str) -> str:
    lines = stderr.strip().splitlines() or ["?"]
    return next((line.strip() for line in lines if "error" in line), lines[-1].strip())


def build_shim() -> tuple[str | None, str]:
    """The shim's library, found in the cache folder or compiled into it now (with threads,
    else without). Returns (its path, "") or (None, why plain OpenBLAS runs)."""
    command = compiler()
    if not shutil.which(command[0]):
        return None, f"no C compiler ({command[0]}) to build it"
    folder, why = cache_folder()
    if why:
        return None, f"cache folder refused: {why}"
    names = [library_name(command, flags) for flags in FLAG_SETS]
    for name in names:  # a build without threads is kept too: this compiler cannot make them
        if (folder / name).exists():
            why = owned_by_user(folder / name, folder=False)
            return (None, f"cached library refused: {why}") if why else (str(folder / name), "")
    for flags, name in zip(FLAG_SETS, names, strict=True):
        partial = folder / f".{name}.{os.getpid()}"
        try:
            done = subprocess.run(
                [*command, *flags, "-shared", "-fPIC", "-o", str(partial), str(SHIM_SOURCE)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if done.returncode == 0:
                os.chmod(partial, 0o700)  # whatever the umask: the load checks it
                os.replace(partial, folder / name)  # whole or not at all, also with two processes at once
                return str(folder / name), ""
        except (OSError, subprocess.SubprocessError) as e:
            partial.unlink(missing_ok=True)
            return None, f"cannot build it in {folder}: {e}"
        partial.unlink(missing_ok=True)
    return None, f"{command[0]} could not build it: {_first_error(done.stderr)}"
