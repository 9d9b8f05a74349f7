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
from specrt.models.layers import rope_inv_freq
from specrt.bundle import graph_io
from specrt.bundle.graph_io import (LM_HEAD_FULL, LOGIT_POSITIONS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH, present_key,
                                    present_value)
from specrt.compiler.export import ONNX_IR_VERSION, ONNX_OPSET
from specrt.compiler.graph_builder import GraphBuilder as _GraphBuilder
from specrt.compiler.onnx_io import save_onnx

MS = "com.microsoft"
FUSED_FAMILIES = ("llama", "qwen", "gemma3")
GQA_HEAD_DIM_MULTIPLE = 16  # ONNX Runtime's CPU GroupQueryAttention kernel requires it


def fused_unsupported_reason(c: DecoderConfig) -> str | None:
    """None when the fused graph can express `c`, else why not (the caller falls back to portable)."""
    if c.family not in FUSED_FAMILIES:
        return f"{c.architecture} has no fused ONNX Runtime graph (only Llama, Mistral, Qwen2, Qwen3, Gemma 3)"
    if c.head_dim % GQA_HEAD_DIM_MULTIPLE:
        return f"head_dim {c.head_dim} is not a multiple of {GQA_HEAD_DIM_MULTIPLE} (GroupQueryAttention on CPU)"
    if c.hidden_act not in ACTIVATION_OPS:
        return f"activation {c.hidden_act!r} has no fused form"
    return None


def fused_io(c: DecoderConfig, screen: bool = False) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of the fused graph for the manifest: name, dtype, shape (C = cache capacity);
    `screen`: the optional `lm_head_full` input of a screened head (compiler/lm_head_screen.py)."""
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
    return inputs, outputs


def _t(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def _matmul_weight(*linears) -> np.ndarray:  # nn.Linear weights [out, in] -> [in, sum(out)]
    return np.concatenate([_t(lin.weight).T for lin in linears], axis=1)


def _bias(*linears) -> np.ndarray | None:
    if linears[0].bias is None:
        return None
    return np.concatenate([_t(lin.bias) for lin in linears])


def _silu(g: _GraphBuilder, x: str, p: str) -> str:
    return g.op("Mul", [x, g.op("Sigmoid", [x], name=f"{p}/sigmoid")], name=f"{p}/silu")


ACTIVATION_OPS = {
    "silu": _silu,
    "gelu": lambda g, x, p: g.op("Gelu", [x], domain=MS, name=f"{p}/gelu"),
    "gelu_new": lambda g, x, p: g.op("FastGelu", [x], domain=MS, name=f"{p}/gelu"),
    "gelu_pytorch_tanh": lambda g, x, p: g.op("FastGelu", [x], domain=MS, name=f"{p}/gelu"),
    "relu": lambda g, x, p: g.op("Relu", [x], name=f"{p}/relu"),
}


def _linear(g: _GraphBuilder, x: str, weight: np.ndarray, bias: np.ndarray | None, p: str) -> str:
    y = g.op("MatMul", [x, g.weight(f"{p}.weight", weight)], name=p)
    return y if bias is None else g.op("Add", [y, g.weight(f"{p}.bias", bias)], name=f"{p}/bias")


def norm_weight(norm, c: DecoderConfig) -> np.ndarray:
    """The RMSNorm scale as the op multiplies by it: Gemma 3 stores w and scales by (1 + w), computed in fp32
    by the reference (models/gemma3.py), so folding the + 1 into the fp32 weight here gives the same factor."""
    w = _t(norm.weight)
    return w + np.float32(1.0) if c.family == "gemma3" else w


def _head_norm(g: _GraphBuilder, x: str, norm, heads: int, c: DecoderConfig, p: str) -> str:
    """Qwen3, Gemma 3: RMSNorm over each head's D values ([1, S, H*D] -> [1, S, H, D] -> norm -> back)."""
    split = g.op("Reshape", [x, g.const_i64(f"{p}.shape4", [0, 0, heads, c.head_dim])], name=f"{p}/split_heads")
    y = g.op("SimplifiedLayerNormalization", [split, g.weight(f"{p}.weight", norm_weight(norm, c))], axis=-1,
             epsilon=float(norm.eps), name=p)
    return g.op("Reshape", [y, g.const_i64(f"{p}.shape3", [0, 0, heads * c.head_dim])], name=f"{p}/join_heads")


