"""The load cache: what loading a GGUF file produced (the weights in the form
this machine runs them, and the tokenizer) kept in the user's cache, so that
later starts read it instead of converting the file again (dequantizing,
repacking, building the tokenizer from its vocabulary).

An entry is keyed by the file's content (its hash, files.model_files_identity),
the weight format and the loader: the source of the modules that build a model
from a file and the versions of the libraries they use, so a changed file or
another loader makes a new entry, never a stale one, and a copy or a renamed
file reads the entry its bytes already have. An entry is named after the file
that wrote it, for the listing; its key ends the name. Entries live in
`loaded/` of the user cache folder ($ENTROPIX_LOAD_CACHE_DIR elsewhere) under
the cards' rule (a folder only this user can write; otherwise nothing is read or
written there), and each is written to a `.partial` folder and renamed into
place, so a crash never leaves half an entry.

Files of an entry: `weights.safetensors` (the model's parameters as loaded),
`model.json` (the config, the RoPE frequency factors if the file has them, the
tokenizer's special tokens, end-of-generation ids and detokenizer) and
`tokenizer.json` (the tokenizer itself).
"""

import hashlib
import json
import os
import shutil
import time
from functools import cache
from importlib import metadata
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, NaiveStreamingDetokenizer, TokenizerWrapper
from transformers import PreTrainedTokenizerFast

from ..files import model_files_identity, private_folder, user_cache_dir
from .gguf_tokenizer import byte_level_detokenizer

LOAD_CACHE_DIR_ENV = "ENTROPIX_LOAD_CACHE_DIR"
ENTRY_FILES = ("weights.safetensors", "model.json", "tokenizer.json")
# What builds a model from a file: a change to any of them, or to these libraries, is another loader.
LOADER_MODULES = ("gguf.py", "gguf_tensors.py", "gguf_tokenizer.py", "gguf_check.py", "loading.py", "load_cache.py")
LOADER_LIBRARIES = ("mlx", "mlx-lm", "transformers", "tokenizers", "gguf")


def cache_root() -> Path:
    given = os.environ.get(LOAD_CACHE_DIR_ENV, "")
    return Path(given).expanduser() if given else user_cache_dir() / "loaded"


@cache
def loader_key() -> str:
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in LOADER_MODULES:
        h.update((here / name).read_bytes())
    h.update((here.parent / "accel" / "weights.py").read_bytes())  # to_float32
    for name in LOADER_LIBRARIES:
        try:
            h.update(f"{name} {metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{name} none".encode())
    return h.hexdigest()[:8]


def entry_paths(path: Path) -> dict[str, Path]:
    """The entry of each weight format for this file's content (its hash read
    once for both): the complete one under any file's name, else a new one
    named after this file."""
    key, root = model_files_identity(path)[:16], cache_root()
    out = {}
    for fmt in ("float32", "native"):
        suffix = f"-{key}-{fmt}-{loader_key()}"
        found = [e for e in sorted(root.glob(f"*{suffix}")) if all((e / f).is_file() for f in ENTRY_FILES)]
        out[fmt] = found[0] if found else root / f"{Path(path).stem[:60]}{suffix}"
    return out


def float32_bytes(entries: dict[str, Path]) -> int | None:
    """The file's weights' size in float32, as an entry of either format keeps it
    (so a later start need not parse the file's header to choose the format)."""
    for entry in entries.values():
        info = entry / "model.json"
        if info.is_file():
            try:
                value = json.loads(info.read_text()).get("float32_bytes")
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(value, int):
                return value
    return None


def read_entry(entry: Path, build_model):
    """(model, tokenizer) from an entry, or None when it is missing or incomplete."""
    if not all((entry / f).is_file() for f in ENTRY_FILES):
        return None
    if private_folder(cache_root()) or private_folder(entry):
        return None
    info = json.loads((entry / "model.json").read_text())
    rope = mx.array(info["rope_freqs"], dtype=mx.float32) if info.get("rope_freqs") is not None else None
    model = build_model(info["config"], mx.load(str(entry / "weights.safetensors")), rope_freqs=rope)
    t = info["tokenizer"]
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(entry / "tokenizer.json"), chat_template=t["chat_template"], **t["special"]
    )
    detokenizer = byte_level_detokenizer if t["byte_level"] else NaiveStreamingDetokenizer
    return model, TokenizerWrapper(hf, detokenizer_class=detokenizer, eos_token_ids=t["eos_token_ids"])


def write_entry(entry: Path, model, tokenizer, config: dict, rope_freqs, float32_bytes: int | None = None) -> str:
    """Keep what loading produced; "" when written, else why not (nothing is written)."""
    why = private_folder(cache_root())
    if why:
        return why
    partial = entry.with_name(entry.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(mode=0o700)
        mx.save_safetensors(str(partial / "weights.safetensors"), dict(tree_flatten(model.parameters())))
        hf = tokenizer._tokenizer
        hf.backend_tokenizer.save(str(partial / "tokenizer.json"))
        special = {k: getattr(hf, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        info = {
            "loader": loader_key(),
            "written": time.strftime("%Y-%m-%d %H:%M:%S"),
            "config": config,
            "float32_bytes": float32_bytes,  # what `auto` decides by, without reading the file's header
            "rope_freqs": None if rope_freqs is None else rope_freqs.tolist(),
            "tokenizer": {
                "special": {k: v for k, v in special.items() if v is not None},
                "chat_template": hf.chat_template,
                "eos_token_ids": sorted(tokenizer.eos_token_ids),
                "byte_level": isinstance(tokenizer._detokenizer, BPEStreamingDetokenizer),
            },
        }
        (partial / "model.json").write_text(json.dumps(info) + "\n")
        os.replace(partial, entry)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        return f"cannot write {entry}: {e.strerror or e}"
    return ""


def entries() -> list[dict]:
    """Every entry: its folder, the file it was loaded from (its name), format and size."""
    root = cache_root()
    out = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name.endswith(".partial") or not entry.is_dir():
            continue
        size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
        written = ""
        if (entry / "model.json").is_file():
            written = json.loads((entry / "model.json").read_text()).get("written", "")
        out.append({"path": entry, "name": entry.name, "bytes": size, "written": written})
    return out
