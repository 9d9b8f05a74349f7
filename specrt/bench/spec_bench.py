"""`specrt bench BUNDLE --suite spec-bench[:FILE]`: Spec-Bench's table (per category: speedup over plain, MAT,
identical to plain) for each method, measured in one interleaved run.

Questions: Spec-Bench's `question.jsonl` (shipped in specrt/assets/spec_bench, Apache-2.0: NOTICE.md there) or a
file of the same form (lines {"category": ..., "turns": [...]}). MT-bench's eight categories form `mt_bench`.
Per category `per_category` questions, evenly spaced through the file, skipping those whose prompt does not fit
the bundle's context with `max_new_tokens`. Each question's first turn is rendered with the bundle's chat
template; an MT-bench question's second turn follows as a second prompt with the model's own (plain, greedy)
first answer as history.

Order of work, on one Generator: every method runs once on a prompt outside the suite (warm-up: first-use costs,
adaptive k's estimates); then per prompt: plain, method 1, plain, method 2, ..., plain. A method's speedup on a
category is its decode tokens/s (prefill excluded) over that of the plain runs beside its runs; MAT (mean
accepted tokens per target pass, the bonus token included, 1.00 for plain) = tokens / decode passes. Methods
that learn across requests (recycle's table) keep what earlier questions taught them, as in a server; no
question is run twice by a method before it is measured. The bundle's successor table is one per loaded bundle,
shared by `recycle` and `auto`: each method here gets its own copy of it (`MethodTables`), so a method never
starts a question from a table another method has just refreshed on that very question's answer; labels of auto
(`auto[-head]`, `auto`) get their own copy of auto's learned state too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specrt.core.errors import InvalidArgument

SUITE = "spec-bench"
MT_BENCH = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})
ORDER = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
WARM_UP_PROMPT = "Tell me about the history of the bicycle."


@dataclasses.dataclass(frozen=True)
class Question:
    category: str  # mt_bench for MT-bench's categories
    turns: tuple[str, ...]


def default_questions_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("specrt.assets.spec_bench").joinpath("question.jsonl")))


def load_questions(path: Path | None = None) -> list[Question]:
    """The question file (default: the shipped Spec-Bench copy); InvalidArgument with file:line on a bad line."""
    from specrt.bench.suites import json_line
    from specrt.core.textfile import PROMPTS_MAX_BYTES, read_user_text

    path = Path(path) if path is not None else default_questions_path()
    lines = read_user_text(path, "--suite spec-bench", PROMPTS_MAX_BYTES).splitlines()  # regular file, capped
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        item = json_line(line, f"{path}:{no}")
        turns = item.get("turns") if isinstance(item, dict) else None
        if (not isinstance(item, dict) or not isinstance(item.get("category"), str) or not isinstance(turns, list)
                or not turns or not all(isinstance(t, str) and t for t in turns)):
            raise InvalidArgument(f'{path}:{no}: expected {{"category": "...", "turns": ["...", ...]}}')
        category = "mt_bench" if item["category"] in MT_BENCH else item["category"]
        out.append(Question(category, tuple(turns)))
    if not out:
        raise InvalidArgument(f"{path}: no questions")
    return out


def chat_ids(gen, messages: list[dict[str, str]]) -> np.ndarray:
    from specrt.runtime.chat_template import ChatFormatter

    text, add_special = ChatFormatter.from_manifest(gen.manifest).render(messages)
    return np.array(gen.tokenizer.encode(text, add_special_tokens=add_special), dtype=np.int64)


def pick(gen, questions: list[Question], per_category: int, max_new_tokens: int) -> tuple[list[Question], int]:
    """Up to `per_category` questions per category, evenly spaced, that fit the context; (picked, skipped)."""
    if per_category < 1:
        raise InvalidArgument(f"--per-category must be >= 1, got {per_category}")
    room = gen.max_seq_len - max_new_tokens - 1
    by_cat: dict[str, list[Question]] = {}
    for q in questions:
        by_cat.setdefault(q.category, []).append(q)
    cats = [c for c in ORDER if c in by_cat] + [c for c in by_cat if c not in ORDER]
    picked, skipped = [], 0
    for cat in cats:
        qs = by_cat[cat]
        stride = max(1, len(qs) // per_category)
        order = qs[::stride] + [q for i, q in enumerate(qs) if i % stride]  # evenly spaced first, then the rest
        n = 0
        for q in order:
            if n == per_category:
                break
            # a second turn adds the first answer (at most max_new_tokens) and the question: checked when run
            if chat_ids(gen, [{"role": "user", "content": q.turns[0]}]).size > room:
                skipped += 1
                continue
            picked.append(q)
            n += 1
    return picked, skipped


def run_spec_bench(gen, methods: list[str], questions: list[Question], max_new_tokens: int = 128,
                   k: int | str = "auto", progress: Callable[[str], None] | None = None,
                   warm_up: bool = True, mat_only: bool = False) -> dict[str, Any]:
    """Measure plain and every method on every question's turns (greedy); returns rows per method and category.
    `warm_up=False`: a later call on the same generator (the first one warmed it up). `mat_only`: no plain run
    after each method's (its speedups are not measured: `--free-rows`), one plain run per turn for the reference."""
    from specrt.bench.measure import run_once
    from specrt.runtime.sampling import SamplingParams

    params = SamplingParams(temperature=0.0)
    note = progress or (lambda _: None)
    tables = MethodTables(gen, methods)
    warm = chat_ids(gen, [{"role": "user", "content": WARM_UP_PROMPT}])
    for m in ["none", *methods] if warm_up else ():
        note(f"warm-up {m}")
        with tables.of(m):
            run_once(gen, warm, max_new_tokens, m, k, params)
    runs: list[dict[str, Any]] = []
    for qi, q in enumerate(questions):
        history: list[dict[str, str]] = []
        for turn, text in enumerate(q.turns[:2] if q.category == "mt_bench" else q.turns[:1]):
            history.append({"role": "user", "content": text})
            ids = chat_ids(gen, history)
            if ids.size > gen.max_seq_len - max_new_tokens - 1:
                break  # a second turn that no longer fits: the first is measured
            note(f"{q.category} #{qi} turn {turn + 1}: plain")
            plain = run_once(gen, ids, max_new_tokens, "none", 0, params)
            before = plain
            for m in methods:
                note(f"{q.category} #{qi} turn {turn + 1}: {m}")
                with tables.of(m):
                    res = run_once(gen, ids, max_new_tokens, m, k, params)
                after = before if mat_only else run_once(gen, ids, max_new_tokens, "none", 0, params)
                runs.append(_record(q.category, m, res, before, after, plain.token_ids))
                before = after
            history.append({"role": "assistant", "content": gen.tokenizer.decode(plain.token_ids)})
    return {"suite": SUITE, "methods": list(methods), "k": k, "max_new_tokens": max_new_tokens, "mat_only": mat_only,
            "questions": len(questions), "rows": aggregate(runs, methods), "runs": runs}


