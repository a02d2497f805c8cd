"""`entropix-mlx serve`: the OpenAI-compatible server and the page at `/`.
The server itself lives in entropix_mlx/server/; this only parses options."""

import ipaddress
import os
import socket
import sys
from typing import Annotated

import typer

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.distributed import run_on_root, world
from entropix_mlx.errors import ConfigError

from .loaded import quiet_unless_root
from .options import ModelOpt, NoCacheOpt, WeightsOpt


def _check_port(value: int) -> int:
    if not 0 < value < 65536:
        raise typer.BadParameter(f"{value} is not a port; use 1 to 65535, e.g. 8080")
    return value


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_address(host: str, port: int):
    """Fail in one line before the model loads (not in uvicorn's log after it)
    when the address cannot be listened on: taken, or not this machine's."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: {e.strerror}; give an address of this machine, e.g. 127.0.0.1") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind(address)
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None


def serve(
    ctx: typer.Context,
    model: ModelOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 0.0.0.0 exposes the server to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", callback=_check_port, help="TCP port.")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="ENTROPIX_API_KEY",
            help="Require 'Authorization: Bearer KEY' on /v1/ (also $ENTROPIX_API_KEY).",
        ),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            metavar="ORIGIN",
            help="Allow browser pages from this origin (CORS); repeatable. Off by default.",
        ),
    ] = None,
    max_body: Annotated[int, typer.Option("--max-body", min=1024, help="Largest request body, bytes.")] = 1_000_000,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=64, help="Requests decoded together; more wait in a queue.")
    ] = 8,
    cache_tokens: Annotated[
        int, typer.Option("--cache-tokens", min=0, help="Prompt-prefix cache: most token positions kept (0: off).")
    ] = 32768,
    weights: WeightsOpt = default_weights(),
    no_cache: NoCacheOpt = False,
    alias: Annotated[
        list[str] | None,
        typer.Option("--alias", metavar="NAME", help="Another name /v1/models lists for the model; repeatable."),
    ] = None,
    strict_model: Annotated[
        bool,
        typer.Option(
            "--strict-model",
            help="Refuse a request naming another model than this one (or an --alias); "
            "by default the model answers whatever name a request gives.",
        ),
    ] = False,
):
    """Serve the model over an OpenAI-compatible API, with a page at / that shows why each token was chosen."""
    if api_key is not None and not api_key.strip():
        raise ConfigError("--api-key is empty; give a key or leave the option out")
    w = world()  # under mlx.launch: the model is split, rank 0 serves and the others follow it
    run_on_root(w, lambda: _check_address(host, port))  # the others stop quietly when it fails
    loaded = ctx.obj.load(model, weights, tensor_parallel=True, cache=not no_cache)
    source = loaded.source
    quiet_unless_root(w)
    if w.root and not _is_loopback(host) and not api_key:
        print(
            f"warning: serving on {host} without --api-key: anyone who can reach this address can use it",
            file=sys.stderr,
        )
    if w.root:
        print(f"entropix-mlx serve: {source.name} on http://{host}:{port}/ (OpenAI API at /v1)", file=sys.stderr)
    # the server package only when serving: app.py imports this module at each start (--help too)
    from entropix_mlx.server import serve as run_server

    run_server(
        loaded,
        host=host,
        port=port,
        api_key=api_key,
        allow_origins=allow_origin or None,
        max_body=max_body,
        cache_entries=8 if cache_tokens else 0,
        cache_tokens=cache_tokens,
        batch_size=batch_size,
        world=w,
        strict_model=strict_model,
        aliases=tuple(alias or ()),
    )
    # uvicorn has shut down and every stream has ended. Leave without running native
    # static destructors: MLX's stream threads can abort the process in them
    # ("terminate called without an active exception") after a clean shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(app: typer.Typer):
    app.command()(serve)
