"""OpenBLAS runs kernels as wide as the CPU allows: a CPU newer than the library gets its
AVX-512 or AVX2 kernels, not the SSE3 fallback it would pick by itself; a user's
OPENBLAS_CORETYPE is kept; the environment is left as it was."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from entropix_mlx.accel import blas, openblas_core
from entropix_mlx.accel.openblas_core import AVX512, better_core, core_level, cpu_flags, cpu_level

AVX2 = {"avx", "avx2", "fma", "sse3"}


@pytest.mark.parametrize(
    "own, flags, forced",
    [
        ("Prescott", AVX2 | AVX512, "SkylakeX"),  # a CPU the library does not know
        ("Prescott", AVX2, "Haswell"),
        ("Sandybridge", AVX2, "Haswell"),
        ("Haswell", AVX2 | AVX512, "SkylakeX"),
        ("Haswell", AVX2, None),
        ("Zen", AVX2, None),
        ("Cooperlake", AVX2 | AVX512, None),
        ("SapphireRapids", AVX2 | AVX512, None),
        ("Prescott", AVX2 | (AVX512 - {"avx512vl"}), "Haswell"),  # SkylakeX's kernels need all five
        ("Prescott", {"sse3", "sse4_2"}, None),
        (None, AVX2 | AVX512, None),  # the library cannot say: its pick stays
    ],
)
def test_the_library_pick_is_replaced_only_when_the_cpu_runs_wider_kernels(own, flags, forced):
    assert better_core(own, flags) == forced


def test_a_users_coretype_is_kept_and_the_library_is_not_asked(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setattr(openblas_core, "own_core", lambda path: pytest.fail("asked the library"))
    assert openblas_core.forced_core("/any/libopenblas.so.0") == (None, "OPENBLAS_CORETYPE=Haswell (your setting)")


def _openblas() -> str | None:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None
    return next((p for p in blas.OPENBLAS_CANDIDATES if Path(p).exists()), None)


def _enable_in_fresh_python(tmp_path, **env_extra) -> dict:
    code = (
        "import json, os, entropix_mlx.accel as a; i = a.enable(); "
        "print(json.dumps({**i, 'left': os.environ.get('OPENBLAS_CORETYPE')}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENTROPIX_", "OPENBLAS_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path), **env_extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


needs_openblas = pytest.mark.skipif(
    _openblas() is None, reason="needs a system OpenBLAS on x86-64 Linux (Debian: libopenblas0-pthread)"
)


@needs_openblas
def test_openblas_runs_kernels_as_wide_as_this_cpu_allows(tmp_path):
    info = _enable_in_fresh_python(tmp_path)
    assert info["name"] == "OpenBLAS" and info["core"], info
    assert core_level(info["core"]) >= cpu_level(cpu_flags()), info
    assert info["left"] is None  # only the library's load saw the setting
    own = openblas_core.own_core(info["path"])
    if core_level(own) < cpu_level(cpu_flags()):
        assert info["core_reason"].startswith(f"OpenBLAS took this CPU for {own}")
    else:
        assert info["core_reason"] == openblas_core.OWN_PICK


@needs_openblas
def test_openblas_runs_the_kernels_the_user_names(tmp_path):
    info = _enable_in_fresh_python(tmp_path, OPENBLAS_CORETYPE="Haswell")
    assert (info["core"], info["core_reason"]) == ("Haswell", "OPENBLAS_CORETYPE=Haswell (your setting)")
    assert info["left"] == "Haswell"
