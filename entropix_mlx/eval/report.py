"""Reports: the CLI's tables, Markdown tables (as in docs/evaluation.md), and the plots."""


def format_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def table_rows(results: dict, strategies: bool = True) -> list[dict]:
    """One row of display strings per sampler (the CLI's table, the Markdown one)."""
    rows = []
    for name, s in results["samplers"].items():
        lo, hi = s["ci95"]
        acc = f"{100 * s['accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
        if s["seeds"] > 1:
            acc += f" sd {100 * s['accuracy_std']:.1f} ({s['seeds']} seeds)"
        vs = s.get("vs_greedy")
        split = results.get("split", "all")
        row = {
            "sampler": name,
            f"{split} accuracy [95% CI]" if split != "all" else "accuracy [95% CI]": acc,
            "n": str(s["n"]),
            "tokens": f"{s['mean_tokens']:.1f}",
            "tok/s": f"{s['tokens_per_second']:.2f}",
            "W/L/T vs greedy": f"{vs['wins']}/{vs['losses']}/{vs['ties']}" if vs else "",
            "p": format_p(vs["p_value"]) if vs else "",
        }
        if strategies:
            row["strategies"] = strategy_text(name, s)
        rows.append(row)
    return rows


def strategy_text(name: str, summary: dict) -> str:
    """Shares of tokens per strategy, for samplers that have more than one."""
    shares = summary["strategy_share"]
    if len(shares) <= 1:
        return ""
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())


def _pyplot():
    # matplotlib: an optional extra, only for --plot; Agg is chosen before pyplot is imported
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: dict, path) -> None:
    """Accuracy with 95% intervals per sampler (or, for open-text results,
    `plot_open`), as a PNG (needs matplotlib)."""
    if results.get("mode") == "open":
        return plot_open(results, path)
    plt = _pyplot()

    names = list(results["samplers"])
    acc = [100 * results["samplers"][n]["accuracy"] for n in names]
    lo = [a - 100 * results["samplers"][n]["ci95"][0] for a, n in zip(acc, names, strict=False)]
    hi = [100 * results["samplers"][n]["ci95"][1] - a for a, n in zip(acc, names, strict=False)]
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 4))
    ax.bar(names, acc, yerr=[lo, hi], capsize=6, color="#4c72b0")
    ax.set_ylabel("accuracy (%) with 95% Wilson interval")
    ax.set_ylim(0, 100)
    split = results.get("split", "all")
    where = f"{results['tasks']}, {split} split" if split != "all" else results["tasks"]
    ax.set_title(f"{results['model']} on {where} ({results['items']} items)")
    fig.tight_layout()
    fig.savefig(path)
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
