"""The CPU fast path: BLAS discovery (with and without a system OpenBLAS) and the
float32 weight format against the file's native quantized format."""

import json
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import make_tiny_model

from entropix_mlx.accel import blas, weights
from entropix_mlx.errors import ConfigError
from entropix_mlx.model.cache import make_cache


def _blas_in_subprocess(env_value: str | None, extra: str = "", env_extra: dict | None = None, after: str = "") -> dict:
    """enable()'s answer in a fresh interpreter, with ENTROPIX_BLAS set as given; `extra`
    runs before it, `after` once it ran (its output is not read)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("ENTROPIX_BLAS", "ENTROPIX_BLAS_SHIM")}
    if env_value is not None:
        env["ENTROPIX_BLAS"] = env_value
    env.update(env_extra or {})
    code = extra + "import json, entropix_mlx.accel as accel; i = accel.enable(); " + after + "print(json.dumps(i))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _openblas_present() -> bool:
    from pathlib import Path

    return sys.platform == "linux" and any(Path(p).exists() for p in blas.OPENBLAS_CANDIDATES)


# Every layout the shim rewrites (one row or one column, either operand stored
# transposed; 2-64 rows times a weight stored N x K, with remainders of every
# tile size; the attention's tiny products, with 64-, 8- and 1-column blocks; big
# products split over threads by columns or by rows, in shares with remainders)
# and ones it passes on, checked against float64 NumPy; a wrong
# stride, transpose flag, tile edge or share in blas_shim.c gives numbers far off, not rounding.
_LAYOUT_CHECK = """
import numpy as np, mlx.core as mx
mx.set_default_device(mx.cpu)
rng = np.random.default_rng(0)
worst = 0.0
for m, n, k in [(1, 37, 19), (23, 1, 19), (1, 1, 7), (1, 576, 1536), (5, 9, 11),
                (2, 301, 67), (7, 577, 40), (8, 1536, 576), (32, 130, 136), (33, 200, 100),
                (64, 130, 136), (65, 2001, 17), (70, 1536, 576), (301, 257, 33), (600, 40, 300),
                (3, 45, 64), (3, 64, 45), (1, 70, 9), (16, 256, 300), (5, 71, 130), (17, 64, 40)]:
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    for A in (mx.array(a), mx.array(np.ascontiguousarray(a.T)).T):
        for B in (mx.array(b), mx.array(np.ascontiguousarray(b.T)).T):
            worst = max(worst, float(np.abs(np.array(A @ B) - a.astype(np.float64) @ b).max()))
    c = rng.standard_normal((m, n)).astype(np.float32)   # addmm: the beta term goes through the shim too
    got = np.array(mx.addmm(mx.array(c), mx.array(a), mx.array(b), alpha=0.5, beta=2.0))
    worst = max(worst, float(np.abs(got - (0.5 * a.astype(np.float64) @ b + 2.0 * c)).max()))
