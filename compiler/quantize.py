"""`quantize_onnx`: weight-only, block-wise int8 / int4 quantization of any ONNX graph whose MatMuls read
initializers, with ONNX Runtime's own `MatMulNBitsQuantizer` (MatMul -> com.microsoft::MatMulNBits).

The graph first goes through ONNX Runtime's offline optimizer at the *basic* level (constant folding,
redundant-node elimination: provider independent), so a weight reached through a Transpose (the portable
export, tied LM heads) becomes a MatMul initializer in MatMul layout. A graph that already stores its weights
as MatMul initializers (a fused graph) passes through unchanged. Nothing here is hand-written quantization.

Batch invariance (lossless speculation over a quantized target): see `DEFAULT_ACCURACY_LEVEL`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

from ..core.errors import InvalidArgument, SpecrtError

QUANT_TYPES = {"int8": 8, "int4": 4}
# MatMulNBits `accuracy_level`: 0 unset (= 1), 1 fp32, 2 fp16, 3 bf16, 4 int8 compute. Measured on the CPU
# provider (onnxruntime 1.32, x86-64), logits of one (k+1)-token pass against k+1 one-token passes: levels 0-3
# differ by accumulation-order noise only, like the fp32 graph (tiny model 2e-6; SmolLM2-135M, logits ~20:
# int4 1.8e-4, int8 5.6e-5, fp32 4.6e-5, every argmax equal); level 4 (int4) quantizes the activations in a
# way that depends on the rows in the call (tiny model 6.5e-3), enough to flip near-tie argmaxes: greedy
# speculative output diverged from plain decoding of the same graph (issue 14's probe, SmolLM2 int4).
# Level 1 is the default: speculation over the quantized target stays lossless.
DEFAULT_ACCURACY_LEVEL = 1
MIN_ROWS_INVARIANT = 2
DEFAULT_BLOCK_SIZE = 32


class QuantizationError(SpecrtError):
    exit_code = 1


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """How one model's MatMul weights are quantized (weight-only, block-wise along K)."""

    type: str  # "int8" | "int4"
    block_size: int = DEFAULT_BLOCK_SIZE
    symmetric: bool = True
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL
    batch_invariant: bool = True  # level 4: pad one-row target calls to MIN_ROWS_INVARIANT rows (see above)

    def __post_init__(self) -> None:
        if self.type not in QUANT_TYPES:
            raise InvalidArgument(f"quantization type must be one of {', '.join(QUANT_TYPES)}, got {self.type!r}")
        b = self.block_size
        if b < 16 or b > 256 or b & (b - 1):
            raise InvalidArgument(f"--quant-block-size must be a power of two in [16, 256], got {b}")
        if not 0 <= self.accuracy_level <= 4:
            raise InvalidArgument(f"--quant-accuracy-level must be in [0, 4], got {self.accuracy_level}")
        if not self.batch_invariant and self.accuracy_level != 4:
            raise InvalidArgument(f"--quant-fast-decode applies to --quant-accuracy-level 4 only (got "
                                  f"{self.accuracy_level}: every pass already uses the fp32-compute kernels)")

    @property
    def bits(self) -> int:
        return QUANT_TYPES[self.type]

    @property
    def min_rows(self) -> int:
        """Rows per target call on ONNX Runtime's CPU runners (runtime/backends/ort/)."""
        return MIN_ROWS_INVARIANT if self.accuracy_level == 4 and self.batch_invariant else 1

    def to_dict(self) -> dict[str, Any]:
        return {"method": "MatMulNBits", "type": self.type, "bits": self.bits, "block_size": self.block_size,
                "symmetric": self.symmetric, "accuracy_level": self.accuracy_level, "min_rows": self.min_rows,
                "batch_invariant_setting": self.accuracy_level != 4 or self.batch_invariant}


def weights_as_matmul_initializers(src: Path, dst: Path) -> Path:
    """ONNX Runtime's basic offline optimization of `src`, saved as `dst` (+ `dst.data`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(dst)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise QuantizationError(f"ONNX Runtime could not optimize {src.name} before quantization: {exc}") from None
    return dst


def count_weight_matmuls(model) -> tuple[int, int]:
    """(MatMuls whose B input is an initializer, MatMulNBits nodes) in the main graph."""
    inits = {t.name for t in model.graph.initializer}
    matmuls = sum(1 for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits)
    nbits = sum(1 for n in model.graph.node if n.op_type == "MatMulNBits")
    return matmuls, nbits


@contextlib.contextmanager
def _quiet_quantizer():
    """The quantizer logs one INFO line per node; keep the compile output readable."""
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def quantize_onnx(src: Path, dst: Path, config: QuantizeConfig) -> dict[str, Any]:
    """Quantize the MatMul weights of `src` into `dst` (+ `dst.data`). Returns counts for the manifest."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    src, dst = Path(src), Path(dst)
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=dst.parent) as tmp:
        optimized = weights_as_matmul_initializers(src, Path(tmp) / "optimized.onnx")
        model = onnx.load(str(optimized), load_external_data=True)
        candidates, _ = count_weight_matmuls(model)
        if candidates == 0:
            raise QuantizationError(
                f"{src.name}: no MatMul reads a weight initializer, even after ONNX Runtime's constant folding; "
                "nothing to quantize"
            )
        ir_version = model.ir_version
        with _quiet_quantizer():
            quantizer = MatMulNBitsQuantizer(model, bits=config.bits, block_size=config.block_size,
                                             is_symmetric=config.symmetric, accuracy_level=config.accuracy_level,
                                             op_types_to_quantize=("MatMul",))
            quantizer.process()
        qmodel = quantizer.model.model
        qmodel.ir_version = ir_version
        left, nbits = count_weight_matmuls(qmodel)
    for f in (dst, Path(str(dst) + ".data")):
        f.unlink(missing_ok=True)
    onnx.save_model(qmodel, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
    return {"quantized_matmuls": nbits, "unquantized_weight_matmuls": left}
