"""The PyTorch backend on an NVIDIA GPU (`--backend torch --target-device cuda:0`), and draft and target on
different devices. Skipped, with the reason, where PyTorch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU visible to PyTorch (torch.cuda.is_available() is False here)",
                allow_module_level=True)

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def _runner(bundle, role, backend, device=None):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends import create_runner

    return create_runner(read_manifest(bundle), role, backend, capacity=128, max_short_tokens=10, device=device)


def test_torch_runner_on_cuda_follows_onnx_runtime_on_the_cpu(pair_bundle):
    """Prefill, single-token decode, a multi-token verify pass and a rollback: the CUDA runner's logits follow ONNX
    Runtime's on the CPU (fp32; CUDA matmuls may use TF32, hence the tolerance) with the same argmax."""
    gpu, cpu = _runner(pair_bundle, "target", "torch", "cuda:0"), _runner(pair_bundle, "target", "ort")
    assert gpu.describe()["device"] == "cuda:0"
    rng = np.random.default_rng(0)
    ids = rng.integers(0, gpu.vocab_size, 40).astype(np.int64)
    worst, agree, rows = 0.0, 0, 0
    for r in (gpu, cpu):
        r.reset()
    calls = [ids[:24], ids[24:25], ids[25:31]]
    for step, chunk in enumerate(calls):
        got, want = gpu.forward(chunk).copy(), cpu.forward(chunk).copy()
        worst = max(worst, float(np.abs(got - want).max()))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        rows += got.shape[0]
        if step == 1:  # roll back the decode token and verify from there
            for r in (gpu, cpu):
                r.truncate(r.length - 1)
    assert worst <= 1e-2 and agree == rows, (worst, agree, rows)


@pytest.mark.parametrize("devices", [("cuda:0", "cuda:0"), ("cuda:0", "cpu"), ("cpu", "cuda:0")])
def test_greedy_speculation_on_cuda_equals_plain(self_bundle, devices):
    """Target and draft on the GPU, or split between GPU and CPU: speculative output equals plain decoding on the
    same placement, and every draft of a self-draft is accepted."""
    from specrt.runtime import load

    target_device, draft_device = devices
    gen = load(self_bundle, backend="torch", target_device=target_device, draft_device=draft_device)
    assert gen.target.describe()["device"] == target_device and gen.draft.describe()["device"] == draft_device
    plain = gen.generate(PROMPT, 32, method="none")
    for method in ("draft", "hybrid", "ngram"):
        spec = gen.generate(PROMPT, 32, method=method, num_speculative_tokens=4)
        assert spec.token_ids == plain.token_ids, method
    full = gen.generate(PROMPT, 32, method="draft", num_speculative_tokens=4)
    assert full.stats.accepted_tokens == full.stats.drafted_tokens > 0