assert worst < 1e-3, worst
"""


# With the shim's threaded kernel, OpenBLAS runs on one thread (the shim splits the big
# products over its own threads); without it, OpenBLAS keeps its threads (2, set below).
_THREADS_CHECK = (
    "import ctypes; "
    "n = ctypes.CDLL(i['path']).openblas_get_num_threads(); "
    "assert n == (1 if i['thin_gemm'] else 2), n; "
)


def test_matmuls_are_exact_through_whatever_blas_runs(on_cpu):
    """In this process (the shim in front of OpenBLAS when both are there)."""
    exec(_LAYOUT_CHECK, {})


@pytest.mark.slow
@pytest.mark.skipif(not _openblas_present(), reason="needs a system OpenBLAS (Debian: libopenblas0-pthread)")
def test_shim_is_built_cached_and_exact(tmp_path):
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler on this machine")
    calls = tmp_path / "calls"
    recording = tmp_path / "cc-recording"
    recording.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {cc} "$@"\n')
    recording.chmod(0o755)
    env = {"XDG_CACHE_HOME": str(tmp_path), "OPENBLAS_NUM_THREADS": "2", "CC": str(recording)}
    info = _blas_in_subprocess(None, env_extra=env, after=f"exec({_LAYOUT_CHECK!r}, {{}}); " + _THREADS_CHECK)
    assert info["name"] == "OpenBLAS" and info["shim"] and info["shim_reason"] == ""
    assert info["shim"].startswith(str(tmp_path / "entropix-mlx"))
    built = calls.read_text()
    assert "-pthread" in built
    # The second process finds the cached library and compiles nothing.
    again = _blas_in_subprocess(None, env_extra=env)
    assert again["shim"] == info["shim"] and calls.read_text() == built
    # Another compiler command (here: other flags in CC) is another library, built anew.
    other = _blas_in_subprocess(None, env_extra={**env, "CC": f"{recording} -DENTROPIX_SHUFFLE_MASKS"})
    assert other["shim"] and other["shim"] != info["shim"] and "-DENTROPIX_SHUFFLE_MASKS" in calls.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not _openblas_present(), reason="needs a system OpenBLAS (Debian: libopenblas0-pthread)")
@pytest.mark.parametrize(
    "env, reason",
    [({"ENTROPIX_BLAS_SHIM": "off"}, "ENTROPIX_BLAS_SHIM=off"), ({"CC": "/bin/false"}, "could not build it")],
)
def test_without_the_shim_openblas_still_runs_every_product(tmp_path, env, reason):
    info = _blas_in_subprocess(
        None, env_extra={"XDG_CACHE_HOME": str(tmp_path), **env}, after=f"exec({_LAYOUT_CHECK!r}, {{}}); "
    )
    assert info["name"] == "OpenBLAS" and info["shim"] is None and reason in info["shim_reason"]


@pytest.mark.slow
@pytest.mark.skipif(not _openblas_present(), reason="needs a system OpenBLAS (Debian: libopenblas0-pthread)")
def test_a_compiler_without_threads_builds_the_shim_with_its_gemv_part_only(tmp_path):
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler on this machine")
    no_threads = tmp_path / "cc-without-threads"
    no_threads.write_text(f'#!/bin/sh\ncase " $* " in *" -pthread "*) exit 1;; esac\nexec {cc} "$@"\n')
    no_threads.chmod(0o755)
    info = _blas_in_subprocess(
        None,
        env_extra={"XDG_CACHE_HOME": str(tmp_path), "CC": str(no_threads), "OPENBLAS_NUM_THREADS": "2"},
        after=f"exec({_LAYOUT_CHECK!r}, {{}}); " + _THREADS_CHECK,
    )
    assert info["shim"] and info["shim_reason"] == "" and info["thin_gemm"] is False


def _thin_gemm_runs() -> bool:
    return blas.blas_info()["thin_gemm"]


@pytest.mark.skipif(
    not _thin_gemm_runs(),
    reason="the shim's few-row kernel needs OpenBLAS, a C compiler with threads and (x86-64) AVX2",
)
def test_a_rows_attention_products_do_not_depend_on_its_padding_or_its_number_of_keys(on_cpu):
    """A decode step's attention, per row and head: its probabilities against its values are
    bit for bit the same with zero-probability keys in front (a batch's left padding), and its
    scores against its keys the same whether the product is small (the shim's tiny path) or
    large enough for the few-row kernel. With OpenBLAS taking the small ones, both differed."""
    rng = np.random.default_rng(2)
    for keys in (1, 7, 45, 80, 300):
        p = rng.random((3, 3, keys)).astype(np.float32)
        v = rng.standard_normal((3, keys, 64)).astype(np.float32)
        alone = mx.array(p) @ mx.array(v)
        for pad in (1, 5, 33):
            padded_p = np.concatenate([np.zeros((3, 3, pad), np.float32), p], axis=-1)
            padded_v = np.concatenate([rng.standard_normal((3, pad, 64)).astype(np.float32), v], axis=1)
            assert mx.array_equal(mx.array(padded_p) @ mx.array(padded_v), alone).item(), (keys, pad)
        q = mx.array(rng.standard_normal((3, 3, 64)).astype(np.float32))
        k = rng.standard_normal((3, keys + 400, 64)).astype(np.float32)  # 401+ keys: the few-row kernel
        many = q @ mx.array(k).swapaxes(-1, -2)
        assert mx.array_equal(many[..., :keys], q @ mx.array(k[:, :keys]).swapaxes(-1, -2)).item(), keys


@pytest.mark.skipif(
    not _thin_gemm_runs(),
    reason="the shim's few-row kernel needs OpenBLAS, a C compiler with threads and (x86-64) AVX2",
)
def test_batched_linear_layers_take_the_few_row_kernel_and_rows_do_not_depend_on_the_batch(on_cpu):
    rng = np.random.default_rng(1)
    layer = nn.Linear(576, 1536)
    x = mx.array(rng.standard_normal((1, 64, 576)).astype(np.float32))
    before = blas.thin_gemm_calls()
    full = layer(x)
    mx.eval(full)
    assert blas.thin_gemm_calls() == before + 1  # x @ W.T + b: 64 rows, one call
    for rows in (1, 2, 3, 5, 8, 13, 33):  # every tile edge: each row's numbers are bit for bit the same
        assert mx.array_equal(layer(x[:, :rows]), full[:, :rows]).item(), rows
    assert blas.thin_gemm_calls() == before + 8
    one = x[0, :1]
    mx.eval(
        layer(mx.concatenate([x, x[:, :1]], axis=1)),  # 65 rows: OpenBLAS
        one @ mx.array(rng.standard_normal((576, 1)).astype(np.float32)),
    )  # one column: GEMV
    assert blas.thin_gemm_calls() == before + 8


@pytest.mark.skipif(
    not _thin_gemm_runs(),
    reason="the shim's few-row kernel needs OpenBLAS, a C compiler with threads and (x86-64) AVX2",
)
def test_the_avx512_tiles_give_the_numbers_of_the_avx2_ones_bit_for_bit(on_cpu):
    """More than 8 rows take the 4 x 4 tiles where the CPU has AVX-512VL; a row's numbers
    must be those of the 4 x 3 tiles (fewer rows, other CPUs). Shapes with remainders of
    both tile widths, of the 4-row tiles and of K's 8-wide steps."""
    wide, calls = blas.wide_thin_tiles(True)
    if not wide:
        pytest.skip("this CPU has no AVX-512VL: only the 4 x 3 tiles exist here")
    rng = np.random.default_rng(2)
    try:
        for m, n, k in [(9, 1536, 576), (14, 577, 1003), (33, 131, 136), (64, 203, 1543)]:
            a = mx.array(rng.standard_normal((m, k)).astype(np.float32))
            w = mx.array(rng.standard_normal((n, k)).astype(np.float32))
            with_wide = np.array(a @ w.T)
            blas.wide_thin_tiles(False)
            narrow = np.array(a @ w.T)
            blas.wide_thin_tiles(True)
            assert np.array_equal(with_wide, narrow), (m, n, k)
            exact = np.array(a).astype(np.float64) @ np.array(w).astype(np.float64).T
            assert np.abs(with_wide - exact).max() < 1e-3
        assert blas.wide_thin_tiles(True)[1] == calls + 4  # the 4 x 4 tiles took each product once
    finally:
        blas.wide_thin_tiles(True)


@pytest.mark.slow
def test_blas_none_loads_nothing_and_says_why():
    info = _blas_in_subprocess("none")
    assert info["name"] is None and info["reason"] == "ENTROPIX_BLAS=none"


@pytest.mark.slow
def test_blas_bad_path_falls_back_without_failing(tmp_path):
    missing = tmp_path / "libopenblas-missing.so.0"
    info = _blas_in_subprocess(str(missing))
    assert info["name"] is None and str(missing) in info["reason"]


@pytest.mark.slow
def test_blas_after_mlx_import_is_refused_with_a_reason():
    # The BLAS must be in the global scope before MLX binds its own.
    info = _blas_in_subprocess(None, extra="import mlx.core; ")
    assert info["name"] is None and "mlx.core was imported before" in info["reason"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="BLAS discovery is for Linux")
def test_system_openblas_is_found_when_installed():
    from pathlib import Path

    present = [p for p in blas.OPENBLAS_CANDIDATES if Path(p).exists()]
    info = _blas_in_subprocess(None)
    if present:
        assert info["name"] == "OpenBLAS" and info["path"] == present[0]
    else:
        assert info["name"] is None and "apt install libopenblas0-pthread" in info["reason"]


def test_weight_formats_are_checked():
    with pytest.raises(ConfigError, match="'fp8' is not a weight format"):
        weights.check_weights("fp8")


def _quantized_tiny():
    model = make_tiny_model()
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def test_auto_picks_float32_on_cpu_and_native_over_the_budget(monkeypatch, on_cpu):
    monkeypatch.setitem(blas._blas, "name", "OpenBLAS")
    model = _quantized_tiny()
    assert weights.weights_format(model) == "native 4-bit"
    assert weights.choose_weights("auto", model) == "float32"
    assert weights.choose_weights("native", model) == "native"
    # float32 while it takes at most half of the machine's memory
    monkeypatch.setattr(weights, "physical_memory", lambda: 2 * weights.float32_bytes(model))
    assert weights.choose_weights("auto", model) == "float32"
    monkeypatch.setattr(weights, "physical_memory", lambda: 2 * weights.float32_bytes(model) - 2)
    assert weights.choose_weights("auto", model) == "native"


def test_auto_keeps_the_native_weights_on_a_gpu(monkeypatch):
    monkeypatch.setitem(blas._blas, "name", "OpenBLAS")
    model = _quantized_tiny()
    monkeypatch.setattr(mx, "default_device", lambda: mx.gpu)
    assert weights.choose_weights("auto", model) == "native"
    assert weights.choose_weights("float32", model) == "float32"


def test_auto_keeps_the_native_weights_without_a_real_blas(monkeypatch, on_cpu):
    """On Linux without OpenBLAS, MLX's reference BLAS makes float32 no faster than the
    quantized kernel (and 4.7x the memory): auto keeps the file's format; asked for, float32
    still runs."""
    monkeypatch.setattr(weights.sys, "platform", "linux")
    monkeypatch.setitem(blas._blas, "name", None)
    model = _quantized_tiny()
    assert weights.choose_weights("auto", model) == "native"
    assert weights.choose_weights("float32", model) == "float32"
    monkeypatch.setitem(blas._blas, "name", "OpenBLAS")
    assert weights.choose_weights("auto", model) == "float32"


def test_float32_bytes_counts_dequantized_weights():
    model = make_tiny_model()
    plain = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters())) * 4
    quantized = _quantized_tiny()
    # same parameter count once dequantized: quantization scales and biases do not count
    assert weights.float32_bytes(quantized) == plain


