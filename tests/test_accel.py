"""Turning the CPU fast path on: only by `entropix_mlx.accel.enable()` (the CLI's `main()`
calls it), never as a side effect of importing; the shim's cache folder is used only when
no one else can write to it; what runs, and why, is always said."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import SHELF
from typer.testing import CliRunner

from entropix_mlx.accel import blas, build

MAPS = Path("/proc/self/maps")


def _recording_compiler(folder: Path, calls: Path) -> Path:
    """A `cc` that records its arguments and writes an empty library where -o says."""
    folder.mkdir(exist_ok=True)
    script = folder / "cc"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\nwhile [ $# -gt 0 ]; do if [ "$1" = -o ]; then : > "$2"; fi; shift; done\n'
    )
    script.chmod(0o755)
    if not (folder / "gcc").exists():
        (folder / "gcc").symlink_to(script)
    return script


def _fresh_python(code: str, tmp_path: Path, **env_extra) -> tuple[dict, str]:
    """(the JSON object `code` prints last, what the compiler recorded) in a fresh
    interpreter whose every compiler (CC, cc and gcc on PATH) records being called."""
    calls = tmp_path / "compiler-calls"
    bin_folder = tmp_path / "bin"
    script = _recording_compiler(bin_folder, calls)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROPIX_") and k != "OPENBLAS_CORETYPE"}
    env.update(
        CC=str(script),
        PATH=f"{bin_folder}{os.pathsep}{env['PATH']}",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        **env_extra,
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), calls.read_text() if calls.exists() else ""


_NATIVE = (
    "import json, sys, os; "
    "maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''; "
    "native = sorted({l.split()[-1] for l in maps.splitlines() if 'libopenblas' in l or 'blas_shim' in l}); "
)


def test_importing_entropix_mlx_imports_no_mlx_and_runs_no_compiler(tmp_path):
    code = (
        "import sys, json, entropix_mlx, entropix_mlx.accel, entropix_mlx.cli.app; "
        "from entropix_mlx import ConfigError, EntropixError, ModelLoadError; "
        "print(json.dumps({'mlx': 'mlx.core' in sys.modules, 'reason': entropix_mlx.accel.blas_info()['reason']}))"
    )
    result, calls = _fresh_python(code, tmp_path)
    assert result == {"mlx": False, "reason": blas.NOT_ENABLED}
    assert calls == "" and not (tmp_path / "cache").exists()


@pytest.mark.skipif(not MAPS.exists(), reason="no /proc/self/maps here (macOS): cannot list the mapped libraries")
def test_importing_entropix_mlx_maps_no_openblas_and_no_shim(tmp_path):
    code = "import entropix_mlx, entropix_mlx.cli.app; " + _NATIVE + "print(json.dumps(native))"
    native, calls = _fresh_python(code, tmp_path)
    assert native == [] and calls == ""
    # What the import leaves out, enable() does (where there is an OpenBLAS to load).
    code = "import entropix_mlx.accel as a; i = a.enable(); " + _NATIVE + "print(json.dumps([i['path'], native]))"
    (path, native), _ = _fresh_python(code, tmp_path, ENTROPIX_BLAS_SHIM="off")
    assert native == ([os.path.realpath(path)] if path else [])


def test_load_is_imported_on_first_use():
    import entropix_mlx
    from entropix_mlx.api import load

    assert entropix_mlx.load is load
    with pytest.raises(AttributeError, match="no attribute 'loader'"):
        entropix_mlx.loader  # noqa: B018


def test_enable_after_mlx_was_imported_loads_nothing_and_says_so(tmp_path):
    code = "import mlx.core, entropix_mlx.accel as a; i = a.enable(); " + _NATIVE + "print(json.dumps([i, native]))"
    (info, native), calls = _fresh_python(code, tmp_path)
    assert info["name"] is None and info["shim"] is None and native == [] and calls == ""
    if sys.platform == "linux":
        assert info["reason"] == blas.MLX_FIRST
    else:  # nothing to load there in any order
        assert info["reason"].startswith("not Linux")


def test_the_run_header_says_when_the_fast_path_was_refused(tiny_ref, monkeypatch):
    from entropix_mlx.cli.app import main

    monkeypatch.setitem(blas._blas, "name", None)
    monkeypatch.setitem(blas._blas, "reason", blas.MLX_FIRST)
    device = mx.default_device()
    mx.set_default_device(mx.cpu)  # the note is about the CPU's BLAS
    try:
        with CliRunner().isolation() as (_, err, _):
            with pytest.raises(SystemExit) as done:
                main(
                    ["run", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "2", "--no-color", "hi"], shelf=SHELF
                )
            sys.stderr.flush()
            header = err.getvalue().decode().splitlines()[0]
    finally:
        mx.set_default_device(device)
    assert done.value.code == 0
    assert "OpenBLAS not loaded: mlx.core was imported before enable()" in header


@pytest.mark.slow
def test_doctor_says_which_path_runs_and_why(tmp_path):
    code = "from entropix_mlx.cli.app import main; main(['doctor'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROPIX_") and k != "OPENBLAS_CORETYPE"}
    env.update(ENTROPIX_BLAS="none", XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = dict(line.split(None, 1) for line in out.stdout.splitlines())
    assert rows["device"].startswith(("cpu", "gpu")) and rows["settings"] == "ENTROPIX_BLAS=none"
    assert rows["weights"].startswith("auto (default)")
    if sys.platform == "linux":
        assert rows["BLAS"] == "MLX's BLAS: ENTROPIX_BLAS=none"
        assert rows["kernels"] == "none: OpenBLAS is not loaded"
        assert rows["shim"].startswith("not running") and "does not exist yet" in rows["cache"]
    else:
        assert rows["BLAS"].startswith("Accelerate: not Linux")


# -- the shim's cache folder -------------------------------------------------------


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "entropix-mlx"


def test_the_cache_folder_is_created_0700_and_accepted(cache_home):
    assert build.cache_folder(create=False) == (
        cache_home,
        f"{cache_home} does not exist yet (the first build creates it)",
    )
    assert build.cache_folder() == (cache_home, "")
    assert cache_home.stat().st_mode & 0o777 == 0o700
    cache_home.chmod(0o755)  # others may read it, not write to it
    assert build.cache_folder() == (cache_home, "")


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_cache_folder_others_can_write_to_is_refused(cache_home, mode):
    cache_home.mkdir(parents=True)
    cache_home.chmod(mode)
    folder, why = build.cache_folder()
    assert folder == cache_home and why == (
        f"{cache_home} is writable by its group or others (mode {mode:o}; chmod go-w fixes it)"
    )


def test_a_cache_folder_owned_by_another_user_is_refused(cache_home, monkeypatch):
    cache_home.mkdir(parents=True, mode=0o700)
    if os.geteuid() == 0:
        os.chown(cache_home, 65534, 65534)
        owner = 65534
    else:  # only root can give a folder away: this user becomes someone else instead
        owner = os.geteuid()
        monkeypatch.setattr(build.os, "geteuid", lambda: owner + 1)
    assert build.cache_folder()[1] == f"{cache_home} is owned by uid {owner}, not by this user (uid {os.geteuid()})"


def test_nothing_is_built_into_or_loaded_from_a_refused_folder(cache_home, tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("CC", str(_recording_compiler(tmp_path / "bin", calls)))
    cache_home.mkdir(parents=True)
    cache_home.chmod(0o770)
    path, why = build.build_shim()
    assert path is None and why.startswith("cache folder refused: ") and "writable by its group" in why
    assert not calls.exists() and list(cache_home.iterdir()) == []


def test_the_shim_is_built_once_per_source_and_compiler_and_a_writable_library_is_refused(
    cache_home, tmp_path, monkeypatch
):
    calls = tmp_path / "calls"
    compiler = _recording_compiler(tmp_path / "bin", calls)
    monkeypatch.setenv("CC", str(compiler))
    old_umask = os.umask(0o002)  # a group-writable default (Ubuntu's): the built file must not keep it
    try:
        path, why = build.build_shim()
    finally:
        os.umask(old_umask)
    assert why == "" and Path(path).parent == cache_home and Path(path).stat().st_mode & 0o777 == 0o700
    assert len(calls.read_text().splitlines()) == 1 and "-pthread" in calls.read_text()
    assert build.build_shim() == (path, "") and len(calls.read_text().splitlines()) == 1  # found, not rebuilt
    # Other flags in CC, or another source, are another library.
    monkeypatch.setenv("CC", f"{compiler} -DENTROPIX_SHUFFLE_MASKS")
    flagged, _ = build.build_shim()
    source = tmp_path / "blas_shim.c"
    source.write_text(build.SHIM_SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(build, "SHIM_SOURCE", source)
    changed, _ = build.build_shim()
    assert len({path, flagged, changed}) == 3 and len(calls.read_text().splitlines()) == 3
    Path(changed).chmod(0o722)
    assert build.build_shim() == (
        None,
        f"cached library refused: {changed} is writable by its group or others (mode 722; chmod go-w fixes it)",
    )
    assert len(calls.read_text().splitlines()) == 3


def test_a_compiler_that_fails_says_its_first_error(cache_home, tmp_path, monkeypatch):
    failing = tmp_path / "cc-failing"
    failing.write_text(
        "#!/bin/sh\necho 'blas_shim.c:60:5: error: something GCC 11 lacks' >&2\necho '1 error' >&2\nexit 1\n"
    )
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    assert build.build_shim() == (
        None,
        f"{failing} could not build it: blas_shim.c:60:5: error: something GCC 11 lacks",
    )
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert build.build_shim() == (None, f"no C compiler ({tmp_path / 'no-such-cc'}) to build it")
