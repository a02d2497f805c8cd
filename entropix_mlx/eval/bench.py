"""`bench`: entropix-mlx against mlx-lm, in one process, on the same weights
(or under `mlx.launch`, both split across the ranks: see `mlx_lm_model`).

Three variants generate the same number of tokens from the same prompt:

- `mlx_lm`: mlx-lm's own `stream_generate` (greedy, its default sampler) on
  mlx-lm's own Llama built from the same weights;
- `entropix_greedy`: our engine with the greedy sampler as the CLI
  builds it (what the engine itself costs: attention scores, the
  metrics, the decode loop);
- `entropix`: our engine with the full Entropix sampler.

All three are timed the same way, from outside, on the tokens they stream:
time to the first token = prefill and the first decision; decode tokens/s =
the tokens after the first / the time they took, every one of them counted
(a sampler that looks ahead hands out several tokens after one long wait: its
decode rate is the whole time over all those tokens, wherever the wait falls).
Prefill tokens/s = prompt tokens / the time to the prompt's logits, as each
engine reports it (mlx-lm's `prompt_tps`, our `Summary.prompt_tps`): for a
greedy sampler that is nearly the time to the first token, but Entropix's
first decision may be a look-ahead of many tokens, which is decoding, not
prompt processing, so it is counted in the time to the first token only. Every
run generates exactly `gen_tokens` tokens: the tokenizer's end-of-sequence set
is emptied for the bench (the same switch for both engines), so neither stops
early.

The three runs take turns, `CHUNK_TOKENS` tokens at a time, in an order that
rotates every round, so load from other processes hits all three alike (on a
shared machine it changes within seconds). At each switch the work a run left
in flight (both engines start the next forward pass before handing out a
token) finishes before the next run starts, and is counted in the turn that
started it; the next turn's clock starts after it. So every step of every run
is timed exactly once, and no run's work lands in another's time.

Peak memory is the run's own weights and KV cache plus the peak of what it
allocated while it ran: both models and all three caches are alive at once
here, so the raw process peak would count the others too. Figures are medians
over repeats.

Both engines run in this process exactly as `run` runs them: the same `generate`
loop, the same weights (the weight format), the same BLAS and the same worker threads
(the shim's threads serve whichever thread calls them, so nothing depends on the
caller). `contended=True` runs the whole bench beside a busy neighbour
(neighbour.py), so the fast path's figure on a shared machine can be watched.
"""

import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream, stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from ..accel.blas import blas_info, blas_name, thread_stats
from ..accel.weights import describe, weights_format
from ..decode.generate import generate
from ..errors import ConfigError
from ..front import fit
from ..front.registry import build
from ..model.convert import cached_conversion
from ..model.loading import download
from .neighbour import busy_neighbour, cores

VARIANTS = ("mlx_lm", "entropix_greedy", "entropix")
# With a JSON schema: Entropix with the answer held to it, its decode speed against Entropix's own.
SCHEMA_VARIANT = "entropix_schema"


CHUNK_TOKENS = 8  # tokens a run makes before the next one takes its turn


# An open-ended passage: the bench continues it, so the Entropix sampler meets
# both confident and uncertain steps (a repeated sentence would be all argmax).
PASSAGE = (
    "The lighthouse keeper had not seen a ship in eleven days when the fog finally lifted. "
    "From the gallery he could make out the long grey line of the coast, the fishing huts "
    "at the mouth of the river, and, much further out, something that did not belong there: "
    "a small boat with a red sail, drifting without anyone at the tiller. He watched it for "
    "an hour, then went down the spiral stairs, pulled on his coat and untied the dinghy. "
    "The sea was calm but the current was strong, and it took him most of the afternoon to "
    "reach it. When he finally climbed aboard, he found a wooden box, a compass that pointed "
    "south, and a letter addressed to him in his own handwriting. "
)


@dataclass
class RunResult:
    prefill_tps: float
    first_token_s: float
    decode_tps: float
    peak_memory_gb: float
    prompt_tokens: int
    gen_tokens: int
    strategy_counts: dict = field(default_factory=dict)