def test_to_float32_matches_the_quantized_model_computed_in_float32():
    """Dequantizing once must give the quantized model's function: compared with
    the quantized kernels run on float32 scales (exact arithmetic), not float16."""
    model = _quantized_tiny()
    model.set_dtype(mx.float32)
    reference_logits, reference_scores = model(mx.array([[5, 17, 99, 3, 42]]), make_cache(model))
    fast = weights.to_float32(_quantized_tiny())
    assert weights.weights_format(fast) == "float32"
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in fast.named_modules())
    logits, scores = fast(mx.array([[5, 17, 99, 3, 42]]), make_cache(fast))
    assert mx.abs(logits - reference_logits).max().item() < 1e-4
    assert all(mx.abs(a - b).max().item() < 1e-4 for a, b in zip(scores, reference_scores, strict=False))


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_describe_names_device_format_and_blas(monkeypatch, device):
    fast, quantized = weights.to_float32(_quantized_tiny()), _quantized_tiny()
    monkeypatch.setattr(mx, "default_device", lambda: getattr(mx, device))
    # Only the CPU's float32 matmuls go to the BLAS; a GPU's are MLX's own kernels.
    blas_part = f" · {blas.blas_name()}" if device == "cpu" else ""
    assert weights.describe(fast) == f"{device} · float32 weights{blas_part}"
    assert weights.describe(quantized) == f"{device} · native 4-bit weights"


