"""specrt.compiler.trt: ONNX bundle -> TensorRT engines, and everything about them that needs no GPU.

    precision.py  fp32 ONNX graph -> fp16 / bf16 ONNX graph (TensorRT 11 is strongly typed)   CPU
    ptq.py        fp32 ONNX graph -> int8 / fp8 / int4 Q/DQ graph (NVIDIA Model Optimizer) + quality   CPU
    support.py    is an ONNX graph within what TensorRT's ONNX parser supports?              CPU
    memory.py     memory plan per model and device, --gpu-memory-budget check, parse_size    CPU
    compat.py     engine facts in the manifest vs the installed TensorRT / GPU              CPU
    build.py      network_from_onnx -> config_for_profiles -> engine_from_network -> save   TensorRT
    cli.py        `specrt compile --engines trt ...` options and the compile step          both

TensorRT is import-optional: nothing here imports it at module level; `specrt.core.trt.import_trt()` is
the one place that does. Run-time pieces (engine compatibility checks, deserialisation) live beside the
TensorRT runner in `specrt.runtime.backends.trt`.
"""
