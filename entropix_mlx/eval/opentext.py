"""Open-text quality (open-text mode): what each sampler's free writing looks like.

Every sampler writes up to max_tokens tokens (default 64) for each prompt (one
user turn of the chat template; the model may end its turn earlier). Greedy runs
once, other samplers once per seed, as in the accuracy eval, through the same
batched, resumable runner. Metrics of one output, on its token ids (the
end-of-turn token is not part of the output):

- repeated-4-gram share: of the output's 4-grams (one per start position), the
  share that already occurred at an earlier start position of the same output.
  "a b c d a b c d" has 5 4-grams, the last repeats the first: 1/5. Lower is
  better: loops drive it towards 1.
- distinct-2: distinct bigrams / bigrams. Higher is more varied.
- longest loop: the longest span made of one unit of p >= 1 tokens repeated back
  to back, whole copies only: "a b c a b c" is a loop of 6 tokens, "x a a a a" of
  4, "a b c a b" none (0). A loop of LOOP_ALERT (12) tokens or more is flagged.
- mean log-probability: the mean, over the output's tokens, of log p (nats) of
  each token under the model's own, unmodified next-token distribution, found by
  running prompt + output through the model once (teacher forcing), whatever the
  sampler did (temperature, inserted thinking text). A coherence proxy: wandering
  text scores low, and so does degenerate repetition at first.
- early ending: the model ended its turn (end-of-turn token) after fewer than
  EARLY_TOKENS (16) tokens, an empty answer included.

Per sampler, over all prompts and seeds: the mean of each metric (the
repeated-4-gram share and distinct-2 over outputs long enough to have a 4-gram /
bigram, the log-probability over non-empty outputs), the mean and largest loop and
the number of outputs with a loop of LOOP_ALERT tokens or more, the number of early
endings, the mean length. Against greedy, per prompt: the sampler's repeated-4-gram
share (mean over seeds) against greedy's; a win is less repetition; W/L/T and
the exact sign test as in the accuracy eval.
"""

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from functools import partial
from importlib import resources
from pathlib import Path

import mlx.core as mx

from ..decode.engine import generate_batch
from ..errors import ConfigError
from ..front import encode_prompt
from ..front.registry import BASELINE
from ..sampling.repetition import LOOP_ALERT, longest_loop
from .runner import EvalConfig, machine_description
from .stats import paired_comparison
from .store import default_sampler_factory, run_items, settings_by_sampler

EARLY_TOKENS = 16  # an answer that ends before this many tokens ended too early for open text
DEFAULT_OPEN_TOKENS = 64


# -- metrics of one output --------------------------------------------------------


def repeated_ngram_share(tokens: list[int], n: int = 4) -> float | None:
    """Share of the n-grams (one per start position) that occurred earlier in the
    same sequence; None when it has no n-gram."""
    total = len(tokens) - n + 1
    if total <= 0:
        return None
    seen, repeated = set(), 0
    for i in range(total):
        gram = tuple(tokens[i : i + n])
        repeated += gram in seen
        seen.add(gram)
    return repeated / total


