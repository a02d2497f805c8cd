"""Helpers for the server tests: start `entropix-mlx serve` on a free local port,
and launch the distribution's Chromium for the page tests."""

import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

KEY = "test-key-1234"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def get(port, path):
    status, data = request(port, "GET", path)
    return status, json.loads(data)


@contextmanager
def app_on_a_port(engine):
    """The port of the server app for `engine`, on uvicorn in a thread of this process."""
    import threading

    import uvicorn

    from entropix_mlx.server.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def running_server(log_path, *args):
    """(base URL, port) of a running `entropix-mlx serve ARGS`, stopped afterwards."""
    port = free_port()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "entropix_mlx", "serve", "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while True:
        try:
            if get(port, "/health")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the server did not start:\n{open(log_path).read()}")
        time.sleep(0.3)
    try:
        yield f"http://127.0.0.1:{port}", port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def chromium_path() -> str:
    """The system Chromium. Missing is a failure, not a skip: the page is part of
    the product (.ci/run installs it with apt-get)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium found: install it (Debian: apt-get install chromium); .ci/run does this")
