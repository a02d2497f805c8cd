"""One job over several processes with MLX's own distributed layer.

`mlx.launch -n 2 -- entropix-mlx eval ...` (or `--hostfile` for several machines)
starts one process per rank and tells each its rank through the environment
(MLX_RANK with the ring backend, the MPI variables with MPI, the JACCL
coordinator with JACCL). Without that environment `world()` is one process and
nothing here touches `mx.distributed`, so the single-process path is unchanged.

Rank 0 is the root: it reads and writes the result files and prints. The
others only compute their share; they print nothing but errors. Everything
the ranks exchange goes through `all_gather` on the CPU stream, as mlx-lm's
`evaluate` does: JSON as bytes, padded to the longest rank's.
"""

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx

from .errors import DistributedError, EntropixError, FollowerExit
from .files import model_files_identity

# The environment a launcher sets; a plain process has none of it.
LAUNCH_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MLX_JACCL_COORDINATOR")

# Seconds to wait for every rank to connect. The ring backend's listening rank
# waits forever for a peer that never comes, so the wait is bounded here.
CONNECT_TIMEOUT = float(os.environ.get("ENTROPIX_CONNECT_TIMEOUT", "60"))

# Model files bigger than this are fingerprinted from evenly spaced blocks, not read whole:
# reading 40 GB on every rank before the first token would take minutes.


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    group: object = None

    @property
    def root(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    return any(v in os.environ for v in LAUNCH_VARIABLES)


@cache
def world() -> World:
    """This process's rank and the number of ranks; one process when no launcher
    started it. Connects the ranks on the first call (bounded by CONNECT_TIMEOUT)."""
    if not launched():
        return World()
    rank = os.environ.get("MLX_RANK", "?")
    message = (
        f"error: rank {rank}: not every rank connected within {CONNECT_TIMEOUT:g} s; check that every host "
        "in the hostfile runs the same command and that its address and port are reachable"
    )
    # The backend holds the interpreter's lock while it waits for its peers, so no
    # Python thread or signal handler can stop the wait: a watchdog process does.
    with watchdog(CONNECT_TIMEOUT, message):
        try:
            group = mx.distributed.init(strict=True)
            if group.size() > 1:  # every rank connected, not only this one's neighbours
                mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
        except RuntimeError as e:  # e.g. "[ring] Couldn't connect"
            raise DistributedError(
                f"rank {rank}: cannot join the other ranks ({e}); check that every host in the hostfile "
                "runs the same command and that its address and port are reachable"
            ) from None
    return World(group.rank(), group.size(), group)


WATCHDOG = """
import os, select, signal, sys
ready, _, _ = select.select([sys.stdin], [], [], float(sys.argv[1]))
if not ready:
    sys.stderr.write(sys.argv[3] + "\\n")
    sys.stderr.flush()
    os.kill(int(sys.argv[2]), signal.SIGKILL)
"""


@contextmanager
def watchdog(seconds: float, message: str):
    """Kill this process with `message` on stderr unless the block ends within
    `seconds`. The watchdog reads its stdin: the block's end (or this process's
    death) closes it."""
    dog = subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(seconds), str(os.getpid()), message], stdin=subprocess.PIPE
    )
    try:
        yield
    finally:
        dog.stdin.close()
        dog.wait()


def all_gather_json(w: World, value) -> list:
    """Every rank's `value` (anything JSON can hold), in rank order, on every rank."""
    if w.size == 1:
        return [value]
    data = json.dumps(value).encode()
    try:
        lengths = mx.distributed.all_gather(mx.array([len(data)]), group=w.group, stream=mx.cpu)
        longest = int(mx.max(lengths).item())
        padded = mx.array(list(data) + [0] * (longest - len(data)), dtype=mx.uint8)
        gathered = mx.distributed.all_gather(padded[None], group=w.group, stream=mx.cpu)
        mx.eval(gathered)
    except RuntimeError as e:  # a peer went away: "[ring] connection to a peer was lost"
        raise DistributedError(
            f"rank {w.rank}: lost the connection to another rank ({e}); its own error says why"
        ) from None
    rows = memoryview(gathered).tobytes()
    return [json.loads(rows[r * longest : r * longest + n]) for r, n in enumerate(lengths.tolist())]


def broadcast_json(w: World, value):
    """Rank 0's `value` on every rank (the others' arguments are ignored)."""
    return all_gather_json(w, value if w.root else None)[0]


def agree(w: World, what: str, value, remedy: str):
    """Stop every rank with one line when the ranks' `value`s differ."""
    values = all_gather_json(w, value)
    differ = [r for r, v in enumerate(values) if v != values[0]]
    if differ:  # every rank sees it; rank 0 says it
        message = f"rank {differ[0]} has different {what} than rank 0; {remedy}"
        if w.root:
            raise DistributedError(message)
        follow_root_out(w, message)


def run_on_root(w: World, work):
    """`work()` on rank 0, its result (JSON) on every rank. An EntropixError on
    rank 0 is raised there and ends the others quietly (FollowerExit)."""
    try:
        outcome = {"value": work()} if w.root else None
    except EntropixError as e:
        if w.size > 1:
            broadcast_json(w, {"error": str(e)})
        raise
    outcome = broadcast_json(w, outcome)
    if "error" in outcome:
        follow_root_out(w, outcome["error"])
    return outcome["value"]


def follow_root_out(w: World, message: str):
    """Raise FollowerExit once rank 0 has exited: a rank that exits with an error
    first makes the launcher stop rank 0 before it prints the error. Rank 0's
    exit closes its connections, which ends the wait; the backend's messages
    about it are not shown."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            mx.eval(mx.distributed.all_sum(mx.array(0.0), group=w.group, stream=mx.cpu))
    except RuntimeError:
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    raise FollowerExit(message)


def file_fingerprint(path) -> str:
    """The model files' identity (files.model_files_identity), to compare across ranks."""
    path = Path(path)
    if not path.exists():  # e.g. a Hugging Face repo not downloaded yet: loading fetches it
        return "absent"
    return model_files_identity(path)


def check_same_model(w: World, path):
    """Every rank must load the same model files."""
    if w.size > 1:
        agree(
            w,
            "model files",
            file_fingerprint(path),
            f"copy rank 0's {Path(path).name} to every machine (another quantization or version changes the answers)",
        )
