"""The mlx-lm-shaped API: `load` binds the model's card (measured on first use),
`make_sampler` takes it from the model and never silently from elsewhere,
`stream_generate` takes text or ids, stays in the context and says why it
stopped; and the README's "From Python" lines run as written."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import make_tiny_model, make_tiny_tokenizer
from test_cli_run import invoke

import entropix_mlx
from entropix_mlx import api
from entropix_mlx.eval import calibrate as cal
from entropix_mlx.eval import usercard
from entropix_mlx.model.loading import ModelSource
from entropix_mlx.sampling import cards

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def tiny_files(tmp_path, monkeypatch):
    """`api.load` of two tiny "files" that the loader resolves to tiny models."""
    monkeypatch.setenv(cards.CARDS_DIR_ENV, str(tmp_path / "cards"))
    monkeypatch.setattr(usercard, "PROMPTS", cal.PROMPTS[:3])
    made = {}

    def fake_load(ref, return_source=False, weights="auto", cache=True):
        path = Path(ref)
        model = make_tiny_model(int(path.stem[-1]), max_position_embeddings=64)
        made[ref] = model
        return model, make_tiny_tokenizer(), ModelSource(ref, path, "gguf", "tiny")

    monkeypatch.setattr(api, "load_files", fake_load)
    paths = []
    for i in (1, 2):
        p = tmp_path / f"m{i}" / f"tiny{i}.gguf"
        p.parent.mkdir()
        p.write_bytes(f"weights {i}".encode())
        paths.append(str(p))
    return paths


def test_load_binds_a_card_measured_on_first_use(tiny_files):
    seen = []
    model, tokenizer = api.load(tiny_files[0], progress=lambda i, n: seen.append(i))
    card = model.entropix_card
    assert card.kind == "measured" and card.path.is_file() and seen[0] == 0 and len(seen) > 4
    again, _ = api.load(tiny_files[0])
    assert again.entropix_card.kind == "user" and again.entropix_card.path == card.path
    sampler = api.make_sampler("entropix", model=model)
    measured = tomllib.loads(card.path.read_text())["sampler"]
    assert sampler.config.high_entropy == measured["high_entropy"] != 0
    assert api.make_sampler("deliberate", model=model).config.clean_first == "loop_or_length"


def test_each_model_keeps_its_own_card(tiny_files):
    # Both are named "tiny": a card chosen by name in a process-wide table would be the last one loaded.
    first, _ = api.load(tiny_files[0])
    second, _ = api.load(tiny_files[1])
    assert first.entropix_card.path != second.entropix_card.path
    for model in (first, second):
        assert api.make_sampler("entropix", model=model).config_source.endswith(model.entropix_card.path.name)


def test_make_sampler_without_a_model_says_so():
    with pytest.warns(UserWarning, match="without model="):
        sampler = api.make_sampler("entropix")
    assert "reference" in sampler.config_source or "default" in sampler.config_source
    with pytest.raises(entropix_mlx.ConfigError, match="entropix_mlx.load"):
        api.make_sampler("entropix", model=make_tiny_model())
    assert api.make_sampler("greedy").name == "greedy"  # greedy has no settings to get wrong


def test_stream_generate_takes_text_or_ids_and_stops_at_the_context(tiny_files):
    model, tokenizer = api.load(tiny_files[0])
    greedy = api.make_sampler("greedy", model=model)
    ids = api.prompt_ids(tokenizer, "hello")
    from_text = list(api.stream_generate(model, tokenizer, "hello", greedy, max_tokens=5))
    from_ids = list(api.stream_generate(model, tokenizer, ids, greedy, max_tokens=5))
    assert [r.token for r in from_text] == [r.token for r in from_ids]
    assert all(r.finish_reason is None for r in from_text[:-1]) and from_text[-1].finish_reason in ("eos", "length")
    assert [r.generation_tokens for r in from_text] == list(range(1, len(from_text) + 1))
    assert from_text[0].prompt_tokens == len(ids) and from_text[0].strategy == "argmax"
    assert api.generate(model, tokenizer, "hello", greedy, max_tokens=5) == "".join(r.text for r in from_text)
    # the tiny model's context is 64: the answer stops there, and says why
    long = list(api.stream_generate(model, tokenizer, ids, greedy, max_tokens=10_000))
    if long[-1].finish_reason != "eos":
        assert len(ids) + len(long) == 64 and long[-1].finish_reason == "context"
    with pytest.raises(entropix_mlx.ContextOverflowError, match="shorten it"):
        list(api.stream_generate(model, tokenizer, list(range(3, 67)), greedy))


def test_deliberate_streams_through_the_same_call(tiny_files):
    model, tokenizer = api.load(tiny_files[0])
    responses = list(api.stream_generate(model, tokenizer, "hi", api.make_sampler("deliberate", model=model), 6))
    assert responses and responses[-1].finish_reason in ("eos", "length")
    assert {r.strategy for r in responses} <= {"argmax", "split", "branch"}


def test_importing_the_package_loads_nothing():
    code = "import sys, entropix_mlx; print('mlx.core' in sys.modules, 'entropix_mlx.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def readme_python() -> str:
    section = README.read_text().split("**From Python.**", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_is_at_most_five_lines():
    lines = readme_python().strip().splitlines()
    assert 1 < len(lines) <= 5 and any("import" in line for line in lines)


@pytest.mark.slow
def test_the_readme_python_runs_as_written():
    code = readme_python().replace(
        '"How many legs does a spider have?"', '"How many legs does a spider have?", max_tokens=8'
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and "warning" not in out.stderr.lower()


def test_entropix_runs_inside_mlx_lms_own_generate():
    import mlx.core as mx
    import mlx_lm
    from conftest import TINY_CONFIG
    from mlx_lm.models import llama

    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs.from_dict(TINY_CONFIG))  # mlx-lm's own Llama, not this project's port
    tokenizer = make_tiny_tokenizer()
    sampler = api.mlx_lm_sampler(tokenizer, config="reference")
    responses = list(mlx_lm.stream_generate(model, tokenizer, "hello there", max_tokens=12, sampler=sampler))
    tokens = [r.token for r in responses]
    assert 0 < len(tokens) <= 12 and tokens == sampler.tokens[: len(tokens)]
    assert set(sampler.strategies) <= {"argmax", "think", "branch", "resample", "adaptive"}
    # its decisions are Entropix's: on the same log-probabilities the sampler chooses what it handed mlx-lm
    again = api.mlx_lm_sampler(tokenizer, config="reference")
    assert [
        r.token for r in mlx_lm.stream_generate(model, tokenizer, "hello there", max_tokens=12, sampler=again)
    ] == tokens
    with pytest.warns(UserWarning, match="without config="):
        api.mlx_lm_sampler(tokenizer)


def test_a_thinking_insertion_goes_to_mlx_lm_one_token_at_a_time():
    from entropix_mlx.sampling.config import SamplerConfig
    from entropix_mlx.sampling.entropix import EntropixSampler
    from entropix_mlx.sampling.mlx_lm_sampler import MlxLmSampler

    tokenizer = make_tiny_tokenizer()
    # every step "think": low thresholds everywhere, thinking allowed twice
    cfg = SamplerConfig(
        low_entropy=0.0,
        low_varentropy=0.0,
        medium_entropy=0.0,
        think_varentropy=1e9,
        thinking_text=" hm",
        max_thinking_insertions=1,
        strategies=("argmax", "think", "adaptive"),
    )
    sampler = MlxLmSampler(EntropixSampler(cfg, tokenizer))
    import mlx.core as mx

    flat = mx.zeros((1, 259))
    handed = [sampler(flat).item() for _ in range(4)]
    thinking = list(tokenizer.encode(" hm", add_special_tokens=False))
    assert handed[: len(thinking)] == thinking and sampler.strategies[: len(thinking)] == ["think"] * len(thinking)
    sampler.reset()
    assert sampler.tokens == [] and sampler.queue == []


def doc_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (README.parent / "docs" / "python-api.md").read_text(), re.S)


@pytest.mark.slow
def test_the_python_api_page_runs_as_written(tmp_path):
    blocks = doc_blocks()
    assert len(blocks) == 3
    converted = tmp_path / "smollm2-mlx"
    code, _, err = invoke("convert", "smollm2-135m", converted)
    assert code == 0 and (converted / "config.json").is_file(), err
    # One fresh process runs the blocks, each in a namespace of its own, as a reader runs them.
    runner = (
        "import sys\nfor i, block in enumerate(sys.argv[1:]):\n    exec(block, {})\n    print(f'<<{i}>>', flush=True)\n"
    )
    codes = []
    for block in blocks:
        code = block.replace('have?", sampler=', 'have?", max_tokens=16, sampler=')
        code = code.replace("path/to/an/mlx-model", str(converted)).replace("max_tokens=64", "max_tokens=16")
        codes.append(code.replace("my-model.toml", str(cards.shipped_card("smollm2-135m"))))
    out = subprocess.run([sys.executable, "-c", runner, *codes], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    printed = re.split(r"<<\d>>\n", out.stdout)
    assert len(printed) == len(blocks) + 1 and all(p.strip() for p in printed[:-1]), out.stdout


def test_the_library_the_cli_and_the_server_share_one_default_length_and_sampler():
    import inspect

    from entropix_mlx.cli import chat, run

    from entropix_mlx.decode.generate import generate as decode_generate
    from entropix_mlx.decode.rows import Request
    from entropix_mlx.front import DEFAULT_MAX_TOKENS, DEFAULT_SAMPLER
    from entropix_mlx.server.schema import parse

    def default(function, name):
        return inspect.signature(function).parameters[name].default

    for function in (api.generate, api.stream_generate, decode_generate, run.run, chat.chat):
        assert default(function, "max_tokens") == DEFAULT_MAX_TOKENS == 256
    assert Request([1]).max_tokens == DEFAULT_MAX_TOKENS
    assert default(api.make_sampler, "name") == default(run.run, "sampler") == default(chat.chat, "sampler")
    assert parse({"messages": [{"role": "user", "content": "hi"}]}, True, ("entropix",)).sampler == DEFAULT_SAMPLER
    assert DEFAULT_SAMPLER == "entropix"
