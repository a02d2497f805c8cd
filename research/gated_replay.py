"""Replay gated `deliberate` rules offline from one wide pool run (docs/gated-deliberate.md).

Every rule starts from the greedy chain, reads its per-token measurements to decide whether
its answer stands, and otherwise adds candidates from the pool (first-token alternatives,
branches inside the chain), each stopped early by its running confidence if the rule says
so, and takes a CISC vote. A candidate's tokens are exactly the pool's: a branch continued
greedily from a prefix is the same whether it started during the greedy chain or after it.

    python -m research.gated_replay POOL_DIR [--json OUT.json] [--freeze SETTING.toml]
    python -m research.gated_replay --per-model STAGED_DIR... [--json OUT.json] [--freeze SETTING.toml]

POOL_DIR is an `eval --out` folder (or a docs/records/ pack: its gzipped parts are read); with
--per-model, live `deliberate_staged` runs (or wide pools) over different items, read as one pool.
"""

import argparse
import functools
import itertools
import json
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from entropix_mlx.eval.calibrate import toml_value  # noqa: E402
from entropix_mlx.eval.report import format_p  # noqa: E402
from entropix_mlx.eval.scoring import parse_number  # noqa: E402
from entropix_mlx.eval.stats import paired_comparison, paired_difference, wilson_interval  # noqa: E402
from entropix_mlx.sampling import gate as gates  # noqa: E402
from entropix_mlx.sampling.answers import numbers_in  # noqa: E402
from entropix_mlx.sampling.deliberate_config import REASONING_TABLE, DeliberateConfig  # noqa: E402
from entropix_mlx.sampling.gate import SIGNALS, WINDOW  # noqa: E402
from entropix_mlx.sampling.settings import read_toml  # noqa: E402

from .run_records import packed_records

VOTE_TEMPERATURE = 0.1
QUANTILES = (0.2, 0.35, 0.5, 0.65, 0.8)
CAP = 2.7  # the selection rule's most tokens, as a multiple of greedy's


