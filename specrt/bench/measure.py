"""Timed runs and micro-measurements on a loaded `Generator`.

`run_once` generates through `Generator.stream_tokens`, recording per-step (k, drafted, accepted) with
the generator's step observer (the per-token acceptance estimate needs them). `verify_curve` times the target's verify pass over k + 1 tokens at a fixed
past length. `memory` reads peak RSS (and CUDA memory where torch sees a GPU).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np

from specrt.bench.method_label import request_options
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.stats import GenerationStats


@dataclasses.dataclass
class Run:
    token_ids: list[int]  # new tokens
    stats: GenerationStats
    steps: list[tuple[int, int, int]]  # per step: (k, drafted, accepted); empty for plain runs


# Runtimes with their own thread pools (ONNX Runtime sessions, onnxruntime-genai's, llama.cpp's, torch's OpenMP)
# keep their worker threads spin-waiting for 10-50 ms after a run. Measured here (2 cores, demo pair, plain
# decoding): our run started right after an onnxruntime-genai run went 596 -> 431 tok/s and theirs after ours
# 638 -> 505, with 10 ms between them 467 / 516, with 50 ms or more 595 / 661. Every switch between engines
# (ours -> a peer, a peer -> ours, a peer's plain model -> its speculative one) waits this long, untimed.
SETTLE_S = 0.1


def settle() -> None:
    """Let the engine that ran last stop spinning before another one is timed (SETTLE_S)."""
    time.sleep(SETTLE_S)


def run_once(gen, prompt_ids: np.ndarray, max_new_tokens: int, method: str, k: int | str,
             params: SamplingParams, proposer=None) -> Run:
    """One generation through `Generator.stream_tokens` (the users' code path, with the generator's lock).
    method "none" = plain, or a label auto[SOURCES] (method_label.py); `proposer` overrides the method's own
    (e.g. replay)."""
    steps: list[tuple[int, int, int]] = []
    ids: list[int] = []
    stats = None
    options = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed,
                   on_step=lambda *step: steps.append(step))
    if method == "none":
        options.update(method="none")
    elif proposer is not None:
        options.update(proposer=proposer, num_speculative_tokens=k)
    else:  # a method or a label auto[SOURCES] (method_label.py)
        options.update(request_options(method), num_speculative_tokens=k)
    for chunk, stats in gen.stream_tokens(prompt_ids, max_new_tokens, **options):
        ids.extend(chunk)
    return Run(ids, stats, steps)


def verify_curve(target, past_len: int, ks: Sequence[int], reps: int = 7, vocab: int | None = None) -> dict[str, Any]:
    """Median seconds of a verify pass over k + 1 tokens after `past_len` cached positions, per k.

    Rounds go over all k in turn (k = 0, 1, ..., then again), so background load affects every k alike. Each
    timed pass follows an untimed one of the same shape, as in decoding (a fixed k repeats its verify shape;
    runners bind their buffers again only when the shape changes): timing the first pass after a shape
    change added that change's cost, ~0.25 ms on the demo pair's 1.8 ms decode step, to every V(k).
    """
    vocab = vocab or target.vocab_size
    capacity = target.capacity
    ks = sorted(set(int(k) for k in ks) | {0})
    past_len = max(1, min(past_len, capacity - max(ks) - 1))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, size=past_len + max(ks) + 1).astype(np.int64)
    target.reset()
    for start in range(0, past_len, 256):
        target.forward(ids[start:min(start + 256, past_len)])
    times: dict[int, list[float]] = {k: [] for k in ks}
    for rep in range(reps + 1):  # the first round is a warm-up
        for k in ks:
            target.truncate(past_len)
            target.forward(ids[past_len:past_len + k + 1])  # same shape as the timed pass
            target.truncate(past_len)
            t0 = time.perf_counter()
            target.forward(ids[past_len:past_len + k + 1])
            dt = time.perf_counter() - t0
            if rep:
                times[k].append(dt)
    target.reset()
    seconds = [statistics.median(times[k]) for k in ks]
    return {"past_length": past_len, "reps": reps, "k": ks, "seconds": seconds,
            "ratio": [s / seconds[0] for s in seconds]}


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def device_memory() -> dict[str, Any] | None:
    """Peak CUDA memory allocated through torch (the torch backend, the HF peer), where there is a GPU; None
    when nothing imported torch (ONNX Runtime runs: importing it here would only cost seconds)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if not torch.cuda.is_available():
        return None
    return {"device": torch.cuda.get_device_name(0),
            "max_memory_allocated_mb": torch.cuda.max_memory_allocated() / 2**20}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(gen) -> dict[str, Any]:
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    desc = gen.target.describe()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    import psutil

    return {
        "cpu": cpu_model(), "cores_available": cores, "cores_physical": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
        "python": platform.python_version(), "backend": gen.backend, "provider": desc.get("provider", gen.backend),
        "threads": desc.get("threads"), "specrt": version("specrt"),
        "onnxruntime": version("onnxruntime") or version("onnxruntime-gpu"), "torch": version("torch"),
        "transformers": version("transformers"), "gpu": (device_memory() or {}).get("device"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # torch's OpenMP threads (the HF peer)
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,  # other work on the machine
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
