"""The load cache: a GGUF file's loaded form is kept after the first load and
read from there later (the same weights, the same tokens), made anew when the
file changes, read by a copy or a renamed file of the same bytes, never read
or written in a folder another user can write, and skipped with cache=False."""

import hashlib
import json
import os
import shutil

import mlx.core as mx
import numpy as np
import pytest
from gguf_writer import write_gguf
from mlx.utils import tree_flatten
from test_gguf_families import FAMILIES, mlx_lm_model

from entropix_mlx import files
from entropix_mlx.model import load_cache, loading
from entropix_mlx.sampling import cards


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "loaded"
    monkeypatch.setenv(load_cache.LOAD_CACHE_DIR_ENV, str(folder))
    return folder


def gguf_file(tmp_path, seed=5, kind="Q8_0", family="qwen2"):
    config = FAMILIES[family]
    _, weights = mlx_lm_model(config, seed=seed)
    path = tmp_path / f"tiny-{family}.gguf"
    write_gguf(path, config, weights, kind)
    return path


def params(model) -> dict:
    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def same(a, b) -> bool:
    pa, pb = params(a), params(b)
    return pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("weights", ["native", "float32"])
def test_a_second_load_reads_the_cache_and_gives_the_same_model(tmp_path, cache_dir, weights, monkeypatch):
    path = gguf_file(tmp_path)
    first, tok1 = loading.load(str(path), weights=weights)
    (entry,) = load_cache.entries()
    assert entry["path"].parent == cache_dir and entry["name"].endswith(f"-{weights}-{load_cache.loader_key()}")
    assert os.stat(cache_dir).st_mode & 0o077 == 0
    # the second load never reads the file's tensors: it comes from the cache
    monkeypatch.setattr(loading.gguf, "read_gguf", lambda *a, **k: pytest.fail("read the GGUF file again"))
    monkeypatch.setattr(loading, "read_header", lambda *a, **k: pytest.fail("parsed the GGUF header again"))
    second, tok2 = loading.load(str(path), weights=weights)
    assert same(first, second)
    text = "Hello, world! 12345 <|im_end|>"
    assert tok1.encode(text) == tok2.encode(text) and tok1.eos_token_ids == tok2.eos_token_ids
    assert tok1.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True) == (
        tok2.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    )
    ids = mx.array([tok1.encode(text)])
    assert np.array_equal(np.array(first(ids)[0]), np.array(second(ids)[0]))


def test_a_changed_file_is_loaded_again(tmp_path, cache_dir):
    path = gguf_file(tmp_path, seed=5)
    first, _ = loading.load(str(path), weights="float32")
    (tmp_path / "other").mkdir()
    path.write_bytes(gguf_file(tmp_path / "other", seed=6).read_bytes())  # the same name, other weights
    second, _ = loading.load(str(path), weights="float32")
    assert not same(first, second) and len(load_cache.entries()) == 2


def test_a_byte_copy_or_a_renamed_file_reads_the_entry_its_bytes_have(tmp_path, cache_dir, monkeypatch):
    path = gguf_file(tmp_path)
    first, _ = loading.load(str(path), weights="native")
    (entry,) = load_cache.entries()
    copy = tmp_path / "elsewhere" / "another-name.gguf"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    renamed = path.rename(tmp_path / "renamed.gguf")
    monkeypatch.setattr(loading.gguf, "read_gguf", lambda *a, **k: pytest.fail("read the GGUF file again"))
    monkeypatch.setattr(loading, "read_header", lambda *a, **k: pytest.fail("parsed the GGUF header again"))
    for other in (copy, renamed):
        again, _ = loading.load(str(other), weights="native")
        assert same(first, again)
    assert load_cache.entries() == [entry]


def test_a_copy_starts_from_the_first_file_s_entry_and_card(tmp_path, cache_dir, monkeypatch):
    from test_cli_run import invoke

    from entropix_mlx.eval import calibrate, usercard

    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    monkeypatch.setattr(usercard, "PROMPTS", calibrate.PROMPTS[:2])  # a card in milliseconds
    path = gguf_file(tmp_path, family="llama")
    copy = tmp_path / "copy" / "my-model.gguf"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    code, _, err = invoke("run", "hi", "-m", path, "--max-tokens", "2", "--weights", "native")
    assert code == 0, err
    assert "kept this model's loaded form" in err and "has no card" in err  # the first start writes both
    (entry,) = load_cache.entries()
    (card,) = (tmp_path / "cards").iterdir()
    code, _, err = invoke("run", "hi", "-m", copy, "--max-tokens", "2", "--weights", "native")
    assert code == 0, err
    assert "kept this model's loaded form" not in err and "has no card" not in err
    assert load_cache.entries() == [entry] and list((tmp_path / "cards").iterdir()) == [card]


