"""`specrt inspect`: a bundle's models, graph I/O, profiles, engines and files, as a dict or a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.bundle.entries import ModelEntry, QuantizationEntry
from specrt.bundle.graph_io import LM_HEAD_FULL
from specrt.models.config import lm_head_share
from specrt.cli.inspect_checks import memory_notes, read_for_inspect


def bundle_summary(bundle: str | Path, memory: bool = False, max_seq_len: int | None = None) -> dict[str, Any]:
    """Describes even a bundle that fails its file checks: `failed_checks` lists them (empty when sound)."""
    m, failed = read_for_inspect(bundle)
    models = {}
    for role, e in m.models.items():
        models[role] = model_summary(e)
    out: dict[str, Any] = {
        "bundle": str(m.root),
        "format_version": m.format_version,
        "specrt_version": m.specrt_version,
        "created": m.created,
        "max_seq_len": m.max_seq_len,
        "max_draft_tokens": m.max_draft_tokens,
        "onnx": m.onnx,
        "models": models,
        "chat_template": m.tokenizer.chat_template,
        "medusa": m.medusa.to_dict() if m.medusa is not None else None,
        "draft_head": head_summary(m.draft_head) if m.draft_head is not None else None,
        "engines": {role: e.to_dict() for role, e in m.engines.items()},
        "files": len(m.files),
        "bytes": sum(f.size for f in m.files.values()),
        "file_sizes": {rel: f.size for rel, f in sorted(m.files.items(), key=lambda kv: (-kv[1].size, kv[0]))},
        "checksums": "ok" if not failed else f"FAILED ({len(failed)})",
        "failed_checks": failed,
    }
    try:
        from specrt.compiler.trt.support import onnx_support_report

        if not failed:
            out["tensorrt_support"] = {role: onnx_support_report(m.path(e.onnx)) for role, e in m.models.items()
                                       if "portable" not in e.omitted}  # a lean bundle left its fp32 graph out
    except ImportError:
        pass
    if memory:
        from specrt.compiler.trt.memory import memory_plan

        cpu = not m.engines
        out["memory"] = memory_plan(m, max_seq_len=max_seq_len, devices={r: "cpu" for r in m.models} if cpu else None,
                                    workspace=0 if cpu else None)
        out["memory"]["notes"] = memory_notes(m, max_seq_len)
    return out


def head_summary(h) -> dict[str, Any]:
    """The draft head (DraftHeadEntry) of `bundle_summary`: its graph, precision and validation."""
    return {"onnx": h.onnx, "precision": h.precision, "draft_vocab_size": h.draft_vocab_size,
            "validation": h.validation, "quantization": h.quantization}


def head_line(h: dict[str, Any]) -> str:
    text = f"draft head: {h['precision']}, {h['draft_vocab_size']}-token vocabulary ({h['onnx']})"
    q = h.get("quantization")
    if not q:
        return text + f", max |ORT-PyTorch| {(h.get('validation') or {}).get('max_abs_diff', float('nan')):.1e}"
    v = q.get("validation") or {}
    return (text + f", {q['quantized_matmuls']} MatMulNBits (block {q['block_size']}, accuracy level "
            f"{q['accuracy_level']}), embedding {q['embedding']['storage']}; against the fp32 head: top-1 agreement "
            f"{v.get('top1_agreement', float('nan')):.2f}, logits cosine {v.get('logits_cosine', float('nan')):.3f}")


def model_summary(e: ModelEntry) -> dict[str, Any]:
    """One model of `bundle_summary`."""
    c = e.decoder_config
    out = {
        "architecture": e.architecture,
        "parameters": e.num_parameters,
        "layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "heads": c.num_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": e.vocab_size,
        "eos_token_ids": list(e.eos_token_ids) if e.eos_token_ids is not None else None,
        "dtype": e.dtype,
        "onnx": e.onnx,
        "inputs": [i.name for i in e.inputs or ()],
        "outputs": [o.name for o in e.outputs or ()],
        "profiles": {phase: {"input_ids": shapes["input_ids"]} for phase, shapes in (e.profiles or {}).items()},
        "validation_max_abs_diff": e.validation["max_abs_diff"],
        "validation": e.validation,
        "source": e.source if e.source is not None else {"format": "hf"},
        "graphs": {name: {"onnx": g.onnx, "validation_max_abs_diff": (g.validation or e.validation)["max_abs_diff"]}
                   for name, g in (e.graphs or {"portable": e.graph("portable")}).items()
                   if name not in (e.omitted or ())},  # a lean bundle's left-out graphs: listed under "omitted"
    }
    out["lm_head"] = lm_head_share(c)
    fused = (e.graphs or {}).get("fused")
    if fused is not None and LM_HEAD_FULL in (fused.optional_inputs or ()):
        screen = (fused.validation or {}).get("lm_head_screen", "")
        out["lm_head"]["screened"] = f"greedy calls: int8 screen + exact fp32 candidates ({screen} at compile)"
    if e.fused_skipped:
        out["fused_skipped"] = e.fused_skipped
    if e.omitted:
        out["omitted"] = list(e.omitted)  # graphs a lean bundle left out (compiler/lean.py)
    if e.quantization:
        out["quantization"] = quantization_summary(e.quantization, e.omitted or ())
    if e.self_draft:
        out["self_draft"] = True
    return out


def lm_head_line(role: str, h: dict[str, Any]) -> str:
    return (f"{role} LM head: {h['head_weights'] / 1e6:.1f}M weights against {h['layer_weights'] / 1e6:.1f}M in the "
            f"layers, {100 * h['share']:.1f}% of the weights a decode step reads" + (
                f"; screened head for {h['screened']}" if h.get("screened") else ""))


def print_summary(summary: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{summary['bundle']}[/bold]  format v{summary['format_version']}, written by specrt "
                  f"{summary['specrt_version']} at {summary['created']}")
    from specrt.cli.console import pack

    for line in pack([f"max_seq_len {summary['max_seq_len']}, max_draft_tokens {summary['max_draft_tokens']},",
                      f"ONNX opset {summary['onnx']['opset']} IR {summary['onnx']['ir_version']},",
                      f"{summary['files']} files, {summary['bytes'] / 2**20:.1f} MiB,", f"checksums {summary['checksums']}"],
                     console.width, sep=" "):
        console.print(line, markup=False, soft_wrap=True)
    for check in summary.get("failed_checks") or []:
        console.print(f"FAILED {check}", style="bold red", markup=False, soft_wrap=True)
    compact = console.width < 100
    table = Table("role", "arch" if compact else "architecture", "params", "layers", "hidden", "heads/kv", "vocab",
                  "dtype", "|ORT-PT|" if compact else "max |ORT-PyTorch|", box=None if compact else box.HEAVY_HEAD)
    for role, m in summary["models"].items():
        arch = m["architecture"].replace("ForCausalLM", "").replace("LMHeadModel", "") if compact else m["architecture"]
        dtype = dtype_cell(m, compact)
        table.add_row(role, arch, f"{m['parameters'] / 1e6:.1f}M", str(m["layers"]), str(m["hidden_size"]),
                      f"{m['heads']}/{m['kv_heads']}", str(m["vocab_size"]), dtype, f"{m['validation_max_abs_diff']:.1e}")
    console.print(table)
    for role, m in summary["models"].items():
        console.print(f"{role}: {_validation_line(m['validation'])}")
        src = m["source"]
        if src.get("format") == "gguf":
            console.print(f"{role} source: GGUF {src.get('member') or src['file']} ({src.get('quantization')}, "
                          f"{src.get('gguf_architecture')}), sha256 {src['sha256'][:16]}…")
        graphs = ", ".join(f"{name} ({g['onnx']}, max |ORT-PyTorch| {g['validation_max_abs_diff']:.1e})"
                           for name, g in m.get("graphs", {}).items())
        graphs = graphs or "none kept in this bundle (its quantized graph: below)"
        console.print(f"{role} graphs: {graphs}" + (f"; no fused graph: {m['fused_skipped']}"
                                                    if m.get("fused_skipped") else ""), markup=False)
        if m.get("omitted"):
            console.print(f"{role} left out (lean bundle, validated at compile): {', '.join(m['omitted'])} "
                          "(--keep-fp32 / --ort-graph both keep them)", markup=False)
        if "lm_head" in m:
            console.print(lm_head_line(role, m["lm_head"]), markup=False)
        if "quantization" in m:
            console.print(quantization_line(role, m["quantization"], m.get("self_draft", False)), markup=False)
    print_files(console, summary.get("file_sizes") or {})
    chat = summary.get("chat_template")
    console.print(f"chat template: {chat if chat else 'none (chat uses the plain role: content format)'}")
    if summary.get("medusa"):
        console.print(f"medusa heads: {summary['medusa']['num_heads']}")
    if summary.get("draft_head"):
        console.print(head_line(summary["draft_head"]), markup=False, soft_wrap=True)
    for name, eng in (summary.get("engines") or {}).items():
        console.print(f"engine {name}: TensorRT {eng.get('tensorrt_version')} on {eng.get('gpu_name')} "
                      f"(sm {eng.get('compute_capability')}), {eng.get('precision')}")
        if eng.get("quantization"):
            console.print(engine_quantization_line(name, eng["quantization"]), markup=False, soft_wrap=True)
    if "tensorrt_support" in summary:
        for role, rep in summary["tensorrt_support"].items():
            console.print(f"TensorRT ONNX-parser check ({role}): {'supported' if rep['supported'] else 'NOT supported'}"
                          + ("" if rep["supported"] else f" — {'; '.join(rep['problems'])}"))
    if "memory" in summary:
        mem = summary["memory"]
        for note in mem.get("notes", []):
            console.print(f"note: {note}", markup=False, soft_wrap=True)
        t = Table("device", "model", "weights", "kv cache", "workspace+activ." if console.width < 100 else
                  "workspace+activations", "total")
        for row in mem["rows"]:
            t.add_row(row["device"], row["model"], _gib(row["weights_bytes"]), _gib(row["kv_cache_bytes"]),
                      _gib(row["workspace_bytes"] + row["activation_bytes"]), _gib(row["total_bytes"]))
        console.print(t)
        for dev, total in mem["per_device"].items():
            console.print(f"{dev}: {_gib(total)} total")


def _validation_line(v: dict) -> str:
    """One line: measured ONNX-vs-PyTorch error and greedy agreement against the tolerance used."""
    if "max_rel_diff" not in v:  # bundles written before scale-aware validation
        return f"validation max |diff| {v.get('max_abs_diff', 0):.2g}"
    return (f"validation max |diff| {v['max_abs_diff']:.2g} ({v['max_rel_diff']:.2g} of the tensor scale; logits "
            f"{v['logits_max_abs_diff']:.2g} on values up to {v['logits_scale']:.3g}), greedy agreement "
            f"{v['argmax_agree']}/{v['argmax_positions']} ({v['argmax_near_ties']} near-ties), "
            f"tolerance atol {v['atol']:g} + rtol {v['rtol']:g}")


def dtype_cell(m: dict[str, Any], compact: bool) -> str:
    """The weights the CPU runner runs: 'int4 (fp32 act.)' for a MatMulNBits model, else the graph dtype."""
    short = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(m["dtype"], m["dtype"])
    if "quantization" in m:
        return m["quantization"]["type"] if compact else f"{m['quantization']['type']} ({short} act.)"
    return short if compact else m["dtype"]


def print_files(console: Any, sizes: dict[str, int]) -> None:
    """Every file of the bundle with its size, largest first (what an operator ships)."""
    if not sizes:
        return
    width = max(len(rel) for rel in sizes)
    console.print(f"files ({len(sizes)}, {sum(sizes.values()) / 2**20:.1f} MiB):", markup=False)
    for rel, size in sizes.items():
        console.print(f"  {rel:<{width}}  {human_size(size):>10}", markup=False, soft_wrap=True)


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def quantization_summary(q: QuantizationEntry, omitted=()) -> dict[str, Any]:
    """`omitted`: the entry's graph kinds a lean bundle left out ("quantized.<variant>" for these graphs)."""
    keys = ("type", "block_size", "symmetric", "accuracy_level", "batch_invariant_setting", "reference_onnx",
            "quality", "verify_consistency")
    return {k: getattr(q, k) for k in keys} | {"onnx": {v: g.onnx for v, g in q.graphs.items()
                                                        if f"quantized.{v}" not in omitted}}


