"""The library's face, shaped like mlx-lm's: `load`, `make_sampler`,
`stream_generate`, `generate`.

    from entropix_mlx import load, make_sampler, generate
    model, tokenizer = load("smollm2-135m")
    sampler = make_sampler("entropix", model=model)
    print(generate(model, tokenizer, "How many legs does a spider have?", sampler=sampler))

`load` binds the model's card to the model it returns (its shipped card, or one
measured on its first use and kept in the user's cache), so `make_sampler(name,
model=model)` takes that model's settings and nothing depends on what ran
before. `stream_generate` takes text (the chat template applied, as mlx-lm does)
or token ids, keeps the answer within the model's context, and yields one
`Response` per token. On Linux, `entropix_mlx.accel.enable()` before anything
imports MLX turns on the CPU fast path; it stays explicit because it loads a
native library into the process.
"""

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .errors import ConfigError
from .eval.usercard import ensure_card
from .front import DEFAULT_MAX_TOKENS, DEFAULT_SAMPLER, EVAL_SAMPLER_NAMES, LoadedModel, build, choose, encode_prompt
from .model.loading import load as load_files
from .sampling.config import resolve_config
from .sampling.entropix import EntropixSampler
from .sampling.mlx_lm_sampler import MlxLmSampler
from .sampling.parameters import PARAMETERS


def load_model(
    path_or_alias: str | None = None, weights: str = "auto", progress: Callable | None = None, cache: bool = True
) -> LoadedModel:
    """The model `path_or_alias` (a GGUF file, a model directory, a Hugging Face
    repo id or the bundled alias, default `smollm2-135m`) with its card: the front
    door (`front.LoadedModel`) the CLI, the server and eval use. A model without a
    card is measured once, now (16 prompts in one batch: seconds for a small
    model); `progress(done, total)` follows it. A GGUF file's loaded form is kept
    in the user cache and read from there on later loads (`cache=False`: the file itself)."""
    model, tokenizer, source = load_files(path_or_alias, return_source=True, weights=weights, cache=cache)
    status = ensure_card(model, tokenizer, source, progress=progress, warn=warnings.warn)
    loaded = LoadedModel.bind(model, tokenizer, source, status.path, status.kind)
    model.entropix_card, model.entropix_loaded = loaded.card, loaded
    return loaded


def load(path_or_alias: str | None = None, weights: str = "auto", progress: Callable | None = None, cache: bool = True):
    """`(model, tokenizer)`, as mlx-lm's `load`, with the model's card bound to the
    model (`model.entropix_card`), so `make_sampler(name, model=model)` takes
    that model's settings (see `load_model`)."""
    loaded = load_model(path_or_alias, weights, progress, cache)
    return loaded.model, loaded.tokenizer


def make_sampler(name: str = DEFAULT_SAMPLER, model=None, **settings):
    """A sampler (`entropix`, `greedy`, `min_p`, `temperature`) or a whole-answer
    decoder (`deliberate`, and eval's baselines) by name, with the settings of
    `model`'s card (a model from `load`) under `settings`. Without a model, the
    defaults (for `entropix`, the `reference` preset, tuned for Llama-3.2-1B),
    with a warning: thresholds do not transfer between models. `reasoning=True`
    (entropix): the card's settings for chains of thought (its [reasoning]
    table, else the default reasoning profile); (deliberate) its reasoning setting,
    each candidate's answer read as eval reads a chain of thought's number."""
    given = {k: settings.pop(k) for k in list(settings) if k in PARAMETERS}
    choice = choose(name, given, EVAL_SAMPLER_NAMES)  # the one rule the CLI and the server follow too
    for note in choice.notes:
        warnings.warn(note, stacklevel=2)
    card = getattr(model, "entropix_card", None) if model is not None else None
    if model is not None and card is None:
        raise ConfigError("make_sampler(model=...) needs a model from entropix_mlx.load, which binds its card")
    if card is None and choice.spec.reads_card and "config" not in settings:
        warnings.warn(
            f"make_sampler('{name}') without model=: the default settings, not a card measured for your model; "
            "pass model= (a model from entropix_mlx.load)",
            stacklevel=2,
        )
    if card is None:
        return build(choice.name, **choice.params, **settings)
    return build(choice.name, card.tokenizer, card.ref, **choice.params, **settings)


