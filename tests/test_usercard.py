"""Self-calibration: a model without a card gets one measured on its first use, in
the user's cache folder, named after the model's identity; it is reused, never
by another model, a corrupt one is measured again, and the vocabulary bounds
every entropy threshold."""

import math
import stat
import tomllib

import pytest
from conftest import SHELF, make_loaded, make_tiny_model, make_tiny_tokenizer, shelve
from test_cli_run import invoke

from entropix_mlx import files
from entropix_mlx.accel import build
from entropix_mlx.eval import calibrate as cal
from entropix_mlx.eval import usercard
from entropix_mlx.front import registry
from entropix_mlx.model.loading import ModelSource, model_identity
from entropix_mlx.sampling import cards
from entropix_mlx.sampling.deliberate_config import resolve_deliberate


@pytest.fixture
def cards_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "entropix-mlx" / "cards"
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(folder))
    monkeypatch.setattr(usercard, "PROMPTS", cal.PROMPTS[:3])  # milliseconds, not seconds, per card
    return folder


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_model(), make_tiny_tokenizer()


def source_for(tmp_path, content: bytes, name="tiny") -> ModelSource:
    path = tmp_path / f"{name}-{content.hex()}.gguf"
    path.write_bytes(content)
    return ModelSource(str(path), path, "gguf", name)


def test_a_card_appears_on_first_use_and_is_used_from_then_on(tiny, tmp_path, cards_dir):
    model, tokenizer = tiny
    source = source_for(tmp_path, b"weights one")
    seen = []
    status = usercard.ensure_card(model, tokenizer, source, progress=lambda i, n: seen.append((i, n)))
    assert status.kind == "measured" and status.path.parent == cards_dir and status.path.is_file()
    assert "has no card: measured one" in status.note and str(status.path) in status.note
    # the bar moves with tokens: from 0 to the most the 3 answers may take, step by step
    total = seen[0][1]
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) > 4
    assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:], strict=False))
    assert stat.S_IMODE(cards_dir.stat().st_mode) == 0o700
    data = tomllib.loads(status.path.read_text())
    assert status.path.read_text().startswith("# Model card for tiny: written by its first use;")
    assert data["identity"] == model_identity(source) and data["name"] == "tiny"
    # the new-model defaults: the bundled model's winning settings, and its entropies within the vocabulary
    assert data["sampler"]["strategies"] == ["argmax", "branch", "adaptive"]
    assert data["sampler"]["high_varentropy"] == data["sampler"]["low_varentropy"]
    assert data["sampler"]["branch_select"] == "path_confidence"
    assert data["sampler"]["high_entropy"] == cal.max_entropy(259) <= math.log2(259)
    assert data["deliberate"]["selector"] == "confidence_vote" and data["deliberate"]["first_alternatives"] == 2
    assert data["deliberate"]["stop_share"] == 1.0
    assert data["deliberate"]["clean_first"] == "loop_or_length"
    # both samplers read it, through the card `load` binds to the model (never by name alone)
    sampler = registry.build("entropix", tokenizer, card=status.path)
    assert status.path.name in sampler.config_source
    assert sampler.config.strategies == ("argmax", "branch", "adaptive")
    assert "shipped card" not in registry.build("entropix", tokenizer, card="tiny").config_source
    config, where = resolve_deliberate(status.path)
    assert config.first_alternatives == 2 and status.path.name in where


def test_the_card_is_reused_and_never_by_another_model(tiny, tmp_path, cards_dir, monkeypatch):
    model, tokenizer = tiny
    one, two = source_for(tmp_path, b"weights one"), source_for(tmp_path, b"weights two")
    first = usercard.ensure_card(model, tokenizer, one)
    calls = []
    real = usercard.calibrate
    monkeypatch.setattr(usercard, "calibrate", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = usercard.ensure_card(model, tokenizer, one)
    assert again.kind == "user" and again.path == first.path and again.note == "" and calls == []
    other = usercard.ensure_card(model, tokenizer, two)  # same name, other weights
    assert other.kind == "measured" and other.path != first.path and calls == [1]
    assert model_identity(one) != model_identity(two)


def test_a_copy_or_a_renamed_file_uses_the_card_its_bytes_have(tiny, tmp_path, cards_dir):
    model, tokenizer = tiny
    one = source_for(tmp_path, b"weights one")
    first = usercard.ensure_card(model, tokenizer, one)
    copy = tmp_path / "elsewhere" / "another-name.gguf"
    copy.parent.mkdir()
    copy.write_bytes(one.path.read_bytes())
    renamed = one.path.rename(tmp_path / "renamed.gguf")
    for path in (copy, renamed):
        again = usercard.ensure_card(model, tokenizer, ModelSource(str(path), path, "gguf", path.stem))
        assert again.kind == "user" and again.path == first.path
    assert list(cards_dir.iterdir()) == [first.path]


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2] + "\n[[[",  # cut off
        lambda text: text.replace("low_entropy = ", "low_entropy = -"),  # fails validation
        lambda text: text.replace('identity = "', 'identity = "x'),  # names another model
        lambda text: "",
    ],
)
def test_a_corrupt_card_is_measured_again_with_a_warning(tiny, tmp_path, cards_dir, damage):
    model, tokenizer = tiny
    source = source_for(tmp_path, b"weights one")
    path = usercard.ensure_card(model, tokenizer, source).path
    path.write_text(damage(path.read_text()))
    warnings = []
    status = usercard.ensure_card(model, tokenizer, source, warn=warnings.append)
    assert status.kind == "measured" and status.path == path
    assert len(warnings) == 1 and "cannot be used" in warnings[0] and "measuring it again" in warnings[0]
    assert usercard.card_problem(path, model_identity(source)) is None