def distinct_n(tokens: list[int], n: int = 2) -> float | None:
    """Distinct n-grams / n-grams; None when it has no n-gram."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def text_metrics(
    tokens: list[int], logprobs: list[float], finish_reason: str, early_tokens: int = EARLY_TOKENS
) -> dict:
    return {
        "repeated_4gram_share": repeated_ngram_share(tokens, 4),
        "distinct_2": distinct_n(tokens, 2),
        "longest_loop": longest_loop(tokens),
        "mean_logprob": statistics.fmean(logprobs) if logprobs else None,
        "early_end": finish_reason == "eos" and len(tokens) < early_tokens,
    }


def sequence_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """log p (nats) of each of `tokens` after `prompt` under the model's unmodified
    distribution: one forward pass over prompt + tokens (teacher forcing)."""
    if not tokens:
        return []
    inputs = mx.array([prompt + tokens[:-1]])
    logits, _ = model(inputs)
    logits = logits[0, len(prompt) - 1 :].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, mx.array(tokens)[:, None], axis=-1)[:, 0]
    return chosen.tolist()


# -- prompts ------------------------------------------------------------------------


@dataclass
class OpenPrompt:
    index: int  # line's position among the prompts, its identity in results
    question: str  # the prompt text (named as a task's question, for the store)


def builtin_prompts_path() -> Path:
    return Path(str(resources.files("entropix_mlx").joinpath("data/open_prompts.txt")))


def load_prompts(path) -> list[OpenPrompt]:
    """One prompt per line; blank lines and lines starting with '#' are skipped.
    A literal backslash-n in a line stands for a line break."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"prompt file {path} {what}; give a text file with one prompt per line")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"prompt file {path} is not UTF-8 text; give one prompt per line") from None
    texts = [line.strip().replace("\\n", "\n") for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not texts:
        raise ConfigError(f"prompt file {path} has no prompts; give one prompt per line")
    return [OpenPrompt(i, t) for i, t in enumerate(texts)]


# -- runner ---------------------------------------------------------------------------


@dataclass
class OpenConfig(EvalConfig):
    max_tokens: int = DEFAULT_OPEN_TOKENS
    early_tokens: int = EARLY_TOKENS
    tasks_name: str = "prompts"


def run_open(
    model,
    tokenizer,
    prompts: list[OpenPrompt],
    config: OpenConfig,
    out_dir=None,
    make_sampler: Callable | None = None,
    progress=None,
    on_record: Callable[[dict], None] | None = None,
) -> dict | None:
    """Every (sampler, seed) writes for every prompt; metrics per output, then
    `summarize_open`. Same resumable store and arguments as `run_eval`."""
    make_sampler = make_sampler or default_sampler_factory(tokenizer, config)
    encoded = [encode_prompt(tokenizer, [{"role": "user", "content": p.question}]) for p in prompts]
    runs = config.runs()
    identity = {
        "mode": "open",
        "model": config.model_name,
        "max_tokens": config.max_tokens,
        "early_tokens": config.early_tokens,
        "samplers": settings_by_sampler(make_sampler, runs),
    }

    def rows(name, todo, requests, prefix):
        return generate_batch(model, tokenizer, requests, partial(make_sampler, name), config.batch_size, prefix=prefix)

    def fields(prompt, tokens, result, seconds):
        logprobs = sequence_logprobs(model, tokens, result.tokens)
        return {
            "output": tokenizer.decode(result.tokens),
            "token_ids": result.tokens,
            "tokens": len(result.tokens),
            "finish_reason": result.finish_reason,
            "strategies": {s: result.strategies.count(s) for s in dict.fromkeys(result.strategies)},
            "thinking_insertions": result.thinking_insertions,
            "seconds": round(seconds, 4),
            **text_metrics(result.tokens, logprobs, result.finish_reason, config.early_tokens),
        }

    store = run_items(
        prompts,
        encoded,
        identity,
        runs,
        config.max_tokens,
        rows,
        fields,
        out_dir,
        progress,
        on_record,
        config.batch_size,
    )
    if store is None:  # a rank other than 0 under a launcher: rank 0 holds the records
        return None
    results = summarize_open(store.records, prompts, config)
    store.write_results(results)
    return results


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarize_open(records: dict, prompts: list[OpenPrompt], config: OpenConfig) -> dict:
    indices = [p.index for p in prompts]
    per_sampler: dict[str, list[list[dict]]] = {}
    for name, seed in config.runs():
        per_sampler.setdefault(name, []).append([records[(name, seed, i)] for i in indices])

    def per_prompt_share(runs):
        shares = {i: _mean(recs[k]["repeated_4gram_share"] for recs in runs) for k, i in enumerate(indices)}
        return {i: v for i, v in shares.items() if v is not None}

    greedy_share = per_prompt_share(per_sampler["greedy"])
    out = {}
    for name, runs in per_sampler.items():
        recs = [r for run in runs for r in run]
        loops = [r["longest_loop"] for r in recs]
        seconds = sum(r["seconds"] for r in recs)
        run_shares = [_mean(r["repeated_4gram_share"] for r in run) for run in runs]
        run_shares = [s for s in run_shares if s is not None]
        entry = {
            "n": len(indices),
            "seeds": len(runs),
            "outputs": len(recs),
            "repeated_4gram_share": _mean(r["repeated_4gram_share"] for r in recs),
            "repeated_4gram_share_std": statistics.stdev(run_shares) if len(run_shares) > 1 else 0.0,
            "distinct_2": _mean(r["distinct_2"] for r in recs),
            "longest_loop_max": max(loops),
            "longest_loop_mean": statistics.fmean(loops),
            "loops_at_least_alert": sum(v >= LOOP_ALERT for v in loops),
            "mean_logprob": _mean(r["mean_logprob"] for r in recs),
            "early_endings": sum(r["early_end"] for r in recs),
            "mean_tokens": statistics.fmean(r["tokens"] for r in recs),
            "tokens_per_second": sum(r["tokens"] for r in recs) / seconds if seconds else 0.0,
        }
        if name != BASELINE:
            entry["vs_greedy"] = paired_comparison(per_prompt_share(runs), greedy_share, higher_is_better=False)
        out[name] = entry
    return {
        "mode": "open",
        "model": config.model_name,
        "prompts": config.tasks_name,
        "items": len(indices),
        "max_tokens": config.max_tokens,
        "early_tokens": config.early_tokens,
        "loop_alert": LOOP_ALERT,
        "batch_size": config.batch_size,
        "date": date.today().isoformat(),
        "machine": machine_description(),
        "samplers": out,
    }
