"""The node builders of the fused ONNX Runtime graph's decoder layers (compiler/fused_graph.py assembles the graph).

Projections, GroupQueryAttention, the MLP and the [Skip]SimplifiedLayerNormalization norms, each written into a
`GraphBuilder`; `llama_layers` stacks them into the Llama / Qwen blocks, compiler/fused_gemma3.py into Gemma 3's;
`softcap` is also the screened LM head's (compiler/lm_head_screen.py). Weights become initializers in the layout the
MatMul consumes ([in, out]).
"""

from __future__ import annotations

import numpy as np

from specrt.models.config import DecoderConfig
from specrt.bundle import graph_io
from specrt.bundle.graph_io import SEQLENS_K, TOTAL_SEQUENCE_LENGTH, present_key, present_value
from specrt.compiler.graph_builder import MS, GraphBuilder


def as_numpy(x) -> np.ndarray:  # a torch tensor, as fp32 numpy
    return x.detach().float().cpu().numpy()


def _matmul_weight(*linears) -> np.ndarray:  # nn.Linear weights [out, in] -> [in, sum(out)]
    return np.concatenate([as_numpy(lin.weight).T for lin in linears], axis=1)


def _bias(*linears) -> np.ndarray | None:
    if linears[0].bias is None:
        return None
    return np.concatenate([as_numpy(lin.bias) for lin in linears])


def residual_linear(g: GraphBuilder, x: str, lin, c: DecoderConfig, p: str) -> str:
    """o_proj / down_proj, whose output joins the residual stream: Granite's residual_multiplier folded into the
    weight and bias (x (W r) + b r = (x W + b) r, to float rounding; 1 elsewhere: the weights as they are)."""
    w, b, r = as_numpy(lin.weight).T, _bias(lin), c.residual_multiplier
    if r != 1:
        w, b = w * np.float32(r), None if b is None else b * np.float32(r)
    return linear(g, x, w, b, p)


def _silu(g: GraphBuilder, x: str, p: str) -> str:
    return g.op("Mul", [x, g.op("Sigmoid", [x], name=f"{p}/sigmoid")], name=f"{p}/silu")


ACTIVATION_OPS = {
    "silu": _silu,
    "gelu": lambda g, x, p: g.op("Gelu", [x], domain=MS, name=f"{p}/gelu"),
    "gelu_new": lambda g, x, p: g.op("FastGelu", [x], domain=MS, name=f"{p}/gelu"),
    "gelu_pytorch_tanh": lambda g, x, p: g.op("FastGelu", [x], domain=MS, name=f"{p}/gelu"),
    "relu": lambda g, x, p: g.op("Relu", [x], name=f"{p}/relu"),
}


def linear(g: GraphBuilder, x: str, weight: np.ndarray, bias: np.ndarray | None, p: str) -> str:
    y = g.op("MatMul", [x, g.weight(f"{p}.weight", weight)], name=p)
    return y if bias is None else g.op("Add", [y, g.weight(f"{p}.bias", bias)], name=f"{p}/bias")


def norm_weight(norm, c: DecoderConfig) -> np.ndarray:
    """The RMSNorm scale as the op multiplies by it: Gemma 3 stores w and scales by (1 + w), computed in fp32
    by the reference (models/gemma3.py), so folding the + 1 into the fp32 weight here gives the same factor."""
    w = as_numpy(norm.weight)
    return w + np.float32(1.0) if c.family == "gemma3" else w


def _head_norm(g: GraphBuilder, x: str, norm, heads: int, c: DecoderConfig, p: str) -> str:
    """Qwen3, Gemma 3: RMSNorm over each head's D values ([1, S, H*D] -> [1, S, H, D] -> norm -> back)."""
    split = g.op("Reshape", [x, g.const_i64(f"{p}.shape4", [0, 0, heads, c.head_dim])], name=f"{p}/split_heads")
    y = g.op("SimplifiedLayerNormalization", [split, g.weight(f"{p}.weight", norm_weight(norm, c))], axis=-1,
             epsilon=float(norm.eps), name=p)
    return g.op("Reshape", [y, g.const_i64(f"{p}.shape3", [0, 0, heads * c.head_dim])], name=f"{p}/join_heads")


