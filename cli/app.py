"""Entry point: `entropix-mlx COMMAND`. Each command lives in its own module."""

import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner

import typer

from entropix_mlx.errors import EntropixError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Entropy-aware sampling for Llama-family models on MLX.")

from . import run as _run  # noqa: E402  (registers its command on `app`)
from . import calibrate as _calibrate  # noqa: E402

_run.register(app)
_calibrate.register(app)


def fail(message: str, code: int = 2):
    """One line on stderr, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main():
    try:
        app()
    except EntropixError as e:
        fail(str(e))
