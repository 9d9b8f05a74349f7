"""The Spec-Bench section's Markdown (scripts/spec_bench_section.py measures; this module only reads its JSON):
the per-category tables, the leaderboard's published figures beside them, MAT at a free-rows budget, issue #51's
goals met / not met, and for each bundle the bound the measured row costs put on the speedup,
speedup <= MAT / (T(S)/T(1)) at the mean pass size S."""

from __future__ import annotations

import numpy as np

ORDER = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
NAMES = {"fp32": "fp32, target only", "int4": "int4 (`--quantize int4`), target only",
         "self": "fp32 with `--draft self:int4`", "head": "fp32 with its fused draft head (`--draft head:DIR`)",
         "store": "fp32 with a datastore of its own answers (`specrt store --answers builtin`)",
         "store_int4": "int4 with a datastore of its own answers (`specrt store --answers builtin`)"}
# github.com/hemingkx/Spec-Bench, Leaderboard.md at commit fd2c1cd7d2201ef71db4c5f4e455008f017967bf (2025-04-22),
# "Leaderboard on A100": one A100 80GB, 96 CPU cores, PyTorch 2.5.1, CUDA 11.5, Vicuna-7B-v1.3, FP16, greedy, batch 1.
# Per method: the six categories in ORDER, #mean accepted tokens, overall (their speedups are over their own plain).
LEADERBOARD = {
    "EAGLE2": ((2.84, 1.88, 2.34, 2.15, 2.79, 2.13), 4.34, 2.36),
    "Recycling (Token Recycling; ours: recycle)": ((2.37, 2.02, 2.27, 2.08, 2.53, 2.02), 2.73, 2.22),
    "PLD (prompt lookup; ours: ngram)": ((1.60, 1.06, 2.66, 1.19, 1.62, 1.86), 1.75, 1.66),
    "SpS (a draft model; ours: draft)": ((1.66, 1.13, 1.71, 1.50, 1.47, 1.66), 2.28, 1.52),
    "Lookahead": ((1.47, 1.14, 1.36, 1.25, 1.57, 1.22), 1.64, 1.34),
}
SOURCE = ("[Spec-Bench leaderboard](https://github.com/hemingkx/Spec-Bench/blob/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/"
          "Leaderboard.md), \"Leaderboard on A100\", Vicuna-7B-v1.3 (commit fd2c1cd, 2025-04-22)")
GOALS = {"fp32": (1.7, 1.25), "int4": (1.7, 1.35)}  # (mean, every category), the target-only default method
DEMO_GOAL, OPEN_GOAL = 0.97, 1.2
HEAD_GOAL, HEAD_CATS, NO_HEAD = 1.25, ("mt_bench", "qa"), "auto[-head]"  # issue #52: auto with / without the head
NO_STORE = "auto[-store]"  # auto without its datastore (the same bundle, one interleaved run)


def rows(result: dict, method: str) -> dict[str, dict]:
    return {r["category"]: r for r in result["rows"] if r["method"] == method}


def cats(result: dict) -> list[str]:
    seen = list(dict.fromkeys(r["category"] for r in result["rows"] if r["category"] != "overall"))
    return [c for c in ORDER if c in seen] + [c for c in seen if c not in ORDER]


def table(result: dict, title: str) -> list[str]:
    cs = cats(result) + ["overall"]
    out = [f"#### {title}", "", "| method | " + " | ".join(cs) + " | identical to plain |", "|---" * (len(cs) + 2) + "|",
           "| plain | " + " | ".join("1.00x (1.00)" for _ in cs) + " | - |"]
    for m in result["methods"]:
        r = rows(result, m)
        cells = [f"{r[c]['speedup']:.2f}x ({r[c]['mat']:.2f})" if c in r else "-" for c in cs]
        out.append(f"| {m} | " + " | ".join(cells) + f" | {r['overall']['identical']}/{r['overall']['prompts']} |")
    return out


