"""The fixed graph I/O naming scheme (DESIGN.md, "Graph I/O"). TensorRT profiles and bindings key on it.

inputs : input_ids [B, S] int64, position_ids [B, S] int64,
         past_key.{i}, past_value.{i} [B, P, Hkv, D]         (i = 0 .. L-1)
         (+ optional inputs with defaults: logit_start, past_lengths [B]; below)
outputs: logits [B, S, V] fp32, hidden_states [B, S, hidden],
         new_key.{i}, new_value.{i} [B, S, Hkv, D]            (only the S new rows)
B is 1 in bundles written before the batched portable graph (docs/batching.md, "TensorRT").
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
POSITION_IDS = "position_ids"
LOGITS = "logits"
HIDDEN_STATES = "hidden_states"

# The draft head's graph (`draft_head/head.onnx`, compiler/draft_head.py): one layer, so one KV pair unnumbered;
# its TensorRT engine is stored under `engines.draft_head`.
HEAD_INPUTS = ("features", INPUT_IDS, POSITION_IDS, "past_key", "past_value")
HEAD_OUTPUTS = (LOGITS, HIDDEN_STATES, "new_key", "new_value")
HEAD_ENGINE_ROLE = "draft_head"
# A fused head (specrt/models/draft_head_fused.py) also reads the target's residual stream after its
# `feature_layers`: the target graphs of such a bundle (only those) have the extra output HIDDEN_LAYERS
# [B, S, n, hidden] (n = len(feature_layers), in that order), and the head graph the input LAYER_FEATURES
# [1, S, n, hidden] (zeros on draft rows, as in training).
HIDDEN_LAYERS = "hidden_layers"
LAYER_FEATURES = "layer_features"
FUSED_HEAD_INPUTS = ("features", LAYER_FEATURES, INPUT_IDS, POSITION_IDS, "past_key", "past_value")


def past_key(i: int) -> str:
    return f"past_key.{i}"


def past_value(i: int) -> str:
    return f"past_value.{i}"


def new_key(i: int) -> str:
    return f"new_key.{i}"


def new_value(i: int) -> str:
    return f"new_value.{i}"


def input_names(num_layers: int) -> list[str]:
    names = [INPUT_IDS, POSITION_IDS]
    for i in range(num_layers):
        names += [past_key(i), past_value(i)]
    return names


def output_names(num_layers: int) -> list[str]:
    names = [LOGITS, HIDDEN_STATES]
    for i in range(num_layers):
        names += [new_key(i), new_value(i)]
    return names


# --- the portable graph's optional inputs (compiler/logit_rows.py, compiler/input_defaults.py) -----------
LOGIT_START = "logit_start"  # [1] int64, default 0: logits for rows [logit_start, S) of the new tokens
# [B] int64: sequence b's valid past rows; rows [L_b, P) of its past are masked and its new tokens sit at positions
# L_b.. (several sequences of different lengths in one pass). Default [INT64_MAX]: every past row (batch 1 as always).
PAST_LENGTHS = "past_lengths"
ALL_ROWS = (1 << 63) - 1  # a past_lengths entry meaning "every past row": the input's default

# --- the fused ONNX Runtime variant (compiler/fused_graph.py): one KV buffer per layer, past == present --
SEQLENS_K = "seqlens_k"  # [1] int32: total length after this call - 1
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"  # [] int32: total length after this call
LOGIT_POSITIONS = "logit_positions"  # [R] int64: rows of the S new tokens whose logits are computed
# [S', S'] bool, default [[True]] (the causal chain): a token tree's ancestor-or-self mask over the S new rows
# (docs/trees.md); fused and portable graphs compiled with token trees have it
TREE_MASK = "tree_mask"
# a windowed fused layer runs GroupQueryAttention with local_window_size = window + this, the exact window in its
# attention bias (its kernel counts a row's index, not its position); trees up to this many rows
TREE_WINDOW_SLACK = 64
LM_HEAD_FULL = "lm_head_full"  # [] bool, fused graphs with a screened LM head: false = rows exact at the argmax only


def pad_rows(token_ids, rows: int):
    """`token_ids` [S] with the last token repeated up to `rows` entries (unchanged when S >= rows): how a
    one-token call runs as a several-row call on a level-4 quantized graph (`quantization.min_rows`)."""
    import numpy as np

    s = token_ids.size
    return token_ids if s >= rows else np.concatenate([token_ids, np.repeat(token_ids[-1:], rows - s)])


def present_key(i: int) -> str:
    return f"present_key.{i}"


def present_value(i: int) -> str:
    return f"present_value.{i}"

# Weights in exported graphs: a parameter `p` of the decoder is the initializer `PARAMETER_PREFIX + p`, or
# `PARAMETER_PREFIX + p + TRANSPOSED` when the graph stores it transposed for its MatMul (compiler/portable_graph.py).
PARAMETER_PREFIX = "decoder."
TRANSPOSED = ".T"
