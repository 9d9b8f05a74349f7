"""specrt.runtime.backends.ort -- ONNX Runtime runners: `runner.py` (CPU provider, the embedded default)
and `gpu_runner.py` (CUDA / TensorRT providers of onnxruntime-gpu)."""