def test_a_shipped_card_is_never_replaced(tiny, tmp_path, cards_dir):
    model, tokenizer = tiny
    source = source_for(tmp_path, b"x", name="smollm2-135m")
    status = usercard.ensure_card(model, tokenizer, source)
    assert status.kind == "shipped" and not cards_dir.exists()


def test_a_folder_others_can_write_is_refused(tiny, tmp_path, cards_dir):
    model, tokenizer = tiny
    cards_dir.mkdir(parents=True)
    cards_dir.chmod(0o777)
    status = usercard.ensure_card(model, tokenizer, source_for(tmp_path, b"w"))
    assert status.kind == "none" and "writable by its group or others" in status.note


def test_the_cache_folder_follows_xdg_and_the_platform(monkeypatch, tmp_path):
    monkeypatch.delenv(cards.CARDS_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cards.user_cards_dir() == tmp_path / "entropix-mlx" / "cards"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(files.sys, "platform", "darwin")
    assert cards.user_cards_dir() == tmp_path / "Library" / "Caches" / "entropix-mlx" / "cards"
    # one resolver for everything the cache holds: cards, the compiled shim, conversions
    assert build.cache_folder(create=False)[0] == tmp_path / "Library" / "Caches" / "entropix-mlx"
    monkeypatch.setattr(files.sys, "platform", "linux")
    assert cards.user_cards_dir() == tmp_path / ".cache" / "entropix-mlx" / "cards"
    assert build.cache_folder(create=False)[0] == files.user_cache_dir() == tmp_path / ".cache" / "entropix-mlx"


def test_clipping_keeps_every_entropy_threshold_within_the_vocabulary():
    fields, clipped = cal.clip_to_vocabulary({"low_entropy": 1.0, "high_entropy": 20.0, "low_varentropy": 99.0}, 49152)
    assert clipped == {"high_entropy": 20.0} and fields["high_entropy"] == 15.5849 <= math.log2(49152)
    assert fields["low_entropy"] == 1.0 and fields["low_varentropy"] == 99.0


def test_the_first_run_of_a_model_says_it_measured_a_card_once(tmp_path, cards_dir, monkeypatch):
    path = tmp_path / "mine.gguf"
    path.write_bytes(b"my model")
    shelve(monkeypatch, path, make_loaded(make_tiny_model(), make_tiny_tokenizer(), path, "mine"))
    code, _, err = invoke("run", "hi", "-m", str(path), "--max-tokens", "3")
    assert code == 0, err
    # it says what it does before measuring, then what it did
    before, after = err.index("has no card yet: measuring it once"), err.index("has no card: measured one")
    assert before < after and err.count("has no card: measured one") == 1 and "mine-" in err
    today = __import__("datetime").date.today().isoformat()
    assert f"card measured on first use ({today}): mine-" in err  # the header names the card it uses
    SHELF.carded.clear()  # as a new process would
    code, _, err = invoke("run", "hi", "-m", str(path), "--max-tokens", "3")
    assert code == 0 and "measuring" not in err and f"card measured on first use ({today}): mine-" in err
    # `models` lists it, with the model it belongs to and where that loads from
    code, out, _ = invoke("models", "--no-color")
    line = next(line for line in out.splitlines() if line.startswith("mine "))
    assert f"measured {today}" in line and str(path) in line and str(cards_dir) in line


def test_a_base_model_without_a_chat_template_gets_its_card_and_plain_prompts(tmp_path, cards_dir):
    from entropix_mlx.decode.prompt import encode_chat

    tokenizer = make_tiny_tokenizer(**{"tokenizer.chat_template": None})
    ids = encode_chat(tokenizer, [{"role": "user", "content": "hi <|im_end|>"}, {"role": "user", "content": "x"}])
    assert tokenizer.decode(ids) == "hi <|im_end|>\n\nx\n" and 2 not in ids  # text, never a control token
    status = usercard.ensure_card(make_tiny_model(), tokenizer, source_for(tmp_path, b"a base model"))
    assert status.kind == "measured" and status.path.is_file()


def test_a_loaded_model_reads_its_card_once_however_many_samplers_it_builds(tiny, tmp_path, cards_dir, monkeypatch):
    from entropix_mlx.front import LoadedModel, ModelCard
    from entropix_mlx.sampling import settings

    model, tokenizer = tiny
    source = ModelSource(str(tmp_path / "m.gguf"), tmp_path / "m.gguf", "gguf", "tiny")
    (tmp_path / "m.gguf").write_bytes(b"a model")
    status = usercard.ensure_card(model, tokenizer, source)
    loaded = LoadedModel(model, tokenizer, source, ModelCard("tiny", status.path, status.kind, tokenizer))
    reads = []
    real = settings.read_toml
    monkeypatch.setattr(settings, "read_toml", lambda path: reads.append(path) or real(path))
    samplers = [loaded.sampler(name) for name in ("entropix", "deliberate", "entropix", "deliberate_staged")]
    assert len({s.config_source.split(" + ")[0] for s in samplers[:2]}) == 2  # each from its own table
    assert all(status.path.name in s.config_source for s in samplers)
    assert reads == []  # read once, when the card was bound
