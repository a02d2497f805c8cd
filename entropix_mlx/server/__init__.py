"""`entropix-mlx serve`: an OpenAI-compatible HTTP server and the page at `/`.

engine.py owns the model (one worker thread), batched.py decodes concurrent
requests together (decode/engine.py's batch engine, streaming per row), app.py
is the HTTP layer, schema.py validates requests, responses.py builds OpenAI's
objects, static/ holds the page (no CDN: it works offline)."""

from .engine import Engine, Job
from .prefix_cache import PrefixCache


def serve(
    loaded,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    allow_origins: list[str] | None = None,
    max_body: int | None = None,
    cache_entries: int = 8,
    cache_tokens: int = 32768,
    batch_size: int = 8,
    log_level: str = "info",
    world=None,
    strict_model: bool = False,
    aliases: tuple[str, ...] = (),
):
    """Serve `loaded` (a `front.LoadedModel`) and block until it is stopped (Ctrl-C). With `world`
    (a launch of several ranks, the model split across them): rank 0 serves and
    the other ranks follow its batches (lockstep.py) until it stops."""
    # uvicorn and starlette (app.py) only when serving: the HTML export of one answer imports this package too
    import uvicorn

    from .app import MAX_BODY, create_app

    lockstep = None
    if world is not None and world.size > 1:
        from .lockstep import Lockstep, follow

        lockstep = Lockstep(world)
        if not world.root:
            engine = Engine(loaded, PrefixCache(cache_entries, cache_tokens), batch_size, lockstep, False)
            follow(engine)
            return
    engine = Engine(loaded, PrefixCache(cache_entries, cache_tokens), batch_size, lockstep)
    app = create_app(engine, api_key, allow_origins, max_body or MAX_BODY, strict_model, tuple(aliases))
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2)
    finally:
        # The worker thread ends before the interpreter does: left running, it held
        # MLX streams whose native threads aborted the process at exit.
        engine.close(wait=True)


__all__ = ["Engine", "Job", "PrefixCache", "serve"]
