"""`specrt bench`: fair, reproducible measurements of speculative decoding on a compiled bundle.

    from specrt.bench import BenchSettings, run_bench
    result = run_bench(BenchSettings("artifacts/demo", ks=(2, 4, "auto")))

Modules: suites (workloads), measure (timed runs, verify-cost curve, memory, machine), predict (the
formulas, pure functions), aggregate (rows per configuration and suite), peer_hf (transformers on the same
checkpoints), random_target (a random Llama of a given size), report (table, Markdown), plot (PNG).
"""

from specrt.bench.runner import BenchSettings, run_bench

__all__ = ["BenchSettings", "run_bench"]
