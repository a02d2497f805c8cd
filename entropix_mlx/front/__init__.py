"""The front door every caller uses: the sampler registry (each sampler described
once) and the loaded model that builds samplers, prepares requests and decodes them."""

from .loaded import Choice, LoadedModel, ModelCard, Prepared, choose, encode_prompt, fit
from .registry import EVAL_SAMPLER_NAMES, SAMPLER_NAMES, SAMPLERS, SamplerSpec, build, deterministic, spec_of