@functools.cache  # the tables read one run several ways
def pool_records(folder: Path) -> list[dict]:
    """A run's records: its `eval --out` folder's items.jsonl, or its docs/records/ pack."""
    if not (folder / "items.jsonl").exists():
        return packed_records(folder)
    lines = (folder / "items.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def read_pool(folder: Path, sampler: str | None = None) -> list[dict]:
    """(greedy row, pool record) per item; the pool is every record of `sampler` (default:
    the one sampler beside greedy)."""
    return pool_of(pool_records(folder), sampler)


def pool_of(records: list[dict], sampler: str | None) -> list[dict]:
    greedy = {r["index"]: r for r in records if r["sampler"] == "greedy"}
    pool = {r["index"]: r for r in records if r["sampler"] == sampler or (sampler is None and r["sampler"] != "greedy")}
    return [(greedy.get(i), pool[i]) for i in sorted(pool)]


@dataclass
class Cand:
    kind: str  # "greedy", "first" (a first-token alternative), "inside" (a branch inside the chain)
    order: int  # its rank among its kind: the likeliest first tokens first, branch points in order
    split: int
    answer: Fraction | None
    right: bool
    ended: bool  # ended on its own before the limit
    own: int  # tokens it generated itself
    logprobs: list
    measures: dict
    answer_margin: float
    signals: dict | None = None
    stop: tuple | None = None  # (floor, where the running stop ends it at that floor)
    values: frozenset = frozenset()  # every number its text writes


def number(answer: str | None) -> Fraction | None:
    return None if answer is None else parse_number(answer)


def candidates(record: dict) -> list[Cand]:
    expected = parse_number(str(record["expected"]))
    out, firsts, insides = [], 0, 0
    for c in record["candidates"]:
        answer = number(c["answer"])
        if c["split"] is None:
            kind, order = "greedy", 0
        elif c["split"] == 0:
            kind, order, firsts = "first", firsts, firsts + 1
        else:
            kind, order, insides = "inside", insides, insides + 1
        out.append(
            Cand(
                kind,
                order,
                c["split"] or 0,
                answer,
                answer is not None and answer == expected,
                c["finish_reason"] != "length",
                c["own_tokens"],
                c["logprobs"],
                c.get("measures", {}),
                c["answer_margin"],
                values=frozenset(value for value, _, _ in numbers_in(c.get("text", ""))),
            )
        )
    firsts_sorted = sorted((c for c in out if c.kind == "first"), key=lambda c: -c.logprobs[0])
    for rank, c in enumerate(firsts_sorted):
        c.order = rank
    insides_sorted = sorted((c for c in out if c.kind == "inside"), key=lambda c: c.split)
    for rank, c in enumerate(insides_sorted):
        c.order = rank
    return out


def signals(g: Cand) -> dict:
    if g.signals is None:  # every rule reads the same chain: measured once
        g.signals = gates.signals(g.logprobs, g.answer_margin, g.measures, WINDOW)
    return g.signals


def stopped_at(c: Cand, floor: float) -> int | None:
    """DeepConf online: the token count at which the candidate's running 16-token mean
    log-probability first falls below `floor` (None: it never does). The floor is its
    question's greedy chain's, the same for every rule: found once."""
    if c.stop is None or c.stop[0] != floor:
        c.stop = (floor, gates.stopped_at(c.logprobs[c.split :], floor, WINDOW))
    return c.stop[1]


def vote(cands: list[Cand]) -> tuple[Fraction | None, bool]:
    """CISC over the candidates that ended (all of them when none did): (answer, right)."""
    pool = [c for c in cands if c.ended and c.answer is not None] or [c for c in cands if c.answer is not None]
    if not pool:
        return None, cands[0].right
    weights: dict = {}
    for c in pool:
        mean = sum(c.logprobs) / len(c.logprobs) if c.logprobs else 0.0
        weights[c.answer] = weights.get(c.answer, 0.0) + math.exp(mean / VOTE_TEMPERATURE)
    best = max(weights, key=lambda a: (weights[a], -[c.answer for c in pool].index(a)))
    return best, any(c.answer == best and c.right for c in pool)


@dataclass(frozen=True)
class Rule:
    name: str
    signal: str | None  # None: never stops at greedy
    quantile: float  # share of questions that stop at greedy (from the dev quantile of the signal)
    firsts: int  # first-token alternatives an unsure question adds
    insides: int  # branches inside the chain it adds
    staged: bool  # the rest only when the first stage disagrees with greedy
    online_stop: bool  # DeepConf online: stop a candidate whose running confidence falls below greedy's lowest group
    disagreement_only: bool = False  # the `staged` baseline's own rule
    # the `staged` baseline's first pair, always, and its second stage when the pair disagrees
    # "and" / "or" the gate finds the chain unsure, or (PAIR_READS) when it disagrees and the
    # pair itself reads as contested: tried after the sealed scoring
    second_stage: str = ""
    first_stage: int = 0  # how many candidates the first stage starts (0: half)


# What a pair rule reads: the alternative chain's own signal ("alt"), or that less greedy's ("gap");
# or the two texts together: the share of their numbers they both write, high ("shared") or low ("parted").
PAIR_READS = ("alt", "gap", "shared", "parted")
NUMBERS = "numbers"  # the signal name of the rules that read the texts
THEN_STAGED = "then staged"  # the gate decides whether the `staged` baseline runs at all


STAGED = Rule("staged (disagreement only)", None, 0.0, 4, 0, True, False, disagreement_only=True)


def pick(cands: list[Cand], firsts: int, insides: int) -> list[Cand]:
    f = sorted((c for c in cands if c.kind == "first"), key=lambda c: c.order)[:firsts]
    i = sorted((c for c in cands if c.kind == "inside"), key=lambda c: c.order)[:insides]
    return f + i


def settled(group: list[Cand]) -> bool:
    """The staged baseline's stop: every candidate ended on one answer."""
    return gates.settled([(c.ended, c.answer) for c in group])


def pair_value(rule: Rule, cands: list[Cand]) -> float:
    g, alternative = cands[0], pick(cands, 1, 0)[0]
    if rule.signal == NUMBERS:
        shared = len(g.values & alternative.values) / max(1, len(g.values | alternative.values))
        return shared if rule.second_stage == "shared" else 1 - shared
    value = signals(alternative)[rule.signal]
    return value - signals(g)[rule.signal] if rule.second_stage == "gap" else value


def replay(rule: Rule, cands: list[Cand], gate: float | None) -> dict:
    g = cands[0]
    spent, rerun = g.own, 0
    if rule.disagreement_only or rule.second_stage:
        first = [g, *pick(cands, 1, 0)]
        spent += sum(c.own for c in first[1:])
        chosen = first
        split = not settled(first)
        if rule.second_stage in PAIR_READS:  # the pair reads as contested
            split = split and pair_value(rule, cands) >= gate
        elif rule.second_stage in ("and", "or"):
            unsure = not gates.sure(g.ended, signals(g)[rule.signal], gate)
            split = (split and unsure) if rule.second_stage == "and" else (split or unsure)
        if split:
            more = pick(cands, 4, 0)[1:]
            spent += sum(c.own for c in more)
            rerun += len(more)
            chosen = first + more
        answer, right = vote(chosen)
        return {"right": right, "tokens": spent, "rerun": rerun, "spent_more": len(chosen) > 1, "answer": answer}
    if rule.signal is not None and gates.sure(g.ended, signals(g)[rule.signal], gate):
        return {"right": g.right, "tokens": spent, "rerun": 0, "spent_more": False, "answer": g.answer, "voters": [g]}
    stages = gates.stages(pick(cands, rule.firsts, rule.insides), rule.staged, rule.first_stage)
    floor = signals(g)["lowest_group"] if rule.online_stop else None  # the greedy chain's weakest window
    voters = [g]
    for n, stage in enumerate(stages):
        if n > 0 and settled(voters):
            break
        for c in stage:
            stop = stopped_at(c, floor) if floor is not None else None
            spent += stop if stop is not None else c.own
            rerun += 1
            if stop is None:
                voters.append(c)
    answer, right = vote(voters)
    return {"right": right, "tokens": spent, "rerun": rerun, "spent_more": True, "answer": answer, "voters": voters}


def grid() -> list[Rule]:
    sets = [(1, 0), (2, 0), (4, 0), (0, 1), (0, 2), (0, 3), (1, 1), (2, 2)]
    rules = [STAGED]
    for signal, q in [(None, 0.0), *itertools.product(SIGNALS, QUANTILES)]:
        for (f, i), staged, online in itertools.product(sets, (False, True), (False, True)):
            if staged and f + i < 2:
                continue
            gate = "always" if signal is None else f"{signal}>=q{q:g}"
            name = f"{gate} +{f}first +{i}inside{' staged' if staged else ''}{' deepconf' if online else ''}"
            rules.append(Rule(name, signal, q, f, i, staged, online))
    return rules


def after_sealed() -> list[Rule]:
    """Rules replayed after the sealed scoring, to see what might close its gap to `staged`:
    outside grid(), so they can change neither the choice nor the frozen setting."""
    read = {"alt": "the alternative's {}", "gap": "the alternative's {} less greedy's"}
    texts = {"shared": "the share of numbers both write", "parted": "the share of numbers one writes alone"}
    whens = (
        [
            (how, s, q, f"split {how} not {s}>=q{q:g}")
            for how in ("and", "or")
            for s, q in itertools.product(SIGNALS, QUANTILES)
        ]
        + [
            (how, s, q, f"split and {read[how].format(s)}>=q{q:g}")
            for how in read
            for s, q in itertools.product(SIGNALS, QUANTILES)
        ]
        + [(how, NUMBERS, q, f"split and {texts[how]}>=q{q:g}") for how in texts for q in QUANTILES]
    )
    return [
        Rule(f"staged pair; +3first if {when}", s, q, 4, 0, True, False, second_stage=how) for how, s, q, when in whens
    ]


def per_model() -> list[Rule]:
    """The rules a live `staged` pool can replay (tried on the 1.5B model after both sealed
    scorings, its gates at its own quantiles): the baseline; the gate in front of it; the gate
    in front of one first-token alternative; and the after-sealed families that run the pair
    always and decide its second stage ("or" would need second stages the pool never ran)."""
    # `staged` behind the gate: an unsure question's likeliest other first token, then three more
    front = [
        Rule(f"{s}>=q{q:g} {THEN_STAGED}", s, q, 4, 0, True, False, first_stage=1)
        for s, q in itertools.product(SIGNALS, QUANTILES)
    ]
    one = [
        Rule(f"{s}>=q{q:g} +1first +0inside", s, q, 1, 0, False, False)
        for s, q in itertools.product(SIGNALS, QUANTILES)
    ]
    return [STAGED, *front, *one, *(r for r in after_sealed() if r.second_stage != "or")]


def staged_pool_check(folder: Path, pool: list) -> None:
    """A live `staged` run holds every candidate per_model() reads: the three later first
    tokens exactly where the pair did not settle; a wide pool all four on every item."""
    for _, record in pool:
        cands = candidates(record)
        firsts = sum(c.kind == "first" for c in cands)
        staged = record["sampler"] == "deliberate_staged"
        want = 1 if staged and settled([cands[0], *pick(cands, 1, 0)]) else 4
        off = firsts != want if staged else firsts < want  # a wide pool may hold more
        if off:
            kind = "staged" if staged else "wide"
            raise SystemExit(
                f"{folder}: item {record['index']} has {firsts} first tokens, not {want}: not a {kind} pool"
            )


def live_fields(rule: Rule, gate: float | None) -> dict | None:
    """The [deliberate] fields that run `rule` live over the pool's own table
    (docs/records/dev_q05_wide/pool.toml); None for the staged baseline (the
    `deliberate_staged` preset)."""
    if rule.disagreement_only or rule.second_stage:
        return None
    return {
        # "never stop": a mean log-probability is never at or above 1
        "gate_signal": rule.signal or "lowest_group",
        "gate_threshold": 1.0 if gate is None else float(gate),
        "gate_first_alternatives": rule.firsts,
        "gate_branches": rule.insides,
        "gate_staged": rule.staged,
        "first_stage": rule.first_stage,
        "running_stop": rule.online_stop,
    }


def rule_of(setting: dict) -> Rule:
    """live_fields() read back: the rule a gated [deliberate] setting runs."""
    return Rule(
        "live",
        setting["gate_signal"],
        0.0,
        setting["gate_first_alternatives"],
        setting["gate_branches"],
        setting["gate_staged"],
        setting["running_stop"],
        first_stage=setting["first_stage"],
    )


def gate_at_quantile(rule: Rule, items: list[list[Cand]]) -> float | None:
    """Stop at greedy on the surest `quantile` share of these questions (a pair rule: spend
    the second stage on the `quantile` share read as contested)."""
    if rule.signal is None:
        return None
    if rule.second_stage in PAIR_READS:
        v = sorted(pair_value(rule, c) for c in items)
    else:
        v = sorted(signals(c[0])[rule.signal] for c in items)
    return v[min(len(v) - 1, int(len(v) * (1 - rule.quantile)))]


def table(pool: list, rules: list[Rule], fixed: dict | None = None) -> list[dict]:
    """Every rule's row over the pool, its gate at the pool's own quantile, or the one `fixed`
    gives for its name (a threshold carried from another pool)."""
    items = [(greedy, candidates(record)) for greedy, record in pool]
    greedy_right = {i: float(c[0].right) for i, (_, c) in enumerate(items)}
    greedy_tokens = sum(c[0].own for _, c in items) / len(items)
    rows = []
    for rule in rules:
        fixed_here = fixed is not None and rule.name in fixed
        gate = fixed[rule.name] if fixed_here else gate_at_quantile(rule, [c for _, c in items])
        outcomes = [replay(rule, c, gate) for _, c in items]
        right = {i: float(o["right"]) for i, o in enumerate(outcomes)}
        n, k = len(outcomes), sum(right.values())
        vs = paired_comparison(right, greedy_right)
        diff = paired_difference(right, greedy_right)
        tokens = sum(o["tokens"] for o in outcomes) / n
        rows.append(
            {
                "rule": rule.name,
                "reads_measurements": rule.signal is not None,
                "accuracy": k / n,
                "interval": wilson_interval(k, n),
                "tokens": tokens,
                "x_greedy": tokens / greedy_tokens,
                "rerun_rows": sum(o["rerun"] for o in outcomes) / n,
                "spent_more": sum(o["spent_more"] for o in outcomes) / n,
                "wins": vs["wins"],
                "losses": vs["losses"],
                "p": vs["p_value"],
                "diff": diff,
                "deliberate": live_fields(rule, gate),
                "gate": gate,
                "right": [o["right"] for o in outcomes],
            }
        )
    return rows


def choose(rows: list[dict], cap: float = CAP) -> dict | None:
    """docs/gated-deliberate.md's selection rule: the rules that read the measurements, at
    most `cap` x greedy's tokens; the best accuracy, every rule within 1 point of it level,
    and of those the fewest tokens."""
    eligible = [r for r in rows if r["reads_measurements"] and r["x_greedy"] <= cap]
    if not eligible:
        return None
    best = max(r["accuracy"] for r in eligible)
    level = [r for r in eligible if r["accuracy"] >= best - 0.01 - 1e-12]
    return min(level, key=lambda r: (r["tokens"], -r["accuracy"]))


def summary(pool: list, rules: list[Rule], fixed: dict | None = None) -> dict:
    """The pool's greedy figures, every rule's row and the one the selection rule picks."""
    rows = table(pool, rules, fixed)
    greedy = [candidates(record)[0] for _, record in pool]
    right = sum(g.right for g in greedy)
    return {
        "items": len(pool),
        "greedy": {"accuracy": right / len(pool), "interval": wilson_interval(right, len(pool))},
        "greedy_tokens": sum(g.own for g in greedy) / len(pool),
        "rows": rows,
        "chosen": choose(rows),
    }


def results(folder: Path) -> dict:
    """The wide pool's rules and the after-sealed ones, beside the baseline they are to beat."""
    pool = read_pool(folder)
    return {**summary(pool, grid()), "after_sealed": table(pool, [STAGED, *after_sealed()])}


def staged_pool(*folders: Path) -> list:
    """The live `staged` runs (or wide pools) in `folders` as one pool (each over different items)."""
    pool = []
    for folder in folders:
        records = pool_records(folder)
        staged = any(r["sampler"] == "deliberate_staged" for r in records)
        part = pool_of(records, "deliberate_staged" if staged else "deliberate")
        staged_pool_check(folder, part)
        pool += part
    indices = [record["index"] for _, record in pool]
    if len(set(indices)) != len(indices):
        raise SystemExit(f"{', '.join(map(str, folders))}: the runs share items; one pool needs different ones")
    return pool


def results_per_model(*folders: Path) -> dict:
    """per_model()'s rules over a live `staged` pool, the selection rule applied to them."""
    return summary(staged_pool(*folders), per_model())


def held_out(chosen: dict, *checks: Path, also: tuple[str, ...] = ()) -> dict:
    """The rules chosen on one staged pool (`chosen`: its results_per_model()) replayed on
    others (as one) with their thresholds fixed where they were chosen: the one the selection rule
    picks, the most accurate within the cap and the rules named in `also`, beside `staged`;
    each also paired with `staged` on the new items."""
    within = [r for r in chosen["rows"] if r["reads_measurements"] and r["x_greedy"] <= CAP]
    best = min(within, key=lambda r: (-r["accuracy"], r["tokens"]))
    names = list(dict.fromkeys([chosen["chosen"]["rule"], best["rule"], *also]))
    by_name = {r.name: r for r in per_model()}
    fixed = {r["rule"]: r["gate"] for r in chosen["rows"] if r["rule"] in names}
    res = summary(staged_pool(*checks), [STAGED, *(by_name[n] for n in names)], fixed)
    res["chosen"] = res["rows"][1]  # the choice is the one made on `choice`, not this pool's best
    staged = dict(enumerate(res["rows"][0]["right"]))
    for r in res["rows"][1:]:
        r["vs_staged"] = paired_comparison(dict(enumerate(r["right"])), staged)
    return {**res, "choice_items": chosen["items"]}


def live_against_replay(live: Path, pool: Path) -> dict:
    """A gated setting run live (`eval --samplers deliberate --config SETTING`) beside its
    replay from a staged pool over the same items: the rule its config.json names, at its
    threshold. The live greedy chain decodes alone, the pool's beside its pair, so they agree
    to rounding only: counted, not assumed."""
    setting = json.loads((live / "config.json").read_text())["samplers"]["deliberate"]
    rule = rule_of(setting)
    runs = {r["index"]: r for r in pool_records(live) if r["sampler"] == "deliberate"}
    replays = {rec["index"]: candidates(rec) for _, rec in read_pool(pool, "deliberate_staged")}
    items = sorted(set(runs) & set(replays))
    pairs = [(runs[i], replay(rule, replays[i], setting["gate_threshold"])) for i in items]
    return {
        "items": len(items),
        "spent_more": (sum(len(r["candidates"]) > 1 for r, _ in pairs), sum(w["spent_more"] for _, w in pairs)),
        "right": (sum(bool(r["correct"]) for r, _ in pairs), sum(bool(w["right"]) for _, w in pairs)),
        "same_answer": sum(number(r["extracted"]) == w["answer"] for r, w in pairs),
        "same_tokens": sum(r["tokens_spent"] == w["tokens"] for r, w in pairs),
        "tokens": (sum(r["tokens_spent"] for r, _ in pairs), sum(w["tokens"] for _, w in pairs)),
    }


def live_markdown(res: dict, where: str) -> str:
    head = ["items", "spent more (live / replay)", "right (live / replay)", "same answer", "same tokens spent"]
    cells = [
        str(res["items"]),
        "{} / {}".format(*res["spent_more"]),
        "{} / {}".format(*res["right"]),
        f"{res['same_answer']} of {res['items']}",
        f"{res['same_tokens']} of {res['items']} ({res['tokens'][0]:,} / {res['tokens'][1]:,} in all)",
    ]
    lines = ["| " + " | ".join([*head, "records"]) + " |", "| --- |" + " --- |" * len(head)]
    return "\n".join([*lines, "| " + " | ".join([*cells, where]) + " |"])


LENGTH = "chain length"  # fewer tokens surer: a reference beside the gate signals, not one of them


def auroc(right: list[float], wrong: list[float]) -> tuple[float, tuple[float, float]]:
    """How often a right chain reads surer than a wrong one (ties half): 0.5 ranks nothing,
    below it ranks backwards; with Hanley and McNeil's 95% interval."""
    if not right or not wrong:
        return float("nan"), (float("nan"), float("nan"))
    a = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong) / (len(right) * len(wrong))
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (len(right) - 1) * (q1 - a * a) + (len(wrong) - 1) * (q2 - a * a)) / (len(right) * len(wrong))
    half = 1.96 * math.sqrt(max(0.0, var))
    return a, (max(0.0, a - half), min(1.0, a + half))


