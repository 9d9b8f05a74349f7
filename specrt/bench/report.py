"""Presenting a bench result: a rich table for the terminal and Markdown for BENCHMARKS.md."""

from __future__ import annotations

from typing import Any

from specrt.bench.peer_common import ratio_line
from specrt.bench.ttft import line as ttft_line

COLUMNS = ("config", "tok/s", "decode tok/s", "speedup [min-max]", "e2e speedup", "accept", "a/token",
           "tokens/step", "c", "V(k)/V(0)", "predicted", "efficiency", "draft/verify %", "identical")


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def row_cells(row: dict[str, Any]) -> list[str]:
    if row["method"] == "none":
        tps, dtps = row["tokens_per_second"], row["decode_tokens_per_second"]
        return ["plain", f"{tps['median']:.1f}", f"{dtps['median']:.1f}", "1.00", "1.00", *["-"] * 8, "-"]
    sp = row["speedup"]
    split = row["time_split"]
    return [
        row["label"], f"{row['tokens_per_second']['median']:.1f}", f"{row['decode_tokens_per_second']['median']:.1f}",
        f"{sp['median']:.2f} [{sp['min']:.2f}-{sp['max']:.2f}]", _fmt(row["speedup_end_to_end"]["median"]),
        _fmt(row["acceptance_rate"]), _fmt(row["acceptance_per_token"]), _fmt(row["mean_accepted_tokens"]),
        _fmt(row["cost_ratio"], 3), _fmt(row["verify_cost_ratio"]), _fmt(row["predicted_speedup"]),
        _fmt(row["efficiency"]), f"{100 * split['draft_fraction']:.0f}/{100 * split['verify_fraction']:.0f}",
        row.get("identical_prompts", "-") if row["identical"] is not None else "n/a",
    ]


TERMINAL = ("config", "decode tok/s", "speedup [min-max]", "accept", "tokens/step", "c", "predicted", "efficiency",
            "identical")
# Below 100 columns: fewer columns with short headers, so nothing is cut ("speed…").
COMPACT = {"config": "config", "decode tok/s": "tok/s", "speedup [min-max]": "speedup",
           "accept": "acc", "predicted": "pred", "efficiency": "eff", "identical": "same"}


def suites_of(result: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["suite"] for r in result["results"]))


def natural_width(console, table) -> int:
    """The width `table` takes uncut (rich's own measure is clamped to the console's width)."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(10_000), table).maximum


def suite_table(result: dict[str, Any], suite: str, columns: tuple[str, ...], compact: bool) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"suite: {suite}", title_justify="left", box=None if compact else table_box())
    keep = [COLUMNS.index(c) for c in columns]
    for col in columns:
        table.add_column(COMPACT[col] if compact else col, justify="left" if col == "config" else "right",
                         no_wrap=compact)
    for row in result["results"]:
        if row["suite"] == suite:
            cells = row_cells(row)
            table.add_row(*(escape(cells[i]) for i in keep))  # `auto[ngram]` is a label, not rich markup
    return table


def print_tables(result: dict[str, Any], console, compact: bool = False, wide: bool = False) -> None:
    """TERMINAL columns; COMPACT ones (short headers) on narrow terminals, or wherever the TERMINAL table's
    natural width exceeds the console's; every column with `wide`."""
    from rich.table import Table

    for suite in suites_of(result):
        table = suite_table(result, suite, COLUMNS if wide else tuple(COMPACT) if compact else TERMINAL, compact)
        if not (wide or compact) and natural_width(console, table) > console.width:
            compact = True  # the full headers do not fit this terminal (at 100 columns they did not): cut nothing
            table = suite_table(result, suite, tuple(COMPACT), compact)
        console.print(table)
    for name, peer in peers_of(result).items():
        table = Table(title=f"peer: {peer_title(peer)}, end to end", title_justify="left",
                      box=None if compact else table_box())
        cols = ("peer", "suite", "their tok/s", "our tok/s", "ours/theirs", "token agreement")
        short = ("peer", "suite", "theirs", "ours", "ratio", "agree")
        for col, col_name in zip(cols, short if compact else cols):
            table.add_column(col_name, justify="left" if col in ("peer", "suite") else "right", no_wrap=True)
        for r in peer["results"]:
            table.add_row(*peer_cells(r))
        console.print(table)
        if peer.get("ratios"):
            console.print(ratio_line(library_of(name, peer), peer["ratios"]), markup=False, soft_wrap=True)
        for note in peer.get("notes") or ():
            console.print(f"note: {note}", markup=False, soft_wrap=True)
    if result.get("ttft"):
        console.print(ttft_line(result["ttft"]), markup=False, soft_wrap=True)
    from specrt.core.text import pack

    m = result["machine"]
    phrases = [f"{m['cpu']}, {m['cores_available']} cores,",  # two phrases: pack() may wrap between them
               f"backend {m['backend']} ({m['provider']}, {m['threads']} threads);",
               f"peak RSS {result['memory']['peak_rss_mb']:.0f} MiB;",
               f"greedy outputs identical to plain: {_fmt(result['identical'])};", f"{result['elapsed_s']:.0f}s"]
    for line in pack(phrases, console.width, sep=" "):
        console.print(line, markup=False, soft_wrap=True)


def table_box():
    from rich import box

    return box.HEAVY_HEAD


