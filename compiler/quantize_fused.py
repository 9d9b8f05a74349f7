"""The fused graph (compiler/fused_graph.py), quantized: `quantize_fused_onnx` and its validation.

The fused graph already stores every projection as a MatMul initializer in MatMul layout ([in, out]), so
ONNX Runtime's `MatMulNBitsQuantizer` applies directly (compiler/quantize.py). The one exception is a tied
LM head, which the fp32 graph computes as Gemm(transB=1) over the embedding to store the vocabulary matrix
once: `untie_lm_head` gives the head its own [hidden, vocab] MatMul weight first, so the head is quantized
like the portable graph's (whose tied head becomes a MatMul initializer after constant folding). The
embedding Gather then becomes GatherBlockQuantized over the head's own packed weights when tied, over its own
quantized table when not (compiler/quantize_embed.py): each weight stored once, at the quantized precision.

Blocks run along K for each output column, so a column of the fused QKV or gate/up matrix gets the same
scales as in the separate q/k/v or gate/up matrices of the portable graph: both quantized graphs compute the
same function. `validate_quantized_fused` checks that, with the scale-aware rule every graph variant is
validated with (compiler/validate.py), against the quantized portable graph at the compile shapes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from specrt.compiler.fused_scorer import FusedScorer
from specrt.compiler.quality import GraphScorer
from specrt.compiler.onnx_io import save_onnx
from specrt.compiler.quantize import QuantizationError, QuantizeConfig, quantize_onnx
from specrt.compiler.quantize_embed import quantize_embedding
from specrt.compiler.validate import Tolerance, _Worst, check_logits

LM_HEAD = "lm_head"


def untie_lm_head(model) -> bool:
    """Replace the tied head Gemm(rows, embed, transB=1) by MatMul(rows, embed^T) in place. True if done."""
    from onnx import helper, numpy_helper

    graph = model.graph
    for idx, node in enumerate(graph.node):
        if node.name == LM_HEAD and node.op_type == "Gemm":
            break
    else:
        return False
    inits = {t.name: t for t in graph.initializer}
    weight = numpy_helper.to_array(inits[node.input[1]])  # [vocab, hidden]
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight.T), f"{LM_HEAD}.weight"))
    graph.node.remove(node)
    graph.node.insert(idx, helper.make_node("MatMul", [node.input[0], f"{LM_HEAD}.weight"], list(node.output),
                                            name=LM_HEAD))
    return True


def with_accuracy_level(src: Path, dst: Path, level: int) -> Path:
    """A copy of the quantized graph `src` whose MatMulNBits nodes compute at `level`. `dst` must be in the
    same directory: it shares `src`'s external weights file."""
    import onnx

    if Path(dst).parent.resolve() != Path(src).parent.resolve():
        raise ValueError(f"{dst} must be next to {src} (shared weights file)")
    model = onnx.load(str(src), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = level
    onnx.save(model, str(dst))
    return Path(dst)


def quantize_fused_onnx(src: Path, dst: Path, config: QuantizeConfig) -> dict[str, Any]:
    """Quantize the fused graph `src` into `dst` (+ `dst.data`). Returns counts for the manifest."""
    import onnx

    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=True)
    tied = untie_lm_head(model)
    with tempfile.TemporaryDirectory(prefix=".quantize-fused-", dir=dst.parent) as tmp:
        untied = Path(tmp) / "untied.onnx"
        save_onnx(model, untied)
        del model
        counts = quantize_onnx(untied, dst, config)
    quantized = onnx.load(str(dst), load_external_data=True)
    embedding = quantize_embedding(quantized, tied, config.bits, config.block_size, config.symmetric)
    if embedding["storage"] != "fp32":
        save_onnx(quantized, dst)
    return counts | {"extra": {"embedding": embedding}}


def validate_quantized_fused(portable: Path, fused: Path, dims: dict[str, int], vocab_size: int, capacity: int,
                             shapes: list[tuple[int, int]], tolerance: Tolerance | None = None) -> dict:
    """The quantized fused graph against the quantized portable graph: for each (S new, P past) shape, random
    token ids, P rows of past from the same ids through each graph, then the S rows' logits compared (every row,
    then the last row alone: the prefill form). Raises QuantizationError naming the shape."""
    from specrt.compiler.validate import ValidationError

    tol = tolerance or Tolerance()
    reference, candidate = GraphScorer(portable, dims), FusedScorer(fused, dims, capacity)
    worst = _Worst()
    rng = np.random.default_rng(0)
    for s, p in shapes:
        ids = rng.integers(0, vocab_size, p + s)
        where = f"{fused.name} at S={s}, P={p}"
        _, ref_past = reference.run(ids[:p], reference.empty_past()) if p else (None, reference.empty_past())
        ref, _ = reference.run(ids[p:], ref_past)
        if p:
            candidate.run(ids[:p], 0)
        got, _ = candidate.run(ids[p:], p)
        try:
            check_logits(where, got[None], ref[None], tol, worst)
            last, _ = candidate.run(ids[p:], p, last_only=True)  # the prefill form
            check_logits(f"{where} (last row)", last[None], ref[None, -1:], tol, worst)
        except ValidationError as exc:
            raise QuantizationError(f"quantized fused graph differs from the quantized portable graph: {exc}") from None
    return worst.record(tol, shapes)