def rank_correlation(a: list[float], b: list[float]) -> float:
    """Spearman's: the correlation of the two lists' ranks (ties share their mean rank)."""

    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        out = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in order[i : j + 1]:
                out[k] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


def ranking(folder: Path, sampler: str) -> dict:
    """How well each gate signal of the greedy chains in `sampler`'s records ranks the wrong
    answers below the right ones, read as the gate reads it (a chain cut off by the limit is
    the least sure of all)."""
    pool = read_pool(folder, sampler)
    chains = [candidates(record)[0] for _, record in pool]
    # One prompt's tokens: the greedy row's (a pool record's `prompt_tokens` sums its candidates'
    # prompts); a pool without greedy rows has only its own.
    context = [(greedy or record)["prompt_tokens"] + g.own for (greedy, record), g in zip(pool, chains, strict=True)]
    reads = {s: [signals(g)[s] if g.ended else -math.inf for g in chains] for s in SIGNALS}
    reads[LENGTH] = [-g.own if g.ended else -math.inf for g in chains]
    return {
        "items": len(chains),
        "wrong": sum(not g.right for g in chains),
        # why head agreement reads as it does: the heads' mean disagreement falls as the context grows
        "agreement_by_length": rank_correlation([signals(g)["head_agreement"] for g in chains], context),
        "auroc": {
            s: auroc(
                [v for v, g in zip(vs, chains, strict=True) if g.right],
                [v for v, g in zip(vs, chains, strict=True) if not g.right],
            )
            for s, vs in reads.items()
        },
    }


