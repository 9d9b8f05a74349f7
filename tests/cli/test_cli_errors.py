"""Exit codes and one-line messages (issue 10 #17): bad input exits 2, never a bare exception name."""

import subprocess

import numpy as np
import pytest
from helpers import run_cli

from specrt.core.errors import BackendError, InvalidArgument


def specrt(*args):
    """In-process (tests/helpers.py run_cli); stdout and stderr as bytes, as a subprocess gives them."""
    proc = run_cli(*args)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.encode("utf-8", "backslashreplace"),
                                       proc.stderr.encode("utf-8", "backslashreplace"))


@pytest.mark.parametrize("extra, words", [
    ([b"--seed", b"-1"], b"seed"),
    ([b"--seed", b"18446744073709551616"], b"seed"),
    ([b"--temperature", b"5e-324"], b"temperature"),
    ([b"--prompt", b"caf\xe9 \xff"], b"Unicode"),
])
def test_bad_generate_input_exits_2_with_one_line(pair_bundle, extra, words):
    prompt = [] if b"--prompt" in extra else [b"--prompt", b"hi"]  # an option given twice is its own error
    args = [b"generate", str(pair_bundle).encode(), *prompt, b"--max-new-tokens", b"2", b"--temperature",
            b"1", *extra]
    proc = specrt(*args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and b"Traceback" not in proc.stderr
    assert words in proc.stderr


@pytest.mark.parametrize("prompt", [b"import os", bytearray(b"import os"), ["1", "2"], [1.5, 2]])
def test_python_api_refuses_bytes_and_non_integer_ids(pair_generator, prompt):
    with pytest.raises(InvalidArgument, match="bytes|integers"):
        pair_generator.generate(prompt, 2)


def test_python_api_refuses_lone_surrogates(pair_generator):
    with pytest.raises(InvalidArgument, match="not valid Unicode"):
        pair_generator.generate("abc\ud800def", 2)


def test_ort_failures_are_summarised_in_one_line(pair_generator):
    from specrt.runtime.backends.ort.runner import OrtRunner

    target = pair_generator.target
    onnx_path = pair_generator.manifest.path(pair_generator.manifest.models["target"].onnx)  # the portable graph
    wrong = target.config.__class__(**{**target.config.__dict__, "head_dim": target.config.head_dim * 2})
    runner = OrtRunner(onnx_path, wrong, capacity=16, max_short_tokens=4, threads=1)
    with pytest.raises(BackendError) as info:
        runner.forward(np.array([1, 2], dtype=np.int64))
    message = str(info.value)
    assert "\n" not in message and str(onnx_path) in message and len(message) < 600
