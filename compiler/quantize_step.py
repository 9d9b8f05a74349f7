"""The compile step that quantizes a bundle's models, measures what it costs, and adds a self draft.

Manifest, per quantized model (`models.<role>.quantization`):

    {"method": "MatMulNBits", "type": "int4", "bits": 4, "block_size": 32, "symmetric": true,
     "accuracy_level": 4, "min_rows": 2, "batch_invariant_setting": true,
     "reference_onnx": "target/model.onnx",                 # the unquantized graph (TensorRT, torch runner)
     "graphs": {"portable": {"onnx": "target/model.int4.onnx", "onnx_data": "...", "quantized_matmuls": 211,
                             "unquantized_weight_matmuls": 0},
                "fused": {"onnx": "target/model.fused.int4.onnx", "onnx_data": "...", "quantized_matmuls": 91,
                          "unquantized_weight_matmuls": 0, "validation": {...}}},   # when the model has a fused graph
     "quality": {"heldout": {tokens, greedy_agreement, ppl_reference, ppl_quantized, ppl_ratio},
                 "calibration": {...}},                      # with --calibration-data
     "verify_consistency": {graph, rows, argmax_equal, identical_fraction, max_abs_diff, draft_tokens}}

ONNX Runtime runners load `graphs.<variant>.onnx` (`ModelEntry.ort_onnx` / `ort_fused_onnx`,
specrt/bundle/entries.py): the CPU runner the quantized fused graph when there is one. The model's own `onnx` entry
stays the unquantized graph. Quality is measured on the quantized portable graph (same weights, same function: the
fused one is validated against it); the verify-vs-decode consistency on the graph the CPU runner runs.
`--draft self:int4` adds `models.draft`: the target's entry (same graph files, `self_draft: true`) with its own
quantized graphs under `draft/`, or, when the target is quantized with the same settings (`--quantize int4
--draft self:int4`), the target's quantized graphs themselves (each weight stored once).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from specrt.bundle.entries import GraphVariant, ModelEntry, QuantizationEntry
from specrt.bundle.writer import ManifestDraft
from specrt.core.errors import InvalidArgument
from specrt.compiler.quality import HELDOUT, GraphScorer, compare_quality, quality_texts, verify_consistency
from specrt.compiler.fused_scorer import FusedScorer
from specrt.compiler.quantize import QUANT_TYPES, QuantizeConfig, quantize_onnx
from specrt.compiler.onnx_io import save_onnx
from specrt.compiler.quantize_embed import align_portable_embedding, embedding_table
from specrt.compiler.quantize_fused import quantize_fused_onnx, validate_quantized_fused, with_accuracy_level
from specrt.compiler.validate import validation_shapes, window_shapes

SELF_DRAFT_PREFIX = "self:"
CONSISTENCY_TRIALS = 16  # positions of the held-out text, each a (k+1)-token pass against k+1 one-token passes


class QualityRefused(InvalidArgument):
    """The quantized model degrades more than --max-ppl-increase allows (exit 2, nothing written)."""


def parse_self_draft(draft: str | Path | None) -> str | None:
    """'self:int4' -> 'int4'; any other draft -> None."""
    if draft is None or not str(draft).startswith(SELF_DRAFT_PREFIX):
        return None
    kind = str(draft)[len(SELF_DRAFT_PREFIX):]
    if kind not in QUANT_TYPES:
        raise InvalidArgument(f"--draft {draft}: the self draft must be one of "
                              f"{', '.join(SELF_DRAFT_PREFIX + t for t in QUANT_TYPES)}")
    return kind


def check_ppl_limit(limit: float | None) -> None:
    """--max-ppl-increase: None (no limit) or >= 0."""
    if limit is not None and not limit >= 0:
        raise InvalidArgument(f"--max-ppl-increase must be >= 0 (0.05 = 5%), got {limit}")


@dataclasses.dataclass(frozen=True)
class QuantizePlan:
    """What `compile` quantizes. `self_draft`: the target quantized again as the draft model."""

    target: QuantizeConfig | None = None
    draft: QuantizeConfig | None = None
    self_draft: QuantizeConfig | None = None
    calibration_text: str | None = None
    calibration_name: str | None = None
    max_ppl_increase: float | None = None  # refuse when ppl_quantized / ppl_reference - 1 exceeds it

    def __post_init__(self) -> None:
        if self.draft is not None and self.self_draft is not None:
            raise InvalidArgument("--draft-quantize applies to a draft checkpoint; a self draft is quantized "
                                  "already (--draft self:int4 or self:int8)")
        if not self.roles():
            if self.calibration_text is not None or self.max_ppl_increase is not None:
                raise InvalidArgument("--calibration-data and --max-ppl-increase need --quantize, "
                                      "--draft-quantize or --draft self:<type>")
        check_ppl_limit(self.max_ppl_increase)

    def roles(self) -> dict[str, QuantizeConfig]:
        out = {"target": self.target, "draft": self.draft or self.self_draft}
        return {role: cfg for role, cfg in out.items() if cfg is not None}


def model_dims(entry: ModelEntry) -> dict[str, int]:
    c = entry.decoder_config
    return {"num_layers": c.num_layers, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim}


def graph_variants(entry: ModelEntry) -> dict[str, str]:
    """variant -> relative ONNX path of the graphs to quantize: the portable graph, and the fused one when the
    model has it (ONNX Runtime's CPU runner runs that one)."""
    return {variant: entry.graph(variant).onnx for variant in ("portable", "fused") if entry.graph(variant)}


def self_draft_entry(target: ModelEntry) -> ModelEntry:
    return dataclasses.replace(target, role="draft", quantization=None, self_draft=True)


def check_quality(role: str, quality: dict[str, dict], limit: float | None,
                  hint: str = "try int8, a smaller --quant-block-size, or a higher limit") -> None:
    if limit is None:
        return
    for text, q in quality.items():
        increase = q["ppl_ratio"] - 1.0
        if increase > limit:
            raise QualityRefused(
                f"quantized {role} raises perplexity on the {text} text by {increase:.1%} "
                f"({q['ppl_reference']:.3g} -> {q['ppl_quantized']:.3g}), above --max-ppl-increase {limit:g}: "
                f"no bundle written ({hint})"
            )


def quantize_model(tmp: Path, role: str, entry: ModelEntry, cfg: QuantizeConfig, texts: dict,
                   plan: QuantizePlan, max_seq_len: int, max_draft_tokens: int) -> QuantizationEntry:
    (tmp / role).mkdir(exist_ok=True)
    cfg = cfg.for_model("fused" in graph_variants(entry))
    graphs = {}
    for variant, rel in graph_variants(entry).items():
        stem = "model" if variant == "portable" else f"model.{variant}"
        out_rel = f"{role}/{stem}.{cfg.type}.onnx"
        quantize = quantize_fused_onnx if variant == "fused" else quantize_onnx
        counts = quantize(tmp / rel, tmp / out_rel, cfg)
        graphs[variant] = GraphVariant(out_rel, out_rel + ".data", **counts)
    if "fused" in graphs:
        align_portable_graph(tmp / graphs["portable"].onnx, tmp / graphs["fused"].onnx)
    dims = model_dims(entry)
    if "fused" in graphs:
        validation = validate_fused_variant(tmp, graphs, entry, cfg, max_seq_len, max_draft_tokens)
        graphs["fused"] = dataclasses.replace(graphs["fused"], validation=validation)
    reference = GraphScorer(tmp / entry.onnx, dims)
    quantized = GraphScorer(tmp / graphs["portable"].onnx, dims)
    quality = {name: compare_quality(reference, quantized, ids) for name, ids in texts.items()}
    check_quality(role, quality, plan.max_ppl_increase)
    runs = "fused" if "fused" in graphs else "portable"
    scorer = (FusedScorer(tmp / graphs["fused"].onnx, dims, max_seq_len, min_rows=cfg.min_rows) if runs == "fused"
              else GraphScorer(tmp / graphs["portable"].onnx, dims, min_rows=cfg.min_rows))
    consistency = {"graph": runs} | verify_consistency(scorer, texts[HELDOUT], k=max_draft_tokens,
                                                       trials=CONSISTENCY_TRIALS)
    return QuantizationEntry(**cfg.to_dict(), reference_onnx=entry.onnx, graphs=graphs, quality=quality,
                             calibration_data=plan.calibration_name, verify_consistency=consistency)


def align_portable_graph(portable: Path, fused: Path) -> None:
    """When the quantized fused graph reads a quantized embedding (compiler/quantize_embed.py), give the quantized
    portable graph the same table dequantized: the two compute the same function again, and the quality measured on
    the portable graph includes the embedding's quantization."""
    import onnx

    table = embedding_table(onnx.load(str(fused), load_external_data=True))
    if table is None:
        return
    model = onnx.load(str(portable), load_external_data=True)
    align_portable_embedding(model, table)
    save_onnx(model, portable)


def validate_fused_variant(tmp: Path, graphs: dict[str, GraphVariant], entry: ModelEntry, cfg: QuantizeConfig,
                           max_seq_len: int, max_draft_tokens: int) -> dict[str, Any]:
    """The quantized fused graph against the quantized portable graph, both at fp32 compute (accuracy level 1):
    same weights, so the graph and its quantized weights are checked; level 4 only changes how MatMulNBits
    computes, and its int8 activations turn any upstream rounding difference into a step, which no tolerance
    separates from a bug."""
    paths = {v: tmp / graphs[v].onnx for v in ("portable", "fused")}
    copies = []
    if cfg.level not in (0, 1):
        for v, path in paths.items():
            copies.append(with_accuracy_level(path, path.with_name(f".{path.stem}.level1.onnx"), 1))
            paths[v] = copies[-1]
    try:
        return validate_quantized_fused(paths["portable"], paths["fused"], model_dims(entry),
                                        entry.decoder_config.vocab_size, max_seq_len,
                                        validation_shapes(max_seq_len, max_draft_tokens)
                                        + window_shapes(entry.decoder_config, max_seq_len, max_draft_tokens))
    finally:
        for path in copies:
            path.unlink(missing_ok=True)


def shares_target_weights(plan: QuantizePlan, models: dict[str, ModelEntry]) -> bool:
    """A self draft quantized exactly like the already quantized target (`--quantize int4 --draft self:int4`):
    quantizing again would write the same files a second time."""
    target = models["target"].quantization
    return (plan.self_draft is not None and plan.target is not None and target is not None
            and plan.self_draft == plan.target)


def apply_quantization(plan: QuantizePlan, tmp: Path, manifest: ManifestDraft,
                       progress: Callable[[str], Callable[[], None]]) -> None:
    """Quantize the planned models of the bundle being written in `tmp`, updating `manifest` in place."""
    texts = quality_texts(tmp / manifest.tokenizer.path, plan.calibration_text, plan.calibration_name)
    models = manifest.models
    if plan.self_draft is not None:
        models["draft"] = self_draft_entry(models["target"])
    for role, cfg in plan.roles().items():
        if role == "draft" and shares_target_weights(plan, models):
            # the same graphs, bit for bit: the draft points at the target's quantized files (stored once)
            models[role] = dataclasses.replace(models[role], quantization=models["target"].quantization)
            continue
        done = progress(f"quantize {role} ({cfg.type}, block {cfg.block_size}) and measure its quality")
        quantization = quantize_model(tmp, role, models[role], cfg, texts, plan, manifest.max_seq_len,
                                      manifest.max_draft_tokens)
        models[role] = dataclasses.replace(models[role], quantization=quantization)
        done()


def resolve_plan(plan: QuantizePlan | None, draft: str | Path | None) -> tuple[QuantizePlan | None, Any]:
    """Turn `draft="self:int4"` into the plan's self draft (settings as the target's, else defaults) and check
    that a quantized draft has a draft. Returns (plan, draft checkpoint or None)."""
    kind = parse_self_draft(draft)
    if kind is not None:
        plan = plan or QuantizePlan()
        if plan.self_draft is None:
            base = plan.target or QuantizeConfig(kind)
            plan = dataclasses.replace(plan, self_draft=dataclasses.replace(base, type=kind))
        draft = None
    if plan is not None and plan.draft is not None and draft is None:
        raise InvalidArgument("--draft-quantize needs a draft checkpoint (--draft DIR)")
    return plan, draft
