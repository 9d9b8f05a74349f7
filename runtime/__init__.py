"""specrt.runtime: load a compiled bundle and decode speculatively.

Module map: generator.py (load / Generator API), loop.py (the orchestrator), acceptance.py (the
rejection sampler), sampling.py (warping), proposers/ (draft model, n-gram, Medusa), controller.py and
adaptive.py (speculation length), kv_cache.py, backends/ (ort, torch, trt runners), stats.py.
"""

from .generator import GenerationResult, Generator, load
from .sampling import SamplingParams
from .stats import GenerationStats

__all__ = ["GenerationResult", "GenerationStats", "Generator", "SamplingParams", "load"]
