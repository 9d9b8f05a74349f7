"""The batched portable graph: several sequences of different lengths in one pass (`past_lengths`).

The portable graph is exported with a batch dimension and a `past_lengths [B]` int64 input (compiler/export.py,
models/layers.attend): sequence b's past is rows [0, L_b) of its `past_key/value [B, P, Hkv, D]` block, rows
[L_b, P) are masked, and its new tokens are at positions L_b.. (its `position_ids` row). A pass of B sequences
with different lengths and new-token counts (right-padded to one S; a padded row is never read back) is then one
call: batched decode, prefill and verify on TensorRT (docs/batching.md, "TensorRT").

`add_past_lengths_default` gives the input an initializer default `[INT64_MAX]` (every past row valid), so a caller
that never feeds it (the batch-1 runners, validation, calibration, bundles' older code paths) computes exactly
what the graph computed before the input existed. TensorRT treats an input that has an initializer as a
constant, so `graph_without_default` writes the copy TensorRT parses, where `past_lengths` is a real input.
`validate_past_lengths` checks the batched call against the PyTorch reference of each sequence alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import ALL_ROWS, PAST_LENGTHS, TREE_MASK
from specrt.compiler.onnx_io import save_onnx
from specrt.compiler.validate import Tolerance, _check_tensor, _Worst, check_logits, validation_session


def has_past_lengths(model) -> bool:
    """True when the ONNX model (a ModelProto) has the `past_lengths` graph input."""
    return any(i.name == PAST_LENGTHS for i in model.graph.input)


def graph_has_input(onnx_path: Path, name: str) -> bool:
    import onnx

    return any(i.name == name for i in onnx.load(str(onnx_path), load_external_data=False).graph.input)


def add_past_lengths_default(onnx_path: Path) -> bool:
    """Give the graph's `past_lengths` input its default in place (unless it has it). Returns whether the graph
    has the input at all (False, file untouched: a graph exported without it)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    if not has_past_lengths(model):
        return False
    if any(t.name == PAST_LENGTHS for t in model.graph.initializer):
        return True
    model = onnx.load(str(onnx_path), load_external_data=True)
    model.graph.initializer.append(numpy_helper.from_array(np.array([ALL_ROWS], dtype=np.int64), PAST_LENGTHS))
    if any(i.name == TREE_MASK for i in model.graph.input):
        broadcast_tree_mask(model)
    save_onnx(model, onnx_path)
    return True


def broadcast_tree_mask(model) -> None:
    """The exported `tree_mask [S, S]` input becomes a defaulted input of its own dims (default [[True]]: the
    chain, docs/trees.md), expanded to [S, S] before its first use. The exporter ties its dims to S (and reads S
    from it), so a [1, 1] feed must never reach those nodes: they read the expanded mask."""
    from onnx import TensorProto, helper, numpy_helper

    expanded = TREE_MASK + "/expanded"
    for node in model.graph.node:
        node.input[:] = [expanded if x == TREE_MASK else x for x in node.input]
    s, ss = TREE_MASK + "/s", TREE_MASK + "/ss"
    model.graph.node.insert(0, helper.make_node("Expand", [TREE_MASK, ss], [expanded], name=expanded))
    model.graph.node.insert(0, helper.make_node("Concat", [s, s], [ss], axis=0, name=ss))
    model.graph.node.insert(0, helper.make_node("Shape", [graph_io.INPUT_IDS], [s], start=1, end=2, name=s))
    graph_input = next(i for i in model.graph.input if i.name == TREE_MASK)
    graph_input.CopyFrom(helper.make_tensor_value_info(TREE_MASK, TensorProto.BOOL, ["tree_rows", "tree_cols"]))
    model.graph.initializer.append(numpy_helper.from_array(np.ones((1, 1), dtype=np.bool_), TREE_MASK))


