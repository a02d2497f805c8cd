import datetime
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..decode.engine import generate_batch
from ..decode.rows import Request
from ..distributed import all_gather_json, run_on_root, world
from ..front import encode_prompt
from ..sampling.config import SamplerConfig, load_toml
from ..sampling.entropix import EntropixSampler
from ..sampling.samplers import GreedySampler, MinPSampler
from .calibrate import PROMPTS, QUANTILES, toml_value, write_card
from .opentext import EARLY_TOKENS, LOOP_ALERT, longest_loop, repeated_ngram_share
from .scoring import score
from .stats import sign_test
from .store import common_prefix, item_seed
from .tasks import builtin_tasks_path, load_tasks, select_split

# -- tuning on the dev split ------------------------------------------------------------
#
# Calibration's tuning: after the thresholds, compare a few sampler
# settings on the built-in tasks' dev split (accuracy, 32 tokens per answer, the
# eval's seeds) and on open text (PROMPTS above, 64 tokens, seeds 0 and 1), choose
# one by a fixed rule, and record every trial in the card's [tuning] table. The
# test split and the eval's open-text prompts are never looked at here.
#
# Each candidate is a set of overrides over the calibrated thresholds and the
# SamplerConfig defaults (not over the previous tuning), so a rerun compares the
# same settings. Kept small on purpose: every setting tried is reported.
NO_THINK = ["argmax", "branch", "resample", "adaptive"]


NO_THINK_NO_RESAMPLE = ["argmax", "branch", "adaptive"]


CONFIDENCE_BRANCH = {
    "strategies": NO_THINK_NO_RESAMPLE,
    "argmax_margin": 1.0,
    "branch_select": "confidence",
    "high_varentropy": 6.3016,
    "high_entropy": 20.0,
}


THINK_STATES_TOO = {
    **CONFIDENCE_BRANCH,
    "branch_rollout_tokens": 16,
    "branch_keep_margin": 0.1,
    "think_varentropy": 0.0,
}


SCORED_ROLLOUTS = {**THINK_STATES_TOO, "branch_rollout": "scored"}


TUNE_CANDIDATES = (
    ("card", {}),  # the calibrated card: thinking text " ...", no margin rule
    ("no-think", {"strategies": NO_THINK}),  # thinking text: none
    ("margin-3", {"argmax_margin": 3.0}),
    ("no-think, no-resample, margin-3", {"strategies": NO_THINK_NO_RESAMPLE, "argmax_margin": 3.0}),
    ("no-think, no-resample, margin-1", {"strategies": NO_THINK_NO_RESAMPLE, "argmax_margin": 1.0}),
    ("no-think, no-resample, margin-0.5", {"strategies": NO_THINK_NO_RESAMPLE, "argmax_margin": 0.5}),
    # Branch by confidence: branch takes every uncertain state below think's (high_varentropy
    # down to the bundled card's low_varentropy, no entropy ceiling), its candidates the 3
    # likeliest tokens, each rolled out greedily.
    *(
        (f"confidence-{n}, keep-{keep}", {**CONFIDENCE_BRANCH, "branch_rollout_tokens": n, "branch_keep_margin": keep})
        for n, keep in ((8, 0.1), (16, 0.1), (16, 0.0), (32, 0.1))
    ),
    # ... and the states think would take (think is off) too, instead of adaptive: on dev,
    # adaptive's draws in the middle of an answer were where confidence-16 still lost items.
    ("confidence-16, keep-0.1, think states too", THINK_STATES_TOO),
    # ... with rollouts that continue by the score (the argmax rule) instead of the model's
    # likeliest token: greedy rollouts run into a repetition and are cut far more often,
    # their look-ahead thrown away.
    ("confidence-16, keep-0.1, think states too, scored rollouts", SCORED_ROLLOUTS),
    # ... with the rows compared over their first k tokens, then only the winner rolling on
    # (branch_decide_tokens). Comparing over all 16 costs 3 passes per token handed out, too
    # slow with native weights on a CPU, where a row costs a full pass; k = 2 and 3 cost about
    # 1.25 and 1.4 (figures: docs/sampler.md, "Tuning").
    *(
        (
            f"confidence-16, keep-0.1, think states too, scored rollouts, decide-{k}",
            {**SCORED_ROLLOUTS, "branch_decide_tokens": k},
        )
        for k in (2, 3)
    ),
    # ... with the candidate's own probability counted in the comparison (a model without a
    # card gets it: a word's sure second piece cannot carry an unlikely first one).
    (
        "path-confidence-16, keep-0.1, think states too, scored rollouts, decide-2",
        {**SCORED_ROLLOUTS, "branch_decide_tokens": 2, "branch_select": "path_confidence"},
    ),
)


