"""specrt.runtime.backends.trt -- the TensorRT runner and what it needs to load an engine: `compat.py`
(engine facts vs the installed TensorRT / GPU, deserialisation, failed-call checks) and `runner.py`.
TensorRT itself is imported only through `specrt.core.trt.import_trt`."""
