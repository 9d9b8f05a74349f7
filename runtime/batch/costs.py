"""The scheduler's cost table, measured once per bundle graph and device, then cached.

Measured: seconds of a batched one-token pass of b = 1..max_batch sequences (best of 3 after a warm-up), of a
one-sequence pass of s tokens (on the pool itself: a region runner, or the batch runner's passes), of
one drafted token, and of a packed
pass (runtime/batch/packed.py) over a small grid of sequences x rows each (interpolated by `CostTable.t_packed`). Cached as JSON
under `$SPECRT_CACHE/batch-costs/` keyed by the target graph (path, size, mtime), threads, max_batch, the ONNX
Runtime version, the CPU (model name, core count) and the packed graphs' slot counts, so a server restart skips the measurement; a changed graph,
runtime or machine measures again. SPECRT_REMEASURE=1 ignores the cache (e.g. after a run on a loaded machine).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from specrt.runtime.batch.goodput import CostTable


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


COSTS_VERSION = 2  # what is measured and how (2: rows on the pool itself); part of the cache key


def cache_key(gen, max_batch: int, pool=None) -> str:
    import onnxruntime

    from specrt.runtime.batch.packed import packed_sizes
    from specrt.runtime.batch.ragged import use_ragged
    from specrt.runtime.batch.slots import BatchRunnerPool

    if isinstance(pool, BatchRunnerPool):  # a batch runner: its backend and device, the bundle as compiled (manifest)
        manifest = Path(gen.manifest.root) / "manifest.json"
        st = manifest.stat()
        ident = [COSTS_VERSION, "slots", pool.batch.name, str(manifest.resolve()), st.st_size, st.st_mtime_ns,
                 gen.threads, str(gen.target_device), max_batch, pool.pad_limit, onnxruntime.__version__, _cpu_name(),
                 os.cpu_count()]
    else:
        target = gen.target
        st = Path(target.onnx_path).stat()
        ident = [COSTS_VERSION, str(Path(target.onnx_path).resolve()), st.st_size, st.st_mtime_ns, target.threads,
                 max_batch, onnxruntime.__version__, _cpu_name(), os.cpu_count(),
                 str(getattr(gen.draft, "onnx_path", "")) if gen.draft is not None else "",
                 "ragged" if target.min_rows > 1 and use_ragged() else packed_sizes(max_batch)]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def cache_path(gen, max_batch: int, pool=None) -> Path:
    from specrt.core.cache import cache_dir

    return cache_dir() / "batch-costs" / f"{cache_key(gen, max_batch, pool)}.json"


def measure_batch(pool, max_batch: int) -> list[float]:
    """Seconds of `pool.decode_batch` over b = 1..max_batch empty regions (best of 3 after one warm-up)."""
    runners = [pool.acquire() for _ in range(max_batch)]
    ids = np.zeros(max_batch, np.int64)
    out = []
    try:
        for b in range(1, max_batch + 1):
            best = float("inf")
            for rep in range(4):
                for r in runners[:b]:
                    r.truncate(0)
                t0 = time.perf_counter()
                pool.decode_batch(ids[:b])
                if rep:
                    best = min(best, time.perf_counter() - t0)
            out.append(best)
    finally:
        for r in reversed(runners):
            pool.release(r)
    return out


PACKED_PAST = 32  # past length of the measured packed passes (one-token and verify calls, not prefills)


def measure_rows(pool, max_rows: int) -> list[float]:
    """Seconds of a one-sequence pass of s = 1..max_rows tokens at PACKED_PAST (best of 3 after a warm-up) on the
    pool itself: a batch runner's passes, or a fused pool's region runner (its bound region views and the pool's
    session as the scheduler runs them; the Generator's load-time timings of its own runner came out 15-20%
    below a region's one-token pass on SmolLM2 fp32, so drafting looked cheaper than it was)."""
    from specrt.runtime.batch.slots import BatchRunnerPool

    past = min(PACKED_PAST, pool.capacity - max_rows)
    if isinstance(pool, BatchRunnerPool):
        runner = pool.runners[0]

        def run(ids):
            pool.run([(0, ids, past, (0, ids.size))])  # the slot's length is set to `past` by the call
    else:
        runner = pool.acquire()
        runner.forward_last(np.zeros(past, np.int64))  # the past, once (not timed)

        def run(ids):
            runner.truncate(past)  # roll back the previous pass's rows
            runner.forward(ids)
    out = []
    try:
        for s in range(1, max_rows + 1):
            ids = np.zeros(s, np.int64)
            best = float("inf")
            for rep in range(4):
                t0 = time.perf_counter()
                run(ids)
                if rep:
                    best = min(best, time.perf_counter() - t0)
            out.append(best)
    finally:
        if isinstance(pool, BatchRunnerPool):
            runner.reset()
        else:
            pool.release(runner)
    return out


def packed_grid(max_batch: int, max_rows: int) -> tuple[list[int], list[int]]:
    """(sequence counts, rows per sequence) measured for the packed pass."""
    bs = sorted({b for b in (1, 2, 4, max_batch) if b <= max_batch})
    rs = sorted({r for r in (1, 2, 4, max_rows) if r <= max(max_rows, 1)})
    return bs, rs


def measure_packed(pool, max_rows: int, min_rows: int) -> tuple[list[list[float]], list[int], list[int]]:
    """Seconds of packed passes over the grid (best of 2 after a warm-up), on regions [0, b) at PACKED_PAST, each
    call's attention padded to `min_rows` rows as the scheduler pads it."""
    packed = pool.packed()
    bs, rs = packed_grid(pool.max_batch, max_rows)
    past = min(PACKED_PAST, pool.capacity - max(max(rs), min_rows))
    for _ in range(3):  # the fused session measured just before may still spin its pool threads: let them settle
        packed.run([(0, np.zeros(rs[0], np.int64), past, (0, 1), min_rows)])
    grid = []
    for b in bs:
        line = []
        for r in rs:
            ids = np.zeros(r, np.int64)
            best = float("inf")
            for rep in range(3):
                t0 = time.perf_counter()
                packed.run([(region, ids, past, (0, r), min_rows) for region in range(b)])
                if rep:
                    best = min(best, time.perf_counter() - t0)
            line.append(best)
        grid.append(line)
    return grid, bs, rs


# What starting a BatchEngine costs: creating the packed graph's session (`import onnx` and the graph rewrite: 2.3-2.7 s
# for SmolLM2 fp32 and for the toy test bundles alike on 2 shared cores), and on first use measuring the cost table,
# in one-token target steps (SmolLM2 fp32, max_batch 2 / 8: 160 / 280 steps)
PACKED_START_S = 2.5
STARTUP_STEPS_MEASURE = 120
STARTUP_STEPS_PER_SLOT = 20


def is_cached(gen, max_batch: int, packed: bool) -> bool:
    """Whether the fused pool's cost table for this graph, device and size is cached (False for batch runners:
    their key needs the runner, created with the engine)."""
    from specrt.runtime.backends.ort.fused_runner import OrtFusedRunner

    if not isinstance(gen.target, OrtFusedRunner) or os.environ.get("SPECRT_REMEASURE") == "1":
        return False
    try:
        data = json.loads(cache_path(gen, max_batch).read_text())
        return len(data["batch"]) == max_batch and bool(data["rows"]) and bool(data.get("packed")) == packed
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def startup_seconds(gen, max_batch: int, packed: bool = True) -> float:
    """What creating a BatchEngine of `max_batch` slots costs now (see above), from the Generator's one-token step
    time (timed at load)."""
    seconds = PACKED_START_S if packed and max_batch > 1 else 0.0
    if not is_cached(gen, max_batch, packed):
        seconds += (STARTUP_STEPS_MEASURE + STARTUP_STEPS_PER_SLOT * max_batch) * step_seconds(gen)
    return seconds


def step_seconds(gen) -> float:
    """Seconds of one one-token target step (the Generator's load-time timing; timed now when it was skipped)."""
    if gen._load_costs is None:
        gen.warmup()
    return float(gen._load_costs[0][0] or 0.0)


def cost_table(gen, pool, max_batch: int, packed: bool = False) -> CostTable:
    """The cached table for this graph and device, else measured now and cached (a failed write is ignored)."""
    from specrt.runtime.batch.slots import BatchRunnerPool

    slots = isinstance(pool, BatchRunnerPool)
    path = None
    try:
        path = cache_path(gen, max_batch, pool)
        if os.environ.get("SPECRT_REMEASURE") != "1" and path.is_file():
            data = json.loads(path.read_text())
            if len(data["batch"]) == max_batch and data["rows"] and bool(data.get("packed")) == packed:
                return CostTable(**data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    batch = measure_batch(pool, max_batch)
    rows = measure_rows(pool, gen.max_draft_tokens + 1)
    if slots:  # no draft model is batched on a batch runner
        table = CostTable(batch=batch, rows=rows)
    else:
        if gen._load_costs is None:  # load(warmup=False)
            gen.warmup()
        table = CostTable(batch=batch, rows=rows, draft_token=gen._load_costs[1] or 0.0)
    if packed:
        min_rows = getattr(gen.target, "min_rows", 1)
        table.packed, table.packed_b, table.packed_r = measure_packed(pool, len(table.rows), min_rows)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(table)))
            os.replace(tmp, path)
        except OSError:
            pass
    return table