def ranking_markdown(pools: list[tuple[str, dict, str]]) -> str:
    """One row a pool (label, ranking(), records): each signal's AUROC and its interval."""
    names = [*SIGNALS, LENGTH]
    lines = [
        "| greedy chains | wrong | "
        + " | ".join(f"`{n}`" if n in SIGNALS else n for n in names)
        + " | `head_agreement` by context length | records |",
        "| --- |" + " --- |" * (len(names) + 3),
    ]
    for label, r, where in pools:
        cells = [f"{a:.2f} [{lo:.2f}, {hi:.2f}]" for a, (lo, hi) in (r["auroc"][n] for n in names)]
        lines.append(
            f"| {label} | {r['wrong']} of {r['items']} | "
            + " | ".join(cells)
            + f" | {r['agreement_by_length']:+.2f} | {where} |"
        )
    return "\n".join(lines)


def fixable(folder: Path, sampler: str, signal: str, threshold: float) -> dict:
    """Where a gate on `signal` at `threshold` spends and where it keeps greedy's answer: how many of
    greedy's answers are wrong there, and how many of those the `staged` baseline puts right
    (read from a pool that ran it: replayed from a wide one, or its own records)."""
    out = {"items": 0}
    for _, record in read_pool(folder, sampler):
        cands = candidates(record)
        g = cands[0]
        side = "kept" if gates.sure(g.ended, signals(g)[signal], threshold) else "spent"
        tally = out.setdefault(side, {"items": 0, "wrong": 0, "fixed": 0})
        tally["items"] += 1
        out["items"] += 1
        if not g.right:
            tally["wrong"] += 1
            tally["fixed"] += replay(STAGED, cands, None)["right"]
    return out


