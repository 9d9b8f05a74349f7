"""specrt.bundle -- the one contract between compile and run (layer: shared base, above specrt.core).

    manifest.py   the manifest: reading, checksums, path rules (`read_manifest`, `Manifest`)
    graph_io.py   fixed graph input/output names
    profiles.py   optimization profiles (prefill / decode / verify shapes)

specrt.compiler writes bundles, specrt.runtime reads them; neither imports the other.
"""

from .manifest import FORMAT_NAME, MANIFEST, Manifest, read_manifest

__all__ = ["FORMAT_NAME", "MANIFEST", "Manifest", "read_manifest"]