def graph_without_default(onnx_path: Path, out_path: Path) -> Path:
    """The graph at `onnx_path` with `past_lengths` as a plain input (no initializer), written to `out_path`
    (+ .data): what TensorRT parses, so that the engine takes per-sequence lengths. A graph without the default
    is returned as is (`onnx_path`)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    if not any(t.name == PAST_LENGTHS for t in model.graph.initializer):
        return Path(onnx_path)
    model = onnx.load(str(onnx_path), load_external_data=True)
    for t in [t for t in model.graph.initializer if t.name in (PAST_LENGTHS, TREE_MASK)]:
        model.graph.initializer.remove(t)  # TensorRT: real inputs (tree_mask: its profiles, bundle/profiles.py)
    return save_onnx(model, out_path)


def batched_sample(decoder, lengths: list[int], new_tokens: list[int], seed: int = 0):
    """Random inputs of a right-padded batch: sequence b has `lengths[b]` valid past rows (of P = max(lengths))
    and `new_tokens[b]` new tokens (of S = max(new_tokens)); its padded rows repeat its last real token.
    Returns (ids [B, S], positions [B, S], past: 2L x [B, P, Hkv, D], past_lengths [B]) as torch tensors."""
    import torch

    from specrt.compiler.export import sample_inputs

    b, s, p = len(lengths), max(new_tokens), max(lengths)
    ids, _, past = sample_inputs(decoder, s, p, seed=seed, batch=b)
    positions = torch.zeros((b, s), dtype=torch.int64)
    for i, (length, n) in enumerate(zip(lengths, new_tokens)):
        ids[i, n:] = ids[i, n - 1]
        positions[i] = torch.arange(length, length + s).clamp(max=length + n - 1)
    return ids, positions, past, torch.tensor(lengths, dtype=torch.int64)


def batched_shapes(max_seq_len: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(past lengths, new tokens) of the validation batch for a context of `max_seq_len`: a decode at a long
    past, a verify at a shorter one, a prompt chunk at none (each within the context)."""
    seq = max_seq_len
    mid = min(4, max(0, seq - 3))
    return (min(9, seq - 1), mid, 0), (1, min(3, seq - mid), min(2, seq))


def validate_past_lengths(decoder, onnx_path: Path, max_seq_len: int, tolerance: Tolerance | None = None) -> dict:
    """One right-padded pass of three sequences (`batched_shapes`: a decode, a verify and a prefill, each at its own
    past length) must give each sequence's real rows, within tolerance, as the PyTorch reference of that sequence
    alone (its own past, no padding). Raises ValidationError. Returns the worst-case stats."""
    import torch

    tol = tolerance or Tolerance()
    lengths, new_tokens = batched_shapes(max_seq_len)
    c = decoder.config
    ids, pos, past, lens = batched_sample(decoder, list(lengths), list(new_tokens), seed=17)
    feeds = {graph_io.INPUT_IDS: ids.numpy(), graph_io.POSITION_IDS: pos.numpy(), PAST_LENGTHS: lens.numpy()}
    for i in range(c.num_layers):
        feeds[graph_io.past_key(i)] = past[2 * i].float().numpy()
        feeds[graph_io.past_value(i)] = past[2 * i + 1].float().numpy()
    names = graph_io.output_names(c.num_layers)
    got = dict(zip(names, validation_session(onnx_path).run(names, feeds)))
    worst = _Worst()
    for b, (length, n) in enumerate(zip(lengths, new_tokens)):
        with torch.no_grad():
            ref = decoder(ids[b:b + 1, :n], pos[b:b + 1, :n], [t[b:b + 1, :length] for t in past[0::2]],
                          [t[b:b + 1, :length] for t in past[1::2]])
        expected = [ref.logits, ref.hidden_states] + [t for kv in zip(ref.new_keys, ref.new_values) for t in kv]
        where = f"{Path(onnx_path).name}, batched pass, sequence {b} (past {length}, {n} new of {ids.shape[1]})"
        for name, e in zip(names, expected):
            g = got[name][b:b + 1, :n]
            if name == graph_io.LOGITS:
                check_logits(where, g, e.float().numpy(), tol, worst)
            else:
                _check_tensor(where, name, g, e.float().numpy(), tol, worst)
    return worst.record(tol, list(zip(lengths, new_tokens)))
