"""specrt.bundle -- the one contract between compile and run (layer: shared base, above specrt.core).

    schema.py     `Manifest`: manifest.json as a frozen dataclass, validated on construction
    entries.py    `ModelEntry` (per model), `GraphVariant`, `QuantizationEntry`, `TensorSpec`
    parts.py      `TokenizerEntry`, `FileEntry`, `MedusaEntry`, `EngineEntry`, `DemoEntry`
    fields.py     the field checks (ManifestError naming the key) and JSON helpers they share
    manifest.py   reading: `read_manifest` (checksums, graphs, memory), `file_entries`, `sha256_file`
    writer.py     writing: `ManifestDraft` (what compile steps fill in) and `write_manifest`
    checks.py     the checks beyond single values: profiles, file list, graph shapes, memory
    paths.py      path rules (relative, inside the bundle root)
    graph_io.py   fixed graph input/output names
    profiles.py   optimization profiles (prefill / decode / verify shapes)

specrt.compiler writes bundles, specrt.runtime reads them; neither imports the other, and neither reads the
manifest's JSON itself.
"""

from specrt.bundle.entries import GraphVariant, ModelEntry, QuantizationEntry, TensorSpec
from specrt.bundle.manifest import FORMAT_NAME, MANIFEST, read_manifest
from specrt.bundle.parts import DemoEntry, EngineEntry, FileEntry, MedusaEntry, TokenizerEntry
from specrt.bundle.schema import Manifest

__all__ = ["FORMAT_NAME", "MANIFEST", "DemoEntry", "EngineEntry", "FileEntry", "GraphVariant", "Manifest",
           "MedusaEntry", "ModelEntry", "QuantizationEntry", "TensorSpec", "TokenizerEntry", "read_manifest"]