def _attention(g: _GraphBuilder, x: str, attn, i: int, c: DecoderConfig) -> str:
    p = f"layers.{i}.attn"
    qkv = _linear(g, x, _matmul_weight(attn.q_proj, attn.k_proj, attn.v_proj),
                  _bias(attn.q_proj, attn.k_proj, attn.v_proj), f"{p}.qkv_proj")
    if c.qk_norm:
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q, k, v = g.op("Split", [qkv, g.const_i64(f"{p}.qkv_split", [q_size, kv_size, kv_size])], n_out=3,
                       axis=-1, name=f"{p}.qkv_split")
        qkv_inputs = [_head_norm(g, q, attn.q_norm, c.num_heads, c, f"{p}.q_norm"),
                      _head_norm(g, k, attn.k_norm, c.num_kv_heads, c, f"{p}.k_norm"), v]
    else:  # packed QKV straight into the op
        qkv_inputs = [qkv, "", ""]
    window = c.layer_window(i)
    cos, sin = rope_cache_names(window is not None)
    extra = {"local_window_size": window} if window is not None else {}
    tree_ins = []
    if g.tree is not None:  # position_ids + attention_bias (compiler/fused_tree.py)
        tree_ins, extra = g.tree.attention_inputs(window)
    if c.attn_logit_softcapping:
        extra["softcap"] = float(c.attn_logit_softcapping)
    out = g.op("GroupQueryAttention",
               qkv_inputs + [graph_io.past_key(i), graph_io.past_value(i), SEQLENS_K, TOTAL_SEQUENCE_LENGTH,
                             cos, sin] + tree_ins,
               n_out=3, domain=MS, name=f"{p}.gqa", outputs=[f"{p}/out", present_key(i), present_value(i)],
               num_heads=c.num_heads, kv_num_heads=c.num_kv_heads, scale=attention_scale(c), do_rotary=1,
               **extra)[0]
    return _linear(g, out, _t(attn.o_proj.weight).T, _bias(attn.o_proj), f"{p}.o_proj")


def attention_scale(c: DecoderConfig) -> float:
    """head_dim ** -0.5, or Gemma 3's query_pre_attn_scalar ** -0.5 (as the reference's Attention.scale)."""
    return float((c.query_pre_attn_scalar or c.head_dim) ** -0.5)


def rope_cache_names(local: bool) -> tuple[str, str]:
    """(cos, sin) initializer names: one pair per rope (Gemma 3's sliding layers have their own)."""
    return ("cos_cache_local", "sin_cache_local") if local else ("cos_cache", "sin_cache")


def _mlp(g: _GraphBuilder, x: str, mlp, i: int, c: DecoderConfig) -> str:
    p = f"layers.{i}.mlp"
    gate_up = _linear(g, x, _matmul_weight(mlp.gate_proj, mlp.up_proj), _bias(mlp.gate_proj, mlp.up_proj),
                      f"{p}.gate_up_proj")
    gate, up = g.op("Split", [gate_up, g.const_i64(f"{p}.split", [c.intermediate_size] * 2)], n_out=2, axis=-1,
                    name=f"{p}.split")
    h = g.op("Mul", [ACTIVATION_OPS[c.hidden_act](g, gate, p), up], name=f"{p}/mul")
    return _linear(g, h, _t(mlp.down_proj.weight).T, _bias(mlp.down_proj), f"{p}.down_proj")


def _skip_norm(g: _GraphBuilder, x: str, residual: str, norm, p: str, c: DecoderConfig | None = None) -> tuple[str, str]:
    """(normed, x + residual) with one SkipSimplifiedLayerNormalization."""
    w = norm_weight(norm, c) if c is not None else _t(norm.weight)
    normed, _, _, total = g.op("SkipSimplifiedLayerNormalization", [x, residual, g.weight(f"{p}.weight", w)],
                               n_out=4, domain=MS, epsilon=float(norm.eps), name=p,
                               outputs=[f"{p}/out", "", "", f"{p}/sum"])
    return normed, total


def softcap(g: _GraphBuilder, logits: str, cap: float | None, p: str) -> str:
    """cap * tanh(logits / cap) (Gemma's final logit soft-capping), or `logits` when there is no cap."""
    if not cap:
        return logits
    c = g.weight(f"{p}/cap", np.array(cap, np.float32))
    tanh = g.op("Tanh", [g.op("Div", [logits, c], name=f"{p}/div")], name=f"{p}/tanh")
    return g.op("Mul", [tanh, c], name=f"{p}/mul")


