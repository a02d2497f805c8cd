"""The front door every caller uses: the sampler registry (each sampler described
once) and the loaded model that builds samplers, prepares requests and decodes them."""

from ..decode.rows import DEFAULT_MAX_TOKENS
from .loaded import LoadedModel, ModelCard, Prepared, SamplerChoice, choose, encode_prompt, fit
from .registry import (
    DEFAULT_SAMPLER,
    EVAL_SAMPLER_NAMES,
    SAMPLER_NAMES,
    SAMPLERS,
    SamplerSpec,
    build,
    deterministic,
    seeded_strategies,
    spec_of,
)