class MethodTables:
    """Per method its own state of the bundle's successor table (runtime/proposers/recycle_table.py `table_for`):
    `with tables.of(m):` loads m's copy into the shared table and keeps what m's run taught it. Labels of method auto
    (`auto`, `auto[-head]`: method_label.py) get their own copy of auto's state as well (its pass costs and acceptance
    estimates, runtime/proposers/auto.py `state_for`), each from the state the bundle had when the run began (the
    free-rows one under --free-rows): auto with and without a source learn apart, as each would alone."""

    def __init__(self, gen, methods: list[str]) -> None:
        from specrt.bench.method_label import request_options
        from specrt.runtime.proposers import auto
        from specrt.runtime.proposers.recycle_table import table_for

        self.gen, self.table = gen, table_for(gen)
        self.own = {m: self.table.succ.copy() for m in methods}  # [V, K] each
        autos = [m for m in methods if request_options(m)["method"] == "auto"]
        first = auto.state_for(gen) if autos else None
        self.states = {m: first if i == 0 else copy.deepcopy(first) for i, m in enumerate(autos)}

    @contextlib.contextmanager
    def of(self, method: str):
        if method not in self.own:  # plain: reads no table
            yield
            return
        with self.table.lock:
            self.table.succ[:] = self.own[method]
        if method in self.states:
            from specrt.runtime.proposers import auto

            with auto._STATES_LOCK:
                auto._STATES[self.gen] = self.states[method]
        try:
            yield
        finally:
            with self.table.lock:
                self.own[method] = self.table.succ.copy()


