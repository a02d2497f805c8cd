"""Entry point: `entropix-mlx COMMAND`. Each command lives in its own module.

The command modules import MLX, which binds its BLAS on that first import, so they are
imported only inside `main()`, after `enable()` has put the CPU fast path in place.
"""

import difflib
import inspect
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner

import typer
from typer.core import TyperCommand, TyperGroup

from entropix_mlx.accel import enable
from entropix_mlx.errors import EntropixError, FollowerExit

from .flags import with_flags
from .signals import exit_code, interrupts_raise

try:  # recent Typer vendors its own copy of Click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:
    from click.exceptions import ClickException, UsageError


class _NoFlagType:
    """Typer (0.29) writes a flag's type in --help, `--json <bool>`, as if it took a
    value. Flags take none: an empty metavar leaves the column blank, for every
    flag of every command, --help itself included (Click adds that one). It also
    writes a required argument as `{PROMPT}` in the usage line; it is `PROMPT`,
    as Click and every manual page write it."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
            if param.param_type_name == "argument" and param.required and hasattr(param, "_usage_display_name"):
                param._usage_display_name = lambda p=param: p.display_name_raw + ("..." if p.nargs != 1 else "")
        return params


class Command(_NoFlagType, TyperCommand):
    pass


class Group(_NoFlagType, TyperGroup):
    pass


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    help="Entropy-aware sampling on MLX for Llama, Mistral, Qwen, Phi-3 and Gemma 3 models.",
)


def _print_version(value: bool):
    if value:
        # only --version reads the installed version: importing this module stays light
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
    """Entropy-aware sampling on MLX for Llama, Mistral, Qwen, Phi-3 and Gemma 3 models."""


def register_commands():
    """Import every command's module and add its command to `app`, once."""
    if app.registered_commands:
        return
    # after enable(): the command modules import MLX (see the module doc)
    from . import bench, cache_cmd, calibrate, chat, convert, doctor, eval, models_cmd, run, serve

    for module in (run, chat, models_cmd, calibrate, bench, eval, serve, doctor, convert, cache_cmd):
        module.register(app)
    for command in app.registered_commands:
        if command.cls in (None, TyperCommand):
            command.cls = Command
        command.help = reflowed(command.help or inspect.getdoc(command.callback) or "")


def reflowed(text: str) -> str:
    """A docstring's paragraphs each on one line, so --help wraps them to the
    terminal's width instead of keeping the source's line breaks too."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip())


def usage_message(e) -> str:
    """Click's message on one line; for an unknown option, a suggestion only when one
    is close (Click offers its nearest match however far it is: --bogus, --verbose?)."""
    name, offered = getattr(e, "option_name", None), getattr(e, "possibilities", None)
    if name is None or offered is None:
        return " ".join(e.format_message().split())
    close = difflib.get_close_matches(name, offered, n=1, cutoff=0.75)
    return f"no such option: {name}" + (f"; did you mean {close[0]}?" if close else "")


def fail(message: str, code: int = 2):
    """One line on stderr, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None, shelf=None):
    """Run the app. Every user error ends as one `error: ...` line and exit code 2:
    ours (EntropixError) and Click's usage errors alike, which Typer would
    otherwise draw as a multi-line box. Ctrl-C exits 130, SIGTERM 143. `shelf`:
    the models already loaded (`loaded.Shelf`; tests reuse one), else a new one."""
    enable()
    register_commands()
    from .loaded import Shelf  # after enable(): it imports MLX

    try:
        with interrupts_raise():
            code = app(args=argv, standalone_mode=False, obj=shelf if shelf is not None else Shelf())
    except FollowerExit:  # rank 0 prints the error
        raise SystemExit(2) from None
    except EntropixError as e:
        fail(with_flags(e))
    except UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `entropix-mlx`: the help, as Click does
            print(e.format_message())
            raise SystemExit(e.exit_code) from None
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        fail(usage_message(e) + hint, e.exit_code)
    except ClickException as e:
        fail(" ".join(e.format_message().split()), e.exit_code)
    except (typer.Abort, KeyboardInterrupt) as e:  # Ctrl-C, Ctrl-D or SIGTERM outside a generation
        raise SystemExit(exit_code(e)) from None
    if code == 130:  # Typer's code for an interrupt that left a command: SIGINT or SIGTERM
        code = exit_code()
    raise SystemExit(code or 0)