def cost_at(costs: dict, s: float) -> float:
    """T(S)/T(1) at a (mean) pass size S, interpolated between the measured sizes."""
    return float(np.interp(s, costs["rows"], costs["ratio"]))


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def goals(data: dict) -> list[str]:
    out = ["| goal (issue #51) | measured | verdict |", "|---|---|---|"]
    stored = {"fp32": "store", "int4": "store_int4"}  # the same target with a datastore (`specrt store`), if measured
    for label, (mean_goal, cat_goal) in GOALS.items():
        for key, what in ((label, f"{label} target only"), (stored[label], f"{label} with its datastore")):
            if key not in data:
                continue
            r = rows(data[key], "auto")
            worst = min(cats(data[key]), key=lambda c: r[c]["speedup"])
            out.append(f"| {what}, default method (`auto`): mean >= {mean_goal}x | {r['overall']['speedup']:.2f}x "
                       f"| {verdict(r['overall']['speedup'] >= mean_goal)} |")
            out.append(f"| {what}: every category >= {cat_goal}x | lowest {worst} {r[worst]['speedup']:.2f}x | "
                       f"{verdict(r[worst]['speedup'] >= cat_goal)} |")
    o = rows(data["open"], "auto")["overall"]
    out.append(f"| open chat prompts outside Spec-Bench, fp32 `auto` >= {OPEN_GOAL}x | {o['speedup']:.2f}x "
               f"(MAT {o['mat']:.2f}, {o['prompts']} prompts) | {verdict(o['speedup'] >= OPEN_GOAL)} |")
    if "open_store" in data:  # the same prompts on the fp32 bundle with a datastore (`specrt store --answers builtin`)
        w, wo = (rows(data["open_store"], m)["overall"] for m in ("auto", NO_STORE))
        out.append(f"| the same, fp32 with a datastore of its answers to specrt's packaged prompts (`specrt store "
                   f"--answers builtin`) | {w['speedup']:.2f}x (MAT {w['mat']:.2f}); without it, same run: "
                   f"{wo['speedup']:.2f}x (MAT {wo['mat']:.2f}) | {verdict(w['speedup'] >= OPEN_GOAL)} |")
    default = data["costs"]["self"]["default_method"]
    s = data["self"]
    worse = []
    for c in cats(s):
        best = max((m for m in s["methods"] if m != default), key=lambda m: rows(s, m)[c]["speedup"])
        if rows(s, default)[c]["speedup"] < rows(s, best)[c]["speedup"]:
            worse.append(f"{c}: {default} {rows(s, default)[c]['speedup']:.2f}x < {best} {rows(s, best)[c]['speedup']:.2f}x")
    out.append(f"| `--draft self:int4`: its default (`{default}`) >= the best of its methods in every category | "
               f"{'; '.join(worse) if worse else 'best or equal everywhere'} | {verdict(not worse)} |")
    below = []
    for label in ("fp32", "int4", "self", *(k for k in ("store", "store_int4") if k in data)):
        a, n = rows(data[label], "auto"), rows(data[label], "ngram")
        below += [f"{label} {c} {a[c]['speedup']:.2f}x < {n[c]['speedup']:.2f}x" for c in cats(data[label])
                  if a[c]["speedup"] < n[c]["speedup"]]
    out.append(f"| every category at least n-gram's speedup (`auto` vs `ngram`, each bundle) | "
               f"{'; '.join(below) if below else 'everywhere'} | {verdict(not below)} |")
    keys = ("fp32", "int4", "self", "open", "fp32_free", "int4_free", "self_free") + tuple(k for k in ("head", "store", "store_int4", "open_store") if k in data)
    same = [(r["identical"], r["prompts"]) for key in keys for r in data[key]["rows"] if r["category"] == "overall"]
    demo_same = all(r["identical"] for r in data["demo"]["rows"])
    ident, total = sum(a for a, _ in same), sum(b for _, b in same)
    out.append(f"| outputs identical to plain on every question | {ident}/{total} runs; demo prompts "
               f"{'all' if demo_same else 'NOT all'} | {verdict(ident == total and demo_same)} |")
    d = data["demo"]
    per = ", ".join(f"{r['kind']} {min(r['min'], r['first']):.2f}x" for r in d["rows"])
    out.append(f"| `auto` >= {DEMO_GOAL}x plain on every demo prompt (every run) | worst run per prompt: {per} | "
               f"{verdict(d['worst'] >= DEMO_GOAL)} |")
    return out + ([head_goal(data["head"])] if "head" in data else [])


def head_ratio(result: dict, cat: str, without: str = NO_HEAD) -> float:
    """`auto`'s speedup over `without`'s (`auto[-head]`) on `cat` (each over the plain runs beside it, one run)."""
    return rows(result, "auto")[cat]["speedup"] / rows(result, without)[cat]["speedup"]


def head_goal(result: dict) -> str:
    """Issue #52's goal line: conversation (mt_bench) and qa with the head >= HEAD_GOAL x the tree without it."""
    have = [c for c in HEAD_CATS if c in rows(result, "auto") and c in rows(result, NO_HEAD)]
    got = "; ".join(f"{c} {head_ratio(result, c):.2f}x" for c in have) or "not measured"
    ok = len(have) == len(HEAD_CATS) and all(head_ratio(result, c) >= HEAD_GOAL for c in have)
    same = all(r["identical"] == r["prompts"] for r in result["rows"] if r["method"] in ("auto", NO_HEAD))
    return (f"| #52: conversation (mt_bench) and qa with the head >= {HEAD_GOAL}x the tree without it (fp32), outputs "
            f"identical | {got} (`auto` / `{NO_HEAD}`); outputs {'identical' if same else 'NOT identical'} | "
            f"{verdict(ok and same)} |")