def _decode(stats) -> tuple[int, float]:
    """(tokens after the first, seconds of decoding): the prefill and its token excluded."""
    return max(stats.new_tokens - 1, 0), max(stats.elapsed_s - stats.prefill_seconds, 0.0)


def _record(category: str, method: str, res, before, after, reference: list[int]) -> dict[str, Any]:
    s = res.stats
    tokens, seconds = _decode(s)
    (t0, s0), (t1, s1) = _decode(before.stats), _decode(after.stats)
    return {"category": category, "method": method, "tokens": tokens, "decode_s": seconds,
            "plain_tokens": (t0 + t1) / 2, "plain_decode_s": (s0 + s1) / 2,
            "verify_steps": s.verify_steps, "accepted": s.accepted_tokens, "drafted": s.drafted_tokens,
            "identical": res.token_ids == reference}


def aggregate(runs: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """One row per method and category (and `overall`: the mean of the categories' speedups and MATs)."""
    rows = []
    cats = list(dict.fromkeys(r["category"] for r in runs))
    for m in methods:
        per_cat = []
        for cat in cats:
            rs = [r for r in runs if r["method"] == m and r["category"] == cat]
            tps = sum(r["tokens"] for r in rs) / max(sum(r["decode_s"] for r in rs), 1e-9)
            plain = sum(r["plain_tokens"] for r in rs) / max(sum(r["plain_decode_s"] for r in rs), 1e-9)
            steps = sum(r["verify_steps"] for r in rs)
            per_cat.append({"method": m, "category": cat, "prompts": len(rs), "speedup": tps / plain,
                            "mat": 1 + sum(r["accepted"] for r in rs) / steps if steps else 1.0,
                            "rows_per_pass": 1 + sum(r.get("drafted", 0) for r in rs) / steps if steps else 1.0,
                            "identical": sum(r["identical"] for r in rs), "tokens_per_second": tps,
                            "plain_tokens_per_second": plain})
        rows += per_cat
        if per_cat:
            rows.append({"method": m, "category": "overall", "prompts": sum(r["prompts"] for r in per_cat),
                         "speedup": float(np.mean([r["speedup"] for r in per_cat])),
                         "mat": float(np.mean([r["mat"] for r in per_cat])),
                         "rows_per_pass": float(np.mean([r["rows_per_pass"] for r in per_cat])),
                         "identical": sum(r["identical"] for r in per_cat), "tokens_per_second": None,
                         "plain_tokens_per_second": None})
    return rows


def markdown(result: dict[str, Any], title: str = "Spec-Bench") -> str:
    """Spec-Bench's table: a row per method, per category `speedup (MAT)` (`mat_only` results: MAT alone), and
    outputs identical to plain."""
    cats = list(dict.fromkeys(r["category"] for r in result["rows"]))
    mat_only = result.get("mat_only", False)
    what = ("MAT = mean accepted tokens per target pass incl. the bonus token; speeds not measured" if mat_only else
            "speedup over plain decode tokens/s (interleaved), (MAT = mean accepted tokens per target pass incl. the "
            "bonus token)")
    lines = [f"## {title}", "", f"{result['questions']} questions, greedy, {result['max_new_tokens']} new tokens, "
             f"k = {result['k']}; {what}; overall = mean of the categories.", "",
             "| method | " + " | ".join(cats) + " | identical to plain |", "|---" * (len(cats) + 2) + "|"]
    for m in result["methods"]:
        rows = {r["category"]: r for r in result["rows"] if r["method"] == m}
        cells = [("-" if c not in rows else f"{rows[c]['mat']:.2f}" if mat_only else
                  f"{rows[c]['speedup']:.2f}x ({rows[c]['mat']:.2f})") for c in cats]
        same = rows["overall"] if "overall" in rows else None
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {same['identical']}/{same['prompts']} |" if same else "")
    return "\n".join(lines) + "\n"
