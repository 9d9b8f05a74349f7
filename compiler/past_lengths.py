"""`validate_past_lengths`: the batched portable graph (several sequences of different lengths in one pass, a
`past_lengths [B]` input) checked against the PyTorch reference of each sequence alone.

The portable graph is exported with a batch dimension and a `past_lengths [B]` int64 input (compiler/export.py,
models/layers.attend): sequence b's past is rows [0, L_b) of its `past_key/value [B, P, Hkv, D]` block, rows
[L_b, P) are masked, and its new tokens are at positions L_b.. (its `position_ids` row). A pass of B sequences
with different lengths and new-token counts (right-padded to one S; a padded row is never read back) is then one
call: batched decode, prefill and verify on TensorRT (docs/batching.md, "TensorRT"). The input's default (every
past row valid) and the copy TensorRT parses: compiler/input_defaults.py.
"""

from __future__ import annotations

from pathlib import Path

from specrt.bundle import graph_io
from specrt.bundle.graph_io import PAST_LENGTHS
from specrt.compiler.export import sample_inputs
from specrt.compiler.validate import Tolerance, _check_tensor, _Worst, check_logits, validation_session


def batched_sample(decoder, lengths: list[int], new_tokens: list[int], seed: int = 0):
    """Random inputs of a right-padded batch: sequence b has `lengths[b]` valid past rows (of P = max(lengths))
    and `new_tokens[b]` new tokens (of S = max(new_tokens)); its padded rows repeat its last real token.
    Returns (ids [B, S], positions [B, S], past: 2L x [B, P, Hkv, D], past_lengths [B]) as torch tensors."""
    import torch

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
