"""The CLI in a real pseudo-terminal: colours per strategy matching the legend,
and the interactive chat (line editing history, Ctrl-C during an answer and at
the prompt)."""

import fcntl
import json
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time

import pytest
from conftest import SHELF
from entropix_mlx.cli.app import main
from typer.testing import CliRunner

from entropix_mlx.sampling.strategies import STRATEGY_COLORS

SGR = re.compile(r"\x1b\[([0-9;]*)m")
OTHER_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-ln-z]|\x1b[=>]")  # cursor/mode codes, not colours


def own_terminal():
    """In the child: a new session whose controlling terminal is the pty (stdin),
    so that Ctrl-C typed into it becomes SIGINT, as in a real terminal."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A command running in a pseudo-terminal; `expect` reads until a pattern shows up."""

    def __init__(self, *args):
        self.master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE")}
        env.update(TERM="xterm-256color", COLUMNS="200", LINES="50")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from entropix_mlx.cli.app import main; main()", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
            preexec_fn=own_terminal,
        )
        os.close(slave)
        self.output = ""

    def read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the process closed the terminal
            return False
        if not data:
            return False
        self.output += data.decode("utf-8", errors="replace")
        return True

    def expect(self, pattern: str, timeout: float = 120, start: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            match = re.compile(pattern).search(self.output, start)
            if match:
                return match
            if time.monotonic() > deadline or (not self.read(1.0) and self.proc.poll() is not None):
                raise AssertionError(f"{pattern!r} never appeared; output so far:\n{self.output!r}")

    def send(self, text: str):
        os.write(self.master, text.encode())

    def wait(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(0.2)
        while self.read(0.1):
            pass
        return self.proc.wait(timeout=1)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def styled_chars(text: str) -> list[tuple[str, str | None]]:
    """Each character of terminal output with the SGR colour code active on it."""
    text = OTHER_ESCAPES.sub("", text).replace("\r\n", "\n")
    chars, code, pos = [], None, 0
    for m in SGR.finditer(text):
        chars += [(c, code) for c in text[pos : m.start()]]
        code = None if m.group(1) in ("", "0") else m.group(1)
        pos = m.end()
    return chars + [(c, code) for c in text[pos:]]


ANSI = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]


def sgr_of(color: str) -> str:
    """The SGR parameter of a standard colour name (30-37, bright 90-97, the terminal's own 39)."""
    if color == "default":
        return "39"
    if color.startswith("bright_"):
        return str(90 + ANSI.index(color.removeprefix("bright_")))
    return str(30 + ANSI.index(color))


RUN_ARGS = ["run", "--max-tokens", "8", "--seed", "0", "Why is the sky blue?"]


@pytest.mark.slow
def test_run_colours_each_token_by_its_strategy_and_the_legend_matches():
    term = Terminal(*RUN_ARGS)
    try:
        assert term.wait() == 0, term.output
    finally:
        term.close()
    lines = term.output.replace("\r\n", "\n").split("\n")
    legend_line = next(line for line in lines if "strategies:" in line)

    # The legend: "■ name" entries, each in its own colour, all colours distinct.
    legend = {}
    chars = styled_chars(legend_line)
    text = "".join(c for c, _ in chars)
    for m in re.finditer(r"■ (\w+)", text):
        codes = {code for _, code in chars[m.start() : m.end()]}
        assert len(codes) == 1 and None not in codes, (m.group(1), codes)
        legend[m.group(1)] = codes.pop()
    # The card may switch strategies off; the legend lists what it leaves on (adaptive, the fallback, always).
    from entropix_mlx.sampling.config import resolve_config

    enabled = set(resolve_config("smollm2-135m")[0].strategies) | {"adaptive"}
    assert enabled >= {"argmax", "adaptive"}
    assert set(legend) == enabled
    assert len(set(legend.values())) == len(legend), "two strategies share a colour"
    assert all(code == sgr_of(STRATEGY_COLORS[name]) for name, code in legend.items())

    # The answer, token by token, as --json reports it for the same seed.
    with CliRunner().isolation() as (out, err, _):
        with pytest.raises(SystemExit) as exit_info:
            main(RUN_ARGS[:1] + ["--json"] + RUN_ARGS[1:], shelf=SHELF)
        sys.stdout.flush()
        records = [json.loads(line) for line in out.getvalue().decode().splitlines()][:-1]
    assert exit_info.value.code == 0
    expected = [(c, r["strategy"]) for r in records for c in r["text"]]
    used = {s for _, s in expected}
    assert len(used) >= 2, f"this prompt should exercise several strategies, got {used}"

    answer = "".join(r["text"] for r in records)
    all_chars = styled_chars(term.output)
    plain = "".join(c for c, _ in all_chars)
    at = plain.index(answer)
    for (char, code), (expected_char, strategy) in zip(all_chars[at : at + len(expected)], expected, strict=False):
        assert char == expected_char
        if not char.isspace():
            assert code == legend[strategy], f"{char!r} chosen by {strategy} shown in colour {code}"


@pytest.mark.slow
def test_chat_in_a_terminal_history_and_ctrl_c():
    term = Terminal("chat", "--sampler", "greedy", "--max-tokens", "200")
    try:
        term.expect(r">>> ")
        term.send("/stats\r")
        first = term.expect(r"turns: 0")
        term.expect(r">>> ", start=first.end())
        term.send("\x1b[A\r")  # arrow up: readline recalls /stats
        second = term.expect(r"turns: 0", start=first.end())
        term.expect(r">>> ", start=second.end())
        term.send("Tell me a long story about a dragon.\r")
        sent = term.expect(r"dragon\.\r\n")
        term.expect(r"\x1b\[39m", start=sent.end())  # the first token has arrived, in argmax's (plain) colour
        term.send("\x03")  # Ctrl-C during the answer
        stopped = term.expect(r"stopped: interrupted")
        term.expect(r">>> ", start=stopped.end())
        term.send("/stats\r")
        stats = term.expect(r"turns: 1", start=stopped.end())
        term.expect(r">>> ", start=stats.end())
        # readline prints the prompt just before it starts waiting for keys; a
        # SIGINT landing in between is only noticed at the next key. People are
        # never that fast; the test waits a moment like them.
        time.sleep(0.5)
        term.send("\x03")  # Ctrl-C at the prompt asks first...
        warned = term.expect(r"Ctrl-C again to quit", start=stats.end())
        term.expect(r">>> ", start=warned.end())
        time.sleep(0.5)
        term.send("\x03")  # ...and quits the second time
        code = term.wait()
    finally:
        term.close()
    assert code == 0
    assert "Traceback" not in term.output
