"""The token embedding of a quantized fused graph, stored block-quantized: `quantize_embedding`.

The fp32 fused graph reads its embedding table `[vocab, hidden]` with a plain Gather. Left as it is, that table is
most of a small quantized model (SmolLM2-135M: 113 MB of a 198 MB int4 graph). ONNX Runtime's
`com.microsoft::GatherBlockQuantized` reads rows of a table stored the way MatMulNBits stores a weight: with
`uint8` data it takes MatMulNBits' conventions (4-bit values two to a byte, low nibble first; no zero points means
the default one, 8 for 4 bits and 128 for 8 bits), `quantize_axis` = 1 with blocks of `block_size` along it, and
scales `[vocab, hidden / block_size]` (ONNX Runtime's ContribOperators.md, its gather_block_quantized tests).

MatMulNBits stores `B` as `[N, k_blocks, blob]` with blocks along K for each output column. For the LM head,
N = vocab and K = hidden, so each block is a block of one vocabulary row: exactly the embedding's row layout.
A tied head (the same matrix as the embedding, untied only to be quantized: compiler/quantize_fused.py) therefore
gives the embedding for free: `Reshape(B -> [vocab, k_blocks * blob])` feeds GatherBlockQuantized with the head's
own scales, and the packed matrix is stored once. An untied embedding is quantized on its own with ONNX
Runtime's block quantizer (the kernels MatMulNBitsQuantizer runs), in the same layout.

Conditions (else the table stays fp32 and the manifest says so): symmetric quantization (no zero points), hidden a
multiple of the block size (no padded blocks), 4 or 8 bits.

The quantized portable graph keeps a standard Gather (TensorRT, CUDA provider), over the *dequantized* table:
`dequantize` computes (q - zero) * scale in fp32 as GatherBlockQuantized does, so both quantized graphs still
compute the same function (the fused one is validated against the portable one), and the quality measured on the
portable graph includes the embedding's quantization error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EMBED_NODE = "embed_tokens"
EMBED_Q = "embed_tokens.weight_Q{bits}"
EMBED_SCALES = "embed_tokens.weight_scales"
MS = "com.microsoft"


def _attr(node, name: str, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def dequantize(packed: np.ndarray, scales: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """MatMulNBits-layout `packed [rows, k_blocks, blob] uint8` with `scales [rows, k_blocks]` -> fp32 [rows, cols].
    Symmetric (default zero point: 2^(bits-1))."""
    rows, k_blocks, _ = packed.shape
    if bits == 4:
        q = np.empty((rows, k_blocks, packed.shape[2] * 2), np.uint8)
        q[..., 0::2] = packed & 0x0F
        q[..., 1::2] = packed >> 4
    else:
        q = packed
    values = (q.astype(np.float32) - np.float32(1 << (bits - 1))) * scales.reshape(rows, k_blocks, 1).astype(np.float32)
    return values.reshape(rows, -1)[:, :cols]


def _block_quantize(table: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """An untied table [rows, cols] -> (packed [rows, k_blocks, blob], scales [rows, k_blocks]) with ONNX Runtime's
    symmetric block quantizer (it quantizes a [K, N] MatMul weight: the table's transpose)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                DefaultWeightOnlyQuantizer)

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, bits=bits)
    packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(np.ascontiguousarray(table.T))
    return packed, scales


def _head_node(graph, vocab: int, hidden: int):
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.name.startswith("lm_head") \
                and _attr(node, "N") == vocab and _attr(node, "K") == hidden:
            return node
    return None


