"""Measuring a model's metrics for its card: every step's six metrics over short
sampled answers to built-in prompts, all answered at once by the batch engine."""

import numpy as np

from ..decode.engine import generate_batch
from ..decode.rows import Request
from ..distributed import World, all_gather_json, world
from ..front import encode_prompt, fit
from ..sampling.config import SamplerConfig
from ..sampling.metrics import METRIC_NAMES
from ..sampling.samplers import TemperatureSampler


class CountingSampler(TemperatureSampler):
    """Calibration's sampler, telling `tick` of every token it chooses (the bar)."""

    def __init__(self, tick, *args):
        super().__init__(*args)
        self.tick = tick

    def finish(self, step, plan):
        self.tick()
        return super().finish(step, plan)


def collect(
    model, tokenizer, prompts, max_tokens: int = 24, seed: int = 0, attention_layers="all", progress=None
) -> dict[str, np.ndarray]:
    """Every step's six metrics over short sampled answers to `prompts`, all
    answered at once by the batch engine (a model's first use waits for this);
    `progress(done, n)` in tokens: at the start, at every step, and at the end
    (n is the most the answers may take; answers that end early take fewer)."""

    base = SamplerConfig()
    if attention_layers != "all":
        raise NotImplementedError("calibration records the default layer choice ('all')")
    # Under a launcher each rank measures every size-th prompt, unless the model is split
    # across the ranks (`model.sharding`): then every rank runs every pass together.
    w = world() if model.head_group is None else World(0, 1, None)
    requests, prompt_of = [], []
    for i, prompt in enumerate(prompts):
        if i % w.size != w.rank:
            continue
        ids = encode_prompt(tokenizer, [{"role": "user", "content": prompt}])
        limit, room = fit(model, len(ids), max_tokens)  # a small context measures what fits
        if room >= 1:
            requests.append(Request(ids, seed + i, limit))
            prompt_of.append(i)
    total, done = sum(r.max_tokens for r in requests), [0]

    def tick():
        done[0] += 1
        if progress:
            progress(min(done[0], total), total)

    if progress:
        progress(0, total)
    answers = []
    rows = generate_batch(
        model,
        tokenizer,
        requests,
        lambda: CountingSampler(tick, base.temperature, base.top_p, base.top_k, base.min_p),
        batch_size=max(1, len(requests)),
    )
    for index, result, _ in rows:
        answers.append((prompt_of[index], [[float(m[n]) for n in METRIC_NAMES] for m in result.metrics]))
    if progress:
        progress(total, total)
    by_prompt = sorted(a for part in all_gather_json(w, answers) for a in part)
    steps = [step for _, answer in by_prompt for step in answer]
    data = np.array(steps, dtype=np.float64).reshape(-1, len(METRIC_NAMES))
    return {name: data[:, j] for j, name in enumerate(METRIC_NAMES)}