def fixable_markdown(pools: list[tuple[str, dict, str]]) -> str:
    """One row a pool (label, fixable(), records)."""
    head = ["greedy chains", "the gate spends on", "greedy wrong there", "`staged` puts right"]
    head += ["it keeps greedy on", "greedy wrong there", "`staged` puts right", "records"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " --- |" * (len(head) - 1)]

    def share(k: int, n: int) -> str:
        return f"{k} ({100 * k / n:.0f}%)" if n else "0"

    for label, r, where in pools:
        cells = [label]
        for side in ("spent", "kept"):
            t = r.get(side, {"items": 0, "wrong": 0, "fixed": 0})
            cells += [f"{t['items']} of {r['items']}", share(t["wrong"], t["items"]), share(t["fixed"], t["wrong"])]
        lines.append("| " + " | ".join([*cells, where]) + " |")
    return "\n".join(lines)


def frozen(folder: Path, res: dict) -> str:
    """The shipped reasoning setting (entropix_mlx/data/deliberate_reasoning.toml): every
    field of the pool's [deliberate] table (its pool.toml) with the chosen rule's gate."""
    head = [
        "# Frozen before the sealed scoring: the dev pool's [deliberate] table",
        "# (docs/records/dev_q05_wide/pool.toml) with the gate of the rule that the selection rule of",
        f"# docs/gated-deliberate.md chose on its {res['items']} items: {res['chosen']['rule']}.",
        "# Written by research/gated_replay.py --freeze from the committed records; a test holds it to them.",
    ]
    return setting_text(head, REASONING_TABLE, read_toml(folder / "pool.toml")["deliberate"], res["chosen"])


