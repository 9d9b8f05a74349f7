"""The tokenizer loads while ONNX Runtime initializes the target's session (runtime/backends/ort/overlap.py)."""

import shutil
import sys
import threading
import time

import pytest

from specrt.core.errors import BundleError
from specrt.runtime.backends.ort import overlap


def test_other_work_starts_once_the_session_thread_is_inside_the_gil_free_call(monkeypatch):
    """`time.sleep` stands in for `initialize_session` (both are C calls that release the GIL): the other work
    runs while the thread sleeps, so the two overlap."""
    monkeypatch.setattr(overlap, "GIL_FREE_CALL", "sleep")
    marks = {}

    def session_work():
        marks["session_start"] = time.perf_counter()
        time.sleep(0.4)
        marks["session_end"] = time.perf_counter()
        return "session"

    def other_work():
        marks["other_start"] = time.perf_counter()
        return "other"

    t0 = time.perf_counter()
    assert overlap.alongside(session_work, other_work) == ("session", "other")
    assert marks["session_start"] < marks["other_start"] < marks["session_end"]
    assert time.perf_counter() - t0 < 0.8


def test_without_the_call_the_two_run_one_after_the_other(monkeypatch):
    monkeypatch.setattr(overlap, "GIL_FREE_CALL", "no_such_call")
    order = []
    assert overlap.alongside(lambda: order.append("session") or 1, lambda: order.append("other") or 2) == (1, 2)
    assert order == ["session", "other"]


def test_errors_reach_the_caller_the_other_works_first():
    def broken_session():
        raise ValueError("session failed")

    def broken_other():
        raise KeyError("other failed")

    with pytest.raises(ValueError, match="session failed"):
        overlap.alongside(broken_session, lambda: 2)
    with pytest.raises(KeyError, match="other failed"):
        overlap.alongside(lambda: 1, broken_other)
    with pytest.raises(KeyError, match="other failed"):
        overlap.alongside(broken_session, broken_other)
    assert sys.getprofile() is None
    assert not [t for t in threading.enumerate() if t.name == "specrt-session-load"]


def test_the_hook_sees_onnx_runtimes_initialize_session(pair_bundle):
    """On the installed onnxruntime, the other work starts while the session's thread is inside
    `initialize_session` (not after the session is done): the call keeps the name the hook looks for."""
    import onnxruntime as ort

    seen = {}

    def session_work():
        seen["thread"] = threading.get_ident()
        return ort.InferenceSession(str(pair_bundle / "target" / "model.onnx"), providers=["CPUExecutionProvider"])

    def other_work():
        frame = sys._current_frames()[seen["thread"]]
        seen["function"] = frame.f_code.co_name
        return True

    session, _ = overlap.alongside(session_work, other_work)
    assert session.get_inputs()
    assert seen["function"] == "_create_inference_session"


def test_a_broken_tokenizer_still_fails_the_load_with_its_message(pair_bundle, tmp_path):
    from specrt.runtime import load

    bundle = tmp_path / "bundle"
    shutil.copytree(pair_bundle, bundle)
    tok = bundle / "tokenizer" / "tokenizer.json"
    tok.write_bytes(b"{" * tok.stat().st_size)  # same size: the manifest's size check passes
    with pytest.raises(BundleError, match="cannot read tokenizer"):
        load(bundle, verify_checksums=False, warmup=False)
