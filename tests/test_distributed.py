"""Several ranks on this machine with MLX's ring backend (`mlx.launch -n 2`):
a sharded eval gives one process's results, a killed rank leaves a resumable
--out, and the faults end with one line in bounded time."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_tiny_model
from test_cli_run import cli_command, invoke
from test_loading import GGUF_CONFIG, write_gguf

from entropix_mlx import distributed

LAUNCH = [sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"]
TIMEOUT = 240  # seconds: a launch on a busy 2-core machine takes tens of them
EVAL = ["eval", "--builtin", "--split", "dev", "--limit", "12", "--max-tokens", "6", "--json"]

# Rank 1 kills itself as it reaches the second exchange of records: after
# greedy's chunk, with entropix's answered but not yet sent.
KILL_RANK_1 = """
import os, signal
import entropix_mlx.accel
entropix_mlx.accel.enable()
import entropix_mlx.eval.store as store
real, calls = store.all_gather_json, []
def gather(w, value):
    calls.append(1)
    if w.rank == 1 and len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(w, value)
store.all_gather_json = gather
from entropix_mlx.cli.app import main
main()
"""


def free_port(count: int = 2) -> int:
    """A port that is free with the `count` - 1 after it: a launch with
    --starting-port P gives rank r port P + r."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count > 65536:
            continue
        sockets = []
        try:
            for p in range(port, port + count):
                sockets.append(socket.socket())
                sockets[-1].bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for t in sockets:
                t.close()


def launch(n: int, *command, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LAUNCH, "-n", str(n), "--starting-port", str(free_port(n)), "--env", "OMP_NUM_THREADS=1", "--", *command],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
    )


def cli(*args) -> list[str]:
    return [*cli_command(), *map(str, args)]


def records(out: Path) -> dict:
    """The items file's records by (sampler, seed, item), without the timing."""
    lines = (json.loads(line) for line in (out / "items.jsonl").read_text().splitlines())
    return {(r["sampler"], r["seed"], r["index"]): {k: v for k, v in r.items() if k != "seconds"} for r in lines}


def without_timing(results):
    if isinstance(results, dict):
        return {
            k: without_timing(v) for k, v in results.items() if k not in ("tokens_per_second", "seconds_per_answer")
        }
    if isinstance(results, list):
        return [without_timing(v) for v in results]
    return results


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    config = {**GGUF_CONFIG, "max_position_embeddings": 512, "tie_word_embeddings": True}
    return write_gguf(tmp_path_factory.mktemp("dist") / "tiny.gguf", make_tiny_model(**config), config)


