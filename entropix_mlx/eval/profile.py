import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..decode.prefill import prefill
from ..front.registry import build
from ..model.cache import make_cache
from ..sampling.metrics import step_metrics
from ..sampling.samplers import Step
from .bench import bench_prompt


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def profile(ours, theirs, tokenizer, model_name: str, prompt_tokens: int = 64, steps: int = 16, seed: int = 0) -> dict:
    """Time the parts of one Entropix decode step, each evaluated on its own
    (MLX is lazy: a part's time is the time to build and evaluate it), over
    `steps` steps after the prompt; medians and means in milliseconds.

    - model: our forward pass for one token, logits and attention scores;
    - metrics: the six metrics alone;
    - candidates: the sampler's whole graph (metrics, every strategy's
      parameters and candidate draws) minus the metrics;
    - decision: the rest of `choose` on the host (the strategy table, the
      candidate scores, and the extra forward passes of branch rollouts or a
      thinking insertion on the steps that take them);
    - mlx_lm_model: mlx-lm's forward pass plus its greedy pick, for comparison.
    """
    sampler = build("entropix", tokenizer, card=model_name)
    sampler.reset()
    prompt = bench_prompt(tokenizer, prompt_tokens)
    cache, their_cache = make_cache(ours), make_prompt_cache(theirs)
    logits, scores = prefill(ours, prompt, cache)
    theirs(mx.array([prompt]), cache=their_cache)
    mx.eval(logits, scores, [c.state for c in their_cache])

    parts = {"model": [], "metrics": [], "candidates": [], "decision": [], "mlx_lm_model": []}
    key = mx.random.key(seed)
    tokens: list[int] = []
    strategies: dict[str, int] = {}
    for _ in range(steps):
        key, step_key = mx.random.split(key)
        step = Step(logits[0, -1], [s[0] for s in scores], tokens, ours, cache)

        t = time.perf_counter()
        mx.eval(step_metrics(step.logits, step.scores, sampler.config.attention_layers))
        metrics_ms = _ms(t)

        t = time.perf_counter()
        mx.eval(sampler.plan(step, step_key))
        plan_ms = _ms(t)

        t = time.perf_counter()
        choice = sampler.choose(step, step_key)
        choose_ms = _ms(t)
        strategies[choice.strategy] = strategies.get(choice.strategy, 0) + 1
        tokens.extend(choice.tokens)

        if choice.advanced is not None:
            # A rollout or an insertion already ran the model over its tokens
            # (its cost is in "decision"); this step has no forward pass to time.
            cache, logits, scores = choice.advanced
        else:
            t = time.perf_counter()
            logits, scores = ours(mx.array([choice.tokens]), cache)
            mx.eval(logits, scores)
            parts["model"].append(_ms(t))

        t = time.perf_counter()
        their_logits = theirs(mx.array([choice.tokens]), cache=their_cache)
        mx.eval(mx.argmax(their_logits[0, -1]))
        if len(choice.tokens) == 1:
            parts["mlx_lm_model"].append(_ms(t))

        parts["metrics"].append(metrics_ms)
        parts["candidates"].append(max(plan_ms - metrics_ms, 0.0))
        parts["decision"].append(max(choose_ms - plan_ms, 0.0))

    return {
        "model": model_name,
        "prompt_tokens": prompt_tokens,
        "steps": steps,
        "strategy_counts": strategies,
        "step_ms": {name: statistics.median(v) if v else 0.0 for name, v in parts.items()},
        # Means show what the rare expensive steps (rollouts) add on average.
        "step_ms_mean": {name: statistics.fmean(v) if v else 0.0 for name, v in parts.items()},
    }
