"""Bundle-level manifest entries besides the models: tokenizer, files, Medusa heads, TensorRT engines, demo mark.

    tokenizer        {path, config, vocab_size, eos_token_ids, bos_token_id, chat_template}
    files[rel]       {sha256, size}
    medusa           {num_heads, onnx, onnx_data, config, inputs, outputs, validation, source_config}
    draft_head       {onnx, onnx_data, config, draft_vocab_size, hidden_size, num_kv_heads, head_dim, inputs,
                      outputs, validation}
    engines.<role>   {path, tensorrt_version, cuda_version, gpu_name, compute_capability,
                      hardware_compatibility_level, version_compatible, lean_runtime_embedded, precision,
                      workspace_bytes, builder_optimization_level, profiles}
    demo             {fingerprint, models}   (bundles `specrt demo` compiled and may replace)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from specrt.core.errors import ManifestError
from specrt.bundle.entries import TensorSpec, tensor_specs
from specrt.bundle.fields import (check_dict, check_ids, check_int, check_list, check_optional_str, check_str, emit, field_names,
                     unknown_keys)

MAX_DRAFT_TOKENS_LIMIT = 64
HEAD_PRECISIONS = ("fp32", "int8", "int4")  # draft_head.precision
SHA256 = re.compile(r"^[0-9a-f]{64}$")
REBUILD_ENGINES = "rebuild the engines: specrt compile --target ... -o BUNDLE --engines trt --force"


@dataclasses.dataclass(frozen=True)
class TokenizerEntry:
    path: str  # tokenizer/tokenizer.json
    config: str | None = None  # tokenizer/tokenizer_config.json
    vocab_size: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    chat_template: str | None = None  # the file holding the chat template, None: none
    chat_template_recorded: bool = True  # False: written before the key existed (not written back)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    ORDER = ("path", "config", "vocab_size", "eos_token_ids", "bos_token_id", "chat_template")

    def __post_init__(self) -> None:
        check_str(self.path, "tokenizer.path")
        check_optional_str(self.config, "tokenizer.config")
        if self.vocab_size is not None:
            check_int(self.vocab_size, "tokenizer.vocab_size", 1)
        check_ids(self.eos_token_ids, "tokenizer.eos_token_ids")
        if self.bos_token_id is not None:
            check_int(self.bos_token_id, "tokenizer.bos_token_id", 0)
        check_optional_str(self.chat_template, "tokenizer.chat_template")

    @classmethod
    def from_dict(cls, raw: Any) -> "TokenizerEntry":
        check_dict(raw, "tokenizer")
        return cls(path=raw.get("path"), config=raw.get("config"), vocab_size=raw.get("vocab_size"),
                   eos_token_ids=check_ids(raw.get("eos_token_ids", []), "tokenizer.eos_token_ids"),
                   bos_token_id=raw.get("bos_token_id"), chat_template=raw.get("chat_template"),
                   chat_template_recorded="chat_template" in raw, extra=unknown_keys(raw, cls.ORDER))

    def to_dict(self) -> dict[str, Any]:
        pairs = [(k, getattr(self, k)) for k in self.ORDER if k != "chat_template" or self.chat_template_recorded]
        return emit(pairs, keep_null=("config", "bos_token_id", "chat_template"), extra=self.extra)

    @property
    def chat_template_source(self) -> str | None:
        """The file to read the template from (bundles written before `chat_template` existed: the config)."""
        return self.chat_template if self.chat_template_recorded else self.config


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """`files[rel]`: what `read_manifest` checks before any file is opened."""

    sha256: str
    size: int
    key: str = dataclasses.field(default="files", compare=False, repr=False)  # for messages only

    def __post_init__(self) -> None:
        if not isinstance(self.sha256, str) or not SHA256.match(self.sha256):
            raise ManifestError(f"manifest key {self.key} needs a sha256 (64 hex digits); recompile the bundle")
        check_int(self.size, f"{self.key}.size", 0)

    @classmethod
    def from_dict(cls, rel: str, raw: Any) -> "FileEntry":
        key = f"files[{rel!r}]"
        if not isinstance(raw, dict):
            raise ManifestError(f"manifest key {key} needs a sha256 (64 hex digits); recompile the bundle")
        return cls(raw.get("sha256"), raw.get("size"), key)

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size}


@dataclasses.dataclass(frozen=True)
class MedusaEntry:
    """`medusa`: heads `hidden_states [N, D] -> medusa_logits [N, H, V]` (compiler/medusa.py)."""

    num_heads: int
    onnx: str
    onnx_data: str | None = None
    config: str | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    validation: Any = None
    source_config: Any = None  # the heads' medusa_config.json
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_int(self.num_heads, "medusa.num_heads", 1, MAX_DRAFT_TOKENS_LIMIT)
        check_str(self.onnx, "medusa.onnx")
        check_optional_str(self.onnx_data, "medusa.onnx_data")
        check_optional_str(self.config, "medusa.config")

    @classmethod
    def from_dict(cls, raw: Any) -> "MedusaEntry":
        check_dict(raw, "medusa")
        simple = {k: raw[k] for k in ("num_heads", "onnx", "onnx_data", "config", "validation", "source_config")
                  if k in raw}
        return cls(**{"num_heads": None, "onnx": None, **simple},
                   inputs=tensor_specs(raw.get("inputs"), "medusa.inputs"),
                   outputs=tensor_specs(raw.get("outputs"), "medusa.outputs"),
                   extra=unknown_keys(raw, field_names(cls)))

    def to_dict(self) -> dict[str, Any]:
        return emit([(f, getattr(self, f)) for f in field_names(MedusaEntry) if f != "extra"], extra=self.extra)


@dataclasses.dataclass(frozen=True)
class DraftHeadEntry:
    """`draft_head`: an EAGLE-style head (compiler/draft_head.py): `features [1,S,D], input_ids, position_ids,
    past_key/past_value [1,P,Hkv,D] -> logits [1,S,V'], hidden_states [1,S,D], new_key/new_value [1,S,Hkv,D]`;
    `config` (head_config.json) holds `vocab_ids` [V'], the full-vocabulary id of each logit. `precision`: "fp32",
    or "int8" / "int4" when its weights are quantized (`quantization`: compiler/draft_head_quantize.py's record)."""

    onnx: str
    draft_vocab_size: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    config: str
    onnx_data: str | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    validation: Any = None
    precision: str = "fp32"
    quantization: Any = None
    # a fused head (head_config version 2): the target layers it reads; the head graph takes `layer_features` and
    # the target graphs output `hidden_layers` (graph_io.py). None: a plain head
    feature_layers: tuple[int, ...] | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_str(self.onnx, "draft_head.onnx")
        if self.feature_layers is not None:
            layers = check_list(self.feature_layers, "draft_head.feature_layers")
            for i in layers:
                check_int(i, "draft_head.feature_layers[]", 0, 1 << 16)
            if not layers or len(set(layers)) != len(layers):
                raise ManifestError(f"draft_head.feature_layers must be distinct layer indices, got {list(layers)}")
            object.__setattr__(self, "feature_layers", tuple(layers))
        if self.precision not in HEAD_PRECISIONS:
            raise ManifestError(f"draft_head.precision must be one of {', '.join(HEAD_PRECISIONS)}, "
                                f"got {self.precision!r}")
        check_str(self.config, "draft_head.config")
        check_optional_str(self.onnx_data, "draft_head.onnx_data")
        check_int(self.draft_vocab_size, "draft_head.draft_vocab_size", 1, 1 << 24)
        for name in ("hidden_size", "num_kv_heads", "head_dim"):
            check_int(getattr(self, name), f"draft_head.{name}", 1, 1 << 20)

    @classmethod
    def from_dict(cls, raw: Any) -> "DraftHeadEntry":
        check_dict(raw, "draft_head")
        names = ("onnx", "onnx_data", "config", "draft_vocab_size", "hidden_size", "num_kv_heads", "head_dim",
                 "validation", "precision", "quantization", "feature_layers")
        simple = {k: raw[k] for k in names if k in raw}
        return cls(**{"onnx": None, "config": None, "draft_vocab_size": None, "hidden_size": None,
                      "num_kv_heads": None, "head_dim": None, **simple},
                   inputs=tensor_specs(raw.get("inputs"), "draft_head.inputs"),
                   outputs=tensor_specs(raw.get("outputs"), "draft_head.outputs"),
                   extra=unknown_keys(raw, field_names(cls)))

    def to_dict(self) -> dict[str, Any]:
        return emit([(f, getattr(self, f)) for f in field_names(DraftHeadEntry) if f != "extra"], extra=self.extra)


@dataclasses.dataclass(frozen=True)
class EngineEntry:
    """`engines.<role>`: a TensorRT engine and the facts its compatibility check needs (compiler/trt/build.py
    writes it, runtime/backends/trt/compat.py checks it against the installed TensorRT and GPU)."""

    role: str  # the key it is stored under (not written)
    path: str
    tensorrt_version: str | None
    cuda_version: str | None
    gpu_name: str | None
    compute_capability: str | None
    hardware_compatibility_level: str
    version_compatible: bool
    precision: str
    profiles: tuple[str, ...]  # optimization profile i = phase profiles[i]
    lean_runtime_embedded: bool | None = None
    workspace_bytes: int | None = None
    builder_optimization_level: int | None = None
    quantization: Mapping[str, Any] | None = None  # int8 / fp8 / int4: compiler/trt/ptq.py's record
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    REQUIRED = ("path", "tensorrt_version", "cuda_version", "gpu_name", "compute_capability",
                "hardware_compatibility_level", "version_compatible", "precision", "profiles")
    ORDER = ("path", "tensorrt_version", "cuda_version", "gpu_name", "compute_capability",
             "hardware_compatibility_level", "version_compatible", "lean_runtime_embedded", "precision",
             "workspace_bytes", "builder_optimization_level", "profiles", "quantization")

    def __post_init__(self) -> None:
        check_str(self.path, f"engines.{self.role}.path")
        if self.quantization is not None:
            check_dict(self.quantization, f"engines.{self.role}.quantization")

    @classmethod
    def from_dict(cls, role: str, raw: Any) -> "EngineEntry":
        key = f"engines.{role}"
        check_dict(raw, key)
        check_str(raw.get("path"), f"{key}.path")
        missing = [k for k in cls.REQUIRED if k not in raw]
        if missing:
            raise ManifestError(f"manifest key {key} lacks {', '.join(missing)}; {REBUILD_ENGINES}")
        known = {k: raw[k] for k in cls.ORDER if k in raw}
        known["profiles"] = tuple(known["profiles"]) if isinstance(known["profiles"], list) else known["profiles"]
        return cls(role=role, **known, extra=unknown_keys(raw, cls.ORDER))

    def to_dict(self) -> dict[str, Any]:
        return emit([(k, getattr(self, k)) for k in self.ORDER],
                    keep_null=self.REQUIRED + ("builder_optimization_level",), extra=self.extra)


@dataclasses.dataclass(frozen=True)
class DemoEntry:
    """`demo`: marks a bundle `specrt demo` compiled (and may replace), with what it was compiled from."""

    fingerprint: str
    models: str  # the checkpoint directory (or GGUF file) it was compiled from
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Any) -> "DemoEntry":
        check_dict(raw, "demo")
        return cls(raw.get("fingerprint"), raw.get("models"), unknown_keys(raw, ("fingerprint", "models")))

    def to_dict(self) -> dict[str, Any]:
        return emit([("fingerprint", self.fingerprint), ("models", self.models)], extra=self.extra)