def head_table(result: dict, without: str = NO_HEAD, what: str = "the head") -> list[str]:
    """Per category: n-gram, auto without `what` (the head, the datastore), auto with it (speedup over plain, MAT),
    and with / without."""
    ng, no, yes = rows(result, "ngram"), rows(result, without), rows(result, "auto")
    out = [f"| category | ngram | auto without {what} (`{without}`) | auto with {what} | with / without |",
           "|---|---|---|---|---|"]
    for c in cats(result) + ["overall"]:
        cells = [f"{r[c]['speedup']:.2f}x ({r[c]['mat']:.2f})" if c in r else "-" for r in (ng, no, yes)]
        ratio = f"{head_ratio(result, c, without):.2f}x" if c in no and c in yes else "-"
        out.append(f"| {c} | " + " | ".join(cells) + f" | {ratio} |")
    return out


def bounds(data: dict, label: str) -> list[str]:
    """Per category for `auto`: MAT, mean pass size, its measured cost, the bound, the measured speedup, the MAT the
    goal needs at that pass size, and the free-rows MAT with what its trees would give at this CPU's row costs."""
    res, free, costs = data[label], data[f"{label}_free"], data["costs"][label]
    a, f = rows(res, "auto"), rows(free, "auto")
    mean_goal, cat_goal = GOALS.get(label, (None, None))
    out = ["| category | MAT | rows per pass S | T(S)/T(1) | bound MAT / (T(S)/T(1)) | measured | MAT the goal needs at S "
           "| free-rows MAT (S) | free-rows bound here |", "|---" * 9 + "|"]
    for c in cats(res) + ["overall"]:
        ratio = cost_at(costs, a[c]["rows_per_pass"])
        goal = mean_goal if c == "overall" else cat_goal
        need = f"{goal * ratio:.2f} (goal {goal}x)" if goal else "-"
        fr = f.get(c)
        free_cells = (f"{fr['mat']:.2f} ({fr['rows_per_pass']:.1f}) | {fr['mat'] / cost_at(costs, fr['rows_per_pass']):.2f}x"
                      if fr else "- | -")
        out.append(f"| {c} | {a[c]['mat']:.2f} | {a[c]['rows_per_pass']:.2f} | {ratio:.2f} | {a[c]['mat'] / ratio:.2f}x | "
                   f"{a[c]['speedup']:.2f}x | {need} | {free_cells} |")
    return [f"`{label}`, method `auto`:", ""] + out


