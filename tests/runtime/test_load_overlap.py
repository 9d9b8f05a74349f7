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
    starts once the session's thread made that call (not at an earlier release of the GIL), and runs while the
    session's work is still going (the session waits for it: were the two run one after the other, that wait would
    end unmet after 10 s). Before: a 0.4 s sleep and the total bound to 0.8 s, which a loaded machine could exceed."""
    monkeypatch.setattr(overlap, "GIL_FREE_CALL", "sleep")
    order, other_ran = [], threading.Event()

    def session_work():
        order.append("session start")
        threading.Event().wait(0.1)  # the GIL released by another call: the other work may not start yet
        order.append("call")
        time.sleep(0)  # the GIL-free call
        met = other_ran.wait(10)
        order.append("session end")
        return met

    def other_work():
        order.append("other")
        other_ran.set()
        return "other"

    assert overlap.alongside(session_work, other_work) == (True, "other")
    assert order == ["session start", "call", "other", "session end"]


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