TUNE_SPLIT = "dev"


TUNE_ANSWER_TOKENS = 32


TUNE_OPEN_TOKENS = 64


TUNE_OPEN_SEEDS = (0, 1)


TUNED_FIELDS = (
    "strategies",
    "argmax_margin",
    "thinking_text",
    "max_thinking_insertions",
    "repetition_bits",
    "repetition_ngram",
    "adaptive_samples",
    "adaptive_max_temperature",
    "branch_candidates",
    "branch_rollout_tokens",
    "branch_select",
    "branch_keep_margin",
    "branch_rollout",
    "branch_decide_tokens",
    "high_entropy",
    "high_varentropy",
    "think_varentropy",
)


def _runs(model, tokenizer, prompts: list[list[int]], make, seeds, max_tokens: int):
    """(prompt index, seed, answer) of every prompt under each seed, in that
    order, batched as the eval batches them (batch 8, the eval's per-item
    seeds). Under a launcher each rank answers every size-th prompt and every
    rank gets all answers (tokens, logprobs, finish_reason)."""
    w = world()
    out = []
    for seed in seeds:
        mine = list(range(w.rank, len(prompts), w.size))
        requests = [Request(prompts[i], item_seed(seed, i), max_tokens) for i in mine]
        for k, result, _ in generate_batch(model, tokenizer, requests, make, 8, prefix=common_prefix(prompts)):
            out.append((mine[k], seed, result))
    if w.size > 1:
        answers = [(i, seed, [r.tokens, r.logprobs, r.finish_reason]) for i, seed, r in out]
        gathered = (a for part in all_gather_json(w, answers) for a in part)
        out = [(i, seed, Answer(*fields)) for i, seed, fields in gathered]
    return sorted(out, key=lambda x: (x[1], x[0]))


@dataclass
class Answer:
    """What tuning reads of an answer another rank decoded."""

    tokens: list[int]
    logprobs: list[float | None]
    finish_reason: str


def open_figures(runs) -> dict:
    """Open-text figures over (index, seed, result) runs: mean repeated-4-gram
    share, the longest back-to-back loop, outputs with a loop of 12+ tokens,
    the mean log-probability (nats, as the sampler reported it: the model's own
    distribution), early endings (end of turn before 16 tokens)."""
    shares = [s for _, _, r in runs if (s := repeated_ngram_share(r.tokens, 4)) is not None]
    loops = [longest_loop(r.tokens) for _, _, r in runs]
    lps = [sum(lp) / len(lp) for _, _, r in runs if (lp := [x for x in r.logprobs if x is not None])]
    return {
        "repeated_4gram_share": round(float(np.mean(shares)), 4) if shares else 0.0,
        "longest_loop": max(loops, default=0),
        "loops": sum(n >= LOOP_ALERT for n in loops),
        "mean_logprob": round(float(np.mean(lps)), 4) if lps else 0.0,
        "early_endings": sum(r.finish_reason == "eos" and len(r.tokens) < EARLY_TOKENS for _, _, r in runs),
    }


def acceptable(trial: dict, greedy: dict, min_p: dict) -> bool:
    """The open-text rule a chosen setting must meet on the tuning prompts: at
    most half greedy's repeated-4-gram share, no loop of 12+ tokens, a mean
    log-probability no lower than min_p's (T 0.7)."""
    o = trial["open"]
    return (
        o["repeated_4gram_share"] <= greedy["open"]["repeated_4gram_share"] / 2
        and o["loops"] == 0
        and o["mean_logprob"] >= min_p["open"]["mean_logprob"]
    )


