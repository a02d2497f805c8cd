"""Shared fixtures: tiny random-weight Llama models (milliseconds) and, for the
few integration tests, the real bundled model (loaded once per session)."""

# ruff: noqa: E402  (every import but the first comes after enable())
# isort: off
import os

# Under pytest-xdist with a worker per core, a product's threads beyond its own core
# only wait on the other workers' (CLI subprocesses inherit the setting).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= len(os.sched_getaffinity(0)):
    os.environ.setdefault("ENTROPIX_THREADS", "1")

import entropix_mlx.accel

entropix_mlx.accel.enable()  # first: the system BLAS must be loaded before mlx.core binds its own

# isort: on
import signal

import mlx.core as mx
import pytest

# A suite started as a background job (`cmd &` in a script) inherits SIGINT ignored, and
# so does every process it starts, which then keeps ignoring it (cli/signals.py, as
# `nohup` asks): the Ctrl-C tests would see no interrupt. They stand for a terminal,
# where SIGINT has its default action; a handler here becomes that default in children.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from pathlib import Path

from entropix_mlx.cli.loaded import Shelf

from entropix_mlx.front import LoadedModel
from entropix_mlx.model.gguf import gguf_tokenizer
from entropix_mlx.model.llama import Model, ModelArgs
from entropix_mlx.model.loading import ModelSource

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokens():
    # GPT-2's byte-to-unicode map: each of the 256 bytes is one printable symbol.
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def make_tiny_tokenizer(**metadata_overrides):
    """A byte-level BPE tokenizer without merges: ids 0-2 are <|endoftext|>,
    <|im_start|>, <|im_end|>, then one token per byte. Built through the same
    GGUF-metadata path as the bundled model's tokenizer; keyword arguments
    replace GGUF tokenizer metadata entries (e.g. a Llama-3 pre-tokenizer)."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_tokens()
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": mx.array([3, 3, 3] + [1] * 256),
        "tokenizer.ggml.bos_token_id": mx.array(1),
        "tokenizer.ggml.eos_token_id": mx.array(2),
        "tokenizer.ggml.padding_token_id": mx.array(2),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    return gguf_tokenizer({**metadata, **metadata_overrides}, "tiny")


TINY_CONFIG = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=259,
    rope_theta=10000.0,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def make_tiny_model(seed: int = 0, **overrides):
    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict({**TINY_CONFIG, **overrides}))
    # Random init is near-uniform; scale the embeddings up so the distributions are peaked enough to be interesting.
    model.model.embed_tokens.weight = model.model.embed_tokens.weight * 8
    mx.eval(model.parameters())
    return model


@pytest.fixture
def on_cpu():
    """MLX's CPU device for this test, whatever the default (a Mac's is the GPU):
    for tests of the CPU path (its own kernels, the BLAS)."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


@pytest.fixture
def tiny_model():
    return make_tiny_model()


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="session", autouse=True)
def user_cards(tmp_path_factory):
    """User cards (measured on a model's first use) go to a folder of this test
    session, never to the user's cache; CLI subprocesses inherit it."""
    import os

    from entropix_mlx.sampling.cards import CARDS_DIR_ENV

    folder = tmp_path_factory.mktemp("cards")
    folder.chmod(0o700)
    os.environ[CARDS_DIR_ENV] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def load_cache_folder(tmp_path_factory):
    """Models loaded in the tests are kept in a folder of this test session, never
    in the user's cache (and never read from there); CLI subprocesses inherit it."""
    import os

    from entropix_mlx.model.load_cache import LOAD_CACHE_DIR_ENV

    folder = tmp_path_factory.mktemp("loaded")
    folder.chmod(0o700)
    os.environ[LOAD_CACHE_DIR_ENV] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def hashes_file(tmp_path_factory):
    """The model files' hashes computed in the tests are kept in a file of this
    test session, never in the user's cache; CLI subprocesses inherit it."""
    import os

    from entropix_mlx.files import HASHES_FILE_ENV

    folder = tmp_path_factory.mktemp("hashes")
    folder.chmod(0o700)
    os.environ[HASHES_FILE_ENV] = str(folder / "hashes.json")
    return folder / "hashes.json"


REAL_MODEL_FIXTURES = {"smollm", "smollm_native", "smollm_float32"}


def pytest_collection_modifyitems(items):
    # A test on the real bundled model takes seconds: it belongs to the slow lane
    # (`-m "not slow"` leaves it out) whether or not it carries the mark itself.
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def smollm():
    """The real bundled model as users get it by default (`--weights auto`: float32
    weights on the CPU, the file's own format on a GPU): (model, tokenizer).
    Loaded once (about 2 s)."""
    from entropix_mlx import load

    return load()


@pytest.fixture(scope="session")
def smollm_native():
    """The bundled model in its file's own format (Q4_1), as mlx-lm runs it."""
    from entropix_mlx import load

    return load(weights="native")


@pytest.fixture(scope="session")
def smollm_float32(smollm):
    """The bundled model with float32 weights on any device (`auto` gives them
    only on the CPU)."""
    from entropix_mlx import load
    from entropix_mlx.accel.weights import weights_format

    return smollm if weights_format(smollm[0]) == "float32" else load(weights="float32")


# The models the in-process CLI commands of the tests load, each once (the CLI's own
# loaded-model cache, handed to `main`): tests put tiny models on it under file names.
SHELF = Shelf()


def make_loaded(model, tokenizer, path, name: str = "tiny", card=None) -> LoadedModel:
    """A `LoadedModel` of an in-memory model, as if loaded from `path`."""
    source = ModelSource(str(path), Path(path), "gguf", name)
    return LoadedModel.bind(model, tokenizer, source, card, "user" if card else "none")


def shelve(monkeypatch, path, loaded: LoadedModel) -> str:
    """Make the CLI commands of this test load `loaded` for the model file `path`."""
    monkeypatch.setitem(SHELF.loaded, (str(path), "auto"), loaded)
    return str(path)


@pytest.fixture
def tiny_ref(tmp_path, monkeypatch):
    """A model reference that the CLI resolves, in this process, to a tiny random
    model (64-token context)."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"")
    model = make_tiny_model(max_position_embeddings=64)
    return shelve(monkeypatch, path, make_loaded(model, make_tiny_tokenizer(), path))


@pytest.fixture
def answers(tiny_ref, monkeypatch):
    """`answers(question, greedy's, a branch's)`: deliberate, asked `question` of the
    tiny model (which writes no numbers), reads the greedy answer's text as the first
    answer and any other text as the second."""
    from entropix_mlx.decode.generate import generate
    from entropix_mlx.sampling.samplers import GreedySampler

    loaded = SHELF.loaded[(tiny_ref, "auto")]

    def use(question, greedy_answer, branch_answer, max_tokens=6):
        ids = loaded.encode([{"role": "user", "content": question}])
        events = generate(loaded.model, loaded.tokenizer, ids, GreedySampler(), max_tokens=max_tokens)
        greedy = loaded.tokenizer.decode([e.token for e in events])
        answer_of = lambda text: greedy_answer if text == greedy else branch_answer  # noqa: E731
        monkeypatch.setattr("entropix_mlx.front.registry.default_answer", answer_of)

    return use
