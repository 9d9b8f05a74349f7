"""`specrt compile`'s options for TensorRT engines and GPU memory budgets (click).

    @main.command("compile")
    @trt_compile_options                    # adds the options below; passes them as trt_options=dict
    def compile_cmd(..., trt_options):
        spec = compile_spec(..., trt_options=trt_options)   # -> CompileSpec.engines (compiler/spec.py)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import click

from specrt.compiler.trt.options import MAX_ENGINE_BATCH, OPTION_NAMES
from specrt.compiler.trt.memory import parse_size
from specrt.compiler.trt.ptq import METHODS, PTQ_PRECISIONS
from specrt.core.errors import InvalidArgument


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None or isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except InvalidArgument as exc:
            self.fail(str(exc), param, ctx)


_OPTIONS = [
    click.option("--engines", "engines", type=click.Choice(["none", "trt"]), default="none", show_default=True,
                 help="none: ONNX graphs only. trt: also build TensorRT engines (NVIDIA GPU + TensorRT)."),
    click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", *PTQ_PRECISIONS]), default="fp32",
                 show_default=True,
                 help="Engine precision (the ONNX graph is converted; logits stay fp32). int8 / fp8: Q/DQ on MatMul "
                      "weights and activations, int4: weight-only AWQ, fp16 elsewhere; calibrated with NVIDIA Model "
                      "Optimizer (pip install 'specrt[trt-quant]') on held-out text or --calibration-data, quality "
                      "recorded in the manifest (--max-ppl-increase applies)."),
    click.option("--ptq-method", type=click.Choice(sorted({m for ms in METHODS.values() for m in ms})), default=None,
                 help="Calibration for --precision int8 / fp8 (entropy, max; default entropy / max) or int4 "
                      "(awq_clip, awq_lite, rtn_dq; default awq_clip)."),
    click.option("--hardware-compat", type=click.Choice(["none", "ampere-plus", "same-compute-capability"]),
                 default="none", show_default=True, help="Engines that also run on other GPUs."),
    click.option("--version-compatible", is_flag=True,
                 help="Engines that run on later TensorRT versions (embeds the lean runtime)."),
    click.option("--workspace", type=SizeType(), default=None, help="TensorRT workspace limit, e.g. 4GiB (default 1GiB)."),
    click.option("--builder-optimization-level", type=click.IntRange(0, 5), default=None,
                 help="TensorRT builder optimization level 0-5 (default 3)."),
    click.option("--timing-cache", type=click.Path(path_type=Path), default=None,
                 help="TensorRT timing cache file (default: <bundle>.timing-cache next to the bundle)."),
    click.option("--gpu-memory-budget", type=SizeType(), default=None,
                 help="Refuse before building when both models do not fit, e.g. 20GiB."),
    click.option("--max-batch", type=click.IntRange(1, MAX_ENGINE_BATCH), default=1, show_default=True,
                 help="Sequences per pass the engines take: prefill / decode / verify profiles with a batch range "
                      "1..N (the batched portable graph; Python: open_batch_runner(bundle, backend='trt')). "
                      "Needs --engines trt."),
]


def trt_compile_options(fn: Callable) -> Callable:
    """Click decorator: adds the options above and passes them to `fn` as one kwarg `trt_options`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        trt_options = {name: kwargs.pop(name, None) for name in OPTION_NAMES}
        return fn(*args, trt_options=trt_options, **kwargs)

    wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))
    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper
