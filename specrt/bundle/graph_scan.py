"""The facts `load` checks in an ONNX graph file, read from its protobuf without the `onnx` package.

`import onnx` costs seconds on a small machine (most of a cold start, docs/first-run.md) and `load` needs only a
few facts per graph: the graph's inputs and outputs (name, element type, fixed sizes), the external-data files
its initializers name, and how many nodes of each operator type it has. `scan_graph` reads exactly those from
the protobuf wire format (field numbers from onnx.proto3: ModelProto.graph = 7; GraphProto node 1, initializer
5, input 11, output 12; NodeProto.op_type 4, attribute 5; AttributeProto name 1, i 3; TensorProto.external_data
13; ValueInfoProto name 1, type 2; TypeProto.tensor_type 1; Tensor elem_type 1, shape 2; TensorShapeProto.dim 1;
Dimension dim_value 1), skipping
every other field by its length, so weights stored inside the file are never copied. A malformed file raises
`GraphScanError`. The block-quantized nodes (`QUANTIZED_OPS`) also give their integer attributes (bits, block size,
accuracy level), which `load` checks against the manifest's quantization record (quant_checks.py).
"""

from __future__ import annotations

import dataclasses
import mmap
from collections import Counter
from pathlib import Path
from typing import Mapping

__all__ = ["GraphFacts", "GraphScanError", "ValueFacts", "scan_graph", "ELEM_TYPES"]

# block-quantized operators and their attribute defaults (ONNX Runtime's ContribOperators.md)
QUANTIZED_OPS = {"MatMulNBits": {"bits": 4, "block_size": None, "accuracy_level": 0},
                 "GatherBlockQuantized": {"bits": 4, "block_size": 128, "accuracy_level": None}}

# TensorProto.DataType codes -> the dtype names the manifest uses
ELEM_TYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
              11: "float64", 16: "bfloat16"}


class GraphScanError(ValueError):
    """The file is not a well-formed ONNX protobuf."""


@dataclasses.dataclass(frozen=True)
class ValueFacts:
    """One graph input or output: `dims` holds an int per fixed dimension and None per symbolic one."""

    name: str
    elem_type: int
    dims: tuple[int | None, ...]

    @property
    def dtype(self) -> str:
        return ELEM_TYPES.get(self.elem_type, str(self.elem_type))


@dataclasses.dataclass(frozen=True)
class GraphFacts:
    inputs: tuple[ValueFacts, ...]
    outputs: tuple[ValueFacts, ...]
    external_locations: frozenset[str]  # `location` of every initializer stored outside the file
    op_counts: Counter  # op_type -> number of nodes in the main graph
    # (op_type, bits, block_size, accuracy_level) -> number of QUANTIZED_OPS nodes with those attributes
    quantized_nodes: Counter = dataclasses.field(default_factory=Counter)
    external_ends: Mapping[str, int] = dataclasses.field(default_factory=dict)  # location -> last byte read + 1


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise GraphScanError("truncated or oversized varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """Yield (field number, wire type, value) over one message; length-delimited values are (start, end)."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise GraphScanError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise GraphScanError("length-delimited field runs past its message")
            value, pos = (pos, pos + n), pos + n
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise GraphScanError("truncated fixed-size field")
            value, pos = None, pos + size
        else:
            raise GraphScanError(f"unsupported wire type {wire}")
        yield field, wire, value


def _text(buf, span) -> str:
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise GraphScanError("a string field is not UTF-8") from None


def _value_info(buf, span) -> ValueFacts:
    name, elem_type, dims = "", 0, []
    for field, wire, value in _fields(buf, *span):
        if field == 1 and wire == 2:
            name = _text(buf, value)
        elif field == 2 and wire == 2:  # TypeProto
            for f2, w2, v2 in _fields(buf, *value):
                if f2 != 1 or w2 != 2:  # tensor_type only
                    continue
                for f3, w3, v3 in _fields(buf, *v2):
                    if f3 == 1 and w3 == 0:
                        elem_type = v3
                    elif f3 == 2 and w3 == 2:  # TensorShapeProto
                        for f4, w4, v4 in _fields(buf, *v3):
                            if f4 == 1 and w4 == 2:
                                dim = None
                                for f5, w5, v5 in _fields(buf, *v4):
                                    if f5 == 1 and w5 == 0:
                                        dim = v5
                                dims.append(dim)
    return ValueFacts(name, elem_type, tuple(dims))


def _external_locations(buf, span) -> list[tuple[str, int]]:
    """(location, end) of an initializer stored outside the file: end = offset + length, 0 when no length is given."""
    entries = {}
    for field, wire, value in _fields(buf, *span):
        if field == 13 and wire == 2:  # StringStringEntryProto
            key = val = None
            for f2, w2, v2 in _fields(buf, *value):
                if w2 == 2 and f2 in (1, 2):
                    if f2 == 1:
                        key = _text(buf, v2)
                    else:
                        val = _text(buf, v2)
            if key is not None and val is not None:
                entries[key] = val
    if "location" not in entries:
        return []
    try:
        end = int(entries.get("offset", "0")) + int(entries["length"]) if "length" in entries else 0
    except ValueError:
        raise GraphScanError(f"external data of {entries['location']!r} has a non-integer offset or length") from None
    return [(entries["location"], end)]


def _node(buf, span) -> tuple[str, tuple | None]:
    """(op_type, (bits, block_size, accuracy_level) for a QUANTIZED_OPS node else None)."""
    op, attrs = "", []
    for field, wire, value in _fields(buf, *span):
        if field == 4 and wire == 2:
            op = _text(buf, value)
        elif field == 5 and wire == 2:
            attrs.append(value)
    if op not in QUANTIZED_OPS:
        return op, None
    found = dict(QUANTIZED_OPS[op])
    for span_a in attrs:
        name, number = None, None
        for f2, w2, v2 in _fields(buf, *span_a):
            if f2 == 1 and w2 == 2:
                name = _text(buf, v2)
            elif f2 == 3 and w2 == 0:
                number = v2 - (1 << 64) if v2 >= 1 << 63 else v2  # int64, two's complement
        if name in found and number is not None:
            found[name] = number
    return op, (found["bits"], found["block_size"], found["accuracy_level"])


def scan_buffer(buf) -> GraphFacts:
    graph = None
    for field, wire, value in _fields(buf, 0, len(buf)):
        if field == 7 and wire == 2:
            graph = value
    if graph is None:
        raise GraphScanError("no graph in the model")
    inputs, outputs, locations, ops, quantized = [], [], set(), Counter(), Counter()
    ends: dict[str, int] = {}
    for field, wire, value in _fields(buf, *graph):
        if wire != 2:
            continue
        if field == 1:
            op, attrs = _node(buf, value)
            ops[op] += 1
            if attrs is not None:
                quantized[(op, *attrs)] += 1
        elif field == 5:
            for loc, end in _external_locations(buf, value):
                locations.add(loc)
                ends[loc] = max(ends.get(loc, 0), end)
        elif field == 11:
            inputs.append(_value_info(buf, value))
        elif field == 12:
            outputs.append(_value_info(buf, value))
    return GraphFacts(tuple(inputs), tuple(outputs), frozenset(locations), ops, quantized, ends)


def scan_graph(path: str | Path) -> GraphFacts:
    """The facts of the ONNX graph at `path` (its external data is not read). Raises GraphScanError when the
    file is not a well-formed ONNX model, OSError when it cannot be read."""
    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            raise GraphScanError("empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return scan_buffer(view)
            finally:
                view.release()
