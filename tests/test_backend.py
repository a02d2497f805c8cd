"""The CPU fast path: BLAS discovery (with and without a system OpenBLAS) and the
float32 weight format against the file's native quantized format."""

import json
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import pytest

from entropix_mlx import backend
from entropix_mlx.cache import make_cache
from entropix_mlx.errors import ConfigError

from conftest import make_tiny_model


def _blas_in_subprocess(env_value: str | None, extra: str = "") -> dict:
    """blas_info() of a fresh interpreter, with ENTROPIX_BLAS set as given."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "ENTROPIX_BLAS"}
    if env_value is not None:
        env["ENTROPIX_BLAS"] = env_value
    code = extra + "import json, entropix_mlx.backend as b; print(json.dumps(b.blas_info()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_blas_none_loads_nothing_and_says_why():
    info = _blas_in_subprocess("none")
    assert info["name"] is None and info["reason"] == "ENTROPIX_BLAS=none"


def test_blas_bad_path_falls_back_without_failing(tmp_path):
    missing = tmp_path / "libopenblas-missing.so.0"
    info = _blas_in_subprocess(str(missing))
    assert info["name"] is None and str(missing) in info["reason"]


def test_blas_after_mlx_import_is_refused_with_a_reason():
    # The BLAS must be in the global scope before MLX binds its own.
    info = _blas_in_subprocess(None, extra="import mlx.core; ")
    assert info["name"] is None and "mlx.core was imported before" in info["reason"]


@pytest.mark.skipif(sys.platform != "linux", reason="BLAS discovery is for Linux")
def test_system_openblas_is_found_when_installed():
    from pathlib import Path

    present = [p for p in backend.OPENBLAS_CANDIDATES if Path(p).exists()]
    info = _blas_in_subprocess(None)
    if present:
        assert info["name"] == "OpenBLAS" and info["path"] == present[0]
    else:
        assert info["name"] is None and "apt install libopenblas0-pthread" in info["reason"]


def test_weight_formats_are_checked():
    with pytest.raises(ConfigError, match="'fp8' is not a weight format"):
        backend.check_weights("fp8")


def _quantized_tiny():
    model = make_tiny_model()
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def test_auto_picks_float32_on_cpu_and_native_over_the_budget(monkeypatch):
    model = _quantized_tiny()
    assert backend.weights_format(model) == "native 4-bit"
    assert backend.choose_weights("auto", model) == "float32"
    assert backend.choose_weights("native", model) == "native"
    monkeypatch.setattr(backend, "FLOAT32_BUDGET_BYTES", backend.float32_bytes(model) - 1)
    assert backend.choose_weights("auto", model) == "native"


def test_float32_bytes_counts_dequantized_weights():
    model = make_tiny_model()
    plain = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters())) * 4
    quantized = _quantized_tiny()
    # same parameter count once dequantized: quantization scales and biases do not count
    assert backend.float32_bytes(quantized) == plain


def test_to_float32_matches_the_quantized_model_computed_in_float32():
    """Dequantizing once must give the quantized model's function: compared with
    the quantized kernels run on float32 scales (exact arithmetic), not float16."""
    model = _quantized_tiny()
    model.set_dtype(mx.float32)
    reference_logits, reference_scores = model(mx.array([[5, 17, 99, 3, 42]]), make_cache(model))
    fast = backend.to_float32(_quantized_tiny())
    assert backend.weights_format(fast) == "float32"
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in fast.named_modules())
    logits, scores = fast(mx.array([[5, 17, 99, 3, 42]]), make_cache(fast))
    assert mx.abs(logits - reference_logits).max().item() < 1e-4
    assert all(mx.abs(a - b).max().item() < 1e-4 for a, b in zip(scores, reference_scores))


def test_describe_names_device_format_and_blas():
    text = backend.describe(backend.to_float32(_quantized_tiny()))
    assert text.startswith("cpu · float32 weights · ")
    assert text.endswith(backend.blas_name())
    assert backend.describe(_quantized_tiny()) == "cpu · native 4-bit weights"


def test_cli_rejects_a_bad_weight_format_in_one_line():
    out = subprocess.run([sys.executable, "-c", "from entropix_mlx.cli.app import main; main()", "run", "hi", "--weights", "fp8"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'fp8' is not a weight format" in lines[0]


# -- the bundled model ---------------------------------------------------------------


@pytest.mark.slow
def test_bundled_float32_logits_match_native_within_1e_3(smollm, smollm_native):
    """Prefill and 20 decode steps. The reference is the native Q4_1 model with its
    quantization scales in float32: the same weights, exact arithmetic. As
    shipped, the scales are float16 and MLX's quantized kernel then computes in
    float16, which moves logits by up to ~0.1: against that model, the argmax
    must agree at every step."""
    from entropix_mlx import load

    fast, tokenizer = smollm
    native, _ = smollm_native
    exact, _ = load(weights="native")
    exact.set_dtype(mx.float32)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which number is larger, 9.9 or 9.11?"}], add_generation_prompt=True)
    models = (fast, exact, native)
    caches = [make_cache(m) for m in models]
    logits = [m(mx.array([ids]), c)[0] for m, c in zip(models, caches)]
    for step in range(21):
        assert mx.abs(logits[0] - logits[1]).max().item() < 1e-3, f"step {step}"
        token = mx.argmax(logits[0][0, -1]).item()
        assert token == mx.argmax(logits[2][0, -1]).item(), f"step {step}"
        logits = [m(mx.array([[token]]), c)[0] for m, c in zip(models, caches)]


@pytest.mark.slow
def test_bundled_float32_greedy_equals_native_on_three_prompts(smollm, smollm_native):
    """16 tokens each here (the README reports 40, measured the same way)."""
    from entropix_mlx.generate import generate
    from entropix_mlx.samplers import GreedySampler

    fast, tokenizer = smollm
    native, _ = smollm_native
    for prompt in ("Why is the sky blue?", "Write a haiku about rain.", "What is 12 times 7?"):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        answers = [[e.token for e in generate(m, tokenizer, ids, GreedySampler(metrics=False), max_tokens=16)]
                   for m in (fast, native)]
        assert answers[0] == answers[1], prompt