def attention(g: GraphBuilder, x: str, attn, i: int, c: DecoderConfig) -> str:
    """Layer i's attention: one fused QKV MatMul, [Qwen3, Gemma 3: per-head norms on q and k],
    GroupQueryAttention (rotary inside, the KV buffer shared by past and present), the o projection."""
    p = f"layers.{i}.attn"
    qkv = linear(g, x, _matmul_weight(attn.q_proj, attn.k_proj, attn.v_proj),
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
    rope = i not in c.nope_layers  # a NoPE layer (SmolLM3): GQA without rotary, no cos / sin
    cos, sin = rope_cache_names(window is not None) if rope else ("", "")
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
               num_heads=c.num_heads, kv_num_heads=c.num_kv_heads, scale=attention_scale(c), do_rotary=int(rope),
               **extra)[0]
    return residual_linear(g, out, attn.o_proj, c, f"{p}.o_proj")


def attention_scale(c: DecoderConfig) -> float:
    """head_dim ** -0.5, Gemma's query_pre_attn_scalar ** -0.5 or Granite's attention_multiplier (as the reference's
    attention scale)."""
    if c.attention_multiplier is not None:
        return float(c.attention_multiplier)
    return float((c.query_pre_attn_scalar or c.head_dim) ** -0.5)


def rope_cache_names(local: bool) -> tuple[str, str]:
    """(cos, sin) initializer names: one pair per rope (Gemma 3's sliding layers have their own)."""
    return ("cos_cache_local", "sin_cache_local") if local else ("cos_cache", "sin_cache")


def mlp(g: GraphBuilder, x: str, block, i: int, c: DecoderConfig) -> str:
    """Layer i's MLP: one fused gate/up MatMul, act(gate) * up, the down projection."""
    p = f"layers.{i}.mlp"
    gate_up = linear(g, x, _matmul_weight(block.gate_proj, block.up_proj), _bias(block.gate_proj, block.up_proj),
                     f"{p}.gate_up_proj")
    gate, up = g.op("Split", [gate_up, g.const_i64(f"{p}.split", [c.intermediate_size] * 2)], n_out=2, axis=-1,
                    name=f"{p}.split")
    h = g.op("Mul", [ACTIVATION_OPS[c.hidden_act](g, gate, p), up], name=f"{p}/mul")
    return residual_linear(g, h, block.down_proj, c, f"{p}.down_proj")


def skip_norm(g: GraphBuilder, x: str, residual: str, norm, p: str, c: DecoderConfig | None = None) -> tuple[str, str]:
    """(normed, x + residual) with one SkipSimplifiedLayerNormalization."""
    w = norm_weight(norm, c) if c is not None else as_numpy(norm.weight)
    normed, _, _, total = g.op("SkipSimplifiedLayerNormalization", [x, residual, g.weight(f"{p}.weight", w)],
                               n_out=4, domain=MS, epsilon=float(norm.eps), name=p,
                               outputs=[f"{p}/out", "", "", f"{p}/sum"])
    return normed, total


def softcap(g: GraphBuilder, logits: str, cap: float | None, p: str) -> str:
    """cap * tanh(logits / cap) (Gemma's final logit soft-capping), or `logits` when there is no cap."""
    if not cap:
        return logits
    c = g.weight(f"{p}/cap", np.array(cap, np.float32))
    tanh = g.op("Tanh", [g.op("Div", [logits, c], name=f"{p}/div")], name=f"{p}/tanh")
    return g.op("Mul", [tanh, c], name=f"{p}/mul")


def llama_layers(g: GraphBuilder, x: str, body, c: DecoderConfig) -> tuple[str, str]:
    """Llama / Qwen blocks: (last MLP output, residual stream before it), for the final skip norm."""
    residual = None
    for i, layer in enumerate(body.layers):
        p = f"layers.{i}"
        if residual is None:
            normed = g.op("SimplifiedLayerNormalization", [x, g.weight(f"{p}.input_layernorm.weight",
                                                                       as_numpy(layer.input_layernorm.weight))],
                          axis=-1, epsilon=float(layer.input_layernorm.eps), name=f"{p}.input_layernorm")
            residual = x
        else:
            normed, residual = skip_norm(g, x, residual, layer.input_layernorm, f"{p}.input_layernorm")
        attn = attention(g, normed, layer.self_attn, i, c)
        normed, residual = skip_norm(g, attn, residual, layer.post_attention_layernorm,
                                     f"{p}.post_attention_layernorm")
        x = mlp(g, normed, layer.mlp, i, c)
    return x, residual
