"""specrt.runtime.backends.pytorch -- the PyTorch reference runner, rebuilt from the bundle's ONNX
initializers (what every other backend is compared against)."""
