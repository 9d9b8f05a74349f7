"""Without TensorRT / a GPU, the GPU tests skip with one short reason, printed once (issue 15, item 13)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_gpu_tests_skip_once_with_a_short_reason():
    here = Path(__file__).parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(here / "test_gpu.py")],
                          capture_output=True, text=True, timeout=300, cwd=here.parent.parent)
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1, proc.stdout
    assert skipped[0].count("pip install") == 1 and len(skipped[0]) < 160, skipped[0]
    assert "TensorRT is not installed" in skipped[0]
