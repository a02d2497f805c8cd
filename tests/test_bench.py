"""`bench`: the JSON shape, exact token counts past EOS, the CLI end to end.

No timing is asserted anywhere: only that the figures exist, are positive and
are put together as documented."""

import contextlib
import json

import mlx.core as mx
import pytest
from conftest import TINY_CONFIG, make_tiny_model, make_tiny_tokenizer
from entropix_mlx.cli.app import main
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from entropix_mlx.decode.generate import generate
from entropix_mlx.errors import ConfigError
from entropix_mlx.eval import bench
from entropix_mlx.eval import profile as profiling
from entropix_mlx.front.registry import build

FIGURES = ("prefill_tps", "first_token_s", "decode_tps", "peak_memory_gb")


def mlx_lm_twin(model):
    """mlx-lm's own Llama with our model's weights (same parameter tree)."""
    twin = llama.Model(llama.ModelArgs.from_dict(TINY_CONFIG))
    twin.load_weights(tree_flatten(model.parameters()), strict=True)
    mx.eval(twin.parameters())
    return twin


def check_result(result: dict, prompt_tokens: int, gen_tokens: int, runs: int):
    assert set(result) >= {"model", "prompt_tokens", "gen_tokens", *bench.VARIANTS, "ratios"}
    assert (result["prompt_tokens"], result["gen_tokens"]) == (prompt_tokens, gen_tokens)
    for name in bench.VARIANTS:
        variant = result[name]
        for figure in FIGURES:
            assert variant[figure] > 0, (name, figure)
        assert variant["runs"] == runs
        assert variant["tokens"] == gen_tokens, f"{name} stopped early"
    assert set(result["ratios"]) == {"prefill", "first_token", "decode", "decode_greedy", "memory"}
    assert all(r > 0 for r in result["ratios"].values())
    # Ratios are entropix-mlx over mlx-lm.
    ref, ours, greedy = result["mlx_lm"], result["entropix"], result["entropix_greedy"]
    assert result["ratios"]["decode"] == pytest.approx(ours["decode_tps"] / ref["decode_tps"])
    assert result["ratios"]["decode_greedy"] == pytest.approx(greedy["decode_tps"] / ref["decode_tps"])
    assert result["ratios"]["prefill"] == pytest.approx(ours["prefill_tps"] / ref["prefill_tps"])
    assert result["ratios"]["first_token"] == pytest.approx(ref["first_token_s"] / ours["first_token_s"])
    for name in bench.VARIANTS:  # the first token comes after the prompt's logits, never before
        assert result[name]["first_token_s"] >= prompt_tokens / result[name]["prefill_tps"] * 0.999, name
    assert result["ratios"]["memory"] == pytest.approx(ours["peak_memory_gb"] / ref["peak_memory_gb"])
    assert sum(result["entropix"]["strategy_counts"].values()) == gen_tokens


def test_bench_on_a_tiny_model_gives_every_figure(tiny_model, tiny_tokenizer):
    result = bench.bench(
        tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", prompt_tokens=12, gen_tokens=6, repeats=2
    )
    check_result(result, 12, 6, runs=2)
    assert result["model"] == "tiny"
    json.dumps(result)  # the --json output is plain data


