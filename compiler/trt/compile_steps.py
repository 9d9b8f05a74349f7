"""The compile steps for TensorRT engines and GPU memory budgets, from `specrt compile`'s option values.

The options (click, specrt/cli/trt_options.py) become an `EngineSpec` (compiler/spec.py); compile_bundle's
preflight (compiler/preflight.py) passes its option dict (keys: options.OPTION_NAMES) here:

    steps += prepare_trt_compile(spec.engines.options() | ..., target=..., draft=..., output=...,
                                 max_seq_len=..., max_draft_tokens=...)

`prepare_trt_compile` fails before any work: no TensorRT / GPU with --engines trt, bad option values,
or a memory plan over --gpu-memory-budget (computed from the checkpoint configs, no TensorRT needed).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from specrt.bundle.writer import ManifestDraft
from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.compiler.trt.memory import (DEFAULT_WORKSPACE, check_budget, model_row, plan_from_rows,
                                       safetensors_parameters, weight_bytes)
from specrt.compiler.trt.options import MAX_BATCH_NEEDS_TRT, build_options
from specrt.compiler.trt.ptq import PTQ_PRECISIONS, PTQConfig

Step = Callable[[Path, ManifestDraft], None]  # (temporary bundle directory, the manifest being written)


def check_trt_available(device: str = "cuda:0") -> None:
    """BackendUnavailable (one line) unless TensorRT imports and a CUDA GPU is visible."""
    from specrt.core.trt import INSTALL_HINT, cuda_device_error, import_trt

    import_trt()
    reason = cuda_device_error(device)
    if reason:
        raise BackendUnavailable(f"--engines trt needs an NVIDIA GPU: {reason}; {INSTALL_HINT}")


def check_budget_before_build(options: dict[str, Any], target: Path, draft: Path | None, max_seq_len: int,
                              max_draft_tokens: int, head: Path | None = None) -> dict[str, Any] | None:
    """With --gpu-memory-budget: plan both models on one GPU from their checkpoints; raise if over. `head`: a draft
    head that gets an engine on the target's GPU (with --engines trt, an fp32 head: `build_engines`)."""
    budget = options.get("gpu_memory_budget")
    if budget is None:
        return None
    from specrt.models.checkpoint import open_checkpoint

    trt = options.get("engines") == "trt"
    precision = (options.get("precision") or "fp32") if trt else "fp32"
    workspace = (options.get("workspace") or DEFAULT_WORKSPACE) if trt else 0
    rows = []
    for role, path in (("target", target), ("draft", draft)):
        if path is None:
            continue
        ck = open_checkpoint(path)
        params = safetensors_parameters(ck.weight_files)
        rows.append(model_row(role, dataclasses.asdict(ck.config), int(params * weight_bytes(precision)), precision,
                              max_seq_len, max_draft_tokens, workspace, max_batch=(options.get("max_batch") or 1)
                              if trt else 1))
        if role == "target" and head is not None and trt:
            rows.append(head_row_before_build(head, ck.config, precision, max_seq_len, max_draft_tokens, workspace))
    plan = plan_from_rows(rows)
    check_budget(plan, budget)
    return plan


def head_row_before_build(head: Path, config, precision: str, max_seq_len: int, max_draft_tokens: int,
                          workspace: int) -> dict[str, Any]:
    """The head engine's memory from its directory (head_config.json's V', head.safetensors' trained weights)
    and the target's config, before anything is built: fp16 beside int8 / fp8 / int4 engines (`head_build_options`)."""
    from specrt.bundle.graph_io import HEAD_ENGINE_ROLE
    from specrt.compiler.trt.memory import head_config, head_weight_count
    from specrt.models.draft_head import WEIGHTS, read_head_config

    prec = precision if precision in ("fp32", "fp16", "bf16") else "fp16"
    cfg = dataclasses.asdict(config)
    vocab = len(read_head_config(head)["vocab_ids"])
    weights, embed = head_weight_count(cfg, safetensors_parameters([Path(head) / WEIGHTS]), vocab)
    return model_row(HEAD_ENGINE_ROLE, head_config(cfg, vocab), int(weights * weight_bytes(prec)) + 2 * embed, prec,
                     max_seq_len, max_draft_tokens, workspace)


def ptq_config(options: dict[str, Any]) -> PTQConfig | None:
    """The Model Optimizer settings for --precision int8 / fp8 / int4, else None (--ptq-method alone is an error)."""
    precision = options.get("precision") or "fp32"
    if precision not in PTQ_PRECISIONS:
        if options.get("ptq_method"):
            raise InvalidArgument(f"--ptq-method applies to --precision int8, fp8 or int4, not {precision}")
        return None
    from specrt.compiler.quantize_step import check_ppl_limit

    check_ppl_limit(options.get("max_ppl_increase"))
    return PTQConfig(precision, options.get("ptq_method"))


def ptq_step(cfg: PTQConfig, options: dict[str, Any], results: dict[str, dict]) -> Step:
    """The compile step that writes each model's Q/DQ graph (`<role>/model.<precision>.qdq.onnx`) and measures
    its quality; `results[role]` gets `engines.<role>.quantization`. Runs on a CPU (no TensorRT)."""
    from specrt.compiler.quality import quality_texts
    from specrt.compiler.quantize_prepare import read_calibration
    from specrt.compiler.trt.ptq import ptq_model

    calibration = options.get("calibration_data")
    text = read_calibration(Path(calibration)) if calibration is not None else None

    def quantize_graphs(tmp: Path, manifest: ManifestDraft) -> None:
        texts = quality_texts(tmp / manifest.tokenizer.path, text, calibration)
        for role, entry in manifest.models.items():
            results[role] = ptq_model(tmp, role, entry, cfg, texts, options.get("max_ppl_increase"))
            if text is not None:
                results[role]["calibration_data"] = Path(calibration).name

    return quantize_graphs


