"""How many batch slots a Generator can have: `auto_max_batch` (the default size) and `check_max_batch` (an
explicit size, refused before anything is preallocated when its KV cache cannot fit in the memory available).

Each slot preallocates one sequence's KV cache for the whole context (target, and the draft where it is batched
too), so `max_batch` x the bytes of one slot is allocated at once, when the engine starts.
"""

from __future__ import annotations

import os
from typing import Any

from specrt.core.errors import InvalidArgument
from specrt.bundle.checks import available_memory  # the one MemAvailable reader (load checks it too)

AUTO_SLOTS_PER_CORE = 4  # CPU: a batched pass of 8 rows costs ~1.5x one row on 2 cores (BENCHMARKS.md)
AUTO_MAX = 16
AUTO_KV_SHARE = 0.25  # the preallocated KV of all `auto` slots stays under this share of the machine's memory
EXPLICIT_KV_SHARE = 0.9  # an explicit size may use up to this share of the memory available now


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def kv_bytes_per_slot(gen: Any) -> int:
    """Preallocated KV bytes of one slot (target, and the draft where it is batched too); 0 where the batch cannot
    run (a fused graph without a batch dimension, a portable graph without `past_lengths`, no batch runner)."""
    from specrt.bundle.graph_io import PAST_LENGTHS
    from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
    from specrt.runtime.batch.pool import graph_has_batch_dim, kv_bytes
    from specrt.runtime.batch.slots import batch_backend

    if isinstance(gen.target, OrtFusedRunner):
        if not graph_has_batch_dim(gen.target.session):
            return 0
        return sum(kv_bytes(r.config, r.capacity) for r in (gen.target, gen.draft)
                   if isinstance(r, OrtFusedRunner))
    entry = gen.manifest.models["target"]
    portable = (entry.graphs or {}).get("portable")
    if batch_backend(gen) is None or portable is None or PAST_LENGTHS not in (portable.optional_inputs or ()):
        return 0
    return kv_bytes(entry.decoder_config, gen.max_seq_len)


def _on_gpu(gen: Any) -> bool:
    """The slots' KV lives in GPU memory (TensorRT engines, torch on CUDA), not in the host's."""
    from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
    from specrt.runtime.batch.slots import batch_backend

    if isinstance(gen.target, OrtFusedRunner):
        return False
    return batch_backend(gen) == "trt" or str(gen.target_device or "cpu").startswith("cuda")


def auto_max_batch(gen: Any) -> int:
    """The default max_batch of a loaded generator: 0 (off) where the batch cannot run (`kv_bytes_per_slot` 0,
    TensorRT engines built without `--max-batch`); TensorRT: the engines' batch range; else AUTO_SLOTS_PER_CORE per
    CPU core, at most AUTO_MAX, fewer when the slots' preallocated KV would pass AUTO_KV_SHARE of the memory."""
    from specrt.bundle.profiles import profiles_max_batch
    from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner
    from specrt.runtime.batch.slots import batch_backend

    entry = gen.manifest.models["target"]
    if not isinstance(gen.target, OrtFusedRunner) and batch_backend(gen) == "trt":
        built = profiles_max_batch(entry.profiles) if entry.profiles else 1  # --max-batch at compile; KV on the GPU
        return built if built > 1 else 0
    per_slot = kv_bytes_per_slot(gen)
    if not per_slot:
        return 0
    n = min(AUTO_MAX, AUTO_SLOTS_PER_CORE * (os.cpu_count() or 1))
    memory = physical_memory()
    if memory:
        n = min(n, int(memory * AUTO_KV_SHARE // per_slot))
    return max(n, 1)


def check_max_batch(gen: Any, max_batch: Any) -> int:
    """An explicit max_batch: an integer >= 1 whose slots' KV cache (max_batch x `kv_bytes_per_slot`) fits in
    EXPLICIT_KV_SHARE of the memory available now; else InvalidArgument with the numbers, before anything is
    allocated (an unchecked 100000 preallocated until the machine ran out of memory)."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise InvalidArgument(f"max_batch must be an integer >= 1, got {max_batch!r}")
    per_slot = 0 if _on_gpu(gen) else kv_bytes_per_slot(gen)
    available = available_memory()
    if per_slot and available and max_batch * per_slot > EXPLICIT_KV_SHARE * available:
        fit = int(EXPLICIT_KV_SHARE * available // per_slot)
        raise InvalidArgument(
            f"max_batch {max_batch} needs {max_batch} x {per_slot / 2**20:.1f} MiB = {max_batch * per_slot / 2**30:.1f} "
            f"GiB of KV cache (preallocated for the bundle's context of {gen.max_seq_len} tokens), more than the "
            f"{available / 2**30:.1f} GiB of memory available: at most {fit} slots fit ('auto' picks a size that fits)")
    return max_batch