def test_describe_names_the_device_in_use():
    device = "cpu" if mx.default_device() == mx.cpu else "gpu"
    assert weights.describe(_quantized_tiny()) == f"{device} · native 4-bit weights"


@pytest.mark.slow
def test_cli_rejects_a_bad_weight_format_in_one_line():
    out = subprocess.run(
        [sys.executable, "-c", "from entropix_mlx.cli.app import main; main()", "run", "hi", "--weights", "fp8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'fp8' is not a weight format" in lines[0]


# -- the bundled model ---------------------------------------------------------------


@pytest.mark.slow
def test_bundled_float32_logits_match_native_within_1e_3(smollm_float32, smollm_native):
    """Prefill and 20 decode steps. The reference is the native Q4_1 model
    dequantized with its quantization scales in float32: the same weights, exact
    arithmetic. As shipped, the scales are float16 and MLX's quantized kernel then
    computes in float16, which moves logits by up to ~0.1: against that model, the
    argmax must agree at every step."""
    from mlx_lm.utils import dequantize_model

    from entropix_mlx import load

    fast, tokenizer = smollm_float32
    native, _ = smollm_native
    exact, _ = load(weights="native")
    exact.set_dtype(mx.float32)
    dequantize_model(exact)  # the same numbers as its quantized products in float32, without their cost on a CPU
    # Raw text: on a CPU each prompt token of the quantized models costs about a decode step.
    ids = tokenizer.encode("Which number is larger, 9.9 or 9.11? The larger number is")
    models = (fast, exact, native)
    caches = [make_cache(m) for m in models]
    logits = [m(mx.array([ids]), c)[0] for m, c in zip(models, caches, strict=False)]
    for step in range(21):
        assert mx.abs(logits[0] - logits[1]).max().item() < 1e-3, f"step {step}"
        token = mx.argmax(logits[0][0, -1]).item()
        assert token == mx.argmax(logits[2][0, -1]).item(), f"step {step}"
        logits = [m(mx.array([[token]]), c)[0] for m, c in zip(models, caches, strict=False)]


@pytest.mark.slow
def test_bundled_float32_greedy_equals_native_on_three_prompts(smollm_float32, smollm_native):
    """16 tokens each here, after raw text (the README reports 40 after the chat template)."""
    from entropix_mlx.decode.generate import generate
    from entropix_mlx.sampling.samplers import GreedySampler

    fast, tokenizer = smollm_float32
    native, _ = smollm_native
    for prompt in ("Why is the sky blue?", "Write a haiku about rain.", "What is 12 times 7?"):
        ids = tokenizer.encode(prompt)
        answers = [
            [e.token for e in generate(m, tokenizer, ids, GreedySampler(metrics=False), max_tokens=16)]
            for m in (fast, native)
        ]
        assert answers[0] == answers[1], prompt
