"""What the CLI's commands share: the models loaded in this process (each once,
with its card), the sampler built from the options, the header line that says
what runs, and the quiet ranks of a launch."""

import os
import sys

import mlx.core as mx

from entropix_mlx.accel import weights as backend
from entropix_mlx.accel.blas import blas_name, blas_refused
from entropix_mlx.accel.weights import weights_format
from entropix_mlx.decode.registry import make_sampler
from entropix_mlx.distributed import check_same_model, world
from entropix_mlx.model.loading import load, resolve
from entropix_mlx.model.sharding import shard
from entropix_mlx.sampling.parameters import sampling_request
from entropix_mlx.sampling.strategies import deterministic

from .cards import ensure_model_card

LOADED: dict[tuple[str, str], tuple] = {}
CARDS: set[tuple[str, str]] = set()  # the models whose card was found or measured in this process


def load_model(
    ref: str | None, weights: str = "auto", tensor_parallel: bool = False, card: bool = True, cache: bool = True
):
    """(model, tokenizer, source), loaded once per process. With `tensor_parallel`,
    under a launcher with several ranks, each rank holds its share of the layers
    (`model.sharding`) and all of them must have rank 0's model files. With `card`,
    a model without a card gets one measured now (cli/cards.py), once per process."""
    w = world() if tensor_parallel else None
    key = (str(resolve(ref).path), weights) + (("sharded",) if w is not None and w.size > 1 else ())
    if key not in LOADED:
        if len(key) > 2:
            check_same_model(w, resolve(ref).path)
        LOADED[key] = load(ref, return_source=True, weights=weights, cache=cache)
        if len(key) > 2:
            shard(LOADED[key][0], w.group)
        warm_up_compiler()
    if card and key not in CARDS:
        ensure_model_card(*LOADED[key])
        CARDS.add(key)
    return LOADED[key]


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


def build_sampler(name, tokenizer, model_name, config=None, **overrides):
    """The sampler by name with the parameters it takes (sampling/parameters.py);
    deliberate takes --budget instead, entropix also --reasoning."""
    budget = overrides.pop("budget", None)
    reasoning = overrides.pop("reasoning", False)
    name, overrides, _ = sampling_request(name, overrides)
    if name == "deliberate":
        overrides = {"budget": budget}
    return make_sampler(
        name,
        tokenizer=tokenizer,
        model_name=model_name,
        config=config if name in ("entropix", "deliberate") else None,
        reasoning=reasoning and name == "entropix",
        **overrides,
    )


def compute_path(model) -> str:
    """How the model runs, in a newcomer's words (`--verbose` adds `describe`'s
    technical line: device, weight format, BLAS)."""
    if mx.default_device() != mx.cpu:
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
    parts.append("deterministic (the seed changes nothing)" if deterministic(sampler) else f"seed {seed}")
    return " · ".join(parts)


def silence_stdout():
    """After the reader of our stdout went away (`| head -1`): point stdout at
    /dev/null so the interpreter's final flush cannot raise (Python docs, 'Note
    on SIGPIPE')."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
