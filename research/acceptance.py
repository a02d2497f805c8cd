"""Issue 64's acceptance targets, read off one sealed scoring's summary (research/tables.py,
kind "acceptance"): each target with the figure reached and whether it holds.

The targets are the issue's, as written before the scoring: greedy cut off on at most
5%; the chosen `deliberate` at least MIN_GAIN points above greedy with p < 0.05; on the
0.5B model its accuracy at least self-consistency k=8's at no more than a third of k=8's
tokens, and above the disagreement-only staged rule at no more of its tokens; on the 1.5B
model at least CISC's at equal tokens: the CISC row with the fewest tokens of those with
at least 90% of deliberate's, so that CISC never has fewer.
"""

from entropix_mlx.eval.report import generated_tokens

CUT_OFF = 0.05
P = 0.05


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def verdict(ok: bool) -> str:
    return "**holds**" if ok else "**missed**"


def targets(results: dict, min_gain: float, against: str) -> list[tuple[str, str, bool]]:
    """(target, figure reached, holds) for each target; `against`: "sc-staged" (0.5B) or "cisc" (1.5B)."""
    rows = results["samplers"]
    greedy, mine = rows["greedy"], rows["deliberate"]
    tokens = generated_tokens(mine)
    vs = mine["vs_greedy"]
    out = [
        ("greedy cut off <= 5%", pct(greedy["cut_off"]), greedy["cut_off"] <= CUT_OFF),
        (
            f"deliberate >= greedy + {100 * min_gain:.0f} points, p < 0.05",
            f"{100 * vs['difference']:+.1f} points ({pct(mine['accuracy'])} against {pct(greedy['accuracy'])}), "
            f"W/L {vs['wins']}/{vs['losses']}, p {vs['p_value']:.3g}",
            vs["difference"] >= min_gain - 1e-9 and vs["p_value"] < P,
        ),
    ]
    if against == "sc-staged":
        sc, staged = rows["self_consistency k=8"], rows["deliberate_staged"]
        share = tokens / generated_tokens(sc)
        out.append(
            (
                "deliberate >= self-consistency k=8 at <= 1/3 of its tokens",
                f"{pct(mine['accuracy'])} against {pct(sc['accuracy'])}, at {share:.2f} of its tokens",
                mine["accuracy"] >= sc["accuracy"] and share <= 1 / 3,
            )
        )
        pair = results["pairs"]["deliberate vs deliberate_staged"]
        share = tokens / generated_tokens(staged)
        out.append(
            (
                "deliberate above staged at equal or fewer tokens (paired)",
                f"{pct(mine['accuracy'])} against {pct(staged['accuracy'])}, W/L {pair['wins']}/{pair['losses']}, "
                f"at {share:.2f} of its tokens",
                mine["accuracy"] > staged["accuracy"] and share <= 1,
            )
        )
    else:
        enough = [n for n in rows if n.startswith("cisc k=") and generated_tokens(rows[n]) >= 0.9 * tokens]
        name = min(enough, key=lambda n: generated_tokens(rows[n]))
        cisc = rows[name]
        share = generated_tokens(cisc) / tokens
        out.append(
            (
                "deliberate >= CISC at equal tokens (within 10%)",
                f"{pct(mine['accuracy'])} against {name} {pct(cisc['accuracy'])}, "
                f"which spends {share:.2f}× deliberate's tokens"
                + ("" if share <= 1.1 else " (no CISC row lies within 10% of them: this is the next one up)"),
                mine["accuracy"] >= cisc["accuracy"],
            )
        )
    return out


def markdown(results: dict, min_gain: float, against: str, where: str) -> str:
    lines = ["| target | reached | verdict | records |", "| --- | --- | --- | --- |"]
    for target, figure, ok in targets(results, min_gain, against):
        lines.append(f"| {target} | {figure} | {verdict(ok)} | {where} |")
    return "\n".join(lines)
