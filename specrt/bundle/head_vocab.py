"""The bundle's draft-head vocabulary: `head_config.json` read and checked against the manifest (docs/safety.md §2)."""

from __future__ import annotations

from specrt.bundle.schema import Manifest
from specrt.core.errors import ManifestError
from specrt.core.jsonfile import load_json
from specrt.models.head_config import FUSED_VERSION, VERSION, check_head_config, target_facts


def head_vocab_ids(manifest: Manifest) -> list[int]:
    """The bundle's draft-head vocabulary ids, checked against its manifest entry and its target (ManifestError)."""
    entry = manifest.draft_head
    if entry is None:
        raise ManifestError("the bundle has no draft head (compile one with --draft head:DIR)")
    where = f"bundle file {entry.config} (draft_head.config)"
    cfg = load_json(manifest.path(entry.config), lambda msg: ManifestError(f"{msg}; recompile the bundle"))
    target = manifest.models["target"].decoder_config
    for name in ("hidden_size", "num_kv_heads", "head_dim"):
        if getattr(entry, name) != getattr(target, name):
            raise ManifestError(f"manifest key draft_head.{name} is {getattr(entry, name)} but the target's "
                                f"decoder_config.{name} is {getattr(target, name)}: the head belongs to another model; "
                                "recompile the bundle")
    fused = entry.feature_layers is not None
    ids = check_head_config(cfg, where, target=target_facts(target), draft_vocab_size=entry.draft_vocab_size,
                            versions=(FUSED_VERSION,) if fused else (VERSION,))
    if fused and (cfg.get("version") != FUSED_VERSION or tuple(cfg.get("feature_layers", ())) != entry.feature_layers):
        raise ManifestError(f"{where}: feature_layers {cfg.get('feature_layers')!r} but the manifest's "
                            f"draft_head.feature_layers is {list(entry.feature_layers)}; recompile the bundle")
    return ids
