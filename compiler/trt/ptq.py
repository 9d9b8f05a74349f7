"""TensorRT int8 / fp8 / int4 engines: post-training quantization with NVIDIA Model Optimizer's ONNX PTQ.

    portable fp32 graph
      --modelopt.onnx.quantization.quantize (calibrated with ONNX Runtime on held-out text windows)-->
    Q/DQ graph, fp32 elsewhere          int8 / fp8: Q/DQ on the activations and weights of every MatMul;
                                        int4: weight-only DequantizeLinear with block-wise int4 weights (AWQ)
      --restore_inputs--> the portable graph's inputs, in order (modelopt drops inputs that have an initializer,
                          e.g. `logit_start`)
      --compare_quality (ONNX Runtime CPU, the Q/DQ graph as is)--> the manifest's `engines.<role>.quantization`
      --half_onnx_from_fp32--> fp16 everywhere but the Q/DQ types, the fp32 islands and the logits: the graph a
                               strongly typed TensorRT network builds (Q/DQ nodes decide the low precision)

Model Optimizer is import-optional (`pip install 'specrt[trt-quant]'`); `import_modelopt()` is the one place
that imports it. Everything here runs on a CPU except the engine build that follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.core.errors import BackendUnavailable, InvalidArgument
from specrt.compiler.onnx_io import save_onnx

PTQ_PRECISIONS = ("int8", "fp8", "int4")
METHODS = {"int8": ("entropy", "max"), "fp8": ("max", "entropy"), "int4": ("awq_clip", "awq_lite", "rtn_dq")}
INSTALL_HINT = "pip install 'specrt[trt-quant]' (NVIDIA Model Optimizer: nvidia-modelopt[onnx])"
CALIBRATION_WINDOW = 64  # tokens per calibration sample (a prefill from an empty cache)
CALIBRATION_SAMPLES = 16
INT4_BLOCK_SIZE = 128


def import_modelopt():
    """`modelopt.onnx.quantization`, or BackendUnavailable naming the package."""
    try:
        import modelopt.onnx.quantization as mq
    except ImportError as exc:
        raise BackendUnavailable(f"--precision int8 / fp8 / int4 quantizes with NVIDIA Model Optimizer, which is "
                                 f"not installed ({exc.name or exc}): {INSTALL_HINT}") from None
    return mq


@dataclasses.dataclass(frozen=True)
class PTQConfig:
    precision: str
    method: str | None = None  # None: METHODS[precision][0]
    block_size: int = INT4_BLOCK_SIZE  # int4 only

    def __post_init__(self) -> None:
        if self.precision not in PTQ_PRECISIONS:
            raise InvalidArgument(f"post-training quantization precision {self.precision!r}: choose one of "
                                  f"{', '.join(PTQ_PRECISIONS)}")
        if self.method is not None and self.method not in METHODS[self.precision]:
            raise InvalidArgument(f"--ptq-method {self.method} does not apply to --precision {self.precision}: "
                                  f"choose one of {', '.join(METHODS[self.precision])}")
        if self.precision == "int4" and (self.block_size < 16 or self.block_size & (self.block_size - 1)):
            raise InvalidArgument(f"int4 block size must be a power of two >= 16, got {self.block_size}")

    @property
    def calibration_method(self) -> str:
        return self.method or METHODS[self.precision][0]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": "nvidia-modelopt", "precision": self.precision,
                               "calibration_method": self.calibration_method}
        if self.precision == "int4":
            out["block_size"] = self.block_size
        return out


class CalibrationReader:
    """ONNX Runtime's calibration-reader protocol (get_next / rewind, and modelopt's get_first) over prefill
    samples: windows of `ids` with an empty KV cache, the portable graph's inputs (minus defaulted ones)."""

    def __init__(self, ids: np.ndarray, dims: dict[str, int], window: int = CALIBRATION_WINDOW,
                 samples: int = CALIBRATION_SAMPLES) -> None:
        window = min(window, ids.size)
        starts = np.linspace(0, ids.size - window, min(samples, max(1, ids.size // window))).astype(int)
        empty = np.zeros((1, 0, dims["num_kv_heads"], dims["head_dim"]), np.float32)
        self.items = []
        for start in dict.fromkeys(starts.tolist()):
            feeds = {graph_io.INPUT_IDS: ids[None, start:start + window].astype(np.int64),
                     graph_io.POSITION_IDS: np.arange(window, dtype=np.int64)[None]}
            for i in range(dims["num_layers"]):
                feeds[graph_io.past_key(i)] = feeds[graph_io.past_value(i)] = empty
            self.items.append(feeds)
        self._it = iter(self.items)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def get_first(self) -> dict[str, np.ndarray]:
        return self.items[0]

    def rewind(self) -> None:
        self._it = iter(self.items)

    def __iter__(self):  # modelopt's AWQ iterates the reader
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def calibration_eps() -> list[str]:
    """ONNX Runtime providers modelopt calibrates with: the GPU when onnxruntime-gpu has it, else the CPU."""
    import onnxruntime as ort

    return (["cuda:0", "cpu"] if "CUDAExecutionProvider" in ort.get_available_providers() else ["cpu"])


def restore_inputs(model, source) -> None:
    """Give `model` the graph inputs of `source` (same names, order and types): modelopt drops inputs that also
    have an initializer (a default value), but the runners feed them."""
    have = {i.name: i for i in model.graph.input}
    initializers = {t.name for t in model.graph.initializer}
    restored = []
    for inp in source.graph.input:
        if inp.name in have:
            restored.append(have.pop(inp.name))
        elif inp.name in initializers:
            restored.append(inp)
        else:
            raise InvalidArgument(f"the quantized graph lost input {inp.name!r}")
    if have:
        raise InvalidArgument(f"the quantized graph has new inputs {sorted(have)}")
    del model.graph.input[:]
    model.graph.input.extend(restored)


LAYOUT_OPS = ("Transpose", "Reshape", "Cast", "Unsqueeze", "Expand")


def qdq_summary(model) -> dict[str, Any]:
    """What a Q/DQ graph quantizes. Per MatMul / Gemm, its inputs are traced back through layout ops and Q/DQ
    nodes: a weight MatMul reads an initializer (quantized when a DequantizeLinear is on the way), an activation
    MatMul (attention scores and values) reads no initializer (quantized when it reads a DequantizeLinear).
    Also the Q/DQ element types, from their zero points (int4 weights: from the weight initializer)."""
    import onnx

    producers = {o: n for n in model.graph.node for o in n.output}
    initializers = {t.name: t for t in model.graph.initializer}

    def trace(name: str) -> tuple[bool, bool]:  # (reaches an initializer, passes a DequantizeLinear)
        dq = False
        while name not in initializers:
            node = producers.get(name)
            if node is None or node.op_type not in LAYOUT_OPS + ("QuantizeLinear", "DequantizeLinear"):
                return False, dq
            dq |= node.op_type == "DequantizeLinear"
            name = node.input[0]
        return True, dq

    counts = Counter()
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm"):
            continue
        traced = [trace(x) for x in n.input[:2]]
        if any(weight for weight, _ in traced):
            counts["quantized_matmuls" if any(dq for _, dq in traced) else "unquantized_weight_matmuls"] += 1
        elif any(dq for _, dq in traced):
            counts["quantized_activation_matmuls"] += 1
    types = Counter()
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            t = initializers.get(n.input[2]) if len(n.input) > 2 and n.input[2] else initializers.get(n.input[0])
            if t is not None and t.data_type != onnx.TensorProto.FLOAT:
                types[onnx.TensorProto.DataType.Name(t.data_type)] += 1
    return {key: counts[key] for key in ("quantized_matmuls", "unquantized_weight_matmuls",
                                         "quantized_activation_matmuls")} | {"qdq_types": dict(sorted(types.items()))}


@contextlib.contextmanager
def _quiet():
    """modelopt logs and prints per tensor; keep compile's console to its own progress lines."""
    loggers = [logging.getLogger(n) for n in ("modelopt", "modelopt.onnx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def quantize_for_trt(src: Path, dst: Path, cfg: PTQConfig, ids: np.ndarray, dims: dict[str, int]) -> dict[str, Any]:
    """fp32 portable graph `src` -> Q/DQ graph `dst` (+ `dst.data`), fp32 outside the Q/DQ nodes, same inputs.
    Returns the manifest facts (settings and qdq_summary)."""
    import onnx

    mq = import_modelopt()
    reader = CalibrationReader(ids, dims)
    source = onnx.load(str(src), load_external_data=False)
    kwargs: dict[str, Any] = {}
    if cfg.precision == "int4":
        kwargs["block_size"] = cfg.block_size
    raw = dst.with_name(f".{dst.stem}.modelopt.onnx")
    try:
        with _quiet():
            mq.quantize(str(src), quantize_mode=cfg.precision, calibration_data_reader=reader,
                        calibration_method=cfg.calibration_method, calibration_eps=calibration_eps(),
                        high_precision_dtype="fp32", output_path=str(raw), use_external_data_format=True,
                        log_level="ERROR", **kwargs)
        model = onnx.load(str(raw))
    finally:
        for leftover in raw.parent.glob(raw.name + "*"):
            leftover.unlink()
    restore_inputs(model, source)
    save_onnx(model, dst)
    return cfg.to_dict() | {"calibration_samples": len(reader.items), "calibration_window": reader.items[0][
        graph_io.INPUT_IDS].shape[1]} | qdq_summary(model)


def ptq_model(tmp: Path, role: str, entry, cfg: PTQConfig, texts: dict[str, np.ndarray],
              max_ppl_increase: float | None) -> dict[str, Any]:
    """Quantize one bundle model's portable graph for TensorRT into `<role>/model.<precision>.qdq.onnx` and
    measure what it costs against the fp32 graph (held-out text, and the user's --calibration-data when given;
    the calibration itself uses that text when given, else the held-out text). Raises QualityRefused over the
    limit. Returns `engines.<role>.quantization`."""
    from specrt.compiler.quality import HELDOUT, GraphScorer, compare_quality
    from specrt.compiler.quantize_step import check_quality, model_dims

    dims = model_dims(entry)
    rel = f"{role}/model.{cfg.precision}.qdq.onnx"
    calibration = texts.get("calibration", texts[HELDOUT])
    facts = quantize_for_trt(tmp / entry.onnx, tmp / rel, cfg, calibration, dims)
    reference = GraphScorer(tmp / entry.onnx, dims)
    quantized = GraphScorer(tmp / rel, dims, optimize=False)  # the Q/DQ function itself, see scorer_session
    quality = {name: compare_quality(reference, quantized, ids) for name, ids in texts.items()}
    check_quality(role, quality, max_ppl_increase, hint="try --precision fp8 or int8, another --ptq-method, "
                  "or a higher limit")
    return {"qdq_onnx": rel, "qdq_onnx_data": rel + ".data"} | facts | {"quality": quality}
