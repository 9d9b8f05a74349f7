"""specrt.compiler: Hugging Face checkpoints -> ONNX bundle (-> TensorRT engines).

Small steps named by input and output: `onnx_from_decoder` (export.py), `validate_onnx` (validate.py),
`profiles_for_model` (profiles.py), `compile_bundle(spec)` (pipeline.py) which chains them; `CompileSpec`
(spec.py, with `QuantizeSpec`, `EngineSpec`) says what to compile.

Importing the package imports no torch (the CLI reads its option modules on every start); `compile_bundle`
loads the pipeline, and with it torch, on first use.
"""

from typing import Any

from specrt.compiler.spec import CompileSpec, EngineSpec, QuantizeSpec

__all__ = ["CompileSpec", "EngineSpec", "QuantizeSpec", "compile_bundle"]


def __getattr__(name: str) -> Any:
    if name == "compile_bundle":
        from specrt.compiler.requirements import require_compile_extra

        require_compile_extra()  # one line naming the extra instead of a ModuleNotFoundError for torch
        from specrt.compiler.pipeline import compile_bundle

        return compile_bundle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
