"""Per-model manifest entries (`models.<role>`): `ModelEntry`, its graph variants and its quantization.

    models.<role>: architecture, config, decoder_config, vocab_size, eos_token_ids, bos_token_id,
                   num_parameters, onnx, onnx_data, dtype, inputs, outputs, profiles, validation, source,
                   graphs {portable, fused}, fused_skipped, self_draft, quantization, omitted

`omitted` names the graphs a lean quantized bundle left out at compile time (compiler/lean.py): "portable" /
"fused" (fp32) and "quantized.portable" / "quantized.fused"; their entries stay as the record of what was
compiled and validated, and whatever would open one refuses in one line naming the compile option that keeps it.

`from_dict` reads a manifest's JSON (keys this version does not know are kept in `extra`); `to_dict` writes
it back in the same key order. Reports the runtime does not interpret (validation statistics, source,
profiles, quality) stay JSON objects.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from specrt.core.errors import BundleError, ManifestError
from specrt.models.config import DecoderConfig, decoder_config
from specrt.bundle.fields import (check_dict, check_ids, check_int, check_list, check_optional_str, check_str, emit,
                     field_names, unknown_keys)

PORTABLE, FUSED = "portable", "fused"
# graph kinds a lean bundle may omit -> the compile option that keeps them
OMITTABLE = {"portable": "--keep-fp32", "fused": "--keep-fp32", "quantized.portable": "--ort-graph both",
             "quantized.fused": "--ort-graph fused"}
CONFIG_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, dtype (absent for the Medusa heads) and shape (ints and dim names)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str | None = None

    @classmethod
    def from_dict(cls, raw: Any, key: str) -> "TensorSpec":
        check_dict(raw, key)
        return cls(check_str(raw.get("name"), f"{key}.name"), tuple(check_list(raw.get("shape"), f"{key}.shape")),
                   check_optional_str(raw.get("dtype"), f"{key}.dtype"))

    def to_dict(self) -> dict[str, Any]:
        return emit([("name", self.name), ("dtype", self.dtype), ("shape", self.shape)])


def tensor_specs(raw: Any, key: str) -> tuple[TensorSpec, ...] | None:
    if raw is None:
        return None
    return tuple(TensorSpec.from_dict(t, f"{key}[{i}]") for i, t in enumerate(check_list(raw, key)))


@dataclasses.dataclass(frozen=True)
class GraphVariant:
    """One ONNX graph of a model (`graphs.<variant>`, or `quantization.graphs.<variant>`)."""

    onnx: str
    onnx_data: str | None = None
    optional_inputs: tuple[str, ...] | None = None  # portable: inputs with a default (logit_start)
    inputs: tuple[TensorSpec, ...] | None = None  # fused: its own I/O
    outputs: tuple[TensorSpec, ...] | None = None
    kv_layout: str | None = None
    validation: Any = None  # ONNX-vs-PyTorch statistics (compiler/validate.py)
    quantized_matmuls: int | None = None  # quantized graphs (compiler/quantize.py)
    unquantized_weight_matmuls: int | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Any, key: str) -> "GraphVariant":
        check_dict(raw, key)
        opt = raw.get("optional_inputs")
        return cls(onnx=check_str(raw.get("onnx"), f"{key}.onnx"),
                   onnx_data=check_optional_str(raw.get("onnx_data"), f"{key}.onnx_data"),
                   optional_inputs=None if opt is None else tuple(check_list(opt, f"{key}.optional_inputs")),
                   inputs=tensor_specs(raw.get("inputs"), f"{key}.inputs"),
                   outputs=tensor_specs(raw.get("outputs"), f"{key}.outputs"),
                   kv_layout=raw.get("kv_layout"), validation=raw.get("validation"),
                   quantized_matmuls=raw.get("quantized_matmuls"),
                   unquantized_weight_matmuls=raw.get("unquantized_weight_matmuls"),
                   extra=unknown_keys(raw, field_names(cls)))

    def to_dict(self) -> dict[str, Any]:
        return emit([(f, getattr(self, f)) for f in field_names(GraphVariant) if f != "extra"], extra=self.extra)


def graph_variants(raw: Any, key: str) -> dict[str, GraphVariant]:
    return {name: GraphVariant.from_dict(g, f"{key}.{name}") for name, g in check_dict(raw, key).items()}


@dataclasses.dataclass(frozen=True)
class QuantizationEntry:
    """`models.<role>.quantization` (compiler/quantize_step.py): MatMulNBits copies of the model's graphs."""

    graphs: Mapping[str, GraphVariant]
    method: str | None = None
    type: str | None = None
    bits: int | None = None
    block_size: int | None = None
    symmetric: bool | None = None
    accuracy_level: int | None = None
    min_rows: int | None = None  # rows a target's decode call is padded to (2: level-4 batch invariance)
    batch_invariant_setting: bool | None = None
    reference_onnx: str | None = None
    quality: Any = None  # {text: {tokens, greedy_agreement, ppl_reference, ppl_quantized, ppl_ratio}}
    calibration_data: str | None = None
    verify_consistency: Any = None  # {rows, argmax_equal, max_abs_diff, draft_tokens}
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    ORDER = ("method", "type", "bits", "block_size", "symmetric", "accuracy_level", "min_rows", "batch_invariant_setting",
             "reference_onnx", "graphs", "quality", "calibration_data", "verify_consistency")
    key: str = dataclasses.field(default="quantization", compare=False, repr=False)  # for messages only

    def __post_init__(self) -> None:
        from specrt.bundle.quant_checks import check_quantization_values

        check_quantization_values(self, self.key)

    @classmethod
    def from_dict(cls, raw: Any, key: str) -> "QuantizationEntry":
        check_dict(raw, key)
        known = {k: raw[k] for k in cls.ORDER if k in raw and k != "graphs"}
        return cls(graphs=graph_variants(raw.get("graphs") or {}, f"{key}.graphs"), **known,
                   extra=unknown_keys(raw, cls.ORDER), key=key)

    def to_dict(self) -> dict[str, Any]:
        return emit([(k, getattr(self, k)) for k in self.ORDER], keep_null=("calibration_data",), extra=self.extra)


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """`models.<role>`: one decoder of the bundle. `role` is the key it is stored under (not written)."""

    role: str
    onnx: str  # the portable fp32 graph (TensorRT, torch reference)
    decoder_config: DecoderConfig
    architecture: str | None = None
    config: str | None = None  # the copied config.json
    vocab_size: int | None = None
    eos_token_ids: tuple[int, ...] | None = None
    bos_token_id: int | None = None
    num_parameters: int | None = None
    onnx_data: str | None = None
    dtype: str | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    profiles: Any = None  # {phase: {input: {"min", "opt", "max": shape}}} (profiles.py)
    validation: Any = None  # ONNX-vs-PyTorch statistics (compiler/validate.py)
    source: Any = None  # {"format": "hf"} or the GGUF file it came from
    graphs: Mapping[str, GraphVariant] | None = None  # None: written before graph variants existed
    fused_skipped: str | None = None  # why there is no fused variant
    self_draft: bool = False  # the draft is the target's graph, quantized (--draft self:int4)
    quantization: QuantizationEntry | None = None
    omitted: tuple[str, ...] = ()  # graph kinds left out of a lean bundle (OMITTABLE)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    ORDER = ("architecture", "config", "decoder_config", "vocab_size", "eos_token_ids", "bos_token_id",
             "num_parameters", "onnx", "onnx_data", "dtype", "inputs", "outputs", "profiles", "validation",
             "source", "graphs", "fused_skipped", "self_draft", "quantization", "omitted")

    def __post_init__(self) -> None:
        key = f"models.{self.role}"
        check_str(self.onnx, f"{key}.onnx")
        if not isinstance(self.decoder_config, DecoderConfig):
            raise ManifestError(f"manifest key {key}.decoder_config must be a decoder config, got "
                                f"{type(self.decoder_config).__name__}")
        for name in CONFIG_SIZES:
            check_int(getattr(self.decoder_config, name), f"{key}.decoder_config.{name}", 1, 1 << 24)
        if self.vocab_size is not None and self.vocab_size != self.decoder_config.vocab_size:
            raise ManifestError(f"manifest key {key}.vocab_size {self.vocab_size!r} disagrees with "
                                f"{key}.decoder_config.vocab_size {self.decoder_config.vocab_size}")
        for name in ("onnx_data", "config"):
            check_optional_str(getattr(self, name), f"{key}.{name}")
        if self.eos_token_ids is not None:
            check_ids(self.eos_token_ids, f"{key}.eos_token_ids")
        for kind in check_list(self.omitted, f"{key}.omitted"):
            if kind not in OMITTABLE:
                raise ManifestError(f"manifest key {key}.omitted holds {kind!r}, not one of {', '.join(OMITTABLE)}")

    @classmethod
    def from_dict(cls, role: str, raw: Any) -> "ModelEntry":
        key = f"models.{role}"
        check_dict(raw, key)
        check_str(raw.get("onnx"), f"{key}.onnx")
        check_dict(raw.get("decoder_config"), f"{key}.decoder_config")
        if raw.get("profiles") is not None:
            check_dict(raw["profiles"], f"{key}.profiles")
        simple = {k: raw[k] for k in cls.ORDER if k in raw and k not in
                  ("decoder_config", "eos_token_ids", "inputs", "outputs", "graphs", "quantization", "self_draft",
                   "omitted")}
        eos = raw.get("eos_token_ids")
        quant = raw.get("quantization")
        return cls(role=role, decoder_config=parse_decoder_config(raw, key), **simple,
                   eos_token_ids=None if eos is None else check_ids(eos, f"{key}.eos_token_ids"),
                   inputs=tensor_specs(raw.get("inputs"), f"{key}.inputs"),
                   outputs=tensor_specs(raw.get("outputs"), f"{key}.outputs"),
                   graphs=None if raw.get("graphs") is None else graph_variants(raw["graphs"], f"{key}.graphs"),
                   self_draft=bool(raw.get("self_draft", False)),
                   quantization=QuantizationEntry.from_dict(quant, f"{key}.quantization") if quant else None,
                   omitted=tuple(check_list(raw.get("omitted", []), f"{key}.omitted")),
                   extra=unknown_keys(raw, cls.ORDER))

    def to_dict(self) -> dict[str, Any]:
        values = {k: getattr(self, k) for k in self.ORDER}
        values["decoder_config"] = self.decoder_config.to_dict()
        values["self_draft"] = True if self.self_draft else None
        values["omitted"] = list(self.omitted) or None
        return emit(values.items(), keep_null=("bos_token_id",), extra=self.extra)

    # ------------------------------------------------------------------------------------- graphs
    def graph(self, variant: str) -> GraphVariant | None:
        """The `variant` graph (None when absent); a bundle without variants has its `onnx` as the portable one."""
        if self.graphs is None:
            return GraphVariant(self.onnx, self.onnx_data) if variant == PORTABLE else None
        return self.graphs.get(variant)

    def require(self, kind: str, needed_by: str) -> None:
        """Raise BundleError (one line, naming the compile option) when the graph `kind` was left out."""
        if kind in self.omitted:
            what = kind.replace("quantized.", "quantized ") if kind.startswith("quantized.") else f"fp32 {kind}"
            raise BundleError(f"{needed_by} needs the {what} graph of models.{self.role}, which this lean bundle "
                              f"left out: recompile with {OMITTABLE[kind]}")

    def ort_kind(self, backend: str) -> str:
        """The graph kind ONNX Runtime opens for `backend` ("ort": the fused graph when there is one)."""
        quantized = "quantized." if self.quantization is not None else ""
        if backend == "ort" and self.ort_fused_onnx is not None:
            return quantized + FUSED
        return quantized + PORTABLE

    def quantized_onnx(self, variant: str = PORTABLE) -> str | None:
        """Relative path of the quantized `variant` graph, or None when the model is not quantized."""
        graph = self.quantization.graphs.get(variant) if self.quantization is not None else None
        return graph.onnx if graph is not None else None

    @property
    def ort_onnx(self) -> str:
        """The portable graph ONNX Runtime loads: the quantized one when there is one."""
        return self.quantized_onnx() or self.onnx

    @property
    def ort_fused_onnx(self) -> str | None:
        """The fused graph ONNX Runtime's CPU runner loads, or None when it must run the portable graph: a
        quantized model without a quantized fused graph (bundles written before the fused graph was quantized)
        runs its quantized portable graph rather than the unquantized fused one."""
        if self.quantization is not None:
            return self.quantized_onnx(FUSED)
        fused = self.graph(FUSED)
        return fused.onnx if fused is not None else None

    @property
    def ort_min_rows(self) -> int:
        """Rows per call ONNX Runtime's CPU runners pad this model's one-token calls to (`quantization.min_rows`):
        2 for a model quantized at accuracy level 4 compiled batch-invariant, else 1."""
        q = self.quantization
        return int(q.min_rows) if q is not None and q.min_rows is not None else 1


def parse_decoder_config(raw: Mapping[str, Any], key: str) -> DecoderConfig:
    """The entry's `decoder_config` as a DecoderConfig; a malformed one is a ManifestError naming the key."""
    try:
        return decoder_config(raw)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ManifestError(f"manifest key {key}.decoder_config is malformed ({type(exc).__name__}: {exc}); "
                            "recompile the bundle") from None
    except BundleError:
        raise
    except Exception as exc:  # CheckpointError from DecoderConfig's own checks
        raise ManifestError(f"manifest key {key}.decoder_config: {exc}") from None
