"""specrt.compiler: Hugging Face checkpoints -> ONNX bundle (-> TensorRT engines).

Small steps named by input and output: `onnx_from_decoder` (export.py), `validate_onnx` (validate.py),
`profiles_for_model` (profiles.py), `compile_bundle` (pipeline.py) which chains them.
"""

from specrt.compiler.pipeline import compile_bundle

__all__ = ["compile_bundle"]
