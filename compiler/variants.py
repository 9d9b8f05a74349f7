"""Graph variants per model in a bundle: `portable` (standard ONNX ops: TensorRT, every provider) is always
present; `fused` (ONNX Runtime contrib ops, compiler/fused_graph.py) is added by `compile --ort-graph fused`
(the default) where the architecture supports it.

Manifest, per model:  "graphs": {"portable": {"onnx", "onnx_data"},
                                 "fused": {"onnx", "onnx_data", "inputs", "outputs", "kv_layout",
                                           "validation"}}
plus "fused_skipped": "<reason>" when fused was asked for but the model cannot have it. Bundles written
before variants existed have no "graphs" key: their `onnx` entry is the portable graph.
"""

from __future__ import annotations

from pathlib import Path
from specrt.bundle.entries import GraphVariant, TensorSpec
from specrt.models import Decoder
from specrt.models.config import lm_head_share
from specrt.compiler.fused_graph import fused_io, fused_onnx_from_decoder, fused_unsupported_reason
from specrt.compiler.fused_validate import validate_fused_onnx
from specrt.compiler.lm_head_screen import screen_supported, screen_wanted
from specrt.bundle.graph_io import LM_HEAD_FULL
from specrt.core.errors import InvalidArgument


FUSED_KV_LAYOUT = "[1, kv_heads, max_seq_len, head_dim] per layer, bound as past_* and present_* (in place)"


def fused_variant(decoder: Decoder, role_dir: Path, role: str, max_seq_len: int,
                  shapes: list[tuple[int, int]], tolerance=None,
                  lm_head_screen: str = "off", feature_layers: tuple[int, ...] = ()
                  ) -> tuple[GraphVariant | None, str | None]:
    """Write and validate `<role>/model.fused.onnx` (`lm_head_screen` auto / on / off: with the screened greedy
    head, compiler/lm_head_screen.py; `feature_layers`: the `hidden_layers` output of a bundle with a fused draft
    head, compiler/feature_layers.py). Returns (graph variant, None) or (None, skip reason)."""
    c = decoder.config
    reason = fused_unsupported_reason(c)
    if reason:
        return None, reason
    screen = screen_wanted(lm_head_screen, c.vocab_size, c.hidden_size, lm_head_share(c)["layer_weights"])
    if screen and screen_supported(c.hidden_size) is not None:
        if lm_head_screen == "on":
            raise InvalidArgument(f"--lm-head-screen on: {screen_supported(c.hidden_size)}")
        screen = False
    path = fused_onnx_from_decoder(decoder, role_dir / "model.fused.onnx", max_seq_len, screen, feature_layers)
    stats = validate_fused_onnx(decoder, path, shapes, capacity=max_seq_len, tolerance=tolerance, screen=screen)
    if feature_layers:
        from specrt.compiler.feature_layers import validate_hidden_layers

        stats["hidden_layers"] = validate_hidden_layers(decoder, path, feature_layers, True, max_seq_len, tolerance)
    inputs, outputs = fused_io(c, screen, feature_layers)
    specs = [tuple(TensorSpec.from_dict(t, f"{role} fused I/O") for t in io) for io in (inputs, outputs)]
    return GraphVariant(f"{role}/model.fused.onnx", f"{role}/model.fused.onnx.data", inputs=specs[0],
                        outputs=specs[1], kv_layout=FUSED_KV_LAYOUT, validation=stats,
                        optional_inputs=(LM_HEAD_FULL,) if screen else None), None