def setting_text(head: list[str], name: str, base: dict, chosen: dict) -> str:
    """A TOML table `name` naming every field: `base` with the chosen rule's gate, under `head`."""
    config = DeliberateConfig(**{**base, **chosen["deliberate"]})
    lines = [*head, f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in config.to_dict().items())]
    return "\n".join(lines) + "\n"


def next_freeze(folders: tuple[Path, ...], res: dict) -> str:
    """A candidate for the next freeze, not scored: the staged pools' own `deliberate_staged`
    table with the gate of the rule the selection rule chose over them, as the [deliberate]
    table that `--config` runs (a card's [deliberate_reasoning] once frozen)."""
    every = [json.loads((f / "config.json").read_text()) for f in folders]
    configs = [c for c in every if "deliberate_staged" in c["samplers"]]  # a wide pool has no staged table
    if not configs:
        raise SystemExit(f"{', '.join(map(str, folders))}: no live staged run, whose table the setting takes")
    if any(c["model"] != every[0]["model"] for c in every) or any(
        c["samplers"] != configs[0]["samplers"] for c in configs
    ):
        raise SystemExit(f"{', '.join(map(str, folders))}: the runs' models or settings differ")
    head = [
        "# A candidate for the next freeze, not scored: the `deliberate_staged` table of the staged dev",
        f"# pools of {configs[0]['model']} ({', '.join(f.name for f in folders)}) with the gate of the",
        f"# rule that the selection rule of docs/gated-deliberate.md chose on their {res['items']} items:",
        f"# {res['chosen']['rule']}.",
        "# Written by research/gated_replay.py --per-model --freeze from the committed records; a test",
        "# holds it to them. Run it: entropix-mlx run --reasoning --sampler deliberate --config THIS_FILE",
    ]
    return setting_text(head, "deliberate", configs[0]["samplers"]["deliberate_staged"], res["chosen"])


