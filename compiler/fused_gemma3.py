"""Gemma 3's pieces of the fused ONNX Runtime graph (compiler/fused_graph.py builds the rest, from the layer pieces
of compiler/fused_layers.py).

Per block, the reference (specrt/models/gemma3.py) computes

    x += post_attention_norm(attn(input_norm(x)));  x += post_feedforward_norm(mlp(pre_feedforward_norm(x)))

which the graph writes with two SkipSimplifiedLayerNormalization (each adds the previous branch's normed
output to the residual stream and norms the sum for the next branch) and two SimplifiedLayerNormalization
(the post norms of the branch outputs): per layer 2 Skip + 2 plain norms, every `(1 + w)` folded into the fp32
weight (`fused_layers.norm_weight`). The embeddings are scaled by sqrt(hidden) rounded to the embedding dtype,
as transformers' Gemma3TextScaledWordEmbedding does (one Mul on [1, S, hidden]: the tied table is also the
LM head, so the scale cannot be folded into it). Attention (sliding window, rope per layer type, scale) is
`fused_layers.attention`; the MLP (GeGLU, FastGelu) is `fused_layers.mlp`.
"""

from __future__ import annotations

import numpy as np
import torch

from specrt.models import Decoder
from specrt.models.config import DecoderConfig
from specrt.compiler.fused_layers import attention, mlp, norm_weight, skip_norm
from specrt.compiler.graph_builder import GraphBuilder


def embed_scale(decoder: Decoder) -> np.float32:
    """sqrt(hidden) as the reference multiplies by it: rounded to the embedding weights' dtype first."""
    dtype = decoder.model.embed_tokens.weight.dtype
    return np.float32(torch.tensor(decoder.config.hidden_size**0.5, dtype=dtype).float().item())


def _norm(g: GraphBuilder, x: str, norm, c: DecoderConfig, p: str) -> str:
    return g.op("SimplifiedLayerNormalization", [x, g.weight(f"{p}.weight", norm_weight(norm, c))], axis=-1,
                epsilon=float(norm.eps), name=p)


def gemma3_layers(g: GraphBuilder, embedded: str, decoder: Decoder, c: DecoderConfig) -> tuple[str, str]:
    """Scale the embeddings [1, S, hidden] and add every block. Returns (last block's normed MLP output,
    residual stream before it): the final norm adds them (fused_graph.build_fused_model)."""
    x = g.op("Mul", [embedded, g.weight("embed_scale", np.array(embed_scale(decoder), np.float32))],
             name="embed_scale/mul")
    residual = None
    for i, layer in enumerate(decoder.model.layers):
        p = f"layers.{i}"
        if residual is None:
            normed, residual = _norm(g, x, layer.input_layernorm, c, f"{p}.input_layernorm"), x
        else:
            normed, residual = skip_norm(g, x, residual, layer.input_layernorm, f"{p}.input_layernorm", c)
        attn = _norm(g, attention(g, normed, layer.self_attn, i, c), layer.post_attention_layernorm, c,
                     f"{p}.post_attention_layernorm")
        normed, residual = skip_norm(g, attn, residual, layer.pre_feedforward_layernorm,
                                     f"{p}.pre_feedforward_layernorm", c)
        x = _norm(g, mlp(g, normed, layer.mlp, i, c), layer.post_feedforward_layernorm, c,
                  f"{p}.post_feedforward_layernorm")
    return x, residual
