"""specrt.core -- the shared base layer: errors, tokenizer, optional TensorRT import.

Imported by every other layer (bundle, compiler, runtime, front ends); imports none of them.
"""
