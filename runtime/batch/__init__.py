"""Continuous batching: a KV slot pool on one session (`pool.py`), per-request state (`sequence.py`), the per-step
choice of k by goodput (`goodput.py`), the scheduler (`scheduler.py`) and a threaded engine (`engine.py`)."""
