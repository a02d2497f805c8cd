"""What Entropix loses inside mlx-lm (docs/python-api.md): the bundled model's
card on the built-in dev split, as it runs here (attention scores, branch
rollouts on the model), without the attention scores alone, and as
`entropix_mlx.mlx_lm_sampler` runs inside mlx-lm (logits only: no attention
scores, no model to roll branches out on, a thinking text fed one token per
step), on the same batch engine.

    python -m research.mlx_lm_dev [--split dev] [--out DIR]
"""

import argparse

# ruff: noqa: E402  (the imports after enable())
import entropix_mlx.accel

entropix_mlx.accel.enable()  # the CLI's compute path: before anything imports mlx

from entropix_mlx import eval as ev
from entropix_mlx import load, make_sampler
from entropix_mlx.sampling.samplers import Step


class LogitsOnly:
    """An Entropix sampler that sees what mlx-lm gives a sampler: the logits (with
    `rollouts`, also the model and its cache, but still no attention scores)."""

    def __init__(self, sampler, rollouts: bool = False):
        self.sampler, self.config, self.rollouts = sampler, sampler.config, rollouts
        self.name = "entropix_no_attention" if rollouts else "entropix_logits_only"

    def reset(self):
        self.sampler.reset()

    def choose(self, step, key):
        model, cache = (step.model, step.cache) if self.rollouts else (None, None)
        return self.sampler.choose(Step(step.logits, [], step.tokens, model, cache, step.penalties), key)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="dev")
    parser.add_argument("--out")
    args = parser.parse_args()
    model, tokenizer = load()
    tasks = ev.select_split(ev.load_tasks(ev.builtin_tasks_path()), args.split)

    def factory(name):
        if name in ("entropix_logits_only", "entropix_no_attention"):
            return LogitsOnly(make_sampler("entropix", model=model), rollouts=name == "entropix_no_attention")
        return make_sampler(name, model=model, **({"metrics": False} if name == "greedy" else {}))

    config = ev.EvalConfig(
        samplers=["greedy", "entropix", "entropix_no_attention", "entropix_logits_only"],
        model_name="smollm2-135m",
        split=args.split,
    )
    results = ev.run_eval(model, tokenizer, tasks, config, args.out, factory)
    print(ev.markdown_table(ev.table_rows(results, strategies=True)))


if __name__ == "__main__":
    main()
