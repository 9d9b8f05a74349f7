"""`quantize_onnx`: weight-only, block-wise int8 / int4 quantization of any ONNX graph whose MatMuls read
initializers, with ONNX Runtime's own `MatMulNBitsQuantizer` (MatMul -> com.microsoft::MatMulNBits).

The graph first goes through ONNX Runtime's offline optimizer at the *basic* level (constant folding,
redundant-node elimination: provider independent), so a weight reached through a Transpose (the portable
export, tied LM heads) becomes a MatMul initializer in MatMul layout. A graph that already stores its weights
as MatMul initializers (a fused graph) passes through unchanged. Nothing here is hand-written quantization.

Batch invariance (lossless speculation over a quantized target): see `DEFAULT_ACCURACY_LEVEL` and `min_rows`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

from specrt.core.errors import InvalidArgument, SpecrtError
from specrt.compiler.onnx_io import save_onnx

QUANT_TYPES = {"int8": 8, "int4": 4}
# MatMulNBits `accuracy_level`: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 compute. Measured on the CPU provider
# (onnxruntime 1.32, x86-64 AVX2; scripts/quant_invariance.py, README "Lossless over a quantized target"):
# levels 0, 2 and 3 give bitwise the logits of level 1 (fp32 kernels); level 1 verify rows differ from one-token
# rows by accumulation order only (<= 2e-4 on SmolLM2-135M), but its several-row path dequantizes the weights per
# call (int8: ~0.2 one-token calls/s). Level 4 is the fast one; its one-row kernel rounds differently from its
# several-row kernel (one-token decoding and a verify pass disagree on 2-4% of argmaxes), so a level-4 target's
# one-token calls run as MIN_ROWS_INVARIANT-row calls (`min_rows`, runtime/backends/ort/): every pass then takes
# the several-row kernel, whose rows do not depend on the call's row count (100% argmax agreement, diff <= 3e-5).
DEFAULT_ACCURACY_LEVEL = 4
MIN_ROWS_INVARIANT = 2
DEFAULT_BLOCK_SIZE = 32
# A draft head in a quantized bundle (compiler/draft_head_quantize.py) is int8 whatever the target's type: on the
# SmolLM2-135M head int8 kept its held-out top-1 accuracy (0.338 -> 0.338) at 0.82 ms per call against 1.95 in
# fp32; int4 lost 17% of it (0.279) for 0.68 ms. `--draft-quantize int4` still gives an int4 head.
HEAD_QUANT_TYPE = "int8"


class QuantizationError(SpecrtError):
    exit_code = 1


@dataclasses.dataclass(frozen=True)
class QuantizeConfig:
    """How one model's MatMul weights are quantized (weight-only, block-wise along K)."""

    type: str  # "int8" | "int4"
    block_size: int = DEFAULT_BLOCK_SIZE
    symmetric: bool = True
    accuracy_level: int | None = None  # None: DEFAULT_ACCURACY_LEVEL where the model has a fused graph, else 1
    batch_invariant: bool = True  # level 4: pad one-row target calls to MIN_ROWS_INVARIANT rows (see above)

    def __post_init__(self) -> None:
        if self.type not in QUANT_TYPES:
            raise InvalidArgument(f"quantization type must be one of {', '.join(QUANT_TYPES)}, got {self.type!r}")
        b = self.block_size
        if b < 16 or b > 256 or b & (b - 1):
            raise InvalidArgument(f"--quant-block-size must be a power of two in [16, 256], got {b}")
        if self.accuracy_level is not None and not 0 <= self.accuracy_level <= 4:
            raise InvalidArgument(f"--quant-accuracy-level must be in [0, 4], got {self.accuracy_level}")
        if not self.batch_invariant and self.accuracy_level not in (None, 4):
            raise InvalidArgument(f"--quant-fast-decode applies to --quant-accuracy-level 4 only (got "
                                  f"{self.accuracy_level}: every pass already uses the fp32-compute kernels)")

    @property
    def bits(self) -> int:
        return QUANT_TYPES[self.type]

    @property
    def level(self) -> int:
        return DEFAULT_ACCURACY_LEVEL if self.accuracy_level is None else self.accuracy_level

    def for_model(self, has_fused: bool) -> "QuantizeConfig":
        """The level left open resolved for one model: level 4 with two-row decode is batch-invariant on the fused
        graph; the portable graph's attention is not row-independent, so there the open level is 1."""
        if self.accuracy_level is not None:
            return self
        if has_fused:
            return dataclasses.replace(self, accuracy_level=DEFAULT_ACCURACY_LEVEL)
        return dataclasses.replace(self, accuracy_level=1, batch_invariant=True)  # --quant-fast-decode: moot at 1

    @property
    def min_rows(self) -> int:
        """Rows per target call on ONNX Runtime's CPU runners (runtime/backends/ort/)."""
        return MIN_ROWS_INVARIANT if self.level == 4 and self.batch_invariant else 1

    def to_dict(self) -> dict[str, Any]:
        return {"method": "MatMulNBits", "type": self.type, "bits": self.bits, "block_size": self.block_size,
                "symmetric": self.symmetric, "accuracy_level": self.level, "min_rows": self.min_rows,
                "batch_invariant_setting": self.level != 4 or self.batch_invariant}


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
                                             is_symmetric=config.symmetric, accuracy_level=config.level,
                                             op_types_to_quantize=("MatMul",))
            quantizer.process()
        qmodel = quantizer.model.model
        qmodel.ir_version = ir_version
        left, nbits = count_weight_matmuls(qmodel)
    save_onnx(qmodel, dst)
    return {"quantized_matmuls": nbits, "unquantized_weight_matmuls": left}
