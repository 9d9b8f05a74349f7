"""onnxruntime and onnxruntime-gpu installed together is refused in one line; it is read from the dist-info
folders beside the imported package (no importlib.metadata on the cold-start path)."""

from __future__ import annotations

import types

import pytest

from specrt.core.errors import BackendUnavailable
from specrt.runtime.backends.ort.environment import check_single_ort_distribution


def fake_ort(tmp_path, *dists):
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("")
    for d in dists:
        (tmp_path / d).mkdir()
    return types.SimpleNamespace(__file__=str(tmp_path / "onnxruntime" / "__init__.py"))


def test_both_distributions_are_refused(tmp_path):
    ort = fake_ort(tmp_path, "onnxruntime-1.32.0.dist-info", "onnxruntime_gpu-1.32.0.dist-info")
    with pytest.raises(BackendUnavailable, match="both onnxruntime and onnxruntime-gpu"):
        check_single_ort_distribution(ort)


@pytest.mark.parametrize("dist", ["onnxruntime-1.32.0.dist-info", "onnxruntime_gpu-1.32.0.dist-info"])
def test_one_distribution_is_fine(tmp_path, dist):
    check_single_ort_distribution(fake_ort(tmp_path, dist, "onnxruntime_genai-0.18.0.dist-info"))


def test_the_installed_one_is_fine():
    import onnxruntime

    check_single_ort_distribution(onnxruntime)