def quantize_embedding(model, tied: bool, bits: int, block_size: int, symmetric: bool,
                       gather_name: str = EMBED_NODE) -> dict[str, Any]:
    """Replace the embedding Gather (node `gather_name`) of the quantized fused graph `model` (ModelProto with its
    weights loaded) by GatherBlockQuantized, in place. `tied`: the LM head was untied from the embedding before
    quantization, so its MatMulNBits weights are the embedding's. An untied table keeps its dtype in its scales, so
    the rows come out as before (the draft head's fp16 table: fp16 rows, compiler/draft_head_quantize.py). Returns
    the manifest's `embedding` record: {"storage": "GatherBlockQuantized", "shared_with": "lm_head" | None} or
    {"storage": "fp32", "reason": ...}."""
    from onnx import helper, numpy_helper

    graph = model.graph
    gather = next((n for n in graph.node if n.name == gather_name and n.op_type == "Gather"), None)
    inits = {t.name: t for t in graph.initializer}
    if gather is None or gather.input[0] not in inits:
        return {"storage": "fp32", "reason": "no embedding Gather over an initializer"}
    vocab, hidden = (int(d) for d in inits[gather.input[0]].dims)
    if not symmetric:
        return {"storage": "fp32", "reason": "asymmetric quantization (zero points)"}
    if hidden % block_size or bits not in (4, 8):
        return {"storage": "fp32", "reason": f"hidden {hidden} is not a multiple of block {block_size}"}
    head = _head_node(graph, vocab, hidden) if tied else None
    if head is not None and len(head.input) <= 3 and _attr(head, "bits") == bits \
            and _attr(head, "block_size") == block_size:
        packed_name, scales_name, shared = head.input[1], head.input[2], "lm_head"
    else:
        table = numpy_helper.to_array(inits[gather.input[0]])
        packed, scales = _block_quantize(table.astype(np.float32), bits, block_size)
        packed_name, scales_name, shared = EMBED_Q.format(bits=bits), EMBED_SCALES, None
        graph.initializer.extend([numpy_helper.from_array(packed, packed_name),
                                  numpy_helper.from_array(scales.astype(table.dtype), scales_name)])
    shape = numpy_helper.from_array(np.array([vocab, -1], np.int64), "embed_tokens/rows_shape")
    graph.initializer.append(shape)
    rows = helper.make_node("Reshape", [packed_name, shape.name], ["embed_tokens/packed_rows"],
                            name="embed_tokens/packed_rows")  # [vocab, k_blocks, blob] -> [vocab, hidden*bits/8]
    quantized = helper.make_node("GatherBlockQuantized", ["embed_tokens/packed_rows", gather.input[1], scales_name],
                                 list(gather.output), name=gather_name, domain=MS, bits=bits,
                                 block_size=block_size, gather_axis=0, quantize_axis=1)
    idx = list(graph.node).index(gather)
    graph.node.remove(gather)
    graph.node.insert(idx, quantized)
    graph.node.insert(idx, rows)
    if not any(gather.input[0] in n.input for n in graph.node):
        graph.initializer.remove(inits[gather.input[0]])
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return {"storage": "GatherBlockQuantized", "shared_with": shared}


def embedding_table(model) -> np.ndarray | None:
    """The table GatherBlockQuantized reads in the quantized fused graph `model` (with weights), dequantized to
    fp32 [vocab, hidden]; None when the embedding is a plain Gather."""
    from onnx import numpy_helper

    node = next((n for n in model.graph.node if n.name == EMBED_NODE and n.op_type == "GatherBlockQuantized"), None)
    if node is None:
        return None
    inits = {t.name: t for t in model.graph.initializer}
    reshape = next(n for n in model.graph.node if node.input[0] in n.output)
    packed = numpy_helper.to_array(inits[reshape.input[0]])
    scales = numpy_helper.to_array(inits[node.input[2]])
    bits, block = _attr(node, "bits"), _attr(node, "block_size")
    return dequantize(packed, scales, bits, packed.shape[1] * block)  # no padded blocks (quantize_embedding)


def align_portable_embedding(model, table: np.ndarray) -> str:
    """Give the quantized portable graph `model` (with weights) the dequantized `table` as its embedding, in place:
    the Gather over `input_ids` whose initializer has the table's shape. Returns that initializer's name."""
    from onnx import numpy_helper

    from specrt.bundle import graph_io

    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[1] == graph_io.INPUT_IDS and node.input[0] in inits:
            init = inits[node.input[0]]
            if tuple(init.dims) == table.shape:
                init.CopyFrom(numpy_helper.from_array(table.astype(np.float32), init.name))
                return init.name
    raise ValueError("the quantized portable graph has no embedding Gather of shape "
                     f"{table.shape}: cannot align it with the fused graph's quantized embedding")
