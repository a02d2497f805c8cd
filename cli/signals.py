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
# A signal that arrives inside deferred() waits here until the block is done.
_held = {"deferring": False, "signum": None}


def _raise(signum):
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _interrupt(signum, frame):
    if signum == signal.SIGTERM:
        received["sigterm"] = True
    if _held["deferring"]:
        _held["signum"] = _held["signum"] or signum
        return
    _raise(signum)


def exit_code(interrupt: BaseException | None = None) -> int:
    return 143 if isinstance(interrupt, Terminated) or received["sigterm"] else 130


@contextmanager
def interrupts_raise():
    """While inside: Ctrl-C raises KeyboardInterrupt and SIGTERM raises
    Terminated, both unless inside deferred(). Python runs signal handlers in
    the main thread only; elsewhere nothing changes. A signal the process was
    started ignoring (nohup, a background job) stays ignored."""
    received["sigterm"] = False
    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) != signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _interrupt)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def deferred():
    """Ctrl-C and SIGTERM wait until the block is done and are raised right
    after it: e.g. a token's line written and counted as written, never one
    without the other. It is the handler that waits, not the signal: one that
    reached the process just before the block, whose handler Python runs
    inside it, waits too (a signal mask could not hold that one back)."""
    _held["deferring"] = True
    try:
        yield
    finally:
        _held["deferring"] = False
        signum, _held["signum"] = _held["signum"], None
        if signum is not None:
            _raise(signum)