def peers_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every peer by name (results written before `peers` existed hold only `peer`, transformers)."""
    if result.get("peers"):
        return result["peers"]
    return {"hf": result["peer"]} if result.get("peer") else {}


def library_of(name: str, peer: dict[str, Any]) -> str:
    return peer.get("library") or name


def peer_title(peer: dict[str, Any]) -> str:
    if peer.get("title"):
        return peer["title"]
    return (f"transformers {peer['transformers']} ({peer['device']}, fp32, {peer['torch_threads']} torch threads = "
            f"{peer['ort_threads']} ORT threads)")


def peer_cells(r: dict[str, Any]) -> list[str]:
    name = r["peer"] if r["peer"] == "plain" else f"{r['peer']} k={r['k']}"
    return [name, r["suite"], f"{r['tokens_per_second']['median']:.1f}", _fmt(r["ours_tokens_per_second"], 1),
            _fmt(r["ratio_ours_over_theirs"]), _fmt(r["token_agreement"])]


def _load(avg) -> str:
    return f"{avg[0]:.2f}" if avg else "n/a"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


POSITIONS = 8  # columns of the per-position table (adaptive k rarely drafts further)


def position_section(result: dict[str, Any]) -> list[str]:
    """Acceptance per draft position, one row per speculative configuration and suite (results written before
    the rows carried it have none: no section)."""
    rows = [r for r in result["results"] if r.get("acceptance_per_position")]
    if not rows:
        return []
    n = min(POSITIONS, max(len(r["acceptance_per_position"]) for r in rows))
    cells = []
    for r in rows:
        rates, drafts = r["acceptance_per_position"], r["drafts_per_position"]
        cells.append([r["label"], r["suite"], *(f"{rates[j]:.2f} ({drafts[j]})" if j < len(rates) else "-"
                                                for j in range(n))])
    return ["### Acceptance per draft position", "",
            "Of the verify steps that drafted at least j tokens (their count in brackets), the share that accepted at "
            "least j.", "", _md_table(["config", "suite", *map(str, range(1, n + 1))], cells), ""]


def markdown(result: dict[str, Any], title: str = "Benchmark", plot: str | None = None) -> str:
    """A self-contained section (## level): machine, date, exact command, tables, notes."""
    m, s = result["machine"], result["settings"]
    out = [f"## {title}", "",
           f"- **Machine**: {m['cpu']}, {m['cores_available']} cores available ({m['cores_physical']} physical), "
           f"{m['memory_gb']} GB RAM, {m['platform']}" + (f", GPU {m['gpu']}" if m.get("gpu") else ""),
           f"- **Runtime**: backend `{m['backend']}` ({m['provider']}, {m['threads']} threads), specrt {m['specrt']}, "
           f"onnxruntime {m['onnxruntime']}, torch {m['torch']}, transformers {m['transformers']}, Python {m['python']}",
           f"- **Date**: {m['date']}; load average (1 min) at start {_load(m.get('load_average_start'))}, at end "
           f"{_load(m.get('load_average'))} (other work on the machine makes timings noisy)",
           f"- **Command**: `{result['command']}`",
           f"- **Settings**: {s['max_new_tokens']} new tokens, {s['repeats']} repeats (median, [min-max]), "
           f"temperature {s['temperature']}, {len(result['prompts'])} prompts; peak RSS "
           f"{result['memory']['peak_rss_mb']:.0f} MiB; greedy output identical to plain on every prompt: "
           f"{_fmt(result['identical'])}", ""]
    for suite in suites_of(result):
        out += [f"### Suite: {suite}", "",
                _md_table(list(COLUMNS), [row_cells(r) for r in result["results"] if r["suite"] == suite]), ""]
    out += position_section(result)
    v = result["verify_cost"]
    out += ["### Verify cost V(k)/V(0)", "",
            f"Median of {v['reps']} target passes over k + 1 tokens after {v['past_length']} cached positions.", "",
            _md_table(["k", *map(str, v["k"])], [["V(k)/V(0)", *(f"{x:.2f}" for x in v["ratio"])],
                                                 ["ms", *(f"{1000 * x:.2f}" for x in v["seconds"])]]), ""]
    for name, p in peers_of(result).items():
        if name == "hf":
            out += ["### Peer: Hugging Face transformers", "",
                    f"transformers {p['transformers']}, torch {p['torch']}, {p['device']}, fp32, {p['torch_threads']} "
                    f"torch threads ({p['ort_threads']} ONNX Runtime threads); tokens/s end to end on both sides.", ""]
        else:
            out += [f"### Peer: {library_of(name, p)}", "", f"{peer_title(p)}; tokens/s end to end on both sides, "
                    "measured interleaved with ours (after our runs on each prompt).", ""]
        out += [_md_table(["peer", "suite", "their tok/s", "our tok/s", "ours/theirs", "token agreement"],
                          [peer_cells(r) for r in p["results"]]), ""]
        if p.get("ratios"):
            out += [f"**{ratio_line(library_of(name, p), p['ratios'])}**", ""]
        out += [f"Note: {note}." for note in p.get("notes") or ()] + ([""] if p.get("notes") else [])
    if result.get("ttft"):
        out += ["### Time to first token", "", ttft_line(result["ttft"]) + ".", ""]
    if plot:
        out += [f"![speedup vs k]({plot})", ""]
    out += ["Columns: speedup = decode tokens/s (prefill excluded) over the neighbouring plain runs; accept = "
            "accepted/drafted; a/token = per-token acceptance; tokens/step = mean accepted tokens incl. the bonus "
            "token; c = draft cost per token / plain decode step; predicted = E(k) / (k c + V(k)/V(0)); "
            "efficiency = measured / predicted; draft/verify % = share of decode time.", ""]
    return "\n".join(out)