def section(data: dict) -> str:
    meta = data["meta"]
    n = data["fp32"]["questions"]
    lines = ["## Spec-Bench: SmolLM2-135M-Instruct on this CPU, beside the published leaderboard", "",
             f"Command: `{meta['command']}` (via `SECTIONS=spec-bench scripts/make_benchmarks.sh`; {meta['date']}, "
             f"{meta['minutes']:.0f} minutes, {meta['cores']} cores of {meta['cpu']}, load average at the end "
             f"{meta['load_average']:.1f}). Spec-Bench's questions (specrt/assets/spec_bench, Apache-2.0), {n} per "
             f"bundle ({data['fp32']['max_new_tokens']} new tokens, greedy, MT-bench's second turn with the model's own "
             "first answer); one interleaved run per bundle (plain, method, plain, ...); cells: speedup over plain "
             "decode tokens/s (MAT = mean tokens per target pass incl. the bonus token); overall = mean of the "
             "categories. No drafter, table or tree shape was trained or tuned on these questions.", "",
             "### Goals", ""] + goals(data)
    lines += ["", "### Measured (this CPU, SmolLM2-135M-Instruct from its Q4_1 GGUF)", ""]
    for label in ("fp32", "int4", "self"):
        lines += table(data[label], NAMES[label]) + [""]
    if "head" in data:
        lines += table(data["head"], NAMES["head"]) + ["", "The draft head's share (issue #52): the same bundle's `auto` "
                  "without the head (`--auto-sources=-head`) and with it, one interleaved run; cells: speedup over "
                  "plain (MAT); with / without = the ratio of their speedups.", ""] + head_table(data["head"]) + [""]
    for label in (k for k in ("store", "store_int4") if k in data):
        lines += table(data[label], NAMES[label]) + ["", "The datastore's share (issue #51): the same bundle's "
                  "`auto` without its datastore (`--auto-sources=-store`) and with it, one interleaved run; the "
                  "datastore holds the target's own greedy answers to specrt's packaged prompts (`specrt store BUNDLE "
                  "--answers builtin --max-new-tokens 256`, every prompt holding a Spec-Bench question's start or "
                  "sharing a topic with an open chat prompt left out: `--exclude` "
                  "specrt/assets/spec_bench/question.jsonl and benchmarks/prompts/store_exclude_open_chat.jsonl). "
                  "Cells as above.", ""]
        lines += head_table(data[label], NO_STORE, "the datastore") + [""]
    cs = ORDER
    lines += ["### Published: other hardware, another model", "",
              f"{SOURCE}: one NVIDIA A100 80GB, Vicuna-7B-v1.3 in FP16, greedy, batch 1. **Not comparable with the "
              "rows above** (a 7B model on a GPU, where a verify pass of many rows costs about one row; here a 135M "
              "model on a CPU): shown for what the methods reach where rows are cheap.", "",
              "| method | " + " | ".join(cs) + " | MAT | overall |", "|---" * (len(cs) + 3) + "|"]
    for name, (per, mat, overall) in LEADERBOARD.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}x" for v in per) + f" | {mat:.2f} | {overall:.2f}x |")
    lines += ["", "### MAT at a free-rows budget", "",
              "`specrt bench BUNDLE --suite spec-bench --free-rows`: `auto` with every verify pass priced as one row "
              "(T(S) = T(1)), so its tree takes every candidate up to the node cap (the bundle's max draft tokens, 8): "
              "what a device where verify rows cost ~nothing would gain. MAT only (speeds on this CPU mean nothing "
              "here); beside it `auto`'s MAT as measured above.", "",
              "| bundle | " + " | ".join(list(cs) + ["overall"]) + " |", "|---" * (len(cs) + 2) + "|"]
    for label in ("fp32", "int4", "self"):
        f, a = rows(data[f"{label}_free"], "auto"), rows(data[label], "auto")
        lines.append(f"| {label} | " + " | ".join(f"{f[c]['mat']:.2f} (measured {a[c]['mat']:.2f})" if c in f else "-"
                                                   for c in list(cs) + ["overall"]) + " |")
    lines += ["", "### Why: the measured cost of a pass of S rows, and the bound it puts on the speedup", "",
              "A speculative step costs one target pass over S rows (the pending token and S - 1 drafts) and emits MAT "
              "tokens on average, so speedup <= MAT / (T(S)/T(1)) (drafting cost left out: an upper bound). T(S)/T(1) "
              "measured now on this CPU (past 300 tokens, median of 7 interleaved rounds):", "",
              "| bundle | " + " | ".join(f"S={s}" for s in data["costs"]["fp32"]["rows"]) + " | T(1) |",
              "|---" * (len(data["costs"]["fp32"]["rows"]) + 2) + "|"]
    for label in ("fp32", "int4"):
        c = data["costs"][label]
        lines.append(f"| {label} | " + " | ".join(f"{r:.2f}" for r in c["ratio"]) + f" | {c['seconds'][0] * 1e3:.1f} ms |")
    d = data["costs"]["self"].get("draft_over_target")
    if d:
        lines += ["", f"`--draft self:int4`: one step of the int4 draft costs {d:.2f} of a one-row fp32 target pass "
                  "(load-time timing): a drafted token must be accepted with probability well above that to pay."]
    for label in ("fp32", "int4"):
        lines += [""] + bounds(data, label)
    lines += ["", "### `auto` on `specrt demo`'s prompts", "", demo_markdown(data["demo"])]
    lines += ["", "Runs: " + "; ".join(f"`{r}`" for r in meta["runs"])]
    return "\n".join(lines) + "\n"


def demo_markdown(d: dict) -> str:
    head = ("| prompt | first run | tokens/s ratio min / median | decode-only min / median | MAT | identical |\n"
            "|---|---|---|---|---|---|\n")
    body = "".join(f"| {r['kind']} | {r['first']:.2f}x | {r['min']:.2f}x / {r['median']:.2f}x | {r['decode_min']:.2f}x / "
                   f"{r['decode_median']:.2f}x | {r['mat']:.2f} | {'yes' if r['identical'] else 'NO'} |\n"
                   for r in d["rows"])
    return (f"scripts/demo_prompts_bench.py: the demo's three chat prompts, a warm-up pair then {d['repeats']} "
            f"interleaved pairs each, {d['max_new_tokens']} new tokens (load average {d['load_average']:.1f}).\n\n"
            + head + body)
