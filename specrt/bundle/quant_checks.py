"""The manifest's quantization record against the graphs it describes (docs/safety.md §2).

A quantized slot's graph must hold the quantization the manifest records: every block-quantized node
(MatMulNBits, GatherBlockQuantized; read by graph_scan.py, no `import onnx`) has the recorded number of bits (the
`type`'s: int4 -> 4, int8 -> 8) and block size, and MatMulNBits the recorded accuracy level (it decides how the
runtime pads one-token calls, `min_rows`). The draft head's graph holds the `precision` its entry records. The
record's own values are checked when the manifest is read (entries.QuantizationEntry).
"""

from __future__ import annotations

from typing import Any

from specrt.core.errors import ManifestError
from specrt.bundle.graph_scan import GraphFacts

QUANT_TYPES = {"int8": 8, "int4": 4}  # as compiler/quantize.py writes them
ACCURACY_LEVELS = (0, 4)
BLOCK_SIZES = (16, 256)  # powers of two in this range
MAX_MIN_ROWS = 16
RECOMPILE = "recompile the bundle"


def check_quantization_values(q: Any, key: str) -> None:
    """The record's values on their own: type, bits of that type, block size, accuracy level, min_rows."""
    from specrt.bundle.fields import check_int

    if q.type is not None and q.type not in QUANT_TYPES:
        raise ManifestError(f"manifest key {key}.type must be one of {', '.join(QUANT_TYPES)}, got {q.type!r}; "
                            f"{RECOMPILE}")
    if q.bits is not None:
        check_int(q.bits, f"{key}.bits", 1, 8)
        if q.type is not None and q.bits != QUANT_TYPES[q.type]:
            raise ManifestError(f"manifest key {key}.bits is {q.bits} but {key}.type is {q.type!r} "
                                f"({QUANT_TYPES[q.type]} bits); {RECOMPILE}")
    if q.block_size is not None:
        b = check_int(q.block_size, f"{key}.block_size", *BLOCK_SIZES)
        if b & (b - 1):
            raise ManifestError(f"manifest key {key}.block_size must be a power of two, got {b}; {RECOMPILE}")
    if q.accuracy_level is not None:
        check_int(q.accuracy_level, f"{key}.accuracy_level", *ACCURACY_LEVELS)
    if q.min_rows is not None:
        check_int(q.min_rows, f"{key}.min_rows", 1, MAX_MIN_ROWS)


def recorded_bits(q: Any) -> int | None:
    return q.bits if q.bits is not None else QUANT_TYPES.get(q.type) if q.type is not None else None


def check_quantized_graph(facts: GraphFacts, key: str, rel: str, q: Any, qkey: str, type_field: str = "type") -> None:
    """Every block-quantized node of the graph `rel` (slot `key`) against the record `q` (at manifest key `qkey`;
    its type is `qkey.type_field`)."""
    bits, block, level = recorded_bits(q), q.block_size, q.accuracy_level
    for (op, n_bits, n_block, n_level), count in sorted(facts.quantized_nodes.items(),
                                                           key=lambda kv: (kv[0][0] != "MatMulNBits", str(kv))):
        if bits is not None and n_bits != bits:
            raise ManifestError(f"{rel} ({key}) holds {count} {n_bits}-bit {op} nodes but {qkey}.type is "
                                f"{q.type!r} ({bits} bits): the graph is not what the manifest says; {RECOMPILE}")
        if block is not None and n_block is not None and n_block != block:
            raise ManifestError(f"{rel} ({key}) holds {op} nodes of block size {n_block} but {qkey}.block_size is "
                                f"{block}; {RECOMPILE}")
        if op == "MatMulNBits" and level is not None and n_level != level:
            raise ManifestError(f"{rel} ({key}) holds MatMulNBits nodes of accuracy level {n_level} but "
                                f"{qkey}.accuracy_level is {level}; {RECOMPILE}")


def check_head_precision(facts: GraphFacts, rel: str, head: Any) -> None:
    """The draft head's graph holds its entry's `precision`: no quantized node in fp32, `type`-bit ones else."""
    n = facts.op_counts.get("MatMulNBits", 0)
    if head.precision == "fp32":
        if n:
            raise ManifestError(f"{rel} (draft_head) is a quantized graph ({n} MatMulNBits) but draft_head.precision "
                                f"is 'fp32'; {RECOMPILE}")
        return
    if not n:
        raise ManifestError(f"{rel} (draft_head) has no quantized MatMul, but draft_head.precision is "
                            f"{head.precision!r}; {RECOMPILE}")
    record = head.quantization if isinstance(head.quantization, dict) else {}
    block = record.get("block_size")
    q = _Record(head.precision, QUANT_TYPES[head.precision], block if isinstance(block, int) else None, None)
    check_quantized_graph(facts, "draft_head", rel, q, "draft_head", "precision")


class _Record:
    def __init__(self, type_: str, bits: int, block_size: int | None, accuracy_level: int | None) -> None:
        self.type, self.bits, self.block_size, self.accuracy_level = type_, bits, block_size, accuracy_level