def test_bench_times_entropix_under_a_json_schema_beside_entropix_alone(tiny_model, tiny_tokenizer):
    from entropix_mlx.front import LoadedModel, ModelCard

    loaded = LoadedModel(tiny_model, tiny_tokenizer, None, ModelCard("tiny", None, "none"))
    made = []

    def constraint():
        made.append(loaded.constraint({"type": "array", "items": {"type": "string"}}))
        return made[-1]

    result = bench.bench(
        tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", 12, 6, repeats=1, constraint=constraint
    )
    held = result["entropix_schema"]
    assert made[0].tokenizer.eos_tokens == sorted(tiny_tokenizer.eos_token_ids)
    assert held["tokens"] == 6 and held["decode_tps"] > 0
    assert result["ratios"]["decode_schema"] == held["decode_tps"] / result["entropix"]["decode_tps"]
    assert len(made) == 3  # one before the runs (the end tokens still known), then a fresh one for each
    assert (
        "decode_schema"
        not in bench.bench(tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", 12, 6, 1)["ratios"]
    )


def eos_only_model():
    """A tiny model whose final norm is zero: every logit is 0, so greedy picks
    token 0 (argmax takes the first of equals) at every step, in both engines."""
    model = make_tiny_model()
    model.model.norm.weight = mx.zeros_like(model.model.norm.weight)
    mx.eval(model.parameters())
    return model


def run_alone(run: bench.Run) -> bench.RunResult:
    while not run.done:
        run.advance(bench.CHUNK_TOKENS)
    return run.result()


def test_runs_generate_exactly_the_tokens_asked_for_even_past_eos():
    model, tokenizer = eos_only_model(), make_tiny_tokenizer()
    tokenizer.eos_token_ids = {0}
    prompt = bench.bench_prompt(tokenizer, 5)
    # Without the bench's switch, both engines stop at once.
    assert list(generate(model, tokenizer, prompt, build("greedy"), max_tokens=8)) == []
    from mlx_lm.generate import stream_generate

    assert [r.finish_reason for r in stream_generate(mlx_lm_twin(model), tokenizer, prompt, max_tokens=8)] == ["stop"]

    with bench.no_eos(tokenizer):
        theirs = run_alone(bench.start_mlx_lm(mlx_lm_twin(model), tokenizer, prompt, 8))
        ours = run_alone(bench.start_entropix(model, tokenizer, prompt, 8, build("greedy", metrics=False)))
    assert theirs.gen_tokens == ours.gen_tokens == 8
    assert ours.strategy_counts == {"argmax": 8}
    assert tokenizer.eos_token_ids == {0}  # restored afterwards


def test_runs_take_turns_a_chunk_at_a_time_in_a_rotating_order():
    log = []

    def tokens(name, n):
        for i in range(n):
            log.append(name)
            yield i

    runs = {
        name: bench.Run(tokens(name, n), 4, 0, list, lambda first: 1.0)
        for name, n in (("a", 2 * bench.CHUNK_TOKENS), ("b", 2 * bench.CHUNK_TOKENS), ("c", bench.CHUNK_TOKENS + 3))
    }
    bench.interleaved(runs)
    turns = [log[i] for i in range(0, len(log), bench.CHUNK_TOKENS)]
    assert turns[:3] == ["a", "b", "c"] and turns[3:] == ["b", "c", "a"]  # round 2 starts one later
    assert [runs[n].generated for n in "abc"] == [
        2 * bench.CHUNK_TOKENS,
        2 * bench.CHUNK_TOKENS,
        bench.CHUNK_TOKENS + 3,
    ]
    # Every token after a run's first is a counted step, whichever turn it falls in.
    assert [runs[n].decode_steps for n in "abc"] == [2 * bench.CHUNK_TOKENS - 1] * 2 + [bench.CHUNK_TOKENS + 2]


def test_a_long_wait_at_the_start_of_a_turn_is_counted(monkeypatch):
    """A look-ahead sampler hands out a burst of tokens after one long wait. Wherever
    that wait falls (here: on the first token of a turn), the decode time includes it."""
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench, "synchronize", lambda: None)
    n = 2 * bench.CHUNK_TOKENS

    def tokens():
        for i in range(n):
            # 1 s for the run's first token (prefill), 10 s for the first of the second
            # turn (a rollout), then a burst of 1 s tokens
            clock[0] += 1.0 if i != bench.CHUNK_TOKENS else 10.0
            yield i

    run = bench.Run(tokens(), 4, 0, list, lambda first: 0.25)
    run_alone(run)
    result = run.result()
    assert run.first_token_s == 1.0 and run.decode_steps == n - 1
    # Prefill is the engine's own prompt time (0.25 s here), not the time to the first token.
    assert result.prefill_tps == 4 / 0.25 and result.first_token_s == 1.0
    assert run.decode_s == (n - 2) * 1.0 + 10.0
    assert result.decode_tps == (n - 1) / ((n - 2) + 10.0)


def test_bench_prompt_has_exactly_the_requested_length(tiny_tokenizer):
    for n in (1, 7, 300, 2000):
        ids = bench.bench_prompt(tiny_tokenizer, n)
        assert len(ids) == n
    assert tiny_tokenizer.decode(bench.bench_prompt(tiny_tokenizer, 30)) == bench.PASSAGE[:30]


