"""`fused_onnx_from_decoder`: the ONNX Runtime graph variant ("fused") of a Llama-family decoder.

Built directly from the PyTorch decoder's weights with `onnx.helper` (no tracing), using ONNX Runtime's
contrib ops (domain com.microsoft):

    embed Gather -> per layer: [Skip]SimplifiedLayerNormalization -> one fused QKV MatMul (+ bias)
      -> [Qwen3: per-head SimplifiedLayerNormalization on q and k] -> GroupQueryAttention (rotary inside,
      KV cache as one [1, Hkv, C, D] buffer shared by past_* and present_*) -> o MatMul
      -> SkipSimplifiedLayerNormalization -> one fused gate/up MatMul -> act(gate) * up -> down MatMul
    -> final SkipSimplifiedLayerNormalization -> hidden_states; Gather(logit_positions) -> lm_head.

Gemma 3 (compiler/fused_gemma3.py) swaps in its own block (four norms, (1 + w) folded into the weights),
scales the embeddings, gives GroupQueryAttention `local_window_size` and a second rope cache on its sliding
layers and `query_pre_attn_scalar ** -0.5` as scale, and soft-caps the logits rows.

Batch B is a graph dimension (one KV region per sequence, `seqlens_k [B]` per-sequence lengths): a batch of B
one-token decodes is one pass; several new tokens with a past run one sequence per pass (ONNX Runtime's CPU
GroupQueryAttention refuses B > 1 there; see DESIGN.md "Batching"). Bundles written before this have B fixed at 1.

Weights are initializers in the layout the MatMul consumes ([in, out]); a tied lm_head reuses the
embedding through Gemm(transB=1) so the vocabulary matrix is stored once. I/O: see `fused_io`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specrt.models import Decoder
from specrt.models.config import DecoderConfig
from specrt.models.layers import rope_cos_sin, rope_inv_freq
from specrt.bundle import graph_io
from specrt.bundle.graph_io import (LM_HEAD_FULL, LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH, present_key,
                                    present_value)
from specrt.compiler.export import ONNX_IR_VERSION, ONNX_OPSET
from specrt.compiler.fused_gemma3 import gemma3_layers
from specrt.compiler.fused_layers import (ACTIVATION_OPS, as_numpy, llama_layers, rope_cache_names, skip_norm,
                                          softcap)
from specrt.compiler.graph_builder import MS, GraphBuilder
from specrt.compiler.lm_head_screen import screened_head
from specrt.compiler.onnx_io import save_onnx

FUSED_FAMILIES = ("llama", "qwen", "gemma3")
GQA_HEAD_DIM_MULTIPLE = 16  # ONNX Runtime's CPU GroupQueryAttention kernel requires it
GQA_PARTIAL_ROPE_MULTIPLE = 8  # a partial rope's cos / sin cache width (ONNX Runtime 1.32: "a multiple of 8")


def fused_unsupported_reason(c: DecoderConfig) -> str | None:
    """None when the fused graph can express `c`, else why not (the caller falls back to portable)."""
    if c.family not in FUSED_FAMILIES:
        return (f"{c.architecture} has no fused ONNX Runtime graph (only Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, "
                "Phi-3, SmolLM3, Granite)")
    if c.head_dim % GQA_HEAD_DIM_MULTIPLE:
        return f"head_dim {c.head_dim} is not a multiple of {GQA_HEAD_DIM_MULTIPLE} (GroupQueryAttention on CPU)"
    if c.rotary_dim < c.head_dim and (c.rotary_dim // 2) % GQA_PARTIAL_ROPE_MULTIPLE:
        return (f"the rope turns {c.rotary_dim} of {c.head_dim} dimensions: GroupQueryAttention's partial rope needs "
                f"a multiple of {2 * GQA_PARTIAL_ROPE_MULTIPLE}")
    if c.hidden_act not in ACTIVATION_OPS:
        return f"activation {c.hidden_act!r} has no fused form"
    return None


def fused_io(c: DecoderConfig, screen: bool = False, feature_layers: tuple[int, ...] = ()
             ) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of the fused graph for the manifest: name, dtype, shape (C = cache capacity);
    `screen`: the optional `lm_head_full` input of a screened head (compiler/lm_head_screen.py); `feature_layers`:
    the `hidden_layers` output of a bundle with a fused draft head (compiler/feature_layers.py)."""
    kv = ["B", c.num_kv_heads, "C", c.head_dim]
    inputs = [{"name": graph_io.INPUT_IDS, "dtype": "int64", "shape": ["B", "S"]},
              {"name": LOGIT_POSITIONS, "dtype": "int64", "shape": ["R"]},
              {"name": SEQLENS_K, "dtype": "int32", "shape": ["B"]},
              {"name": TOTAL_SEQUENCE_LENGTH, "dtype": "int32", "shape": []}]
    outputs = [{"name": graph_io.LOGITS, "dtype": "float32", "shape": ["B", "R", c.vocab_size]},
               {"name": graph_io.HIDDEN_STATES, "dtype": "float32", "shape": ["B", "S", c.hidden_size]}]
    if screen:
        inputs.append({"name": LM_HEAD_FULL, "dtype": "bool", "shape": []})
    for i in range(c.num_layers):
        inputs += [{"name": n, "dtype": "float32", "shape": kv} for n in (graph_io.past_key(i), graph_io.past_value(i))]
        outputs += [{"name": n, "dtype": "float32", "shape": kv} for n in (present_key(i), present_value(i))]
    if feature_layers:
        from specrt.compiler.feature_layers import output_spec

        outputs.append(output_spec(c.hidden_size, feature_layers))
    return inputs, outputs


