"""The TensorRT compile options: `specrt compile`'s option dict (keys: OPTION_NAMES) -> a validated `BuildOptions`.

Read by the engine builder (build.py), the compile steps (compile_steps.py), the compile spec (compiler/spec.py) and
the click options (specrt/cli/trt_options.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specrt.core.errors import InvalidArgument
from specrt.compiler.trt.memory import DEFAULT_WORKSPACE
from specrt.compiler.trt.precision import PRECISIONS
from specrt.compiler.trt.ptq import PTQ_PRECISIONS

# the keys of `trt_options` (specrt/cli/trt_options.py defines one option per key)
OPTION_NAMES = ("engines", "precision", "ptq_method", "hardware_compat", "version_compatible", "workspace",
                "builder_optimization_level", "timing_cache", "gpu_memory_budget", "max_batch")
MAX_ENGINE_BATCH = 256  # --max-batch's upper bound
MAX_BATCH_NEEDS_TRT = ("--max-batch is the batch range of TensorRT engines (add --engines trt); ONNX Runtime bundles "
                       "batch at run time (specrt serve --max-batch)")
HW_COMPAT = {"none": "NONE", "ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    precision: str = "fp32"
    hardware_compat: str = "none"  # manifest spelling: none | ampere_plus | same_compute_capability
    version_compatible: bool = False
    workspace: int = DEFAULT_WORKSPACE  # bytes, MemoryPoolType.WORKSPACE limit
    builder_optimization_level: int | None = None  # 0..5, TensorRT's default (3) when None
    timing_cache: Path | None = None
    max_batch: int = 1  # sequences per pass the profiles take (1: the batch-1 profiles of every bundle)

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch, int) or not 1 <= self.max_batch <= MAX_ENGINE_BATCH:
            raise InvalidArgument(f"--max-batch must be in 1..{MAX_ENGINE_BATCH}, got {self.max_batch!r}")
        if self.precision not in PRECISIONS + PTQ_PRECISIONS:
            raise InvalidArgument(f"--precision {self.precision!r}: choose one of "
                                  f"{', '.join(PRECISIONS + PTQ_PRECISIONS)}")
        if self.hardware_compat not in HW_COMPAT:
            raise InvalidArgument(f"--hardware-compat {self.hardware_compat!r}: choose none, ampere-plus or "
                                  "same-compute-capability")
        if self.workspace <= 0:
            raise InvalidArgument(f"--workspace must be positive, got {self.workspace} bytes")
        if self.builder_optimization_level is not None and not 0 <= self.builder_optimization_level <= 5:
            raise InvalidArgument(f"--builder-optimization-level must be in 0..5, got {self.builder_optimization_level}")


def build_options(options: dict[str, Any], bundle: Path | None = None) -> BuildOptions:
    """CLI option dict -> BuildOptions (validated). The timing cache defaults to <bundle>.timing-cache."""
    cache = options.get("timing_cache")
    if cache is None and bundle is not None:
        bundle = Path(bundle)
        cache = bundle.with_name(bundle.name + ".timing-cache")
    return BuildOptions(
        precision=options.get("precision") or "fp32",
        hardware_compat=(options.get("hardware_compat") or "none").replace("-", "_"),
        version_compatible=bool(options.get("version_compatible")),
        workspace=options.get("workspace") or DEFAULT_WORKSPACE,
        builder_optimization_level=options.get("builder_optimization_level"),
        timing_cache=Path(cache) if cache is not None else None,
        max_batch=options.get("max_batch") or 1,
    )
