"""GPU runners on a machine without TensorRT / onnxruntime-gpu / CUDA: clear BackendUnavailable messages."""

from __future__ import annotations

import importlib.util
import types

import pytest

from specrt.core.errors import BackendUnavailable
from specrt.runtime.backends.ort.gpu_runner import check_gpu_provider, trt_ep_profile_options

no_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed")


@pytest.fixture(scope="module")
def manifest(pair_bundle):
    from specrt.bundle.manifest import read_manifest

    return read_manifest(pair_bundle, verify_checksums=False)


@no_tensorrt
def test_trt_backend_without_tensorrt(manifest):
    from specrt.runtime.backends import create_runner
    from specrt.runtime.backends.trt.runner import trt_unavailable_reason

    assert "TensorRT is not installed" in trt_unavailable_reason(manifest)
    with pytest.raises(BackendUnavailable, match=r"TensorRT is not installed.*pip install 'specrt\[gpu\]'"):
        create_runner(manifest, "target", "trt", capacity=128, max_short_tokens=10)


def test_ort_cuda_without_the_gpu_provider(manifest):
    import onnxruntime as ort

    from specrt.runtime.backends import create_runner

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here")
    for backend, provider in (("ort-cuda", "CUDAExecutionProvider"), ("ort-trt", "TensorrtExecutionProvider")):
        with pytest.raises(BackendUnavailable, match=rf"{provider}.*offers only .*CPUExecutionProvider.*specrt\[gpu\]"):
            create_runner(manifest, "draft", backend, capacity=128, max_short_tokens=10, device="cuda:1")


def test_check_gpu_provider_with_a_fake_ort():
    fake = types.SimpleNamespace(__version__="1.22.0", get_available_providers=lambda: [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    assert check_gpu_provider(fake, "trt") == "TensorrtExecutionProvider"
    with pytest.raises(BackendUnavailable, match="'cuda' or 'trt'"):
        check_gpu_provider(fake, "rocm")


def test_trt_ep_profile_covers_prefill_decode_verify():
    c = types.SimpleNamespace(num_layers=1, num_kv_heads=2, head_dim=16)
    opts = trt_ep_profile_options(c, capacity=128)
    assert opts["trt_profile_min_shapes"] == "input_ids:1x1,position_ids:1x1,past_key.0:1x0x2x16,past_value.0:1x0x2x16"
    assert opts["trt_profile_max_shapes"].startswith("input_ids:1x128,position_ids:1x128,past_key.0:1x127x2x16")