def test_a_model_file_is_read_once_until_it_changes(tmp_path, monkeypatch, hashes_file):
    reads = []
    real = hashlib.file_digest
    monkeypatch.setattr(files.hashlib, "file_digest", lambda f, name: reads.append(f.name) or real(f, name))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"a" * 1000)
    digest = hashlib.sha256(b"a" * 1000).hexdigest()  # as sha256sum prints it
    assert files.model_files_identity(path) == digest and len(reads) == 1
    # Written just now, it could change again within its timestamps' resolution: not kept.
    assert not hashes_file.exists() or str(path) not in json.loads(hashes_file.read_text())
    assert files.model_files_identity(path) == digest and len(reads) == 2
    monkeypatch.setattr(files, "SETTLED_SECONDS", 0)
    assert files.model_files_identity(path) == digest and len(reads) == 3
    assert files.model_files_identity(path) == digest and len(reads) == 3  # kept: not read again
    before = path.stat().st_mtime_ns
    path.write_bytes(b"b" * 1000)  # the same size, other bytes
    os.utime(path, ns=(before - 10**9, before - 10**9))
    assert files.model_files_identity(path) == hashlib.sha256(b"b" * 1000).hexdigest() and len(reads) == 4
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(path, copy)
    assert files.model_files_identity(copy) == files.model_files_identity(path) and len(reads) == 5
    # A file others could write is never trusted: its hashes are read again.
    hashes_file.parent.chmod(0o777)
    try:
        assert files.model_files_identity(path) == hashlib.sha256(b"b" * 1000).hexdigest() and len(reads) == 6
    finally:
        hashes_file.parent.chmod(0o700)


def test_no_cache_reads_the_file_and_writes_nothing(tmp_path, cache_dir):
    path = gguf_file(tmp_path)
    loading.load(str(path), weights="native", cache=False)
    assert load_cache.entries() == [] and not cache_dir.exists()


def test_a_folder_others_can_write_is_never_used(tmp_path, cache_dir):
    path = gguf_file(tmp_path)
    cache_dir.mkdir(parents=True)
    cache_dir.chmod(0o777)
    loading.load(str(path), weights="native")
    assert list(cache_dir.iterdir()) == []  # nothing written there
    # an entry someone else could have written is not read either
    cache_dir.chmod(0o700)
    first, _ = loading.load(str(path), weights="native")
    (entry,) = load_cache.entries()
    cache_dir.chmod(0o777)
    assert load_cache.read_entry(entry["path"], loading.build_model) is None
    cache_dir.chmod(0o700)
    entry["path"].chmod(0o777)
    assert load_cache.read_entry(entry["path"], loading.build_model) is None


def test_the_cache_command_lists_and_removes_and_run_can_skip_it(tmp_path, cache_dir):
    from entropix_mlx.cli.cache_cmd import size_text
    from test_cli_run import invoke

    path = gguf_file(tmp_path, family="llama")
    code, _, err = invoke("run", "hi", "-m", path, "--sampler", "greedy", "--max-tokens", "2", "--no-cache")
    assert code == 0, err
    assert load_cache.entries() == []  # --no-cache: the file itself, nothing kept
    code, _, err = invoke("run", "hi", "-m", path, "--sampler", "greedy", "--max-tokens", "2", "--weights", "native")
    assert code == 0, err
    (entry,) = load_cache.entries()
    # The space it took is announced once, with where it went and how to get it back.
    (said,) = [line for line in err.splitlines() if line.startswith("kept this model's loaded form")]
    assert str(load_cache.cache_root()) in said and "entropix-mlx cache" in said
    sizes = f"({size_text(entry['bytes'])}: the {size_text(path.stat().st_size)} file's weights in the file's own"
    assert sizes in said
    code, out, _ = invoke("cache")
    assert code == 0 and entry["name"] in out and "1 loaded model(s)" in out
    code, _, err = invoke("cache", "--remove", "nothing-like-it")
    assert code == 2 and "no such entry" in err
    code, out, _ = invoke("cache", "--remove", entry["name"])
    assert code == 0 and "removed" in out and load_cache.entries() == []
