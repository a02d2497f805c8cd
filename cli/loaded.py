"""What the CLI's commands share: the models loaded in this process (each once,
with its card), the header line that says what runs, and the quiet ranks of a launch."""

import os
import sys

import mlx.core as mx

from entropix_mlx.accel import weights as backend
from entropix_mlx.accel.blas import blas_name, blas_refused
from entropix_mlx.accel.weights import weights_format
from entropix_mlx.distributed import check_same_model, world
from entropix_mlx.front import LoadedModel, deterministic
from entropix_mlx.front.registry import same_for_every_seed, seeded_strategies
from entropix_mlx.model.loading import load, resolve
from entropix_mlx.model.sharding import shard

from .cache_cmd import size_text
from .cards import ensure_model_card


class Shelf:
    """The models this CLI process has loaded, each once (with its card, measured
    now if it has none): `main` owns one and hands it to every command, so chat's
    /model and a test's repeated commands reuse what was loaded."""

    def __init__(self):
        self.loaded: dict[tuple, LoadedModel] = {}
        self.carded: set[tuple] = set()  # the models whose card was found or measured

    def put(self, path, loaded: LoadedModel, weights: str = "auto") -> None:
        """Keep `loaded` as the model at `path` (tests: a tiny model under a file name)."""
        self.loaded[(str(path), weights)] = loaded

    def load(
        self, ref: str | None, weights: str = "auto", tensor_parallel: bool = False, card: bool = True, cache=True
    ) -> LoadedModel:
        """The model `ref`. With `tensor_parallel`, under a launcher with several
        ranks, each rank holds its share of the layers (`model.sharding`) and all of
        them must have rank 0's model files. With `card`, a model without a card
        gets one measured now (cli/cards.py)."""
        w = world() if tensor_parallel else None
        key = (str(resolve(ref).path), weights) + (("sharded",) if w is not None and w.size > 1 else ())
        if key not in self.loaded:
            if len(key) > 2:
                check_same_model(w, resolve(ref).path)
            model, tokenizer, source = load(ref, return_source=True, weights=weights, cache=cache, kept=_say_kept)
            if len(key) > 2:
                shard(model, w.group)
            warm_up_compiler()
            self.loaded[key] = LoadedModel.bind(model, tokenizer, source)
        loaded = self.loaded[key]
        if card and key not in self.carded:
            status = ensure_model_card(loaded.model, loaded.tokenizer, loaded.source)
            loaded = self.loaded[key] = LoadedModel.bind(
                loaded.model, loaded.tokenizer, loaded.source, status.path, status.kind
            )
            self.carded.add(key)
        return loaded


def _say_kept(entry, nbytes: int, file_bytes: int, fmt: str) -> None:
    """The load cache took disk space: say how much (beside the file's own size:
    float32 weights take several times a quantized file's), where, and how to get it back."""
    form = "as float32, for the fast CPU path" if fmt == "float32" else "in the file's own format"
    print(
        f"kept this model's loaded form in {entry.parent} ({size_text(nbytes)}: the {size_text(file_bytes)} "
        f"file's weights {form}), so later starts take seconds; `entropix-mlx cache` lists and removes it "
        "(--no-cache: do without)",
        file=sys.stderr,
    )


def quiet_unless_root(w) -> None:
    """Ranks other than 0 print nothing but errors: stdout goes nowhere (their
    consoles are made quiet by the caller); the errors go to stderr as ever."""
    if not w.root:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)


@mx.compile
def _fused(x):
    return x * 2 + 1


def warm_up_compiler():
    """MLX's CPU backend checks for its compiler with C's system("g++ --version")
    at the first compiled kernel of a process, and system() ignores SIGINT while
    it runs: a Ctrl-C in that moment, the start of the first prefill, would be
    lost. One tiny compiled kernel moves that moment into the model load."""
    mx.eval(_fused(mx.array([1.0])))


def compute_path(model) -> str:
    """How the model runs, in a newcomer's words (`--verbose` adds `describe`'s
    technical line: device, weight format, BLAS)."""
    if not model.backend.cpu_kernels:
        return "GPU"
    fmt = weights_format(model)
    if fmt.startswith("native"):
        words = f"CPU, the file's {fmt.removeprefix('native ')} weights"
    elif blas_name() == "MLX's BLAS":
        words = "CPU, slow path (no OpenBLAS found: see entropix-mlx doctor)"
    else:
        words = "fast CPU path"
    return f"{words} ({blas_refused()})" if blas_refused() else words


def header(source, sampler, seed: int, model=None, verbose: bool = False) -> str:
    path = []
    if model is not None:
        path = [compute_path(model)] + ([backend.describe(model)] if verbose else [])
    parts = [source.name, *path, f"sampler {sampler.name}"]
    config_source = getattr(sampler, "config_source", None)  # entropix: card, preset or file
    if config_source:
        parts.append(config_source)
    parts.append(
        "deterministic (the seed changes nothing)" if deterministic(sampler) else seed_words(sampler, seed, model)
    )
    return " · ".join(parts)


def seed_words(sampler, seed: int, model=None) -> str:
    """The seed, and for Entropix the steps it draws at: the rest of an answer
    is the same for every seed."""
    seeded = seeded_strategies(sampler, model.args.vocab_size if model is not None else None)
    if seeded == ("sample",):  # a baseline: every token is drawn
        return f"seed {seed}"
    return f"seed {seed} (used at {' and '.join(seeded)} steps)"


def every_seed_gives(sampler, summary) -> bool:
    """Whether a sampler that may sample gave an answer that every seed gives (no token drawn)."""
    return not deterministic(sampler) and same_for_every_seed(sampler, summary.strategy_counts)


def silence_stdout():
    """After the reader of our stdout went away (`| head -1`): point stdout at
    /dev/null so the interpreter's final flush cannot raise (Python docs, 'Note
    on SIGPIPE')."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
