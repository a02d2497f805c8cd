"""`convert`: a GGUF file as an MLX directory that mlx_lm.load opens with the same
weights, and that entropix-mlx loads back."""

import json

import mlx.core as mx
import numpy as np
import pytest
from entropix_mlx.cli.app import main
from gguf_writer import write_gguf
from mlx.utils import tree_flatten
from mlx_lm.utils import load as mlx_lm_load
from test_gguf_families import FAMILIES, TOKENS, mlx_lm_model, relative_error

from entropix_mlx.model import gguf
from entropix_mlx.model.convert import cached_conversion, convert
from entropix_mlx.model.loading import build_model, load


@pytest.mark.parametrize("family,kind", [("llama", "Q8_0"), ("qwen2", "Q4_K"), ("gemma3_text", "Q5_0")])
def test_mlx_lm_opens_the_same_weights(tmp_path, family, kind):
    config = FAMILIES[family]
    module, weights = mlx_lm_model(config, seed=7)
    write_gguf(tmp_path / "tiny.gguf", config, weights, kind)
    out = convert(tmp_path / "tiny.gguf", tmp_path / "mlx")

    theirs, tokenizer = mlx_lm_load(str(out))
    g = gguf.read_gguf(tmp_path / "tiny.gguf", native=True, hf_layout=True)
    ours = build_model(g.config, g.weights, module.Model, module.ModelArgs)
    assert relative_error(theirs(TOKENS), ours(TOKENS)) == 0.0
    written = json.loads((out / "config.json").read_text())
    assert written["quantization"]["group_size"] == 32
    assert {m.bits for _, m in theirs.named_modules() if hasattr(m, "bits")} == {int(kind[1])}
    assert tokenizer.encode("hi 12") == [107, 108, 35, 52, 53]
    assert 2 in tokenizer.eos_token_ids


def test_mixed_types_get_per_layer_quantization(tmp_path):
    """A Q4_K_M-like file mixes types: the common one is the default, others by name."""
    config = FAMILIES["qwen2"]
    module, weights = mlx_lm_model(config, seed=8)
    write_gguf(tmp_path / "a.gguf", config, weights, "Q4_K")
    g = gguf.read_gguf(tmp_path / "a.gguf")
    assert {q["bits"] for q in g.quantization.values()} == {4}
    from entropix_mlx.model.convert import quantization_block

    four, eight = {"bits": 4, "group_size": 32}, {"bits": 8, "group_size": 32}
    block = quantization_block({"a.b": four, "c": four, "d": eight})
    assert block == {"group_size": 32, "bits": 4, "d": {"bits": 8, "group_size": 32}}


def test_llama_round_trip_through_the_port(tmp_path):
    config = FAMILIES["llama"]
    _, weights = mlx_lm_model(config, seed=9)
    write_gguf(tmp_path / "tiny.gguf", config, weights, "Q8_0")
    out = convert(tmp_path / "tiny.gguf", tmp_path / "mlx")
    from_gguf, _ = load(str(tmp_path / "tiny.gguf"), weights="float32")
    from_dir, _ = load(str(out), weights="float32")
    assert relative_error(from_dir(TOKENS)[0], from_gguf(TOKENS)[0]) < 1e-5


def test_float32_conversion(tmp_path):
    config = FAMILIES["qwen3"]
    _, weights = mlx_lm_model(config, seed=10)
    write_gguf(tmp_path / "tiny.gguf", config, weights, "Q8_0")
    out = convert(tmp_path / "tiny.gguf", tmp_path / "mlx", weights="float32")
    assert "quantization" not in json.loads((out / "config.json").read_text())
    model, _ = mlx_lm_load(str(out))
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {mx.float32}


def test_cached_conversion_is_reused(tmp_path):
    config = FAMILIES["llama"]
    _, weights = mlx_lm_model(config, seed=11)
    write_gguf(tmp_path / "tiny.gguf", config, weights, "Q8_0")
    first = cached_conversion(tmp_path / "tiny.gguf", tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert cached_conversion(tmp_path / "tiny.gguf", tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp


def test_cli_convert_and_its_errors(tmp_path, capsys):
    config = FAMILIES["llama"]
    _, weights = mlx_lm_model(config, seed=12)
    write_gguf(tmp_path / "tiny.gguf", config, weights, "F32")
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(tmp_path / "tiny.gguf"), str(tmp_path / "out")])
    assert exit_info.value.code == 0
    said = capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").is_file() and "wrote" in said
    # the hint names a command that exists: `run` with its --model option
    hint = said[said.index("entropix-mlx ") :].split()
    assert hint[1:4] == ["run", "--model", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--model" in capsys.readouterr().out
    for args in ([str(tmp_path / "tiny.gguf"), str(tmp_path / "out")], [str(tmp_path / "out"), str(tmp_path / "o2")]):
        with pytest.raises(SystemExit) as exit_info:
            main(["convert", *args])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert np.array_equal(
        np.array(mx.load(str(tmp_path / "out" / "model.safetensors"))["model.norm.weight"]),
        weights["model.norm.weight"],
    )
