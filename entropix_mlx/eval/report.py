"""Reports: the CLI's tables, Markdown tables (as in docs/evaluation.md), and the plots."""

from .summary import split_label, vote_k


def format_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def generated_tokens(summary: dict) -> float:
    """Tokens generated per answer, every candidate counted; the chosen answer's
    length in results written before that was counted."""
    return summary["tokens_generated"] if "tokens_generated" in summary else summary["mean_tokens"]


def table_rows(results: dict, strategies: bool = True) -> list[dict]:
    """One row of display strings per sampler and budget (the CLI's table, the
    Markdown one): accuracy, then what it cost with every candidate counted,
    then the paired comparison with greedy at the same budget."""
    rows = []
    split = results.get("split", "all")
    for name, s in results["samplers"].items():
        lo, hi = s["ci95"]
        acc = f"{100 * s['accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
        if s["seeds"] > 1:
            acc += f" sd {100 * s['accuracy_std']:.1f} ({s['seeds']} seeds)"
        vs = s.get("vs_greedy")
        row = {
            "sampler": name,
            f"{split} accuracy [95% CI]" if split != "all" else "accuracy [95% CI]": acc,
            "n": str(s["n"]),
            "gen tokens": f"{generated_tokens(s):.1f}",
            "s/answer": f"{s['seconds_per_answer']:.2f}" if "seconds_per_answer" in s else "",
            "cut off": pct(s.get("cut_off")),
            "no answer": pct(s.get("no_answer")),
            "W/L/T vs greedy": f"{vs['wins']}/{vs['losses']}/{vs['ties']}" if vs else "",
            "diff [95% CI]": "",
            "p": format_p(vs["p_value"]) if vs else "",
            "p Holm": format_p(vs["p_holm"]) if vs and "p_holm" in vs else "",
        }
        if vs and "difference" in vs:
            d, (dlo, dhi) = vs["difference"], vs["difference_ci95"]
            row["diff [95% CI]"] = f"{100 * d:+.1f} [{100 * dlo:+.1f}, {100 * dhi:+.1f}]"
        if strategies:
            row["strategies"] = strategy_text(name, s)
        rows.append(row)
    return rows


def markdown_table(rows: list[dict]) -> str:
    """`table_rows` as a Markdown table (docs/evaluation.md)."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    return "\n".join(lines)


def strategy_text(name: str, summary: dict) -> str:
    """Shares of tokens per strategy, for samplers that have more than one."""
    shares = summary["strategy_share"]
    if len(shares) <= 1:
        return ""
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())


def _pyplot():
    # matplotlib: an optional extra, only for plots; Agg is chosen before pyplot is imported
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: dict, path) -> None:
    """Accuracy with 95% intervals against generated tokens per answer (every
    candidate counted), one point per sampler and budget, the vote rows as
    curves over k: the cost/accuracy frontier, as a PNG (needs matplotlib).
    Open-text results: `plot_open`."""
    if results.get("mode") == "open":
        return plot_open(results, path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 5))
    curves: dict[str, list] = {}
    for name, s in results["samplers"].items():
        base, budget = split_label(name)
        x, y = generated_tokens(s), 100 * s["accuracy"]
        err = [[y - 100 * s["ci95"][0]], [100 * s["ci95"][1] - y]]
        if k := vote_k(base):  # a vote row: a point of its method's curve
            method = base.partition(" k=")[0] + (f" @{budget}" if budget else "")
            curves.setdefault(method, []).append((x, y, err, str(k)))
            continue
        ax.errorbar([x], [y], yerr=err, fmt="o", capsize=4, label=name)
    for method, points in curves.items():
        points.sort()
        line = ax.plot([p[0] for p in points], [p[1] for p in points], "-", marker="s", label=f"{method} (k)")[0]
        for x, y, err, k in points:
            ax.errorbar([x], [y], yerr=err, fmt="none", capsize=3, color=line.get_color(), alpha=0.5)
            ax.annotate(k, (x, y), textcoords="offset points", xytext=(4, -12), fontsize=8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens per answer, every candidate counted (log scale)")
    ax.set_ylabel("accuracy (%) with 95% Wilson interval")
    split = results.get("split", "all")
    where = f"{results['tasks']}, {split} split" if split != "all" else results["tasks"]
    items = results.get("item_range") or f"{results['items']} items"
    ax.set_title(f"{results['model']} on {where} (items {items})", fontsize=10)
    ax.grid(alpha=0.3)
    # beside the axes: inside, with a dozen rows, it covers some row's point or interval
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _num(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def open_table_rows(results: dict) -> list[dict]:
    """One row of display strings per sampler for open-text results."""
    rows = []
    for name, s in results["samplers"].items():
        vs = s.get("vs_greedy")
        share = s["repeated_4gram_share"]
        rep = _num(None if share is None else 100 * share, ".1f")
        if s["seeds"] > 1 and s["repeated_4gram_share"] is not None:
            rep += f" sd {100 * s['repeated_4gram_share_std']:.1f}"
        rows.append(
            {
                "sampler": name,
                "rep-4 %": rep,
                "distinct-2": _num(s["distinct_2"], ".3f"),
                "loop max/mean": f"{s['longest_loop_max']} / {s['longest_loop_mean']:.1f}",
                f"loops >= {results['loop_alert']}": f"{s['loops_at_least_alert']}/{s['outputs']}",
                "mean logprob": _num(s["mean_logprob"], ".3f"),
                f"early (< {results['early_tokens']})": f"{s['early_endings']}/{s['outputs']}",
                "tokens": f"{s['mean_tokens']:.1f}",
                "W/L/T rep-4 vs greedy": f"{vs['wins']}/{vs['losses']}/{vs['ties']}" if vs else "",
                "p": format_p(vs["p_value"]) if vs else "",
            }
        )
    return rows


def plot_open(results: dict, path) -> None:
    """Repeated-4-gram share against mean log-probability, one point per sampler:
    the good corner is top left (little repetition, coherent text)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, s in results["samplers"].items():
        if s["repeated_4gram_share"] is None or s["mean_logprob"] is None:
            continue
        x, y = 100 * s["repeated_4gram_share"], s["mean_logprob"]
        ax.scatter([x], [y], s=60)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("repeated 4-grams (%), lower is better")
    ax.set_ylabel("mean log-probability (nats), higher is better")
    ax.set_title(f"{results['model']}: open text, {results['items']} prompts, {results['max_tokens']} tokens")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