def choose(trials: list[dict], greedy: dict, min_p: dict) -> dict:
    """The acceptable trial with the highest dev accuracy (the earlier one on a
    tie); with none acceptable, the one with the highest accuracy."""
    ok = [t for t in trials if acceptable(t, greedy, min_p)] or trials
    return max(ok, key=lambda t: (t["accuracy"], -trials.index(t)))


def tune(
    model, tokenizer, model_name: str, path, candidates=None, limit: int | None = None, progress=None
) -> tuple[dict, list[dict], dict, dict]:
    """Run greedy, min_p (T 0.7, open text only) and every candidate; choose one;
    write its settings into the card's [sampler] and every trial into [tuning].
    Returns (chosen, trials, greedy, min_p)."""
    candidates = TUNE_CANDIDATES if candidates is None else candidates
    path = Path(path)
    w = world()  # the card is rank 0's: the other ranks may have none, or an older one
    thresholds = run_on_root(w, lambda: {k: getattr(load_toml(path), k) for k in QUANTILES})
    thresholds_only = SamplerConfig().replace(**thresholds)
    tasks = select_split(load_tasks(builtin_tasks_path()), TUNE_SPLIT)[:limit]
    chat = [encode_prompt(tokenizer, [{"role": "user", "content": t.prompt_text()}]) for t in tasks]
    # A limit shortens the open text too: the prompts cost most of a tuning run.
    open_prompts = [encode_prompt(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS[:limit]]

    def measure(name, make, answers=True, seeds=TUNE_OPEN_SEEDS):
        if progress:
            progress(name)
        row = {"name": name}
        if answers:
            row["correct"] = [
                score(tokenizer.decode(r.tokens), tasks[i])[1]
                for i, _, r in sorted(_runs(model, tokenizer, chat, make, (0,), TUNE_ANSWER_TOKENS), key=lambda x: x[0])
            ]
            row["accuracy"] = round(sum(row["correct"]) / len(tasks), 4)
        row["open"] = open_figures(_runs(model, tokenizer, open_prompts, make, seeds, TUNE_OPEN_TOKENS))
        return row

    greedy = measure("greedy", lambda: GreedySampler(metrics=False), seeds=(0,))
    min_p = measure("min_p", lambda: MinPSampler(0.7, 0.1, metrics=False), answers=False)
    trials = []
    for name, overrides in candidates:
        config = thresholds_only.replace(**overrides)
        row = measure(name, lambda config=config: EntropixSampler(config, tokenizer))
        wins = sum(a and not b for a, b in zip(row["correct"], greedy["correct"], strict=False))
        losses = sum(b and not a for a, b in zip(row["correct"], greedy["correct"], strict=False))
        row.update(
            overrides=overrides,
            wins=wins,
            losses=losses,
            ties=len(tasks) - wins - losses,
            p=round(sign_test(wins, losses), 4),
        )
        trials.append(row)
    chosen = choose(trials, greedy, min_p)
    settings = {f: getattr(thresholds_only.replace(**chosen["overrides"]), f) for f in TUNED_FIELDS}
    if not w.root:
        return chosen, trials, greedy, min_p
    earlier = earlier_trials(path, {t["name"] for t in trials})
    write_card(
        path,
        tuned_card_text(
            path.read_text(),
            settings,
            tuning_table(chosen, trials, greedy, min_p, len(tasks), len(open_prompts), earlier),
        ),
    )
    return chosen, trials, greedy, min_p


def earlier_trials(path, names: set) -> list[dict]:
    """The card's trials from earlier tuning runs that this run did not repeat,
    each with the date of its run: kept for the record, never chosen from
    (they were measured on the code of their day)."""
    tuning = tomllib.loads(Path(path).read_text()).get("tuning", {})
    out = []
    for t in tuning.get("earlier", []) + [{"date": tuning.get("date", ""), **t} for t in tuning.get("trials", [])]:
        if t.get("name") not in names and t.get("name") not in {e["name"] for e in out}:
            out.append(t)
    return out


def tuning_table(
    chosen: dict,
    trials: list[dict],
    greedy: dict,
    min_p: dict,
    n_items: int,
    n_prompts: int,
    earlier: list[dict] = (),
) -> str:
    lines = [
        "# How [sampler]'s strategy settings were chosen (calibrate's tuning): every",
        "# setting tried, its dev-split accuracy (built-in tasks, 32 tokens, seed 0) against greedy,",
        "# and its open text on the calibration prompts (64 tokens, seeds 0-1). Rule: the best dev",
        "# accuracy among settings with at most half greedy's repeated-4-gram share, no loop of 12+",
        "# tokens and a mean log-probability no lower than min_p's (T 0.7).",
        "[tuning]",
        f"date = {toml_value(datetime.date.today().isoformat())}",
        f"split = {toml_value(TUNE_SPLIT)}",
        f"items = {n_items}",
        f"open_prompts = {n_prompts}",
        f"chosen = {toml_value(chosen['name'])}",
        f"greedy_accuracy = {greedy['accuracy']!r}",
        "greedy_open = " + _inline(greedy["open"]),
        "min_p_open = " + _inline(min_p["open"]),
    ]
    for t in trials:
        lines += [
            "",
            "[[tuning.trials]]",
            f"name = {toml_value(t['name'])}",
            "overrides = " + _inline(t["overrides"]),
            f"accuracy = {t['accuracy']!r}",
            f"wins_losses_ties = {toml_value([t['wins'], t['losses'], t['ties']])}",
            f"p = {t['p']!r}",
            "open = " + _inline(t["open"]),
        ]
    if earlier:
        lines += [
            "",
            "# Trials of earlier tuning runs, not repeated in this one: measured on the code of",
            "# their date, kept for the record, not chosen from.",
        ]
    for t in earlier:
        lines += ["", "[[tuning.earlier]]"] + [
            f"{k} = {_inline(v) if isinstance(v, dict) else toml_value(v)}" for k, v in t.items()
        ]
    return "\n".join(lines)


def _inline(d: dict) -> str:
    if not d:
        return "{}"
    return "{ " + ", ".join(f"{k} = {toml_value(list(v) if isinstance(v, tuple) else v)}" for k, v in d.items()) + " }"


def tuned_card_text(text: str, settings: dict, tuning: str) -> str:
    """The card with `settings` set in [sampler] (each key's line replaced, or
    added at the end of the table) and its [tuning] table replaced; everything
    else kept as it is."""
    lines = text.splitlines()
    out, table, seen = [], None, set()

    def flush_missing():
        for k, v in settings.items():
            if k not in seen:
                out.append(f"{k} = {toml_value(list(v) if isinstance(v, tuple) else v)}")
                seen.add(k)

    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            if table == "sampler":
                while out and not out[-1].strip():
                    out.pop()
                flush_missing()
                out.append("")
            table = stripped.strip("[]").split(".")[0].strip()
        elif table == "sampler" and "=" in stripped and not stripped.startswith("#"):
            key = stripped.split("=", 1)[0].strip()
            if key in settings:
                v = settings[key]
                out.append(f"{key} = {toml_value(list(v) if isinstance(v, tuple) else v)}")
                seen.add(key)
                continue
        out.append(line)
    if table == "sampler":
        flush_missing()
    body = other_tables_except("\n".join(out), "tuning")
    return body.rstrip("\n") + "\n\n" + tuning + "\n"


def other_tables_except(text: str, name: str) -> str:
    """`text` without the top-level table `name` (its sub-tables, arrays of
    tables and the comment lines just above its header included)."""
    kept, block, drop, pending = [], [], False, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            top = stripped.strip("[]").split(".")[0].strip().strip('"')
            if not drop:
                kept.extend(block)
            block, drop, pending = pending + [line], top == name, []
        elif stripped.startswith("#") or not stripped:
            pending.append(line)
        else:
            block += pending + [line]
            pending = []
    if not drop:
        kept.extend(block + pending)
    else:
        kept.extend(pending)
    return "\n".join(kept)
