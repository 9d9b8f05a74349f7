"""The `QuantizePlan` that `specrt compile`'s quantization options make.

The options themselves (click) are in specrt/cli/quantize_options.py, which passes them here as one dict
`quant_options` (keys: OPTION_NAMES):

    plan, draft = prepare_quantization(quant_options, draft, trt_backend=...)
    compile_bundle(..., draft=draft, quantization=plan)

Every check runs before any export: bad values, --draft-quantize without a draft, an unreadable
--calibration-data file, a self draft with TensorRT engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.core.errors import InvalidArgument
from specrt.compiler.quantize import QuantizeConfig
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the step module imports torch (validation); the CLI reads this module on every start
    from specrt.compiler.quantize_step import QuantizePlan

# the keys of `quant_options` (specrt/cli/quantize_options.py defines one option per key)
OPTION_NAMES = ("quantize", "draft_quantize", "quant_block_size", "quant_symmetric", "quant_accuracy_level",
                "quant_batch_invariant", "calibration_data", "max_ppl_increase")
def read_calibration(path: Path | None) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise InvalidArgument(f"--calibration-data {path}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"--calibration-data {path}: not UTF-8 text") from None


def prepare_quantization(options: dict[str, Any], draft: Path | str | None, trt_backend: bool = False,
                         trt_ptq: bool = False) -> tuple["QuantizePlan | None", Any]:
    """The plan for `compile_bundle` and the draft checkpoint to export (None for a self draft). `trt_ptq`:
    TensorRT int8 / fp8 / int4 engines, which use --calibration-data and --max-ppl-increase themselves."""
    def config(kind: str | None) -> QuantizeConfig | None:
        if kind is None:
            return None
        return QuantizeConfig(kind, block_size=options["quant_block_size"], symmetric=options["quant_symmetric"],
                              accuracy_level=options["quant_accuracy_level"],
                              batch_invariant=options["quant_batch_invariant"])

    from specrt.compiler.quantize_step import QuantizePlan, parse_self_draft, resolve_plan

    self_kind = parse_self_draft(draft)
    if trt_ptq and not (options["quantize"] or options["draft_quantize"] or self_kind):
        read_calibration(options["calibration_data"])  # checked before any export
        return None, draft
    if self_kind is not None and trt_backend:
        raise InvalidArgument(f"--draft {draft} runs on ONNX Runtime only; drop --engines trt or use a draft checkpoint")
    plan = QuantizePlan(target=config(options["quantize"]), draft=config(options["draft_quantize"]),
                        self_draft=config(self_kind),
                        calibration_text=read_calibration(options["calibration_data"]),
                        calibration_name=options["calibration_data"].name if options["calibration_data"] else None,
                        max_ppl_increase=options["max_ppl_increase"])
    if not plan.roles():
        return None, draft
    return resolve_plan(plan, draft)