def bench_prompt(tokenizer, n: int) -> list[int]:
    """Exactly n prompt tokens: the passage, repeated as often as needed."""
    ids = tokenizer.encode(PASSAGE, add_special_tokens=False)
    reps = -(-n // len(ids))
    return (ids * reps)[:n]


@contextmanager
def no_eos(tokenizer):
    """Neither engine stops at an end-of-sequence token, so every run generates
    exactly the tokens asked for (both read `tokenizer.eos_token_ids`)."""
    saved = set(tokenizer.eos_token_ids)
    tokenizer.eos_token_ids = set()
    try:
        yield
    finally:
        tokenizer.eos_token_ids = saved


def weights_bytes(model) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def synchronize():
    """Wait for everything queued, on our stream and on mlx-lm's generation stream."""
    mx.synchronize()
    mx.synchronize(generation_stream)


def cache_bytes(cache) -> int:
    return sum(c.nbytes for c in cache)


class Run:
    """One variant's token stream, advanced a chunk at a time (see the module doc)."""

    def __init__(self, tokens, prompt_tokens: int, weights: int, own_cache, prefill_of, strategy_counts=None):
        self.tokens = iter(tokens)
        self.prefill_of = prefill_of  # (the first item streamed) -> the engine's prefill seconds
        self.prefill_time = None  # those seconds, once the first item came
        self.prompt_tokens, self.weights = prompt_tokens, weights
        self.own_cache = own_cache  # () -> the run's KV cache, as it is now
        self.strategy_counts = strategy_counts or dict
        self.generated = self.decode_steps = 0
        self.first_token_s = None
        self.decode_s = 0.0
        self.peak_bytes = 0
        self.done = False

    def advance(self, n: int):
        synchronize()
        active = mx.get_active_memory()
        own = self.weights + cache_bytes(self.own_cache())
        mx.reset_peak_memory()
        start = time.perf_counter()
        stamps = []
        for _ in range(n):
            try:
                item = next(self.tokens)
            except StopIteration:
                self.done = True
                break
            stamps.append(time.perf_counter())
            if self.prefill_time is None:
                self.prefill_time = self.prefill_of(item)
        peak = mx.get_peak_memory()
        synchronize()  # the work left in flight (the next token's) finishes inside this turn's time
        end = time.perf_counter()
        if stamps:
            if self.first_token_s is None:  # the run's first token: prefill and first decision
                self.first_token_s = stamps[0] - start
                self.decode_s += end - stamps[0]
                self.decode_steps += len(stamps) - 1
            else:
                self.decode_s += end - start
                self.decode_steps += len(stamps)
            self.generated += len(stamps)
        self.peak_bytes = max(self.peak_bytes, own + peak - active)

    def result(self) -> RunResult:
        return RunResult(
            prefill_tps=self.prompt_tokens / self.prefill_time if self.prefill_time else 0.0,
            first_token_s=self.first_token_s or 0.0,
            decode_tps=self.decode_steps / self.decode_s if self.decode_s else 0.0,
            peak_memory_gb=self.peak_bytes / 1e9,
            prompt_tokens=self.prompt_tokens,
            gen_tokens=self.generated,
            strategy_counts=self.strategy_counts(),
        )


def start_mlx_lm(model, tokenizer, prompt: list[int], gen_tokens: int) -> Run:
    cache = make_prompt_cache(model)
    # sampler=None: mlx-lm's own greedy sampler (argmax of the log-probabilities).
    stream = stream_generate(model, tokenizer, prompt, max_tokens=gen_tokens, prompt_cache=cache)
    return Run(
        stream, len(prompt), weights_bytes(model), lambda: cache, lambda response: len(prompt) / response.prompt_tps
    )


def start_entropix(
    model, tokenizer, prompt: list[int], gen_tokens: int, sampler, seed: int = 0, constraint=None
) -> Run:
    generation = generate(model, tokenizer, prompt, sampler, max_tokens=gen_tokens, seed=seed, penalties=constraint)
    return Run(
        generation,
        len(prompt),
        weights_bytes(model),
        lambda: generation.cache,
        lambda _: len(prompt) / generation.summary().prompt_tps,
        lambda: generation.summary().strategy_counts,
    )


def mlx_lm_model(source, group=None):
    """mlx-lm's own implementation of the model family of `source` on the same weights
    in the file's own format (what a user of mlx-lm gets: a GGUF file goes through
    `convert`, cached). With `group` (a launch of several ranks): split across its
    ranks the way mlx-lm splits it, as ours is (`cli.loaded.Shelf`), so every rank
    runs the bench in lockstep."""
    if source.kind in ("bundled", "gguf"):
        theirs, _ = load_model(cached_conversion(source.path))
    else:
        path = source.path if source.kind == "directory" else download(source.ref)
        theirs, _ = load_model(path)
    if group is not None:
        theirs.shard(group)
        mx.eval(theirs.parameters())
    return theirs


def make_samplers(sampler: Callable):
    return {
        "entropix_greedy": lambda: sampler("greedy"),  # as the CLI builds greedy
        "entropix": lambda: sampler("entropix"),
        SCHEMA_VARIANT: lambda: sampler("entropix"),
    }


def start_variant(name, ours, theirs, tokenizer, prompt, gen_tokens, samplers, constraint=None) -> Run:
    if name == "mlx_lm":
        return start_mlx_lm(theirs, tokenizer, prompt, gen_tokens)
    held = constraint() if name == SCHEMA_VARIANT else None
    return start_entropix(ours, tokenizer, prompt, gen_tokens, samplers[name](), constraint=held)


def interleaved(runs: dict[str, Run], rounds_start: int = 0) -> None:
    """Advance the runs a chunk each, in turn, the order rotating every round."""
    names = list(runs)
    r = rounds_start
    while not all(run.done for run in runs.values()):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if not runs[name].done:
                runs[name].advance(CHUNK_TOKENS)
        r += 1


def median_result(results: list[RunResult]) -> dict:
    out = {
        "prefill_tps": statistics.median(r.prefill_tps for r in results),
        "first_token_s": statistics.median(r.first_token_s for r in results),
        "decode_tps": statistics.median(r.decode_tps for r in results),
        "peak_memory_gb": statistics.median(r.peak_memory_gb for r in results),
        "tokens": min(r.gen_tokens for r in results),  # every run must have made gen_tokens
        "runs": len(results),
    }
    if results[0].strategy_counts:
        out["strategy_counts"] = results[-1].strategy_counts
    return out


def ratios(results: dict) -> dict:
    ref = results["mlx_lm"]
    held = results.get(SCHEMA_VARIANT)
    return {
        **({"decode_schema": held["decode_tps"] / results["entropix"]["decode_tps"]} if held else {}),
        "prefill": results["entropix"]["prefill_tps"] / ref["prefill_tps"],
        # how many times sooner the first token comes (prefill and the first decision)
        "first_token": ref["first_token_s"] / results["entropix"]["first_token_s"],
        "decode": results["entropix"]["decode_tps"] / ref["decode_tps"],
        "decode_greedy": results["entropix_greedy"]["decode_tps"] / ref["decode_tps"],
        "memory": results["entropix"]["peak_memory_gb"] / ref["peak_memory_gb"],
    }


def bench(
    ours,
    theirs,
    tokenizer,
    model_name: str,
    prompt_tokens: int = 64,
    gen_tokens: int = 128,
    repeats: int = 2,
    warmup: bool = True,
    progress=None,
    contended: bool = False,
    constraint=None,
    sampler: Callable | None = None,
) -> dict:
    """Run the three variants `repeats` times, interleaved; medians and ratios.
    `contended`: beside a NumPy matrix-product loop on every core (neighbour.py), from
    before the warm-up to after the last run. `constraint()`: a fresh JSON-schema
    constraint (front.LoadedModel.constraint), for a fourth variant, Entropix under it.
    `sampler(name)`: a sampler with the model's card (front.LoadedModel.sampler; default:
    the card `model_name` names)."""
    if prompt_tokens < 1 or gen_tokens < 2 or repeats < 1:
        raise ConfigError("bench needs at least 1 prompt token, 2 generated tokens and 1 repeat")
    limit, room = fit(ours, prompt_tokens, gen_tokens)
    if limit < gen_tokens:  # every run generates exactly gen_tokens: none may be cut
        raise ConfigError(
            f"prompt_tokens + gen_tokens is {prompt_tokens + gen_tokens} but the model's "
            f"context holds {prompt_tokens + room}; ask for fewer tokens",
            settings=("prompt_tokens", "gen_tokens"),
        )
    samplers = make_samplers(sampler or (lambda name: build(name, tokenizer, card=model_name)))
    prompt = bench_prompt(tokenizer, prompt_tokens)
    variants = VARIANTS + ((SCHEMA_VARIANT,) if constraint is not None else ())
    runs = {name: [] for name in variants}
    load = [os.getloadavg()[0]]
    if constraint is not None:
        constraint()  # the first builds the grammar engine's tokenizer: before no_eos hides the end tokens
    with busy_neighbour() if contended else nullcontext(), no_eos(tokenizer):
        if warmup:
            # First calls pay for kernel set-up and mlx-lm's compiled sampler: not timed.
            if progress:
                progress("warm-up" + (" beside the busy neighbour" if contended else ""))
            short = prompt[: min(prompt_tokens, 16)]
            interleaved(
                {
                    name: start_variant(name, ours, theirs, tokenizer, short, 4, samplers, constraint)
                    for name in variants
                }
            )
        for r in range(repeats):
            if progress:
                progress(f"run {r + 1}/{repeats} (the three variants take turns)")
            mx.clear_cache()
            current = {
                name: start_variant(name, ours, theirs, tokenizer, prompt, gen_tokens, samplers, constraint)
                for name in variants
            }
            interleaved(current, rounds_start=r)
            for name, run in current.items():
                runs[name].append(run.result())
        load.append(os.getloadavg()[0])
    results = {name: median_result(rs) for name, rs in runs.items()}
    return {
        "model": model_name,
        "paths": compute_paths(ours, theirs),
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        **results,
        "ratios": ratios(results),
        "machine": {
            "cores": cores(),
            **thread_stats(),  # the shim's threads a product, what its workers and the caller did
            "load_average": load,  # the 1-minute load average before and after
            "contended": contended,
        },
    }


def compute_paths(ours, theirs) -> dict:
    """What each side computes with: device, weight format, the BLAS its float
    matmuls call (quantized matmuls are MLX's own kernels, no BLAS) and OpenBLAS's
    kernel set (None without OpenBLAS)."""
    theirs_text = describe(theirs)
    if weights_format(theirs).startswith("native"):
        theirs_text += " · MLX quantized matmul"
    return {"mlx_lm": theirs_text, "entropix": describe(ours), "blas": blas_name(), "blas_core": blas_info()["core"]}