ROW_HEAD = ["accuracy [95% CI]", "tokens × greedy", "W/L vs greedy", "p", "diff [95% CI]", "spent more"]


def row_cells(r: dict, label: str) -> list[str]:
    """`label` and a row's cells under ROW_HEAD."""
    lo, hi = r["interval"]
    accuracy = f"{100 * r['accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
    if "diff" not in r:
        return [label, accuracy, "1.00", "", "", "", ""]
    d, (dlo, dhi) = r["diff"]["difference"], r["diff"]["ci95"]
    return [
        label,
        accuracy,
        f"{r['x_greedy']:.2f}",
        f"{r['wins']}/{r['losses']}",
        format_p(r["p"]),
        f"{100 * d:+.1f} [{100 * dlo:+.1f}, {100 * dhi:+.1f}]",
        f"{100 * r['spent_more']:.0f}%",
    ]


def markdown(res: dict, every: bool, where: str, top: int = 10) -> str:
    """Every rule (`every`), best first, or the summary: greedy, the staged baseline, the
    chosen rule, the spend-always rules, the best `top` under the cap and the best 3 over it."""
    rows = sorted(res["rows"], key=lambda r: (-r["accuracy"], r["tokens"]))
    chosen = res["chosen"]
    if not every:
        eligible = [r for r in rows if r["reads_measurements"] and r["x_greedy"] <= CAP]
        over = [r for r in rows if r["x_greedy"] > CAP]
        spend = [r for r in rows if not r["reads_measurements"] and r["rule"] != STAGED.name]
        base = [r for r in rows if r["rule"] == STAGED.name]
        picked = [*base, *([chosen] if chosen else []), *eligible[:top], *over[:3], *spend[:3]]
        rows = [r for i, r in enumerate(picked) if r not in picked[:i]]
    head = ["rule", *ROW_HEAD, "records"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " --- |" * (len(head) - 1)]
    lines.append("| " + " | ".join([*row_cells(res["greedy"], "greedy"), where]) + " |")
    for r in rows:
        label = f"**{r['rule']}** (chosen)" if r is chosen else f"`{r['rule']}`"
        lines.append("| " + " | ".join([*row_cells(r, label), where]) + " |")
    return "\n".join(lines)


