"""Entry point: `entropix-mlx COMMAND`. Each command lives in its own module."""

import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner

import typer

from entropix_mlx.errors import EntropixError

from .signals import exit_code, interrupts_raise

try:  # recent Typer vendors its own copy of Click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:
    from click.exceptions import ClickException, UsageError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Entropy-aware sampling for Llama-family models on MLX."
)


def _print_version(value: bool):
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"entropix-mlx {version('entropix-mlx')}")
        except PackageNotFoundError:  # a checkout used without installing it
            print("entropix-mlx (not installed)")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
):
    """Entropy-aware sampling for Llama-family models on MLX."""


from . import bench as _bench  # noqa: E402
from . import calibrate as _calibrate  # noqa: E402
from . import chat as _chat  # noqa: E402
from . import eval as _eval  # noqa: E402
from . import models_cmd as _models  # noqa: E402
from . import run as _run  # noqa: E402  (each module registers its command on `app`)
from . import serve as _serve  # noqa: E402

_run.register(app)
_chat.register(app)
_models.register(app)
_calibrate.register(app)
_bench.register(app)
_eval.register(app)
_serve.register(app)


def fail(message: str, code: int = 2):
    """One line on stderr, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None):
    """Run the app. Every user error ends as one `error: ...` line and exit code 2:
    ours (EntropixError) and Click's usage errors alike, which Typer would
    otherwise draw as a multi-line box. Ctrl-C exits 130, SIGTERM 143."""
    try:
        with interrupts_raise():
            code = app(args=argv, standalone_mode=False)
    except EntropixError as e:
        fail(str(e))
    except UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `entropix-mlx`: the help, as Click does
            print(e.format_message())
            raise SystemExit(e.exit_code) from None
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        fail(" ".join(e.format_message().split()) + hint, e.exit_code)
    except ClickException as e:
        fail(" ".join(e.format_message().split()), e.exit_code)
    except (typer.Abort, KeyboardInterrupt) as e:  # Ctrl-C, Ctrl-D or SIGTERM outside a generation
        raise SystemExit(exit_code(e)) from None
    if code == 130:  # Typer's code for an interrupt that left a command: SIGINT or SIGTERM
        code = exit_code()
    raise SystemExit(code or 0)
