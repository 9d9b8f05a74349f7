"""specrt.runtime: load a compiled bundle and decode speculatively.

Module map: generator.py (load / Generator API), request.py (GenerationRequest: the one typed request), prepared.py
(PreparedRequest: a call resolved once), loop.py (the orchestrator), acceptance.py (the
rejection sampler), sampling.py (warping), proposers/ (draft model, n-gram, Medusa), constraint.py +
constrained.py (structured output: JSON schema / regex / grammar masks, forced tokens), policy.py
(speculation length: FixedK, AdaptiveK), kv_cache.py, backends/ (ort/, pytorch/, trt/ runners), stats.py.
Layer: above specrt.bundle and specrt.core; never imports specrt.compiler or specrt.recipes.
"""

from specrt.runtime.backends.ort.threads import share_thread_pool
from specrt.runtime.constraint import ConstraintError, ConstraintSpec
from specrt.runtime.generator import GenerationResult, Generator, load
from specrt.runtime.open import open_batch_runner
from specrt.runtime.prepared import PreparedRequest
from specrt.runtime.request import GenerationRequest
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats

__all__ = ["ConstraintError", "ConstraintSpec", "GenerationRequest", "GenerationResult", "GenerationStats", "Generator",
           "PreparedRequest", "SamplingParams", "load", "open_batch_runner", "share_thread_pool"]
