"""Every check of a `CompileSpec` that reads files, before any export, and the compile steps it implies.

`preflight(spec)` -> `Preflight`: the draft checkpoint to export (None for a self draft or a draft head), the
quantization plan, and the steps that run after the models are exported (draft head, Medusa heads, TensorRT
Q/DQ graphs and engines). It fails with one line naming the option: a missing or wrong input directory, an
output that may not be written, an unreadable --calibration-data file, TensorRT options without TensorRT, a
memory plan over --gpu-memory-budget.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from specrt.bundle.writer import ManifestDraft
from specrt.core.errors import InvalidArgument
from specrt.compiler.input_check import check_checkpoint_dir
from specrt.compiler.output_dir import check_output
from specrt.compiler.quantize_prepare import head_quantization, prepare_quantization
from specrt.compiler.spec import CompileSpec
from specrt.compiler.trt.compile_steps import prepare_trt_compile
from specrt.compiler.trt.ptq import PTQ_PRECISIONS

Step = Callable[[Path, ManifestDraft], None]  # (temporary bundle directory, the manifest being written)


@dataclasses.dataclass(frozen=True)
class Preflight:
    draft: Path | None  # the draft checkpoint to export
    quantization: object | None  # QuantizePlan (compiler/quantize_step.py) or None
    steps: tuple[Step, ...]  # after export, quantization: draft head, Medusa, TensorRT
    feature_layers: tuple[int, ...] = ()  # a fused draft head's: the target graphs output them (feature_layers.py)


def preflight(spec: CompileSpec) -> Preflight:
    """Check `spec` against the file system (nothing is written) and plan its extra steps."""
    head = spec.head_dir
    e = spec.engines
    layers: tuple[int, ...] = ()
    if head is not None:
        from specrt.models.draft_head import head_feature_layers, read_head_config

        layers = head_feature_layers(read_head_config(head)) or ()
        if layers and e.kind == "trt":
            raise InvalidArgument(f"--draft head:{head} is a fused draft head: its target layers are not bound by "
                                  "the TensorRT runners yet; compile it without --engines trt (ONNX Runtime)")
    plan, draft = prepare_quantization(spec.quantize.options(), None if head is not None else spec.draft,
                                       trt_backend=e.kind == "trt", trt_ptq=e.precision in PTQ_PRECISIONS,
                                       head=head is not None)
    for flag, path in (("--target", spec.target), ("--draft", draft), ("--medusa", spec.medusa)):
        if path is not None:
            check_checkpoint_dir(path, flag)
    check_output(spec.output, spec.force, (spec.target, draft, spec.medusa, head, *spec.keep_clear))
    steps: list[Step] = []
    if head is not None:
        from specrt.compiler.draft_head import draft_head_step

        steps.append(draft_head_step(head, spec.target, head_quantization(spec.quantize.options())))
    if spec.medusa is not None:
        from specrt.compiler.medusa import medusa_step

        steps.append(medusa_step(spec.medusa, spec.target))
    trt_options = e.options() | {"calibration_data": spec.quantize.calibration_data,
                                 "max_ppl_increase": spec.quantize.max_ppl_increase}
    # a head quantized for ONNX Runtime (MatMulNBits) gets no engine (compiler/trt/compile_steps.py: build_engines)
    head_engine = head if head is not None and head_quantization(spec.quantize.options()) is None else None
    steps += prepare_trt_compile(trt_options, target=spec.target, draft=draft, output=spec.output,
                                 max_seq_len=spec.max_seq_len, max_draft_tokens=spec.max_draft_tokens,
                                 head=head_engine)
    return Preflight(draft, plan, tuple(steps), layers)
