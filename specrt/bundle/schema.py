"""`Manifest`: manifest.json as a frozen dataclass, validated on construction (the one contract between
`compile`, which writes it through writer.py, and `load`, which reads it through manifest.read_manifest).

    format, format_version, specrt_version, created, torch_version, onnx {opset, ir_version},
    max_seq_len, max_draft_tokens, batch_size, models {role: ModelEntry}, engines {role: EngineEntry},
    tokenizer TokenizerEntry, medusa MedusaEntry, draft_head DraftHeadEntry, demo DemoEntry, files {rel: FileEntry}

`Manifest.from_dict(json)` reads format version 1 (the current one); keys this version does not know are
kept (`extra`) and written back. `to_dict()` gives the JSON object back, key for key and in the same order.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from specrt import BUNDLE_FORMAT_VERSION, __version__
from specrt.core.errors import BundleError, ManifestError, VersionMismatch
from specrt.bundle.checks import check_file_list, check_profiles, resolve_inside
from specrt.bundle.entries import ModelEntry
from specrt.bundle.fields import check_dict, check_int, emit, unknown_keys
from specrt.bundle.parts import (MAX_DRAFT_TOKENS_LIMIT, DemoEntry, DraftHeadEntry, EngineEntry, FileEntry,
                                 MedusaEntry, TokenizerEntry)
from specrt.bundle.paths import check_relative

FORMAT_NAME = "specrt-bundle"
READABLE_VERSIONS = (1,)  # format versions this specrt reads (BUNDLE_FORMAT_VERSION is the one it writes)
MAX_SEQ_LEN_LIMIT = 1 << 20
MAX_BATCH_SIZE = 1 << 16  # sequences per pass a bundle's engines were built for
REQUIRED = ("models", "files", "max_seq_len", "max_draft_tokens", "tokenizer")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A validated manifest. `root` is the bundle directory (None for a manifest not yet on disk)."""

    max_seq_len: int
    max_draft_tokens: int
    models: Mapping[str, ModelEntry]
    tokenizer: TokenizerEntry
    files: Mapping[str, FileEntry]
    format: str = FORMAT_NAME
    format_version: int = BUNDLE_FORMAT_VERSION
    specrt_version: str | None = __version__
    created: str | None = None  # ISO 8601, UTC
    torch_version: str | None = None
    onnx: Any = None  # {"opset", "ir_version"} of the exported graphs
    batch_size: int | None = None
    engines: Mapping[str, EngineEntry] = dataclasses.field(default_factory=dict)
    medusa: MedusaEntry | None = None
    demo: DemoEntry | None = None
    draft_head: DraftHeadEntry | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    root: Path | None = dataclasses.field(default=None, compare=False)

    ORDER = ("format", "format_version", "specrt_version", "created", "torch_version", "onnx", "max_seq_len",
             "max_draft_tokens", "batch_size", "models", "engines", "tokenizer", "medusa", "draft_head", "demo",
             "files")

    def __post_init__(self) -> None:
        seq = check_int(self.max_seq_len, "max_seq_len", 2, MAX_SEQ_LEN_LIMIT)
        k = check_int(self.max_draft_tokens, "max_draft_tokens", 1, MAX_DRAFT_TOKENS_LIMIT)
        if k + 2 > seq:
            raise ManifestError(f"manifest: max_draft_tokens {k} leaves no room in max_seq_len {seq}")
        if self.batch_size is not None:
            check_int(self.batch_size, "batch_size", 1, MAX_BATCH_SIZE)
        if "target" not in self.models:
            raise ManifestError("manifest has no models.target; recompile the bundle")
        for role, entry in self.models.items():
            if entry.role != role:
                raise ManifestError(f"manifest key models.{role} holds the entry of {entry.role!r}")
            if entry.profiles is not None:
                check_profiles(entry.profiles, f"models.{role}", seq, k)
            vocab = entry.decoder_config.vocab_size
            for key, ids in ((f"models.{role}.eos_token_ids", entry.eos_token_ids or ()),
                             ("tokenizer.eos_token_ids", self.tokenizer.eos_token_ids),
                             ("tokenizer.bos_token_id", () if self.tokenizer.bos_token_id is None
                              else (self.tokenizer.bos_token_id,)),
                             (f"models.{role}.bos_token_id", () if entry.bos_token_id is None
                              else (entry.bos_token_id,))):
                bad = [i for i in ids if i >= vocab]
                if bad:
                    raise ManifestError(f"manifest key {key} holds {bad[0]}, outside the {vocab}-token vocabulary "
                                        f"of models.{role} (it could never be produced); recompile the bundle")
        check_file_list(self.files, self.referenced_paths())

    # ------------------------------------------------------------------------------------------ JSON
    @classmethod
    def from_dict(cls, data: Any, root: Path | None = None, source: str = "manifest") -> "Manifest":
        """Read manifest JSON (`source` names it in messages). Raises BundleError / VersionMismatch /
        ManifestError naming the key."""
        if not isinstance(data, dict):
            raise BundleError(f"{source} holds a JSON {type(data).__name__}, not an object; recompile the bundle")
        if data.get("format") != FORMAT_NAME:
            raise BundleError(f"{source}: format is {data.get('format')!r}, expected {FORMAT_NAME!r}")
        version = data.get("format_version")
        if isinstance(version, bool) or not isinstance(version, int):  # "1" is not version 1
            raise VersionMismatch(f"bundle format version {version!r} is not an integer ({source}: format_version); "
                                  f"this specrt ({__version__}) reads version {BUNDLE_FORMAT_VERSION}: recompile with "
                                  "`specrt compile`")
        if version not in READABLE_VERSIONS:
            raise VersionMismatch(f"bundle format version {version} but this specrt ({__version__}) reads version "
                                  f"{BUNDLE_FORMAT_VERSION}: recompile with `specrt compile`")
        for key in REQUIRED:
            if key not in data:
                raise BundleError(f"{source} lacks the field {key!r}; recompile the bundle")
        files = data["files"]
        if isinstance(files, dict):
            files = {rel: FileEntry.from_dict(rel, meta) for rel, meta in files.items()}
        engines = check_dict(data.get("engines", {}), "engines")
        simple = {k: data[k] for k in ("format", "format_version", "specrt_version", "created", "torch_version",
                                       "onnx", "max_seq_len", "max_draft_tokens", "batch_size") if k in data}
        simple.setdefault("specrt_version", None)
        models = check_dict(data["models"], "models")
        return cls(**simple, models={role: ModelEntry.from_dict(role, e) for role, e in models.items()},
                   tokenizer=TokenizerEntry.from_dict(data["tokenizer"]), files=files,
                   engines={role: EngineEntry.from_dict(role, e) for role, e in engines.items()},
                   medusa=MedusaEntry.from_dict(data["medusa"]) if "medusa" in data else None,
                   draft_head=DraftHeadEntry.from_dict(data["draft_head"]) if "draft_head" in data else None,
                   demo=DemoEntry.from_dict(data["demo"]) if data.get("demo") is not None else None,
                   extra=unknown_keys(data, cls.ORDER), root=root)

    def to_dict(self) -> dict[str, Any]:
        return emit([(k, getattr(self, k)) for k in self.ORDER], keep_null=("engines",), extra=self.extra)

    # ----------------------------------------------------------------------------------------- files
    def path(self, rel: str) -> Path:
        """The file `rel`, which must be listed in the manifest (so verified) and lie inside the bundle."""
        if rel not in self.files:
            raise BundleError(f"{rel!r} is not listed in the bundle's manifest: refusing to open an unverified file")
        if self.root is None:
            raise BundleError(f"{rel!r}: this manifest has no bundle directory")
        return resolve_inside(self.root, check_relative(rel))

    def referenced_paths(self) -> dict[str, str]:
        """{manifest key: relative path} for every file the runtime may open."""
        refs = {"tokenizer.path": self.tokenizer.path}
        if self.tokenizer.config:
            refs["tokenizer.config"] = self.tokenizer.config
        for role, entry in self.models.items():
            for name in ("onnx", "onnx_data", "config"):
                if name != "config" and "portable" in entry.omitted:
                    continue  # a lean bundle's record of its fp32 graph (entries.OMITTABLE)
                if getattr(entry, name):
                    refs[f"models.{role}.{name}"] = getattr(entry, name)
        if self.medusa is not None:
            for name in ("onnx", "onnx_data", "config"):
                if getattr(self.medusa, name):
                    refs[f"medusa.{name}"] = getattr(self.medusa, name)
        if self.draft_head is not None:
            for name in ("onnx", "onnx_data", "config"):
                if getattr(self.draft_head, name):
                    refs[f"draft_head.{name}"] = getattr(self.draft_head, name)
        for role, engine in self.engines.items():
            refs[f"engines.{role}.path"] = engine.path
        return refs

    def graph_files(self) -> dict[str, str]:
        """{manifest key: relative path} of the decoder graphs and the Medusa heads (checks.check_graphs)."""
        graphs = {f"models.{role}": e.onnx for role, e in self.models.items() if "portable" not in e.omitted}
        if self.medusa is not None:
            graphs["medusa"] = self.medusa.onnx
        if self.draft_head is not None:
            graphs["draft_head"] = self.draft_head.onnx
        return graphs
