"""`onnx_from_decoder`: export one decoder to ONNX with dynamic B (batch), S (new tokens) and P (past length).

The exported graph follows specrt/bundle/graph_io.py. Weights go to `<name>.onnx.data` (external data) and
the IR version is pinned so that ONNX Runtime and TensorRT's parser accept the file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from specrt.core.errors import SpecrtError
from specrt.models import Decoder
from specrt.bundle import graph_io
from specrt.compiler.input_defaults import add_past_lengths_default
from specrt.compiler.onnx_io import save_onnx

ONNX_OPSET = 18
ONNX_IR_VERSION = 10


class _FlatDecoder(nn.Module):
    """Adapts the decoder contract to flat positional ONNX inputs/outputs."""

    def __init__(self, decoder: Decoder, feature_layers: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.decoder = decoder
        self.num_layers = decoder.config.num_layers
        self.feature_layers = tuple(feature_layers)  # a fused head's layers: the extra output hidden_layers

    def forward(self, input_ids, position_ids, past, past_lengths, tree_mask):
        # input_ids, position_ids: [B, S]; past: tuple of 2L tensors (key, value per layer), each [B, P, Hkv, D];
        # past_lengths: [B] valid past rows per sequence (compiler/input_defaults.py gives it a default: all P);
        # tree_mask: [S, S] bool, a token tree's ancestor mask (docs/trees.md; default [[True]]: the chain)
        if self.feature_layers:
            from specrt.models.draft_head_fused import layer_taps

            got, handles = layer_taps(self.decoder, self.feature_layers)
        try:
            out = self.decoder(input_ids, position_ids, past[0::2], past[1::2], past_lengths, tree_mask)
        finally:
            for h in handles if self.feature_layers else ():
                h.remove()
        flat = [out.logits, out.hidden_states]
        for k, v in zip(out.new_keys, out.new_values):
            flat += [k, v]
        if self.feature_layers:  # [B, S, n, hidden]: the residual stream after each of feature_layers
            flat.append(torch.stack(got, dim=2))
        return tuple(flat)


def sample_inputs(decoder: Decoder, new_tokens: int, past_len: int, seed: int = 0, batch: int = 1):
    """Random inputs in the graph's layout: (input_ids [B,S], position_ids [B,S], past tuple of [B,P,Hkv,D])."""
    c = decoder.config
    gen = torch.Generator().manual_seed(seed)
    dtype = next(decoder.parameters()).dtype
    ids = torch.randint(0, c.vocab_size, (batch, new_tokens), generator=gen)
    pos = torch.arange(past_len, past_len + new_tokens)[None].repeat(batch, 1)
    past = tuple(
        torch.randn(batch, past_len, c.num_kv_heads, c.head_dim, generator=gen).to(dtype)
        for _ in range(2 * c.num_layers)
    )
    return ids, pos, past


class ExportError(SpecrtError):
    exit_code = 1


def export_module(module: nn.Module, args: tuple, path: Path, input_names: list[str], output_names: list[str],
                  dynamic_shapes: tuple, what: str) -> Path:
    """torch.onnx.export (dynamo) -> `path` + `path.data`, with the IR version pinned for ORT / TensorRT."""
    import onnx

    path = Path(path)
    tmp = path.with_suffix(".tmp.onnx")
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed"
            # optimize=False keeps parameter names as initializer names (the torch runner relies on it);
            # ONNX Runtime and TensorRT fold constants themselves when they load the graph.
            program = torch.onnx.export(module, args, dynamo=True, opset_version=ONNX_OPSET,
                                        input_names=input_names, output_names=output_names,
                                        dynamic_shapes=dynamic_shapes, optimize=False, verbose=False)
            program.save(str(tmp), external_data=True)
    except Exception as exc:  # torch's messages run over many lines: the first one, cut (SPECRT_DEBUG: all)
        from specrt.compiler.os_errors import is_write_failure
        from specrt.core.text import one_line

        if is_write_failure(exc):  # writing the graph failed (a full disk): compile names the output
            raise

        raise ExportError(f"ONNX export of {what} failed: {type(exc).__name__}: {one_line(exc)}") from exc
    model = onnx.load(str(tmp), load_external_data=True)
    model.ir_version = ONNX_IR_VERSION
    for f in (tmp, Path(str(tmp) + ".data")):
        f.unlink(missing_ok=True)
    return save_onnx(model, path)


def onnx_from_decoder(decoder: Decoder, path: Path, feature_layers: tuple[int, ...] = ()) -> Path:
    """Export `decoder` to `path` (+ `path.data`). Returns the path of the .onnx file. `feature_layers` (a bundle
    with a fused draft head): the graph also outputs `hidden_layers` [B, S, n, hidden]."""
    c = decoder.config
    b_dim = torch.export.Dim("batch", min=1, max=4096)
    s_dim = torch.export.Dim("new_tokens", min=1, max=65536)
    p_dim = torch.export.Dim("past_len", min=0, max=1 << 20)
    dynamic = ({0: b_dim, 1: s_dim}, {0: b_dim, 1: s_dim}, tuple({0: b_dim, 1: p_dim} for _ in range(2 * c.num_layers)),
               {0: b_dim}, {0: s_dim, 1: s_dim})
    # batch 2 in the sample: torch.export specialises a dimension whose sample size is 1
    ids, pos, past = sample_inputs(decoder, new_tokens=3, past_len=5, batch=2)
    lengths = torch.tensor([5, 3], dtype=torch.int64)
    tree = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])  # a two-branch tree
    outputs = graph_io.output_names(c.num_layers) + ([graph_io.HIDDEN_LAYERS] if feature_layers else [])
    path = export_module(_FlatDecoder(decoder, feature_layers).eval(), (ids, pos, past, lengths, tree), path,
                         graph_io.input_names(c.num_layers) + [graph_io.PAST_LENGTHS, graph_io.TREE_MASK],
                         outputs, dynamic, c.architecture)
    add_past_lengths_default(path)  # callers that never feed past_lengths get every past row, and a chain
    return path
