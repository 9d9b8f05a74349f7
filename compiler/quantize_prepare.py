"""The `QuantizePlan` that `specrt compile`'s quantization options make.

The options (click, specrt/cli/quantize_options.py) become a `QuantizeSpec` (spec.py); compile_bundle's
preflight (preflight.py) passes its option dict (keys: OPTION_NAMES) here:

    plan, draft = prepare_quantization(spec.quantize.options(), spec.draft, trt_backend=...)

Every check runs before any export: bad values, --draft-quantize without a draft, an unreadable
--calibration-data file, a self draft with TensorRT engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specrt.core.errors import InvalidArgument
from specrt.compiler.quantize import DEFAULT_BLOCK_SIZE, HEAD_QUANT_TYPE, QuantizeConfig
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the step module imports torch (validation); the CLI reads this module on every start
    from specrt.compiler.quantize_step import QuantizePlan

# the keys of `quant_options` (specrt/cli/quantize_options.py defines one option per key)
OPTION_NAMES = ("quantize", "draft_quantize", "quant_block_size", "quant_symmetric", "quant_accuracy_level",
                "quant_batch_invariant", "calibration_data", "max_ppl_increase")
def read_calibration(path: Path | None) -> str | None:
    if path is None:
        return None
    from specrt.core.textfile import CALIBRATION_MAX_BYTES, read_user_text

    text = read_user_text(path, "--calibration-data", CALIBRATION_MAX_BYTES)
    if not text.strip():
        raise InvalidArgument(f"--calibration-data {path} is empty: give a text file to measure quality on")
    return text


# option -> (its default, the flag that sets it): a changed value without any quantization would be ignored
QUANT_ONLY = {"quant_block_size": (DEFAULT_BLOCK_SIZE, "--quant-block-size"),
              "quant_symmetric": (True, "--quant-asymmetric"), "quant_accuracy_level": (None, "--quant-accuracy-level"),
              "quant_batch_invariant": (True, "--quant-fast-decode"), "calibration_data": (None, "--calibration-data"),
              "max_ppl_increase": (None, "--max-ppl-increase")}


def check_unused(options: dict[str, Any]) -> None:
    """Refuse quantization options given without anything to quantize (they would be accepted and ignored)."""
    for name, (default, flag) in QUANT_ONLY.items():
        if options.get(name) != default:
            raise InvalidArgument(f"{flag} only applies when something is quantized (--quantize, --draft-quantize, "
                                  "--draft self:int4/int8, or TensorRT int8/fp8/int4 engines)")


def _config(options: dict[str, Any], kind: str | None) -> QuantizeConfig | None:
    if kind is None:
        return None
    return QuantizeConfig(kind, block_size=options["quant_block_size"], symmetric=options["quant_symmetric"],
                          accuracy_level=options["quant_accuracy_level"],
                          batch_invariant=options["quant_batch_invariant"])


def head_quantization(options: dict[str, Any]) -> QuantizeConfig | None:
    """A draft head's precision (`--draft head:DIR`): --draft-quantize when given (e.g. an int4 head on an fp32
    target), else HEAD_QUANT_TYPE (int8) when the target is quantized; None: the head stays fp32."""
    return _config(options, options["draft_quantize"] or (HEAD_QUANT_TYPE if options["quantize"] else None))


def prepare_quantization(options: dict[str, Any], draft: Path | str | None, trt_backend: bool = False,
                         trt_ptq: bool = False, head: bool = False) -> tuple["QuantizePlan | None", Any]:
    """The plan for `compile_bundle` and the draft checkpoint to export (None for a self draft). `trt_ptq`:
    TensorRT int8 / fp8 / int4 engines, which use --calibration-data and --max-ppl-increase themselves. `head`:
    the draft is a draft head, which --draft-quantize applies to (`head_quantization`), not a draft model."""
    def config(kind: str | None) -> QuantizeConfig | None:
        return _config(options, kind)

    from specrt.compiler.quantize_step import QuantizePlan, parse_self_draft, resolve_plan

    self_kind = parse_self_draft(draft)
    if trt_ptq and not (options["quantize"] or options["draft_quantize"] or self_kind):
        read_calibration(options["calibration_data"])  # checked before any export
        return None, draft
    if self_kind is not None and trt_backend:
        raise InvalidArgument(f"--draft {draft} runs on ONNX Runtime only; drop --engines trt or use a draft checkpoint")
    plan = QuantizePlan(target=config(options["quantize"]), draft=None if head else config(options["draft_quantize"]),
                        self_draft=config(self_kind),
                        calibration_text=read_calibration(options["calibration_data"]),
                        calibration_name=options["calibration_data"].name if options["calibration_data"] else None,
                        max_ppl_increase=options["max_ppl_increase"])
    if not plan.roles():
        if not (head and options["draft_quantize"]):
            check_unused(options)
        return None, draft
    return resolve_plan(plan, draft)