def test_bench_rejects_sizes_it_cannot_run(tiny_model, tiny_tokenizer):
    with pytest.raises(ConfigError, match="context holds 512"):
        bench.bench(tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", prompt_tokens=500, gen_tokens=20)
    with pytest.raises(ConfigError, match="at least"):
        bench.bench(tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", prompt_tokens=8, gen_tokens=1)


def test_profile_times_every_part(tiny_model, tiny_tokenizer):
    p = profiling.profile(tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", prompt_tokens=10, steps=5)
    parts = {"model", "metrics", "candidates", "decision", "mlx_lm_model"}
    assert set(p["step_ms"]) == set(p["step_ms_mean"]) == parts
    assert p["step_ms"]["metrics"] > 0 and p["step_ms_mean"]["mlx_lm_model"] > 0
    assert all(v >= 0 for v in p["step_ms_mean"].values())
    assert sum(p["strategy_counts"].values()) == 5


def test_table_shows_every_variant_and_ratio(capsys):
    variant = {
        "prefill_tps": 10.0,
        "first_token_s": 0.9,
        "decode_tps": 5.0,
        "peak_memory_gb": 0.12,
        "tokens": 4,
        "runs": 1,
    }
    result = {
        "model": "m",
        "prompt_tokens": 8,
        "gen_tokens": 4,
        "mlx_lm": variant,
        "entropix_greedy": variant,
        "entropix": {**variant, "decode_tps": 4.5, "strategy_counts": {"argmax": 3, "branch": 1}},
        "ratios": {"prefill": 1.0, "first_token": 1.5, "decode": 0.9, "decode_greedy": 1.0, "memory": 1.0},
    }
    from entropix_mlx.cli.bench import print_tables

    print_tables(result)
    out = capsys.readouterr().out
    for text in ("mlx_lm", "entropix_greedy", "entropix / mlx_lm", "0.90", "1.50× sooner", "argmax 3, branch 1"):
        assert text in out


def test_cli_rejects_one_generated_token(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--gen-tokens", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--gen-tokens" in err and "\n" not in err


@pytest.mark.slow
def test_cli_json_on_the_bundled_model(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--prompt-tokens", "4", "--gen-tokens", "2", "--repeats", "1", "--json", "--weights", "native"])
    assert exit_.value.code == 0
    result = json.loads(capsys.readouterr().out)
    check_result(result, 4, 2, runs=1)
    assert result["model"] == "smollm2-135m"
    assert result["paths"]["entropix"] == result["paths"]["mlx_lm"].removesuffix(" · MLX quantized matmul")
    # mlx-lm's model and ours hold the same weights: same footprint within the cache's growth step.
    assert result["entropix_greedy"]["peak_memory_gb"] == pytest.approx(result["mlx_lm"]["peak_memory_gb"], rel=0.2)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_compute_paths_name_each_side(monkeypatch, device):
    import mlx.core as mx
    import mlx.nn as nn
    from conftest import make_tiny_model

    from entropix_mlx.accel.blas import blas_info, blas_name
    from entropix_mlx.accel.weights import to_float32
    from entropix_mlx.eval.bench import compute_paths

    theirs = make_tiny_model()
    nn.quantize(theirs, group_size=32, bits=4)
    ours = to_float32(make_tiny_model())
    monkeypatch.setattr(mx, "default_device", lambda: getattr(mx, device))
    paths = compute_paths(ours, theirs)
    assert paths == {
        "mlx_lm": f"{device} · native 4-bit weights · MLX quantized matmul",
        "entropix": f"{device} · float32 weights" + (f" · {blas_name()}" if device == "cpu" else ""),
        "blas": blas_name(),
        "blas_core": blas_info()["core"],
    }


def test_the_busy_neighbour_runs_for_the_block_and_is_ended_after(monkeypatch):
    from entropix_mlx.eval import neighbour

    with neighbour.busy_neighbour(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.returncode is not None for p in procs)
    with pytest.raises(RuntimeError), neighbour.busy_neighbour(1) as procs:
        raise RuntimeError("a failed run")
    assert procs[0].returncode is not None  # ended on an error too


def test_contended_bench_starts_its_neighbour_on_every_core_and_ends_it(tiny_model, tiny_tokenizer, monkeypatch):
    started, alive = [], []
    real = bench.busy_neighbour

    def recording(*args, **kwargs):
        with real(*args, **kwargs) as procs:
            started.extend(procs)
            yield procs

    monkeypatch.setattr(bench, "busy_neighbour", contextlib.contextmanager(recording))
    result = bench.bench(
        tiny_model,
        mlx_lm_twin(tiny_model),
        tiny_tokenizer,
        "tiny",
        prompt_tokens=8,
        gen_tokens=4,
        repeats=1,
        progress=lambda _: alive.append([p.poll() is None for p in started]),
        contended=True,
    )
    check_result(result, 8, 4, runs=1)
    assert len(started) == bench.cores() and alive and all(all(a) and a for a in alive)  # running all along
    assert all(p.returncode is not None for p in started)  # and ended
    assert result["machine"]["contended"] is True and len(result["machine"]["load_average"]) == 2
    quiet = bench.bench(tiny_model, mlx_lm_twin(tiny_model), tiny_tokenizer, "tiny", 8, 4, 1, warmup=False)
    assert quiet["machine"]["contended"] is False and len(started) == bench.cores()  # no neighbour unless asked
