"""`serve` under `mlx.launch -n 2` (ring backend, this machine): rank 0 owns HTTP,
rank 1 holds its half of the model and follows rank 0's batches. The official
`openai` client gets the same streamed tokens as from one process, and Ctrl-C
ends every rank."""

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from conftest import make_tiny_model
from serving import get
from test_distributed import LAUNCH, free_port
from test_loading import GGUF_CONFIG, write_gguf

pytestmark = pytest.mark.slow

START_TIMEOUT = 180  # seconds: two ranks load and connect on a busy 2-core machine
PROMPTS = [
    ("Hello there", 7, "entropix"),
    ("Tell me about cats.", 3, "entropix"),
    ("Hi", 1, "greedy"),
    ("Why?", 2, "deliberate"),  # runs alone, outside the batch
]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    config = {**GGUF_CONFIG, "max_position_embeddings": 512, "tie_word_embeddings": True}
    return write_gguf(tmp_path_factory.mktemp("serve2") / "tiny.gguf", make_tiny_model(**config), config)


@contextmanager
def server(log: Path, ranks: int, model: Path):
    """The base URL of `serve` (one process, or `ranks` under the launcher) and its
    process; whatever is left of its process group at the end is killed (the test
    fails then, never hangs)."""
    port = free_port()
    command = [sys.executable, "-m", "entropix_mlx", "serve", "-m", str(model), "--port", str(port)]
    if ranks > 1:
        command = [*LAUNCH, "-n", str(ranks), "--starting-port", str(free_port()), "--", *command]
    with open(log, "w") as out:
        # stdin open and silent, as a terminal's: at end of file (CI's /dev/null) mlx.launch's
        # loop passes an empty read to every rank ten times a second, and a Ctrl-C that lands
        # inside that queue's lock leaves the launcher waiting on it for good (docs/distributed.md).
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if get(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, f"the server did not start:\n{log.read_text()}"
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        proc.stdin.close()


def group_members(pgid: int):
    """(pid, its /proc folder, its environment) for each process of the group."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == pgid:
                yield int(entry.name), entry, (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue


def rank_pid(pgid: int, rank: int) -> int:
    """The process of `rank` among the launcher's children (its MLX_RANK)."""
    for pid, entry, environ in group_members(pgid):
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if f"MLX_RANK={rank}".encode() in environ and b"entropix_mlx" in cmdline and b"bash" not in cmdline:
            return pid
    raise AssertionError(f"no process of rank {rank}")


def group_left(pgid: int) -> str:
    """Who of the group is still there, with each one's rank and kernel wait channel:
    a failure says which process did not end."""
    left = []
    for pid, entry, environ in group_members(pgid):
        rank = next((v.decode() for v in environ if v.startswith(b"MLX_RANK=")), "launcher")
        try:
            state = (entry / "stat").read_text().split(") ")[1].split()[0]
            wchan = (entry / "wchan").read_text()
        except (OSError, ProcessLookupError):
            continue
        left.append(f"{pid} {rank} state {state} waiting in {wchan or '-'}")
    return "; ".join(left) or "none"


def group_ends(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether the launcher and every rank have exited within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        proc.poll()  # reaped: a zombie still counts as one of the group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def streamed(url: str) -> list:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    model, answers = client.models.list().data[0].id, []
    for text, seed, sampler in PROMPTS:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=10,
            seed=seed,
            stream=True,
            extra_body={"sampler": sampler},
        )
        records = [r for chunk in stream if chunk.choices for r in chunk.choices[0].model_extra["entropix"]]
        answers.append([(r["token"], r["strategy"]) for r in records])
    return answers


def test_two_ranks_serve_the_openai_client_as_one_process(model_file, tmp_path):
    with server(tmp_path / "one.log", 1, model_file) as (url, _):
        alone = streamed(url)
    assert all(len(answer) == 10 for answer in alone)
    with server(tmp_path / "two.log", 2, model_file) as (url, proc):
        assert streamed(url) == alone
        os.kill(rank_pid(proc.pid, 0), signal.SIGTERM)  # rank 0 stops serving: rank 1 follows it out
        proc.wait(timeout=60)
    log = (tmp_path / "two.log").read_text()
    assert "exited with code" not in log and "was killed" not in log and "Traceback" not in log, log
    assert "Finished server process" in log and proc.returncode == 0


def test_ctrl_c_ends_every_rank(model_file, tmp_path):
    with server(tmp_path / "two.log", 2, model_file) as (url, proc):
        streamed(url)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends Ctrl-C: to the launcher and every rank
        assert group_ends(proc, 60), f"still running: {group_left(proc.pid)}\n" + (tmp_path / "two.log").read_text()


def test_a_taken_port_is_one_line_from_rank_0(model_file):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "entropix_mlx", "serve", "-m", str(model_file), "--port", str(port)]
        done = subprocess.run(
            [*LAUNCH, "-n", "2", "--starting-port", str(free_port()), "--", *command],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: cannot listen on 127.0.0.1:{port} (Address already in use); choose another --port"]
    assert "Traceback" not in done.stderr
