"""SIGTERM handled like Ctrl-C: every command already cleans up after a
KeyboardInterrupt (run prints its summary, chat keeps the conversation,
calibrate removes its temporary card), so SIGTERM raises a subclass of it and
only the exit code differs: 130 for SIGINT, 143 (128 + 15) for SIGTERM, as a
shell reports a process killed by either signal."""

import signal
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM."""


# Typer turns a KeyboardInterrupt escaping a command into exit code 130 and
# drops the exception, so the handler also leaves a mark for cli.app.main.
received = {"sigterm": False}


def _raise_terminated(signum, frame):
    received["sigterm"] = True
    raise Terminated()


def exit_code(interrupt: BaseException | None = None) -> int:
    return 143 if isinstance(interrupt, Terminated) or received["sigterm"] else 130


@contextmanager
def sigterm_raises():
    """While inside: SIGTERM raises Terminated (in the main thread only, where
    Python delivers signals; elsewhere nothing changes)."""
    received["sigterm"] = False
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:   # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def deferred():
    """Ctrl-C and SIGTERM wait until the block is done (they are delivered right
    after it): e.g. a token's line written and counted as written, never one
    without the other."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:   # no POSIX signal masks: as before
        yield
        return
    blocked = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, blocked)
