"""`draft_head_step`: export a trained draft head (specrt/models/draft_head.py) as `draft_head/head.onnx`.

Graph: `features [1,S,D]`, `input_ids [1,S]`, `position_ids [1,S]`, `past_key`, `past_value [1,P,Hkv,D]`
-> `logits [1,S,V']`, `hidden_states [1,S,D]`, `new_key`, `new_value [1,S,Hkv,D]` (only the S new rows, like
the decoder graphs). Validated against the PyTorch module at compile (prefill-, draft- and catch-up-shaped
calls: compiler/draft_head_validate.py); `draft_head/head_config.json` carries `vocab_ids` (logit index -> full-vocabulary token id). In a
quantized bundle (or with --draft-quantize) the graph is `draft_head/head.int4.onnx` / `head.int8.onnx` instead:
compiler/draft_head_quantize.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch

from specrt.bundle.entries import TensorSpec
from specrt.bundle.graph_io import HEAD_INPUTS, HEAD_OUTPUTS
from specrt.bundle.parts import DraftHeadEntry
from specrt.bundle.writer import ManifestDraft
from specrt.compiler.export import export_module
from specrt.compiler.draft_head_quantize import quantize_head, target_rows, validate_quantized_head
from specrt.compiler.draft_head_validate import (feature_layers, graph_module, input_names, sample_inputs,
                                                 validate_head)
from specrt.compiler.quantize import QuantizeConfig
from specrt.compiler.sources import checkpoint_dir
from specrt.models.checkpoint import open_checkpoint
from specrt.models.draft_head import CONFIG, DraftHead, load_head, read_head_config

PREFIX = "head:"
INPUTS, OUTPUTS = HEAD_INPUTS, HEAD_OUTPUTS


def head_dir_of(draft: str | Path | None) -> Path | None:
    """`head:DIR` -> DIR (None for any other --draft value)."""
    text = str(draft) if isinstance(draft, (str, Path)) else ""
    return Path(text[len(PREFIX):]) if text.startswith(PREFIX) else None


def export_head(head: DraftHead, path: Path) -> Path:
    """The head's graph: INPUTS, or a fused head's (with `layer_features [1,S,n,D]` second) -> OUTPUTS."""
    s = torch.export.Dim("new_tokens", min=1, max=65536)
    p = torch.export.Dim("past_len", min=0, max=1 << 20)
    dynamic = ({1: s}, {1: s}, {1: s}, {1: p}, {1: p})
    if feature_layers(head):
        dynamic = (dynamic[0], {1: s}, *dynamic[1:])
    return export_module(graph_module(head.eval()), sample_inputs(head, 3, 5), path, list(input_names(head)),
                         list(OUTPUTS), dynamic, "the draft head")


def quantized_head(head: DraftHead, decoder, fp32: Path, tmp: Path, manifest: ManifestDraft,
                   cfg: QuantizeConfig) -> tuple[str, dict]:
    """`fp32` (the validated fp32 head graph) quantized to `draft_head/head.<type>.onnx` and validated on the
    target's features over the held-out text; the fp32 graph is then removed. Returns (relative path, record)."""
    from specrt.compiler.quality import heldout_text, text_token_ids

    rel = f"draft_head/head.{cfg.type}.onnx"
    record = quantize_head(fp32, tmp / rel, cfg)
    ids = text_token_ids(tmp / manifest.tokenizer.path, heldout_text(), "the built-in held-out text")
    record["validation"] = validate_quantized_head(head, tmp / rel, *target_rows(decoder, ids, feature_layers(head)))
    for path in (fp32, fp32.with_name(fp32.name + ".data")):
        path.unlink(missing_ok=True)
    return rel, record


def draft_head_step(head_dir: Path, target: str | Path,
                    quantize: QuantizeConfig | None = None) -> Callable[[Path, ManifestDraft], None]:
    """The compile step (`CompileSpec.draft="head:DIR"`) adding the head to the bundle being written (fails fast on
    a bad dir). `quantize`: the head's weights quantized (compiler/draft_head_quantize.py), else it stays fp32."""
    read_head_config(head_dir)

    def step(tmp: Path, manifest: ManifestDraft) -> None:
        decoder = open_checkpoint(checkpoint_dir(target, tmp)).load_decoder(torch.float32)
        head, _ = load_head(head_dir, decoder)
        (tmp / "draft_head").mkdir()
        onnx_path = export_head(head, tmp / "draft_head" / "head.onnx")
        validation = validate_head(head, onnx_path)
        rel, quantization = "draft_head/head.onnx", None
        if quantize is not None:
            rel, quantization = quantized_head(head, decoder, onnx_path, tmp, manifest, quantize)
        del decoder
        shutil.copy2(Path(head_dir) / CONFIG, tmp / "draft_head" / CONFIG)
        c = head.config
        kv = (1, "P", c.num_kv_heads, c.head_dim)
        new = (1, "S", c.num_kv_heads, c.head_dim)
        layers = feature_layers(head)
        fused_in = (TensorSpec("layer_features", (1, "S", len(layers), c.hidden_size), "float32"),) if layers else ()
        manifest.draft_head = DraftHeadEntry(
            onnx=rel, onnx_data=rel + ".data", config=f"draft_head/{CONFIG}",
            draft_vocab_size=head.draft_vocab_size, hidden_size=c.hidden_size, num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            inputs=(TensorSpec("features", (1, "S", c.hidden_size), "float32"), *fused_in,
                    TensorSpec("input_ids", (1, "S"), "int64"),
                    TensorSpec("position_ids", (1, "S"), "int64"), TensorSpec("past_key", kv, "float32"),
                    TensorSpec("past_value", kv, "float32")),
            outputs=(TensorSpec("logits", (1, "S", head.draft_vocab_size), "float32"),
                     TensorSpec("hidden_states", (1, "S", c.hidden_size), "float32"),
                     TensorSpec("new_key", new, "float32"), TensorSpec("new_value", new, "float32")),
            validation=validation, precision=quantize.type if quantize else "fp32", quantization=quantization,
            feature_layers=layers or None)

    return step