def rope_caches(c: DecoderConfig, max_seq_len: int, rope=None) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [max_seq_len, D/2] of `rope` (default c.rope), computed exactly as the PyTorch reference does
    (float32)."""
    inv_freq = rope_inv_freq(rope or c.rope, c.head_dim)
    freqs = torch.arange(max_seq_len).float()[:, None] * inv_freq
    return _t(freqs.cos()), _t(freqs.sin())


def build_fused_model(decoder: Decoder, max_seq_len: int, screen: bool = False, tree: bool = True):
    """The fused graph as an in-memory onnx.ModelProto (weights as initializers); `screen`: with the screened
    greedy LM head (compiler/lm_head_screen.py) and its `lm_head_full` input; `tree`: with the token-tree input
    (compiler/fused_tree.py)."""
    from onnx import TensorProto, helper

    c = decoder.config
    reason = fused_unsupported_reason(c)
    if reason:
        raise ValueError(reason)
    g = _GraphBuilder()
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
    embed = g.weight("embed_tokens.weight", _t(body.embed_tokens.weight))
    x = g.op("Gather", [embed, graph_io.INPUT_IDS], name="embed_tokens")
    if c.family == "gemma3":
        from specrt.compiler.fused_gemma3 import gemma3_layers

        x, residual = gemma3_layers(g, x, decoder, c)
    else:
        x, residual = _layers(g, x, body, c)
    hidden, _ = _skip_norm(g, x, residual, body.norm, "norm", c)
    g.nodes.append(helper.make_node("Identity", [hidden], [graph_io.HIDDEN_STATES], name="hidden_states"))
    rows = g.op("Gather", [hidden, LOGIT_POSITIONS], axis=1, name="logit_rows")  # [B, R, hidden]
    rows2d = g.op("Reshape", [rows, g.const_i64("rows_2d_shape", [-1, c.hidden_size])], name="logit_rows_2d")  # [B*R, hidden]
    if screen:  # greedy calls may take the exact int8-screened head (compiler/lm_head_screen.py)
        from specrt.compiler.lm_head_screen import screened_head

        w = _t(decoder.lm_head_weight())  # [V, hidden]
        head = embed if c.tie_word_embeddings else g.weight("lm_head.weight", w)
        logits2d = screened_head(g, rows2d, head, w, c.final_logit_softcapping)  # soft-capped inside
    else:
        if c.tie_word_embeddings:
            logits2d = g.op("Gemm", [rows2d, embed], transB=1, name="lm_head")
        else:
            logits2d = g.op("MatMul", [rows2d, g.weight("lm_head.weight", _t(decoder.lm_head_weight()).T)],
                            name="lm_head")
        logits2d = softcap(g, logits2d, c.final_logit_softcapping, "softcap")  # on the R rows only
    batch = g.op("Shape", [graph_io.INPUT_IDS], start=0, end=1, name="batch_size")  # [1] = B
    shape3 = g.op("Concat", [batch, g.const_i64("rows_vocab", [-1, c.vocab_size])], axis=0, name="logits_shape")
    g.nodes.append(helper.make_node("Reshape", [logits2d, shape3], [graph_io.LOGITS], name="logits"))  # [B, R, V]

    dtypes = {"int64": TensorProto.INT64, "int32": TensorProto.INT32, "float32": TensorProto.FLOAT,
              "bool": TensorProto.BOOL}
    inputs, outputs = fused_io(c, screen)
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


def _layers(g: _GraphBuilder, x: str, body, c: DecoderConfig) -> tuple[str, str]:
    """Llama / Qwen blocks: (last MLP output, residual stream before it), for the final skip norm."""
    residual = None
    for i, layer in enumerate(body.layers):
        p = f"layers.{i}"
        if residual is None:
            normed = g.op("SimplifiedLayerNormalization", [x, g.weight(f"{p}.input_layernorm.weight",
                                                                       _t(layer.input_layernorm.weight))],
                          axis=-1, epsilon=float(layer.input_layernorm.eps), name=f"{p}.input_layernorm")
            residual = x
        else:
            normed, residual = _skip_norm(g, x, residual, layer.input_layernorm, f"{p}.input_layernorm")
        attn = _attention(g, normed, layer.self_attn, i, c)
        normed, residual = _skip_norm(g, attn, residual, layer.post_attention_layernorm,
                                      f"{p}.post_attention_layernorm")
        x = _mlp(g, normed, layer.mlp, i, c)
    return x, residual


def fused_onnx_from_decoder(decoder: Decoder, path: Path, max_seq_len: int, screen: bool = False) -> Path:
    """Write the fused graph to `path` (+ `path.data`, external weights). Returns `path`."""
    return save_onnx(build_fused_model(decoder, max_seq_len, screen), path)