@pytest.fixture(scope="module")
def one_process(model_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "out"
    done = subprocess.run(cli(*EVAL, "-m", model_file, "--out", out), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    return out, json.loads(done.stdout)


def test_one_process_has_one_rank(monkeypatch):
    for name in distributed.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched()
    w = distributed.world()
    assert (w.rank, w.size, w.root) == (0, 1, True)
    assert distributed.all_gather_json(w, {"a": [1]}) == [{"a": [1]}]


def test_fingerprint_tells_files_apart(tmp_path):
    for size in (500, 5000):
        a, b = tmp_path / f"a{size}", tmp_path / f"b{size}"
        data = bytes(range(256)) * (size // 256 + 1)
        a.write_bytes(data[:size])
        b.write_bytes(data[:size])
        assert distributed.file_fingerprint(a) == distributed.file_fingerprint(b)
        middle = size // 2  # every byte counts, not only the two ends
        b.write_bytes(data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 : size])
        assert distributed.file_fingerprint(a) != distributed.file_fingerprint(b)


@pytest.mark.slow
def test_two_ranks_give_one_process_results(model_file, one_process, tmp_path):
    out, alone = one_process
    done = launch(2, *cli(*EVAL, "-m", model_file, "--out", tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert records(tmp_path / "out") == records(out)
    assert without_timing(json.loads(done.stdout)) == without_timing(alone)  # rank 1 printed nothing
    assert without_timing(json.loads((tmp_path / "out" / "results.json").read_text())) == without_timing(alone)


@pytest.mark.slow
def test_a_killed_rank_leaves_an_out_that_one_process_resumes(model_file, one_process, tmp_path):
    out, alone = one_process
    done = launch(2, sys.executable, "-c", KILL_RANK_1, *EVAL, "-m", model_file, "--out", tmp_path / "out")
    assert "rank 1 exited with code -9" in done.stderr  # mlx.launch itself exits 0
    kept = records(tmp_path / "out")
    assert {k[0] for k in kept} == {"greedy"} and len(kept) == 12  # greedy's chunk was saved, entropix's not
    resumed = subprocess.run(cli(*EVAL, "-m", model_file, "--out", tmp_path / "out"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert records(tmp_path / "out") == records(out)
    assert without_timing(json.loads(resumed.stdout)) == without_timing(alone)


@pytest.mark.slow
def test_a_rank_that_cannot_connect_fails_in_bounded_time(model_file, tmp_path, monkeypatch):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    env = {"MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile), "ENTROPIX_CONNECT_TIMEOUT": "2"}
    start = time.monotonic()
    done = subprocess.run(
        cli(*EVAL, "-m", model_file), capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert done.returncode != 0 and time.monotonic() - start < 60
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: not every rank connected within 2 s"), done.stderr


@pytest.mark.slow
def test_ranks_with_different_model_files_stop_with_one_line(model_file, tmp_path):
    other = tmp_path / "tiny1.gguf"
    config = {**GGUF_CONFIG, "max_position_embeddings": 512, "tie_word_embeddings": True}
    write_gguf(other, make_tiny_model(seed=1, **config), config)
    (tmp_path / "tiny0.gguf").symlink_to(model_file)
    per_rank = shlex.join(cli(*EVAL)) + f" -m {tmp_path}/tiny$MLX_RANK.gguf"
    done = launch(2, "bash", "-c", per_rank)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "rank 1 has different model files than rank 0" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_two_ranks_calibrate_and_tune_as_one_process(model_file, tmp_path):
    args = ["calibrate", "-m", model_file, "--max-tokens", "3", "--tune", "--limit", "2", "--only", "margin-1"]
    code, alone, err = invoke(*args, "--out", tmp_path / "one.toml")  # one process: this one
    assert code == 0, err
    two = launch(2, *cli(*args, "--out", tmp_path / "two.toml"))
    assert "exited with code" not in two.stderr, two.stderr
    assert (tmp_path / "two.toml").read_text() == (tmp_path / "one.toml").read_text()
    assert two.stdout.replace("two.toml", "one.toml") == alone  # printed once, by rank 0


@pytest.mark.slow
def test_a_tensor_parallel_model_decodes_as_the_whole_one():
    done = launch(2, sys.executable, "sharded_worker.py", cwd=Path(__file__).parent)
    assert "exited with code" not in done.stderr, done.stderr
    result = json.loads(done.stdout)
    assert result["heads"] == 2  # each rank holds half of the 4 query heads
    assert result["logits"] < 1e-4 and result["metrics"] < 1e-4
    for name in ("greedy", "entropix"):
        whole, parted = result[name]
        assert len(whole) == 20 and parted == whole
    assert "adaptive" in result["strategies"]  # entropix drew tokens: the ranks' draws agreed
    whole, parted = result["layer_bytes"]
    assert 0.49 < parted / whole < 0.52  # the layers' weights: half, and the norms whole


class FakeGroup:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def test_a_world_size_that_does_not_divide_the_kv_heads_is_one_error(tiny_model):
    from entropix_mlx.errors import UnsupportedModelError
    from entropix_mlx.model.sharding import shard

    with pytest.raises(UnsupportedModelError, match="3 ranks cannot share this model's 2 key/value heads"):
        shard(tiny_model, FakeGroup(3))
    assert tiny_model.layers[0].self_attn.n_heads == 4  # left whole


@pytest.mark.slow
def test_run_on_two_ranks_answers_as_one_process(model_file):
    args = ["run", "-m", model_file, "--json", "--max-tokens", "12", "Hello there"]
    _, alone, _ = invoke(*args)  # one process: this one
    two = launch(2, *cli(*args))
    assert "exited with code" not in two.stderr, two.stderr
    one_lines, two_lines = (
        [json.loads(line) for line in out.splitlines()] for out in (alone, two.stdout)
    )  # rank 1 printed nothing: as many lines as one process
    assert len(two_lines) == len(one_lines) == 13
    for a, b in zip(one_lines[:-1], two_lines[:-1], strict=True):
        assert (a["token"], a["strategy"]) == (b["token"], b["strategy"])
        for metric in ("entropy", "varentropy", "attn_entropy", "attn_varentropy", "agreement", "interaction_strength"):
            assert abs(a[metric] - b[metric]) < 1e-4


@pytest.mark.slow
def test_chat_on_two_ranks_prints_once_what_one_process_prints(model_file, tmp_path):
    # mlx.launch hands every rank the terminal's input: each rank reads the same lines.
    script = f"hello\n/seed 3\nand again\n/save {tmp_path / 'chat.json'}\n/quit\n"
    args = ["chat", "-m", model_file, "--max-tokens", "8", "--no-color"]
    alone = subprocess.run(cli(*args), input=script, capture_output=True, text=True, timeout=TIMEOUT)
    assert alone.returncode == 0, alone.stderr
    first = (tmp_path / "chat.json").read_text()
    (tmp_path / "chat.json").unlink()
    two = subprocess.run(
        [*LAUNCH, "-n", "2", "--starting-port", str(free_port()), "--", *cli(*args)],
        input=script,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert "exited with code" not in two.stderr, two.stderr
    assert without_speed(two.stdout) == without_speed(alone.stdout)  # printed once, by rank 0
    assert (tmp_path / "chat.json").read_text() == first


def without_speed(text: str) -> str:
    return re.sub(r"[\d.]+ (tok/s|GB)", r"N \1", text)


@pytest.mark.slow
def test_bench_on_two_ranks_prints_once_with_half_the_memory(model_file):
    args = ["bench", "-m", model_file, "--prompt-tokens", "8", "--gen-tokens", "6", "--repeats", "1", "--json"]
    code, alone, err = invoke(*args)  # one process: this one
    assert code == 0, err
    two = launch(2, *cli(*args))
    assert "exited with code" not in two.stderr, two.stderr
    one_result, (two_result,) = json.loads(alone), [json.loads(line) for line in two.stdout.splitlines()]
    assert "ranks" not in one_result and two_result["ranks"] == 2  # rank 0 alone printed
    for name in ("mlx_lm", "entropix_greedy", "entropix"):
        assert two_result[name]["tokens"] == 6
        assert two_result[name].get("strategy_counts") == one_result[name].get("strategy_counts")
        assert two_result[name]["peak_memory_gb"] < 0.75 * one_result[name]["peak_memory_gb"]  # the split weights


# Each rank keeps its user cards in a folder of its own, as ranks on different machines do.
CARDS_PER_RANK = """
import os, sys
os.environ["ENTROPIX_CARDS_DIR"] = os.path.join(sys.argv.pop(1), "rank" + os.environ.get("MLX_RANK", "0"))
from entropix_mlx.cli.app import main
main()
"""


@pytest.mark.slow
def test_ranks_with_their_own_caches_measure_one_card_together(model_file, tmp_path):
    args = ["run", "-m", model_file, "--json", "--max-tokens", "8", "--sampler", "entropix", "Hello there"]
    (tmp_path / "rank1").mkdir(mode=0o700)
    (tmp_path / "rank1" / "stale.toml").write_text("")  # rank 1 alone has a folder, rank 0 none yet
    two = launch(2, sys.executable, "-c", CARDS_PER_RANK, str(tmp_path), *args)
    assert two.returncode == 0 and "exited with code" not in two.stderr, two.stderr
    cards = [sorted(p.name for p in (tmp_path / f"rank{r}").glob("tiny-*.toml")) for r in (0, 1)]
    assert cards[0] == cards[1] and len(cards[0]) == 1  # every rank wrote the card its sampler reads
    assert (tmp_path / "rank0" / cards[0][0]).read_text() == (tmp_path / "rank1" / cards[0][0]).read_text()
    (tmp_path / "rank1" / cards[0][0]).unlink()  # now only rank 0 has it: both must measure again, together
    again = launch(2, sys.executable, "-c", CARDS_PER_RANK, str(tmp_path), *args)
    assert "exited with code" not in again.stderr, again.stderr
    tokens = [[json.loads(line).get("token") for line in p.stdout.splitlines()] for p in (two, again)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 9
    assert (tmp_path / "rank1" / cards[0][0]).is_file()
