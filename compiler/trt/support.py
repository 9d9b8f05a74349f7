"""`onnx_support_report`: is an ONNX graph within what TensorRT's ONNX parser supports? Checked on the CPU.

The operator list and opset range below are transcribed from onnx-tensorrt's support matrix,
https://github.com/onnx/onnx-tensorrt/blob/10.1-GA/docs/operators.md ("TensorRT 10.0 supports operators
in the inclusive range of opset 9 to opset 20"): every operator marked "Y". Later TensorRT releases
support more operators and newer opsets; this check is deliberately conservative, and a graph it
passes can still fail to parse for per-operator restrictions (e.g. an input that must be an
initializer) -- building the engine is the final word.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REFERENCE = "onnx-tensorrt 10.1-GA docs/operators.md (TensorRT 10.x ONNX parser)"
MIN_OPSET, MAX_OPSET = 9, 20

SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast CastLike
Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DeformConv DepthToSpace
DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather GatherElements
GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample
GroupNormalization GRU HardSigmoid HardSwish Hardmax Identity If ImageScaler InstanceNormalization IsInf
IsNaN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LRN LSTM LpNormalization LpPool
MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression NonZero Not OneHot
Or Pad ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal RandomNormalLike RandomUniform
RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean
ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RNN RoiAlign Round
ScaledTanh Scan Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax
Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu
Unsqueeze Upsample Where Xor
""".split())

# ONNX TensorProto data types the parser takes (DOUBLE is only "limited": cast down with clamping, so
# we report it; UINT8 only as network I/O). Names as in onnx.TensorProto.DataType.
SUPPORTED_DTYPES = frozenset({"FLOAT", "FLOAT16", "BFLOAT16", "INT32", "INT64", "INT8", "UINT8", "BOOL",
                              "FLOAT8E4M3FN", "INT4"})


def _dtype_name(code: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else f"#{code}"


def _graph_dtypes(model) -> set[str]:
    from onnx import AttributeProto

    g = model.graph
    codes = {t.data_type for t in g.initializer}
    codes |= {v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    for n in list(g.node) + [n for f in model.functions for n in f.node]:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to":
                codes.add(a.i)
            elif a.type == AttributeProto.TENSOR:
                codes.add(a.t.data_type)
    codes.discard(0)  # UNDEFINED: no type recorded
    return {_dtype_name(c) for c in codes}


def _op_types(model) -> tuple[set[str], list[str]]:
    """Standard op types used (local functions expanded) and ops from other domains."""
    functions = {(f.domain, f.name): f for f in model.functions}
    ops: set[str] = set()
    foreign: list[str] = []
    seen: set[tuple[str, str]] = set()
    stack = list(model.graph.node)
    while stack:
        n = stack.pop()
        key = (n.domain, n.op_type)
        if key in functions:
            if key not in seen:
                seen.add(key)
                stack += list(functions[key].node)
        elif n.domain in ("", "ai.onnx"):
            ops.add(n.op_type)
        else:
            foreign.append(f"{n.domain}::{n.op_type}")
    return ops, sorted(set(foreign))


def onnx_support_report(onnx_path: str | Path) -> dict[str, Any]:
    """{"supported": bool, "problems": [str], "opset", "ir_version", "op_types", "dtypes", "reference"}."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    problems: list[str] = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        problems.append("no default-domain opset import")
    elif not MIN_OPSET <= opset <= MAX_OPSET:
        problems.append(f"opset {opset} outside the parser's range {MIN_OPSET}..{MAX_OPSET}")
    ops, foreign = _op_types(model)
    unsupported = sorted(ops - SUPPORTED_OPS)
    if unsupported:
        problems.append(f"operators not in the TensorRT ONNX parser's list: {', '.join(unsupported)}")
    if foreign:
        problems.append(f"operators from custom domains (need TensorRT plugins): {', '.join(foreign)}")
    dtypes = _graph_dtypes(model)
    bad = sorted(dtypes - SUPPORTED_DTYPES)
    if bad:
        problems.append(f"data types TensorRT does not take: {', '.join(bad)}")
    return {
        "supported": not problems,
        "problems": problems,
        "opset": opset,
        "ir_version": model.ir_version,
        "op_types": sorted(ops),
        "dtypes": sorted(dtypes),
        "reference": REFERENCE,
    }