def quality_text(quality: dict[str, dict]) -> str:
    return "; ".join(f"{text}: greedy agreement {r['greedy_agreement']:.3f}, ppl x{r['ppl_ratio']:.4f} "
                     f"({r['ppl_reference']:.3g} -> {r['ppl_quantized']:.3g}, {r['tokens']} tokens)"
                     for text, r in quality.items())


def engine_quantization_line(role: str, q: dict[str, Any]) -> str:
    """`engines.<role>.quantization` (compiler/trt/ptq.py) in one line."""
    block = f", block {q['block_size']}" if "block_size" in q else ""
    return (f"engine {role}: {q['precision']} Q/DQ ({q.get('tool')}, {q['calibration_method']}{block}, "
            f"{q['quantized_matmuls']} MatMuls quantized, graph {q['qdq_onnx']}); {quality_text(q['quality'])}")


def quantization_line(role: str, q: dict[str, Any], self_draft: bool) -> str:
    quality = quality_text(q["quality"])
    vc = q["verify_consistency"]
    return (f"{role}{' (self draft: the quantized target)' if self_draft else ''}: {q['type']} MatMulNBits, "
            f"block {q['block_size']}, {'symmetric' if q['symmetric'] else 'asymmetric'}, accuracy level "
            f"{q['accuracy_level']}, ONNX Runtime loads {', '.join(q['onnx'].values())}; {quality}; verify vs "
            f"one-token passes: {vc['argmax_equal']}/{vc['rows']} argmax equal, max |diff| {vc['max_abs_diff']:.1e}")


def _gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"