def held_out_markdown(res: dict, where: str) -> str:
    """held_out()'s rows: each threshold as it was set where the rule was chosen."""
    head = [
        "rule",
        f"threshold (set on the {res['choice_items']} items it was chosen on)",
        *ROW_HEAD,
        "W/L vs staged",
        "p vs staged",
        "records",
    ]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " --- |" * (len(head) - 1)]
    greedy = row_cells(res["greedy"], "greedy")
    lines.append("| " + " | ".join([greedy[0], "", *greedy[1:], "", "", where]) + " |")
    for r in res["rows"]:
        label = f"**{r['rule']}** (chosen)" if r is res["chosen"] else f"`{r['rule']}`"
        cells = row_cells(r, label)
        threshold = "" if r["gate"] is None else f"{r['gate']:.4f}"
        vs = r.get("vs_staged")
        against = [f"{vs['wins']}/{vs['losses']}", format_p(vs["p_value"])] if vs else ["", ""]
        lines.append("| " + " | ".join([cells[0], threshold, *cells[1:], *against, where]) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pool", type=Path, nargs="+")
    parser.add_argument(
        "--per-model", action="store_true", help="the pools are live staged runs (or wide pools), read as one"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--freeze", type=Path, help="write the chosen rule's reasoning setting here")
    args = parser.parse_args()
    if not args.per_model and len(args.pool) > 1:
        parser.error("one wide pool, or --per-model for live staged runs")
    if args.per_model:
        res = summary(staged_pool(*args.pool), per_model())
    else:
        res = summary(read_pool(args.pool[0]), grid())
    rows, chosen = res["rows"], res["chosen"]
    if args.json:
        args.json.write_text(json.dumps({"items": res["items"], "rows": rows, "chosen": chosen}, indent=1) + "\n")
    print(f"{res['items']} items; greedy {100 * res['greedy']['accuracy']:.1f}%; {len(rows)} rules")
    shown = sorted(rows, key=lambda r: (-r["accuracy"], r["tokens"]))[: args.top]
    for r in shown + ([chosen] if chosen and chosen not in shown else []):
        mark = "*" if r is chosen else " "
        print(
            f"{mark} {100 * r['accuracy']:5.1f}%  {r['x_greedy']:4.2f}x  W/L {r['wins']:>2}/{r['losses']:<2} "
            f"p {format_p(r['p'])}  {r['rule']}"
        )
    if chosen:
        print(f"  chosen, live: the pool's [deliberate] table with {chosen['deliberate']}")
    if args.freeze and chosen:
        args.freeze.write_text(next_freeze(tuple(args.pool), res) if args.per_model else frozen(args.pool[0], res))
        print(f"  frozen: {args.freeze}")
    base = next(r for r in rows if r["rule"] == STAGED.name)
    print(f"  baseline {100 * base['accuracy']:5.1f}%  {base['x_greedy']:4.2f}x  W/L {base['wins']}/{base['losses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
