"""`convert`: a GGUF file (or the bundled model) as an MLX model directory that
`mlx_lm.load` opens and `load` loads back: config.json (with mlx-lm's
"quantization" block when quantized), model.safetensors and the tokenizer files.

The weights are exactly those `load` builds from the file (gguf_tensors.py), in
Hugging Face's layout: a `llama` file's Q/K rows go back to HF's order, so the
directory is an ordinary HF-layout model.
"""

import json
import math
import os
import shutil
from collections import Counter
from pathlib import Path

import mlx.core as mx

from ..errors import ModelLoadError, UnsupportedModelError
from ..files import model_files_identity, user_cache_dir
from . import gguf

CONVERTED_FILES = ("config.json", "model.safetensors")


def convert(path: Path, outdir: Path, weights: str = "native", overwrite: bool = False) -> Path:
    """Write the MLX directory for GGUF `path`; `weights` "native" keeps the file's
    quantization (as MLX affine quantization), "float32" dequantizes it."""
    if weights not in ("native", "float32"):
        raise ModelLoadError(f"'{weights}' is not a weight format for convert; use native or float32")
    outdir = Path(outdir)
    if outdir.exists() and any(outdir.iterdir()) and not overwrite:
        raise ModelLoadError(
            f"{outdir} exists and is not empty; choose a new folder, or overwrite it", settings=("overwrite",)
        )
    g = gguf.read_gguf(path, native=weights == "native", hf_layout=True)
    tokenizer = gguf.gguf_tokenizer(g.header.metadata, g.header.path)
    config = dict(g.config)
    if g.rope_freqs is not None:
        config["rope_scaling"] = llama3_scaling(g.rope_freqs, config, path)
    tensors = dict(g.weights)
    if weights == "float32":
        tensors = dequantized(tensors, g.quantization)
    elif g.quantization:
        config["quantization"] = quantization_block(g.quantization)
        config["quantization_config"] = config["quantization"]
    partial = outdir.with_name(outdir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    mx.save_safetensors(str(partial / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer._tokenizer.save_pretrained(str(partial))
    if outdir.exists():
        shutil.rmtree(outdir)
    os.replace(partial, outdir)
    return outdir


def quantization_block(quantization: dict) -> dict:
    """mlx-lm's form: the most common bits/group size, and each other layer by name."""
    common = Counter((q["bits"], q["group_size"]) for q in quantization.values()).most_common(1)[0][0]
    block = {"group_size": common[1], "bits": common[0]}
    for name, q in sorted(quantization.items()):
        if (q["bits"], q["group_size"]) != common:
            block[name] = dict(q)
    return block


def dequantized(tensors: dict, quantization: dict) -> dict:
    out = {k: v for k, v in tensors.items() if not k.endswith((".scales", ".biases")) or k[:-7] not in quantization}
    for name, q in quantization.items():
        out[f"{name}.weight"] = mx.dequantize(
            tensors[f"{name}.weight"],
            tensors[f"{name}.scales"].astype(mx.float32),
            tensors[f"{name}.biases"].astype(mx.float32),
            group_size=q["group_size"],
            bits=q["bits"],
        )
    return {k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in out.items()}


def llama3_scaling(rope_freqs: mx.array, config: dict, path) -> dict:
    """llama.cpp stores Llama-3.1 RoPE scaling as per-frequency factors; an HF config
    needs the parameters. The published models use low 1, high 4 and an original context
    of 8192 with the largest factor as `factor`: accept them only if they reproduce
    the file's factors."""
    factors = [float(f) for f in rope_freqs.tolist()]
    scaling = {
        "rope_type": "llama3",
        "factor": max(factors),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    dims, base = config["head_dim"], config["rope_theta"]
    low_wavelen = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    high_wavelen = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    for i, got in enumerate(factors):
        wavelen = 2 * math.pi * base ** (2 * i / dims)
        if wavelen < high_wavelen:
            want = 1.0
        elif wavelen > low_wavelen:
            want = scaling["factor"]
        else:
            smooth = (scaling["original_max_position_embeddings"] / wavelen - 1) / (4.0 - 1.0)
            want = 1 / ((1 - smooth) / scaling["factor"] + smooth)
        if abs(got - want) > 1e-3 * want:
            raise UnsupportedModelError(
                f"{path} has RoPE frequency factors that no llama3 rope_scaling reproduces; "
                "convert cannot write them into a config (load the GGUF file directly instead)"
            )
    return scaling


def cached_conversion(path: Path, cache_root: Path | None = None) -> Path:
    """The MLX directory for `path` in the user's cache, converted once per
    model file (files.model_files_identity)."""
    path = Path(path)
    key = model_files_identity(path)[:16]
    root = cache_root or user_cache_dir() / "converted"
    outdir = root / f"{path.stem}-{key}"
    if not all((outdir / f).is_file() for f in CONVERTED_FILES):
        root.mkdir(parents=True, exist_ok=True)
        convert(path, outdir, overwrite=True)
    return outdir
