"""The `serve` figures of docs/distributed.md (Linux: reads /proc): starts
`entropix-mlx serve` on the bundled model, in one process (`python
research/serve_figures.py 1`) or under `mlx.launch -n N` (`... N`), asks one
streamed greedy chat completion of the official `openai` client, then leaves the
server idle and counts the CPU seconds each process of the launch spends.
Prints one JSON line: the answer's tokens, its timings, the idle CPU seconds."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

TOKENS, IDLE_SECONDS = 16, 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group(pgid: int) -> dict[str, int]:
    """The launch's python processes by role: launcher, rank0, rank1, ..."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == pgid:
                cmdline = (entry / "cmdline").read_bytes()
                environ = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
                if b"python" in cmdline.split(b"\0")[0]:
                    rank = environ.get(b"MLX_RANK")
                    name = f"rank{int(rank)}" if rank is not None else "launcher" if ranks > 1 else "server"
                    found[name] = int(entry.name)
        except (OSError, ValueError):
            pass
    return found


ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 1
port = free_port()
command = [sys.executable, "-m", "entropix_mlx", "serve", "--port", str(port)]
if ranks > 1:
    launch = [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"]
    command = [*launch, "-n", str(ranks), "--env", "OMP_NUM_THREADS=1", "--", *command]
server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
try:
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            break
        except OSError:
            time.sleep(1)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    start, first, tokens = time.perf_counter(), None, []
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Write a short story about a lighthouse keeper."}],
        max_tokens=TOKENS,
        stream=True,
        extra_body={"sampler": "greedy"},
    )
    for chunk in stream:
        for record in chunk.choices[0].model_extra["entropix"] if chunk.choices else []:
            first = first or time.perf_counter() - start
            tokens.append(record["token"])
    total = time.perf_counter() - start
    processes = group(server.pid)
    before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    time.sleep(IDLE_SECONDS)
    idle = {name: round(cpu_seconds(pid) - before[name], 2) for name, pid in processes.items()}
    print(
        json.dumps(
            {
                "ranks": ranks,
                "tokens": tokens,
                "first_token_s": round(first, 2),
                "decode_tok_s": round((len(tokens) - 1) / (total - first), 2),
                f"idle_cpu_s_over_{IDLE_SECONDS}_s": idle,
            }
        )
    )
finally:
    os.killpg(server.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to the whole launch
    server.wait(timeout=60)
