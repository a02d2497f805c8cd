"""A GGUF that cannot be loaded is one clear line and exit code 2: an unknown or
unreadable tensor type, one part of a split file, a truncated file, an architecture
the port does not run."""

import struct

import numpy as np
import pytest
from conftest import SHELF
from entropix_mlx.cli.app import main
from gguf_writer import write_gguf
from test_gguf_families import FAMILIES, mlx_lm_model

from entropix_mlx.errors import ModelLoadError, UnsupportedModelError
from entropix_mlx.model.loading import load


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("errors") / "tiny.gguf"
    _, weights = mlx_lm_model(FAMILIES["llama"], seed=1)
    write_gguf(path, FAMILIES["llama"], weights, "Q8_0")
    return path


def with_tensor_type(src, dst, new_type: int):
    """`src` with the first tensor's GGML type set to `new_type` (bytes patched in place)."""
    data = bytearray(src.read_bytes())
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, new_type)
    dst.write_bytes(bytes(data))
    return dst


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *args, "--max-tokens", "1"], shelf=SHELF)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_unknown_tensor_type(tiny, tmp_path, capsys):
    bad = with_tensor_type(tiny, tmp_path / "unknown.gguf", 200)
    with pytest.raises(UnsupportedModelError, match="token_embd.weight has GGML type 200 \\(unknown\\)"):
        load(str(bad))
    assert "re-quantize" in run_cli(capsys, "-m", str(bad), "hi")


def test_type_the_gguf_package_has_but_cannot_dequantize(tiny, tmp_path, capsys):
    bad = with_tensor_type(tiny, tmp_path / "tq.gguf", 35)  # TQ2_0 (ternary)
    with pytest.raises(UnsupportedModelError, match="TQ2_0"):
        load(str(bad))
    assert "TQ2_0" in run_cli(capsys, "-m", str(bad), "hi")


def test_split_file_part(tiny, tmp_path, capsys):
    """llama.cpp's gguf-split names its parts NAME-00001-of-00003.gguf and marks them
    with split.count; a part alone (whole or cut short) is refused by name."""
    part = tmp_path / "model-00001-of-00003.gguf"
    part.write_bytes(tiny.read_bytes())
    with pytest.raises(ModelLoadError, match="one part of a GGUF split into 3 files"):
        load(str(part))
    assert "llama-gguf-split --merge" in run_cli(capsys, "-m", str(part), "hi")

    marked = tmp_path / "marked.gguf"
    _, weights = mlx_lm_model(FAMILIES["llama"], seed=1)
    write_gguf(marked, FAMILIES["llama"], weights, "Q8_0", extra={"split.count": (3, _uint16())})
    with pytest.raises(ModelLoadError, match="split into 3 files"):
        load(str(marked))

    cut = tmp_path / "cut-00002-of-00003.gguf"
    cut.write_bytes(tiny.read_bytes()[:5000])
    assert "split into 3 files" in run_cli(capsys, "-m", str(cut), "hi")


def test_truncated_file(tiny, tmp_path, capsys):
    data = tiny.read_bytes()
    for size in (3, 200, len(data) // 2, len(data) - 1):
        cut = tmp_path / f"cut{size}.gguf"
        cut.write_bytes(data[:size])
        with pytest.raises(ModelLoadError) as err:
            load(str(cut))
        assert "\n" not in str(err.value) and ("truncated" in str(err.value) or "not a GGUF" in str(err.value))
    assert "truncated" in run_cli(capsys, "-m", str(tmp_path / f"cut{len(data) // 2}.gguf"), "hi")


def test_unsupported_architecture(tiny, tmp_path, capsys):
    data = bytearray(tiny.read_bytes())
    at = data.index(b"llama")  # general.architecture's value comes first; same length keeps offsets
    data[at : at + 5] = b"mamba"
    bad = tmp_path / "mamba.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(UnsupportedModelError, match="'mamba' model; entropix-mlx runs these GGUF architectures"):
        load(str(bad))
    assert "llama, qwen2, qwen3, phi3, gemma3" in run_cli(capsys, "-m", str(bad), "hi")


def _uint16():
    from gguf import GGUFValueType

    return GGUFValueType.UINT16


def test_errors_name_no_numpy_types(tiny):
    """The header's arrays decode to NumPy; a message still reads as plain numbers."""
    from entropix_mlx.model.gguf_check import read_header

    header = read_header(tiny)
    assert isinstance(header.metadata["tokenizer.ggml.token_type"], np.ndarray)
    assert header.metadata["general.architecture"] == "llama"