def rope_caches(c: DecoderConfig, max_seq_len: int, rope=None) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [max_seq_len, rotary_dim / 2] of `rope` (default c.rope), computed exactly as the PyTorch reference does
    (float32)."""
    rope = rope or c.rope
    freqs = torch.arange(max_seq_len).float()[:, None] * rope_inv_freq(rope, c.rotary_dim)
    cos, sin = rope_cos_sin(rope, freqs)
    return as_numpy(cos), as_numpy(sin)


def build_fused_model(decoder: Decoder, max_seq_len: int, screen: bool = False, tree: bool = True,
                      feature_layers: tuple[int, ...] = ()):
    """The fused graph as an in-memory onnx.ModelProto (weights as initializers); `screen`: with the screened
    greedy LM head (compiler/lm_head_screen.py) and its `lm_head_full` input; `tree`: with the token-tree input
    (compiler/fused_tree.py); `feature_layers`: with the `hidden_layers` output (compiler/feature_layers.py)."""
    from onnx import TensorProto, helper

    c = decoder.config
    reason = fused_unsupported_reason(c)
    if reason:
        raise ValueError(reason)
    g = GraphBuilder()
    cos, sin = rope_caches(c, max_seq_len)
    g.weight("cos_cache", cos)
    g.weight("sin_cache", sin)
    if c.windowed:
        cos, sin = rope_caches(c, max_seq_len, c.local_rope)
        g.weight(rope_cache_names(True)[0], cos)
        g.weight(rope_cache_names(True)[1], sin)
    if tree:
        from specrt.compiler.fused_tree import TreeInputs

        g.tree = TreeInputs(g, c)
    body = decoder.model
    embed = g.weight("embed_tokens.weight", as_numpy(body.embed_tokens.weight))
    x = g.op("Gather", [embed, graph_io.INPUT_IDS], name="embed_tokens")
    if c.embedding_multiplier != 1:  # Granite (the table is also a tied head: not folded into it)
        x = g.op("Mul", [x, g.weight("embedding_multiplier", np.array(c.embedding_multiplier, np.float32))],
                 name="embed_tokens/scale")
    if c.family == "gemma3":
        x, residual = gemma3_layers(g, x, decoder, c)
    else:
        x, residual = llama_layers(g, x, body, c)
    hidden, _ = skip_norm(g, x, residual, body.norm, "norm", c)
    g.nodes.append(helper.make_node("Identity", [hidden], [graph_io.HIDDEN_STATES], name="hidden_states"))
    if feature_layers:
        from specrt.compiler.feature_layers import add_output

        add_output(g, c.num_layers, tuple(feature_layers))
    rows = g.op("Gather", [hidden, LOGIT_POSITIONS], axis=1, name="logit_rows")  # [B, R, hidden]
    rows2d = g.op("Reshape", [rows, g.const_i64("rows_2d_shape", [-1, c.hidden_size])], name="logit_rows_2d")  # [B*R, hidden]
    if screen:  # greedy calls may take the exact int8-screened head (compiler/lm_head_screen.py)
        w = as_numpy(decoder.lm_head_weight())  # [V, hidden]
        head = embed if c.tie_word_embeddings else g.weight("lm_head.weight", w)
        logits2d = screened_head(g, rows2d, head, w, c.final_logit_softcapping)  # soft-capped inside
    else:
        if c.tie_word_embeddings:
            logits2d = g.op("Gemm", [rows2d, embed], transB=1, name="lm_head")
        else:
            logits2d = g.op("MatMul", [rows2d, g.weight("lm_head.weight", as_numpy(decoder.lm_head_weight()).T)],
                            name="lm_head")
        logits2d = softcap(g, logits2d, c.final_logit_softcapping, "softcap")  # on the R rows only
    if c.logits_scaling != 1:  # Granite: logits / logits_scaling, on the R rows only
        logits2d = g.op("Div", [logits2d, g.weight("logits_scaling", np.array(c.logits_scaling, np.float32))],
                        name="logits_scaling")
    batch = g.op("Shape", [graph_io.INPUT_IDS], start=0, end=1, name="batch_size")  # [1] = B
    shape3 = g.op("Concat", [batch, g.const_i64("rows_vocab", [-1, c.vocab_size])], axis=0, name="logits_shape")
    g.nodes.append(helper.make_node("Reshape", [logits2d, shape3], [graph_io.LOGITS], name="logits"))  # [B, R, V]

    dtypes = {"int64": TensorProto.INT64, "int32": TensorProto.INT32, "float32": TensorProto.FLOAT,
              "bool": TensorProto.BOOL}
    inputs, outputs = fused_io(c, screen, tuple(feature_layers))
    graph_inputs = [helper.make_tensor_value_info(d["name"], dtypes[d["dtype"]], d["shape"]) for d in inputs]
    if tree:
        from specrt.compiler.fused_tree import tree_mask_input

        value, default = tree_mask_input()
        graph_inputs.append(value)
        g.inits.append(default)
    graph = helper.make_graph(
        g.nodes, f"{c.architecture}-fused", graph_inputs,
        [helper.make_tensor_value_info(d["name"], dtypes[d["dtype"]], d["shape"]) for d in outputs],
        g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(MS, 1)],
                             ir_version=ONNX_IR_VERSION, producer_name="specrt")


def fused_onnx_from_decoder(decoder: Decoder, path: Path, max_seq_len: int, screen: bool = False,
                            feature_layers: tuple[int, ...] = ()) -> Path:
    """Write the fused graph to `path` (+ `path.data`, external weights). Returns `path`."""
    return save_onnx(build_fused_model(decoder, max_seq_len, screen, feature_layers=feature_layers), path)
