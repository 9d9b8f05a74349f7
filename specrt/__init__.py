"""specrt: speculative decoding for LLM inference, compiled ahead of time.

Sub-packages:
  specrt.compiler  -- Hugging Face checkpoint -> ONNX (-> TensorRT) bundle
  specrt.runtime   -- load a bundle and decode speculatively (ONNX Runtime, PyTorch, TensorRT)
  specrt.models    -- the PyTorch decoder definitions that are exported and used as reference
  specrt.recipes   -- training recipes (demo pair, draft distillation, Medusa heads)
"""

__version__ = "0.1.0"
BUNDLE_FORMAT_VERSION = 1
