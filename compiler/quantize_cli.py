"""`specrt compile` options for quantized bundles, and the `QuantizePlan` they make.

Wiring (specrt/cli/commands/core.py):

    @quantize_compile_options               # adds the options below; passes them as quant_options=dict
    def compile_cmd(..., quant_options):
        plan, draft = prepare_quantization(quant_options, draft, trt_backend=...)
        compile_bundle(..., draft=draft, quantization=plan)

Every check runs before any export: bad values, --draft-quantize without a draft, an unreadable
--calibration-data file, a self draft with TensorRT engines.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from specrt.core.errors import InvalidArgument
from specrt.compiler.quantize import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, QUANT_TYPES, QuantizeConfig
from specrt.compiler.quantize_step import QuantizePlan, parse_self_draft, resolve_plan

OPTION_NAMES = ("quantize", "draft_quantize", "quant_block_size", "quant_symmetric", "quant_accuracy_level",
                "quant_batch_invariant", "calibration_data", "max_ppl_increase")
_TYPES = click.Choice(list(QUANT_TYPES))

_OPTIONS = [
    click.option("--quantize", "quantize", type=_TYPES, default=None,
                 help="Quantize the target's MatMul weights (weight-only, block-wise MatMulNBits) for ONNX Runtime."),
    click.option("--draft-quantize", type=_TYPES, default=None, help="Quantize the draft checkpoint's weights."),
    click.option("--quant-block-size", type=int, default=DEFAULT_BLOCK_SIZE, show_default=True,
                 help="Weights per quantization block along K (power of two, 16-256)."),
    click.option("--quant-symmetric/--quant-asymmetric", default=True, show_default=True,
                 help="Symmetric blocks (scale only) or asymmetric (scale + zero point)."),
    click.option("--quant-accuracy-level", type=click.IntRange(0, 4), default=None,
                 help=f"MatMulNBits compute type: 4 int8 (fast; lossless speculation through two-row decode "
                      "calls, see --quant-fast-decode), 1 fp32 (slow multi-row passes; 0, 2, 3 run as 1 on CPUs "
                      f"without fp16/bf16 kernels). Default: {DEFAULT_ACCURACY_LEVEL} for models with a fused "
                      "ONNX Runtime graph (Llama family), 1 otherwise (their portable graph is not "
                      "batch-invariant at 4)."),
    click.option("--quant-batch-invariant/--quant-fast-decode", "quant_batch_invariant", default=True,
                 show_default=True,
                 help="Accuracy level 4 only. batch-invariant: one-token target calls run as two-row calls, on the "
                      "same MatMulNBits kernel as verify passes, so speculative output equals plain decoding. "
                      "fast-decode: one-token calls use ONNX Runtime's one-row kernel (faster plain decoding), "
                      "which rounds differently: speculative output may differ from plain decoding of the bundle."),
    click.option("--calibration-data", type=click.Path(path_type=Path), default=None,
                 help="A UTF-8 text file: quality is also measured on it (first 4096 tokens)."),
    click.option("--max-ppl-increase", type=float, default=None,
                 help="Refuse the bundle when quantization raises perplexity by more than this (0.05 = 5%)."),
]


def quantize_compile_options(fn):
    for opt in reversed(_OPTIONS):
        fn = opt(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        kwargs["quant_options"] = {name: kwargs.pop(name) for name in OPTION_NAMES}
        return fn(*args, **kwargs)

    return wrapper


def read_calibration(path: Path | None) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise InvalidArgument(f"--calibration-data {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"--calibration-data {path}: not UTF-8 text") from None
    except OSError as exc:
        raise InvalidArgument(f"--calibration-data {path}: {exc.strerror or exc}") from None
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


def prepare_quantization(options: dict[str, Any], draft: Path | str | None, trt_backend: bool = False,
                         trt_ptq: bool = False) -> tuple[QuantizePlan | None, Any]:
    """The plan for `compile_bundle` and the draft checkpoint to export (None for a self draft). `trt_ptq`:
    TensorRT int8 / fp8 / int4 engines, which use --calibration-data and --max-ppl-increase themselves."""
    def config(kind: str | None) -> QuantizeConfig | None:
        if kind is None:
            return None
        return QuantizeConfig(kind, block_size=options["quant_block_size"], symmetric=options["quant_symmetric"],
                              accuracy_level=options["quant_accuracy_level"],
                              batch_invariant=options["quant_batch_invariant"])

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
        check_unused(options)
        return None, draft
    return resolve_plan(plan, draft)
