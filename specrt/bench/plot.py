"""`--plot FILE.png`: speedup vs k per method and suite (top row), accepted-length histograms (bottom row)."""

from __future__ import annotations

from typing import Any


def _series(row: dict[str, Any]) -> str:
    a = row["simulated_acceptance"]
    return row["method"] if a is None else f"a={a:g}"


def _k_order(rows: list[dict[str, Any]]) -> list:
    ks = {r["k"] for r in rows if r["method"] != "none"}
    return sorted(k for k in ks if k != "auto") + (["auto"] if "auto" in ks else [])


def save_plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["results"] if r["method"] != "none"]
    suites = list(dict.fromkeys(r["suite"] for r in rows)) or ["overall"]
    series = list(dict.fromkeys(_series(r) for r in rows))
    ks = _k_order(rows)
    ncols = max(len(suites), len(series), 1)
    fig, axes = plt.subplots(2, ncols, figsize=(3.6 * ncols, 6.4), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        for name in series:
            pts = [(ks.index(r["k"]), r) for r in rows if r["suite"] == suite and _series(r) == name]
            if not pts:
                continue
            x = [p[0] for p in pts]
            med = [p[1]["speedup"]["median"] for p in pts]
            err = [[m - p[1]["speedup"]["min"] for m, p in zip(med, pts)],
                   [p[1]["speedup"]["max"] - m for m, p in zip(med, pts)]]
            line = ax.errorbar(x, med, yerr=err, marker="o", capsize=3, label=name)
            ax.plot(x, [p[1]["predicted_speedup"] for p in pts], linestyle=":", color=line[0].get_color())
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_title(f"{suite}: speedup vs k")
        ax.set_xlabel("k (dotted: predicted)")
    axes[0][0].set_ylabel("decode speedup over plain")
    axes[0][0].legend(fontsize="small")
    overall = [r for r in rows if r["suite"] == "overall"]
    for ax, name in zip(axes[1], series):
        group = [r for r in overall if _series(r) == name]
        width = 0.8 / max(len(group), 1)
        longest = 1
        for i, r in enumerate(group):
            hist = r["accepted_histogram"]
            total = sum(hist) or 1
            longest = max(longest, len(hist))
            ax.bar([j - 0.4 + (i + 0.5) * width for j in range(len(hist))], [h / total for h in hist], width=width,
                   label=f"k={r['k']}")
        ax.set_xticks(range(longest))
        ax.set_title(f"{name}: accepted drafts per step")
        ax.set_xlabel("accepted drafts")
        ax.legend(fontsize="small")
    axes[1][0].set_ylabel("fraction of steps")
    for ax in list(axes[0][len(suites):]) + list(axes[1][len(series):]):
        ax.axis("off")
    fig.suptitle(f"specrt bench: {result['machine']['cpu']} ({result['machine']['backend']})", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_concurrency_plot(result: dict[str, Any], path: str) -> None:
    """Aggregate tokens/s against concurrency, one line per configuration (`bench --concurrency --plot`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    configs = list(dict.fromkeys(r["config"] for r in result["rows"]))
    for config in configs:
        pts = [(r["concurrency"], r["tokens_per_second"]) for r in result["rows"] if r["config"] == config]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
    ax.set_xlabel("clients at once")
    ax.set_ylabel("tokens/s (all clients)")
    ax.set_xticks(sorted({r["concurrency"] for r in result["rows"]}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"greedy, {result['max_new_tokens']} new tokens per request")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
