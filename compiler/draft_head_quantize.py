"""The draft head of a quantized bundle: `quantize_head` and `validate_quantized_head`.

Precision (compiler/quantize_prepare.py `head_quantization`): `--draft-quantize` when given, else int8 in a bundle
whose target is quantized (int8 or int4: HEAD_QUANT_TYPE, measured in compiler/quantize.py), else fp32. Block size
and symmetry follow the --quant-* options, as the target's do.

The head graph (compiler/draft_head.py) is an export of a PyTorch module, like the target's portable graph, so
`quantize_onnx` (compiler/quantize.py: ONNX Runtime's constant folding, then its MatMulNBitsQuantizer) turns its
nine weight MatMuls (fc, q/k/v/o, gate/up/down, the reduced LM head [D, V']) into MatMulNBits. Its input
embedding (the target's full table [V, D], fp16: the largest part of the head; docs/draft-head.md) then
becomes GatherBlockQuantized with the same bits and blocks (compiler/quantize_embed.py; scales kept in fp16, so the
rows come out in fp16 as before). It gathers one row per drafted token: it costs memory, not time.

Accuracy level: the head's output only changes which drafts are proposed, never the output (the target verifies
every draft), so the head takes the fast level 4 (int8 compute) whatever the target's batch-invariance needs;
`--quant-accuracy-level` still applies when given.

Validation: a quantized head is not expected to equal the fp32 module, only to draft about as well. It runs on the
target's own features (the PyTorch target over the built-in held-out text: the rows a head sees after a prefill)
and must agree with the fp32 module on the top-1 token of at least MIN_TOP1_AGREEMENT of the rows, with logits
whose centred cosine similarity to the module's averages at least MIN_COSINE; a graph giving NaN, wrong shapes or
unrelated logits is refused (ValidationError naming the figure). The SHAPES calls check shapes and finiteness.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specrt.compiler.onnx_io import save_onnx
from specrt.compiler.quantize import DEFAULT_ACCURACY_LEVEL, QuantizeConfig, quantize_onnx
from specrt.compiler.quantize_embed import quantize_embedding
from specrt.compiler.draft_head_validate import (OUTPUTS, SHAPES, feature_layers, graph_module, input_names,
                                                 sample_inputs)
from specrt.compiler.validate import ValidationError

EMBED_GATHER = "node_embedding"  # the exporter's name for DraftHead.embed's Gather (torch 2.13 dynamo)
# Floors that only a broken graph misses (what real heads reach: docs/draft-head.md, "Compile and use").
MIN_TOP1_AGREEMENT = 0.2
MIN_COSINE = 0.8
MAX_ROWS = 128  # held-out tokens the target and the head run over


def head_config(cfg: QuantizeConfig) -> QuantizeConfig:
    """The head's settings: the target's, at the fast accuracy level unless one was given (see the module doc)."""
    if cfg.accuracy_level is not None:
        return cfg
    return dataclasses.replace(cfg, accuracy_level=DEFAULT_ACCURACY_LEVEL)


def quantize_head(src: Path, dst: Path, cfg: QuantizeConfig) -> dict[str, Any]:
    """The fp32 head graph `src` quantized into `dst` (+ `dst.data`). Returns the manifest's record."""
    import onnx

    cfg = head_config(cfg)
    counts = quantize_onnx(src, dst, cfg)
    model = onnx.load(str(dst), load_external_data=True)
    embedding = quantize_embedding(model, False, cfg.bits, cfg.block_size, cfg.symmetric, gather_name=EMBED_GATHER)
    if embedding["storage"] != "fp32":
        save_onnx(model, dst)
    else:  # left as the head's own table
        embedding["storage"] = "fp16"
    return {"method": "MatMulNBits", "type": cfg.type, "bits": cfg.bits, "block_size": cfg.block_size,
            "symmetric": cfg.symmetric, "accuracy_level": cfg.level, **counts, "embedding": embedding}


def target_rows(decoder, ids: np.ndarray, layers: tuple[int, ...] = ()
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The head's prefill rows on real text: (features [T-1, D] of positions 0..T-2, the tokens 1..T-1, and for a
    fused head the residual stream after `layers` [T-1, n, D], else None)."""
    from specrt.models.base import empty_past
    from specrt.models.draft_head_fused import layer_taps

    t = torch.as_tensor(ids[:MAX_ROWS], dtype=torch.long)[None]
    keys, values = empty_past(decoder.config)
    got, handles = layer_taps(decoder, layers)
    try:
        with torch.no_grad():
            hidden = decoder(t, torch.arange(t.shape[1])[None], keys, values).hidden_states[0]
    finally:
        for h in handles:
            h.remove()
    stacked = torch.stack(got, dim=2)[0, :-1].float().numpy() if layers else None
    return hidden[:-1].float().numpy(), t[0, 1:].numpy(), stacked


def _centred_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # [R, V'] x2 -> [R]
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)


def validate_quantized_head(head, path: Path, features: np.ndarray, tokens: np.ndarray,
                            layers: np.ndarray | None = None) -> dict[str, Any]:
    """The quantized head graph `path` against the fp32 module `head` (DraftHead): SHAPES calls (shapes, finite),
    then one prefill call over the target's `features [R, D]` (a fused head: and `layers [R, n, D]`) and `tokens
    [R]` (top-1 agreement, cosine)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    module, names = graph_module(head), input_names(head)

    def run(args: tuple[torch.Tensor, ...], where: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
        got = sess.run(list(OUTPUTS), {n: a.numpy() for n, a in zip(names, args)})
        with torch.no_grad():
            ref = [t.numpy() for t in module(*args)]
        for name, a, b in zip(OUTPUTS, got, ref):
            if a.shape != b.shape or not np.isfinite(a).all():
                raise ValidationError(f"quantized draft head output {name} ({where}) has shape {a.shape}"
                                      f"{'' if np.isfinite(a).all() else ' and non-finite values'}, the fp32 "
                                      f"head's is {b.shape}: the quantized graph is broken")
        return got, ref

    for i, (s, p) in enumerate(SHAPES):
        run(sample_inputs(head, s, p, seed=i + 1), f"S={s}, P={p}")
    rows = tokens.size
    args = (torch.from_numpy(features)[None], torch.from_numpy(tokens)[None], torch.arange(rows)[None],
            *sample_inputs(head, rows, 0)[-2:])
    if feature_layers(head):
        args = (args[0], torch.from_numpy(layers)[None], *args[1:])
    got, ref = run(args, f"{rows} rows of target features")
    top1 = float((got[0][0].argmax(-1) == ref[0][0].argmax(-1)).mean())
    cosine = float(_centred_cosine(got[0][0].astype(np.float64), ref[0][0].astype(np.float64)).mean())
    record = {"rows": int(rows), "top1_agreement": round(top1, 4), "logits_cosine": round(cosine, 5),
              "max_abs_diff": float(np.abs(got[0] - ref[0]).max()), "logits_scale": float(np.abs(ref[0]).max()),
              "min_top1_agreement": MIN_TOP1_AGREEMENT, "min_cosine": MIN_COSINE, "shapes": [list(x) for x in SHAPES]}
    if top1 < MIN_TOP1_AGREEMENT or cosine < MIN_COSINE:
        raise ValidationError(f"quantized draft head drafts unlike the fp32 head on {rows} rows of the target's "
                              f"features: top-1 agreement {top1:.2f} (floor {MIN_TOP1_AGREEMENT}), logits cosine "
                              f"{cosine:.3f} (floor {MIN_COSINE}); try --draft-quantize int8 or a smaller "
                              "--quant-block-size")
    return record
