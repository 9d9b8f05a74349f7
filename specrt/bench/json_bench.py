"""`specrt bench BUNDLE --suite json`: structured output on the JSON extraction suite (bench/json_cases.py).

Configurations, run interleaved per prompt and repeat (a loaded machine slows all of them alike):
  plain              method none, unconstrained (its output is not JSON: the speed reference only)
  constrained plain  method none + the case's schema (the baseline: one target pass per token, forced included)
  <method>           the method + the schema + forced tokens (drafted for free, verified with the drafts)
  <method> no forced the same without forced tokens (what forced tokens add; with `ablation`)
Per configuration: decode tokens/s (prefill excluded), the share of outputs that parse and validate against
their schema (jsonschema), whether greedy outputs equal constrained plain decoding, tokens per target pass and
forced tokens. Ratios are per prompt and repeat, then the geometric mean over prompts, median over repeats.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any, Callable

from specrt.bench.json_cases import CASES, JsonCase
from specrt.bench.predict import geomean
from specrt.runtime.constraint import ConstraintSpec

SYSTEM = "You extract facts from text. Answer with one JSON object that follows the schema, nothing else."


@dataclasses.dataclass(frozen=True)
class JsonConfig:
    label: str
    method: str
    constrained: bool
    forced: bool = True


def configs_for(methods: tuple[str, ...], ablation: bool = False) -> list[JsonConfig]:
    """`ablation` adds each method without forced tokens (what forced tokens add; one more run per prompt)."""
    out = [JsonConfig("plain", "none", False), JsonConfig("constrained plain", "none", True)]
    for m in methods:
        if m != "none":
            out.append(JsonConfig(m, m, True))
            if ablation:
                out.append(JsonConfig(f"{m} no forced", m, True, forced=False))
    return out


def prompt_ids(gen: Any, case: JsonCase, short: bool = False) -> list[int]:
    """The case as a chat turn (the bundle's template when it has one), schema included; `short`: the passage
    alone, no system message (for bundles with a small context)."""
    from specrt.runtime.chat_template import ChatFormatter, chat_prompt_ids

    if short:
        return list(chat_prompt_ids(gen, case.passage, None, ChatFormatter.from_manifest(gen.manifest)))
    message = f"{case.prompt.rstrip()}\nSchema: {json.dumps(case.schema, separators=(',', ':'))}"
    return list(chat_prompt_ids(gen, message, SYSTEM, ChatFormatter.from_manifest(gen.manifest)))


NUMBER_LIMIT = 1e15  # |value| below it: at most 16 integer digits
FRACTION_STEP = 1e-6  # multipleOf: at most 6 decimals


def bounded(schema: Any) -> Any:
    """The schema with the limits OpenAI's strict mode asks for, where it has none: objects get
    additionalProperties false, strings maxLength 48 (unless enum / pattern / format / const), arrays maxItems 4,
    numbers a magnitude below 1e15 and (type number) at most 6 decimals (multipleOf 1e-6; llguidance turns both
    into a finite digit pattern). A bounded schema accepts a subset of the original's documents; outputs are
    validated against the original. (A 135M model otherwise runs on in an unbounded string, adds keys, or repeats
    a digit until max_new_tokens: `1.1111...` for a latitude, int4 SmolLM2.)"""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v) for k, v in schema.items()}
    kind = out.get("type")
    if kind == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if kind == "string" and not {"maxLength", "enum", "pattern", "format", "const"} & set(out):
        out["maxLength"] = 48
    if kind == "array" and "maxItems" not in out:
        out["maxItems"] = 4
    if kind in ("number", "integer") and not {"enum", "const"} & set(out):
        if not {"minimum", "exclusiveMinimum"} & set(out):
            out["minimum"] = -NUMBER_LIMIT
        if not {"maximum", "exclusiveMaximum"} & set(out):
            out["maximum"] = NUMBER_LIMIT
        if kind == "number" and "multipleOf" not in out:
            out["multipleOf"] = FRACTION_STEP
    return out


def valid(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def run_json_bench(gen: Any, methods: tuple[str, ...], k: int | str, max_new_tokens: int, repeats: int,
                   cases: tuple[JsonCase, ...] = CASES, progress: Callable[[str], None] | None = None,
                   ablation: bool = False, short: bool = False) -> dict:
    configs = configs_for(methods, ablation)
    ids = {c.name: prompt_ids(gen, c, short) for c in cases}
    specs = {c.name: ConstraintSpec.json_schema(bounded(c.schema)) for c in cases}
    for c in cases:  # compile every schema once before timing (a bad one fails here, not mid-run)
        gen.compile_constraint(specs[c.name])
    runs: dict[str, list[dict[str, Any]]] = {cfg.label: [] for cfg in configs}
    for r in range(repeats):
        for case in cases:
            for cfg in configs:
                res = gen.generate(ids[case.name], max_new_tokens, method=cfg.method, num_speculative_tokens=k,
                                   constraint=specs[case.name] if cfg.constrained else None,
                                   forced_tokens=cfg.forced)
                s = res.stats
                runs[cfg.label].append({
                    "repeat": r, "case": case.name, "token_ids": res.token_ids, "text": res.text,
                    "finish_reason": res.finish_reason, "tps": s.decode_tokens_per_second,
                    "valid": valid(res.text, case.schema), "new_tokens": s.new_tokens,
                    "target_calls": s.verify_steps, "forced": s.forced_tokens, "forced_accepted": s.forced_accepted,
                    "drafted": s.drafted_tokens, "accepted": s.accepted_tokens})
            if progress is not None:
                progress(f"repeat {r + 1}/{repeats}: {case.name}")
    return summarize(configs, runs, cases, repeats, k, max_new_tokens)


def _ratio(runs_a: list[dict], runs_b: list[dict], repeats: int) -> float:
    """Median over repeats of the geometric mean over prompts of tps(a) / tps(b)."""
    per_repeat = []
    for r in range(repeats):
        a = {x["case"]: x["tps"] for x in runs_a if x["repeat"] == r}
        b = {x["case"]: x["tps"] for x in runs_b if x["repeat"] == r}
        per_repeat.append(geomean([a[c] / b[c] for c in a if b.get(c, 0) > 0 and a[c] > 0]))
    return statistics.median(per_repeat)


def summarize(configs, runs, cases, repeats, k, max_new_tokens) -> dict:
    base = runs["constrained plain"]
    reference = {(x["repeat"], x["case"]): x["token_ids"] for x in base}
    rows = []
    for cfg in configs:
        rr = runs[cfg.label]
        steps = sum(x["target_calls"] for x in rr)
        rows.append({
            "label": cfg.label, "method": cfg.method, "constrained": cfg.constrained, "forced": cfg.forced,
            "tokens_per_second": statistics.median(x["tps"] for x in rr),
            "vs_plain": _ratio(rr, runs["plain"], repeats),
            "vs_constrained_plain": _ratio(rr, base, repeats),
            "valid": sum(x["valid"] for x in rr) / len(rr),
            "stopped": sum(x["finish_reason"] == "stop" for x in rr) / len(rr),
            "identical": (sum(x["token_ids"] == reference[(x["repeat"], x["case"])] for x in rr) / len(rr)
                          if cfg.constrained else None),
            "tokens_per_pass": sum(x["new_tokens"] - 1 for x in rr) / steps if steps else 0.0,
            "forced": sum(x["forced"] for x in rr), "forced_accepted": sum(x["forced_accepted"] for x in rr),
            "acceptance": (sum(x["accepted"] for x in rr) / max(1, sum(x["drafted"] for x in rr))),
        })
    invalid = sorted({x["case"] for x in base if not x["valid"]})
    return {"cases": len(cases), "repeats": repeats, "k": k, "max_new_tokens": max_new_tokens, "rows": rows,
            "invalid_cases": invalid, "origins": sorted({c.origin for c in cases}),
            "examples": {x["case"]: x["text"] for x in base if x["repeat"] == 0}}


def json_markdown(result: dict, title: str, command: str | None, machine: str) -> str:
    lines = [f"## {title}", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [f"{result['cases']} extraction prompts with schemas (specrt/bench/json_cases.py; sources: "
              f"{', '.join(result['origins'])}), greedy, max_new_tokens {result['max_new_tokens']}, k "
              f"{result['k']}, {result['repeats']} repeats, configurations interleaved per prompt. The constraint is "
              "the schema bounded as OpenAI's strict mode asks (`json_bench.bounded`: additionalProperties false, "
              "maxLength / maxItems, numbers below 1e15 in magnitude with at most 6 decimals, where absent); outputs "
              "are validated against the original schema. "
              f"{machine}", "",
              "| configuration | decode tok/s (median) | vs plain | vs constrained plain | valid JSON | stopped | "
              "identical to constrained plain | tokens per pass | forced accepted / drafted | acceptance |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        ident = "-" if row["identical"] is None else f"{100 * row['identical']:.0f}%"
        forced = f"{row['forced_accepted']} / {row['forced']}" if row["forced"] else "-"
        lines.append(f"| {row['label']} | {row['tokens_per_second']:.1f} | {row['vs_plain']:.2f}x | "
                     f"{row['vs_constrained_plain']:.2f}x | {100 * row['valid']:.0f}% | {100 * row['stopped']:.0f}% | "
                     f"{ident} | {row['tokens_per_pass']:.2f} | {forced} | {row['acceptance']:.2f} |")
    lines += ["", "Ratios: per prompt and repeat, geometric mean over prompts, median over repeats. \"plain\" is "
              "unconstrained (its text is not held to the schema: speed reference only). Outputs that stop at "
              "max_new_tokens before the JSON closes count as invalid."]
    if result["invalid_cases"]:
        lines += ["", f"Constrained outputs that did not validate: {', '.join(result['invalid_cases'])}."]
    return "\n".join(lines)
