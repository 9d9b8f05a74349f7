"""`specrt compile`'s options for quantized bundles (click).

    @quantize_compile_options               # adds the options below; passes them as quant_options=dict
    def compile_cmd(..., quant_options):
        spec = compile_spec(..., quant_options=quant_options)   # -> CompileSpec.quantize (compiler/spec.py)
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

from specrt.compiler.quantize import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, QUANT_TYPES
from specrt.compiler.quantize_prepare import OPTION_NAMES

_TYPES = click.Choice(list(QUANT_TYPES))

_OPTIONS = [
    click.option("--quantize", "quantize", type=_TYPES, default=None,
                 help="Quantize the target's MatMul weights (weight-only, block-wise MatMulNBits) for ONNX Runtime."),
    click.option("--draft-quantize", type=_TYPES, default=None,
                 help="Quantize the draft checkpoint's weights, or the draft head's (--draft head:DIR; a head follows "
                      "--quantize otherwise)."),
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