def batched_entry(entry, max_seq_len: int, max_draft_tokens: int, max_batch: int):
    """`entry` with profiles taking 1..max_batch sequences per pass (unchanged for max_batch 1). Whether the graph
    can take them is checked where the graph is read (build.trt_input_graph)."""
    from specrt.bundle.profiles import profiles_for_model

    if max_batch <= 1:
        return entry
    from specrt.bundle.graph_io import TREE_MASK

    tree = any(i.name == TREE_MASK for i in entry.inputs)
    return dataclasses.replace(entry, profiles=profiles_for_model(entry.decoder_config, max_seq_len, max_draft_tokens,
                                                                  max_batch=max_batch, past_lengths=True, tree=tree))


def trt_extra_steps(options: dict[str, Any], max_seq_len: int, max_draft_tokens: int,
                    bundle: Path | None = None) -> list[Step]:
    """The compile steps for --engines trt: one engine per model, recorded in the manifest's `engines`
    (int8 / fp8 / int4: after the step that writes and measures the Q/DQ graphs)."""
    if (options.get("engines") or "none") != "trt":
        if options.get("ptq_method"):
            raise InvalidArgument("--ptq-method applies to --engines trt with --precision int8, fp8 or int4")
        if (options.get("max_batch") or 1) > 1:
            raise InvalidArgument(MAX_BATCH_NEEDS_TRT)
        if options.get("precision") in PTQ_PRECISIONS:
            raise InvalidArgument(f"--precision {options['precision']} is for TensorRT engines (add --engines trt); "
                                  "ONNX Runtime bundles quantize with --quantize int8|int4")
        return []
    opts = build_options(options, bundle)
    ptq = ptq_config(options)
    quantized: dict[str, dict] = {}
    steps = [ptq_step(ptq, options, quantized)] if ptq is not None else []

    def build_engines(tmp: Path, manifest: ManifestDraft) -> None:
        from specrt.core.trt import import_trt, installed_facts
        from specrt.compiler.trt.build import build_engine, engine_entry

        trt = import_trt()
        o = opts
        if o.timing_cache is None:  # no bundle path given: derive it from the temporary directory's name
            name = tmp.name.lstrip(".").split(".tmp-")[0]
            o = dataclasses.replace(o, timing_cache=tmp.parent / f"{name}.timing-cache")
        facts = installed_facts("cuda:0")
        manifest.batch_size = o.max_batch
        for role, entry in list(manifest.models.items()):
            rel = f"{role}/model.{o.precision}.engine"
            src = tmp / (quantized[role]["qdq_onnx"] if role in quantized else entry.onnx)
            entry = manifest.models[role] = batched_entry(entry, manifest.max_seq_len, manifest.max_draft_tokens,
                                                          o.max_batch)
            build_engine(trt, src, tmp / rel, entry.profiles, o)
            manifest.engines[role] = engine_entry(role, rel, o, facts, quantized.get(role))
        if manifest.draft_head is not None and manifest.draft_head.precision == "fp32":
            build_head_engine(trt, tmp, manifest, o, facts)  # a quantized head (MatMulNBits) stays on ONNX Runtime

    return steps + [build_engines]


def head_build_options(opts):
    """The draft head's engine options: the bundle's float precision; fp16 beside an int8 / fp8 / int4 target (the
    head's graph has no Q/DQ nodes; it proposes, so its precision never changes the output)."""
    return opts if opts.precision in ("fp32", "fp16", "bf16") else dataclasses.replace(opts, precision="fp16")


def build_head_engine(trt, tmp: Path, manifest: ManifestDraft, opts, facts: dict[str, Any]) -> None:
    """`draft_head/head.<precision>.engine` from the head's fp32 graph, with its two profiles
    (profiles.head_profiles: decode, prefill), recorded as `engines.draft_head`. Only for an fp32 head: one
    quantized for ONNX Runtime (--quantize / --draft-quantize: MatMulNBits) keeps running there."""
    from specrt.bundle.graph_io import HEAD_ENGINE_ROLE
    from specrt.bundle.profiles import HEAD_PHASES, head_profiles
    from specrt.compiler.trt.build import build_engine, engine_entry

    head = manifest.draft_head
    o = dataclasses.replace(head_build_options(opts), max_batch=1)
    rel = f"draft_head/head.{o.precision}.engine"
    build_engine(trt, tmp / head.onnx, tmp / rel, head_profiles(head, manifest.max_seq_len), o, HEAD_PHASES)
    manifest.engines[HEAD_ENGINE_ROLE] = engine_entry(HEAD_ENGINE_ROLE, rel, o, facts, order=HEAD_PHASES)


def prepare_trt_compile(options: dict[str, Any], *, target: Path, draft: Path | None, output: Path,
                        max_seq_len: int, max_draft_tokens: int, head: Path | None = None) -> list[Step]:
    """Everything `specrt compile` needs before the export starts; returns the extra steps. `head`: a draft head
    that will get an engine (fp32: not quantized for ONNX Runtime), counted in the --gpu-memory-budget plan."""
    steps = trt_extra_steps(options, max_seq_len, max_draft_tokens, bundle=output)  # validates the options
    if steps:
        check_trt_available()
    if ptq_config(options) is not None:
        from specrt.compiler.trt.ptq import import_modelopt

        import_modelopt()
    check_budget_before_build(options, target, draft, max_seq_len, max_draft_tokens, head)
    return steps
