"""What compiling needs beyond the runtime: the `compile` extra (torch for the export, onnxscript for the graph
cleanup, safetensors for checkpoints). The runtime (load, generate, inspect, serve, bench) needs none of it.

    require_compile_extra()   # MissingDependency (exit 2, one line naming the extra) when a module is missing
"""

from __future__ import annotations

import importlib.util

from specrt.core.errors import MissingDependency

COMPILE_MODULES = ("torch", "onnxscript", "safetensors")
COMPILE_HINT = 'compiling needs the `compile` extra: pip install "specrt[compile]"'


def missing_compile_modules() -> list[str]:
    return [m for m in COMPILE_MODULES if importlib.util.find_spec(m) is None]


def require_compile_extra() -> None:
    missing = missing_compile_modules()
    if missing:
        raise MissingDependency(f"{COMPILE_HINT} (missing: {', '.join(missing)}); running a compiled bundle "
                                "needs only specrt[cpu]")
