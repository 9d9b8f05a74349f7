"""ONNX Runtime's process-wide thread pool (runtime/backends/ort/threads.py): off unless asked for; once on, every
session specrt creates uses it (the target, a draft, the packed pass), the scheduler picks its family of passes
step by step, and a request's greedy output under batching still equals its output alone. The shared pool is a
property of the whole process, so the checks that turn it on run in a process of their own."""

import json
import os
import subprocess
import sys

from specrt.runtime.backends.ort import threads

CHILD = r"""
import json, sys
from specrt.runtime import load, share_thread_pool
from specrt.runtime.batch.engine import BatchEngine

assert share_thread_pool()
gen = load(sys.argv[1], backend="ort")
prompts = ["hello world", "def f(x): return x + 1\ndef g(x): return", "a b a b a b a b a b", "the quick brown fox"]
alone = [gen.generate(p, max_new_tokens=16, method="draft", temperature=0).token_ids for p in prompts]
engine = BatchEngine(gen, max_batch=4)
batched = [r.token_ids for r in engine.generate_batch(prompts, max_new_tokens=16, method="draft", temperature=0)]
sessions = [gen.target.session, gen.draft.session, engine.scheduler.targets.packed().session]
print(json.dumps({"alone": alone, "batched": batched, "switch_free": engine.scheduler.chooser.switch_free,
                  "per_session": [s.get_session_options().use_per_session_threads for s in sessions]}))
engine.close()
"""


def _child(bundle, env_value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECRT_SHARED_POOL": env_value}
    return subprocess.run([sys.executable, "-c", CHILD, str(bundle)], capture_output=True, text=True, env=env,
                          timeout=600)


def test_off_in_this_process_when_disabled():
    # tests/conftest.py sets SPECRT_SHARED_POOL=0: the in-process servers keep per-session pools
    assert threads.share_thread_pool() is False
    assert threads.shared_pool() is None


def test_shared_pool_runs_every_session_and_keeps_outputs(pair_bundle):
    proc = _child(pair_bundle, "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["per_session"] == [False, False, False]  # target, draft and packed pass on the one pool
    assert out["switch_free"] is True
    assert out["batched"] == out["alone"]


def test_disabled_by_environment_in_a_fresh_process(pair_bundle):
    proc = _child(pair_bundle, "0")
    assert proc.returncode != 0 and "AssertionError" in proc.stderr  # share_thread_pool() said no


def test_a_batching_server_turns_it_on(pair_bundle):
    # what `specrt serve --max-batch N` runs: the engine's sessions on the process's one pool
    code = ("import sys; from specrt.serve.batching import batched_engine; "
            "from specrt.runtime.backends.ort.threads import shared_pool; "
            "gen, engine = batched_engine(sys.argv[1], 2, 'ort'); "
            "print(shared_pool(), engine.scheduler.chooser.switch_free); engine.close()")
    env = {**os.environ, "SPECRT_SHARED_POOL": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(pair_bundle)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    size, switch_free = proc.stdout.split()[-2:]
    assert int(size) >= 1 and switch_free == "True"