@dataclass
class Response:
    """One generated token, as mlx-lm's `GenerationResponse`, with what Entropix saw."""

    text: str  # the new piece of text ("" while a multi-byte character is incomplete)
    token: int
    strategy: str  # which strategy chose it ("argmax", "branch", ...)
    metrics: dict  # the uncertainty it was chosen under (entropy, varentropy, ...)
    logprob: float
    prompt_tokens: int
    generation_tokens: int
    finish_reason: str | None = None  # on the last response: "eos", "length" or "context"
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    peak_memory: float = 0.0  # GB


def prompt_ids(tokenizer, prompt) -> list[int]:
    """Token ids: text gets the model's chat template (one user turn)."""
    if isinstance(prompt, str):
        return encode_prompt(tokenizer, [{"role": "user", "content": prompt}])
    return list(prompt)


def stream_generate(
    model, tokenizer, prompt, sampler=None, max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, json_schema=None
) -> Iterator[Response]:
    """Yield a `Response` per generated token. `prompt`: text or token ids;
    `sampler`: from `make_sampler` (default: entropix with the model's card);
    `json_schema` (a dict): every answer is JSON valid under it (sampling/constraint.py).
    The answer stops where the model's context ends (finish reason "context")."""
    ids = prompt_ids(tokenizer, prompt)
    loaded = getattr(model, "entropix_loaded", None)
    if loaded is None or loaded.tokenizer is not tokenizer:
        loaded = LoadedModel.bind(model, tokenizer, None, name=getattr(model, "name", "model"))
    sampler = sampler or make_sampler(DEFAULT_SAMPLER, model=model)
    prepared = loaded.prepare(ids, sampler, max_tokens, seed, json_schema=json_schema)
    generation = loaded.generate(prepared)
    pending = None
    for count, event in enumerate(generation, 1):
        if pending is not None:
            yield pending
        pending = Response(event.text, event.token, event.strategy, event.metrics, event.logprob, len(ids), count)
    if pending is not None:
        s = generation.summary()
        finish = prepared.finish(s.finish_reason)
        yield dataclasses.replace(
            pending,
            finish_reason=finish,
            prompt_tps=s.prompt_tps,
            generation_tps=s.generation_tps,
            peak_memory=s.peak_memory_gb,
        )


def generate(
    model, tokenizer, prompt, sampler=None, max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, json_schema=None
) -> str:
    """The whole answer's text (see `stream_generate`)."""
    responses = stream_generate(model, tokenizer, prompt, sampler, max_tokens, seed, json_schema)
    return "".join(r.text for r in responses)


def mlx_lm_sampler(tokenizer, config=None, seed: int = 0, reasoning: bool = False, **settings) -> MlxLmSampler:
    """Entropix for mlx-lm: pass it as `sampler=` to `mlx_lm.generate` or
    `mlx_lm.stream_generate`, one per answer (sampling/mlx_lm_sampler.py says
    what it cannot do there). `config`: a preset name, a TOML card or a
    SamplerConfig; without one, the defaults, with a warning. `reasoning`: its
    reasoning profile (see `make_sampler`)."""
    if config is None:
        warnings.warn(
            "mlx_lm_sampler without config=: the default settings, not a card measured for your model; "
            "pass config= (a card from entropix-mlx calibrate, or a preset)",
            stacklevel=2,
        )
    cfg, source = resolve_config(None, config, reasoning, **settings)
    return MlxLmSampler(EntropixSampler(cfg, tokenizer, source), seed)
