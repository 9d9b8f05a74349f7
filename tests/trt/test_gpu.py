"""TensorRT on a real GPU. Skipped (with the reason) unless TensorRT and an NVIDIA GPU are present.

Run them with `pytest -m gpu tests/trt` or `scripts/gpu_check.sh`. NOT yet executed on real TensorRT.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from specrt.core.trt import cuda_device_error, trt_import_error

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def missing() -> str | None:
    """What is missing, in a few words (the install advice is given once, in the skip reason)."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT is not installed"
    reason = trt_import_error() or cuda_device_error("cuda:0")
    return reason.split(" (")[0].split(": ")[0] if reason else None


pytestmark = pytest.mark.gpu
MISSING = missing()
if MISSING:  # one short line for the whole module in `pytest -rs`, not one per test
    pytest.skip(f"GPU tests need TensorRT and an NVIDIA GPU (pip install 'specrt[gpu]'); here: {MISSING}",
                allow_module_level=True)


def compile_trt(llama_target, llama_draft, out, precision: str):
    from specrt.compiler import CompileSpec, EngineSpec, compile_bundle

    engines = EngineSpec("trt", precision=precision, workspace=1 << 28)
    return compile_bundle(CompileSpec(llama_target, out, llama_draft, max_seq_len=128, max_draft_tokens=8, force=True,
                                      engines=engines))


@pytest.fixture(scope="module")
def trt_bundles(llama_target, llama_draft, workdir):
    return {p: compile_trt(llama_target, llama_draft, workdir / "bundles" / f"trt-{p}", p)
            for p in ("fp32", "fp16", "bf16")}


def _runners(bundle, role="target"):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends import create_runner

    m = read_manifest(bundle)
    mk = lambda backend: create_runner(m, role, backend, capacity=128, max_short_tokens=10)  # noqa: E731
    return mk("trt"), mk("ort")


def _calls(trt_runner, ort_runner):
    """Prefill 7, decode 1, verify 9 (k = 8), a chunk at P > 0: yields (trt logits, ort logits) per call."""
    rng = np.random.default_rng(0)
    for s in (7, 1, 9, 20):
        ids = rng.integers(0, trt_runner.vocab_size, s).astype(np.int64)
        yield trt_runner.forward(ids).copy(), ort_runner.forward(ids).copy()


def test_manifest_records_engine_facts(trt_bundles):
    m = json.loads((trt_bundles["fp16"] / "manifest.json").read_text())
    for role in ("target", "draft"):
        e = m["engines"][role]
        assert e["precision"] == "fp16" and e["profiles"] == ["prefill", "decode", "verify"]
        assert e["path"] in m["files"] and e["tensorrt_version"] and e["compute_capability"]
    assert (trt_bundles["fp16"].parent / "trt-fp16.timing-cache").exists()


def test_fp32_engine_matches_onnx_runtime(trt_bundles):
    trt_runner, ort_runner = _runners(trt_bundles["fp32"])
    for got, ref in _calls(trt_runner, ort_runner):
        assert np.abs(got - ref).max() <= 1e-4


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_engines_match_on_the_median(trt_bundles, precision):
    trt_runner, ort_runner = _runners(trt_bundles[precision])
    for got, ref in _calls(trt_runner, ort_runner):
        assert got.dtype == np.float32
        assert np.median(np.abs(got - ref)) <= 1e-3 + 1e-3 * np.median(np.abs(ref))


def test_greedy_speculative_equals_plain_on_tensorrt(trt_bundles):
    from specrt.runtime import load

    gen = load(trt_bundles["fp32"], backend="trt")
    plain = gen.generate(PROMPT, 32, method="none")
    spec = gen.generate(PROMPT, 32, method="draft", num_speculative_tokens=4)
    assert spec.token_ids == plain.token_ids
    assert gen.backend == "trt" and spec.stats.accepted_tokens >= 0


def test_shape_outside_profiles_refused_in_python(trt_bundles):
    from specrt.core.errors import InvalidArgument

    trt_runner, _ = _runners(trt_bundles["fp32"])
    trt_runner.profiles = json.loads(json.dumps(trt_runner.profiles))
    trt_runner.profiles["prefill"]["input_ids"]["max"] = [1, 4]
    with pytest.raises(InvalidArgument, match="no optimization profile covers S=5"):
        trt_runner.forward(np.arange(5, dtype=np.int64))
    assert trt_runner.length == 0
    assert trt_runner.forward(np.arange(3, dtype=np.int64)).shape == (3, trt_runner.vocab_size)


def test_corrupted_engine_is_a_typed_error(trt_bundles, tmp_path):
    from specrt.bundle.manifest import file_entries, read_manifest
    from specrt.core.errors import BundleError
    from specrt.runtime.backends import create_runner

    b = shutil.copytree(trt_bundles["fp32"], tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    engine = b / m["engines"]["target"]["path"]
    data = bytearray(engine.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    engine.write_bytes(bytes(data[: len(data) // 2]))
    m["files"] = file_entries(b)  # checksums updated: only TensorRT can notice
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError):
        create_runner(read_manifest(b), "target", "trt", capacity=128, max_short_tokens=10)


def test_placement_on_a_second_gpu(trt_bundles):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two NVIDIA GPUs")
    from specrt.runtime import load

    gen = load(trt_bundles["fp32"], backend="trt", target_device="cuda:0", draft_device="cuda:1")
    assert gen.draft.cache.keys[0].device.index == 1 and gen.target.cache.keys[0].device.index == 0
    plain = gen.generate(PROMPT, 16, method="none")
    assert gen.generate(PROMPT, 16, method="draft", num_speculative_tokens=4).token_ids == plain.token_ids


def test_ort_cuda_provider_matches_cpu(trt_bundles):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu (CUDAExecutionProvider)")
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends import create_runner

    m = read_manifest(trt_bundles["fp32"])
    gpu = create_runner(m, "target", "ort-cuda", capacity=128, max_short_tokens=10)
    cpu = create_runner(m, "target", "ort", capacity=128, max_short_tokens=10)
    assert gpu.describe()["provider"] == "CUDAExecutionProvider"
    for got, ref in _calls(gpu, cpu):
        assert np.abs(got - ref).max() <= 1e-3  # CUDA fp32 matmuls may use TF32


@pytest.mark.parametrize("precision", ["int8", "fp8", "int4"])
def test_quantized_engines_follow_their_qdq_graph(llama_target, llama_draft, workdir, precision):
    """--precision int8 / fp8 / int4: Model Optimizer's Q/DQ graph built by TensorRT; its logits follow the same
    Q/DQ graph run by ONNX Runtime as written (fake quantization, fp32 elsewhere) on the argmax."""
    pytest.importorskip("modelopt.onnx.quantization", reason="needs pip install 'specrt[trt-quant]'")
    import torch

    if precision == "fp8" and torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip("fp8 engines need compute capability 8.9 or later (Ada, Hopper)")
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler.quality import GraphScorer
    from specrt.compiler.quantize_step import model_dims
    from specrt.runtime import load

    out = compile_trt(llama_target, llama_draft, workdir / "bundles" / f"trt-{precision}", precision)
    m = read_manifest(out)
    q = m.engines["target"].quantization
    assert m.engines["target"].precision == precision and q["precision"] == precision and q["quality"]["heldout"]
    trt_runner, _ = _runners(out)
    ref = GraphScorer(out / q["qdq_onnx"], model_dims(m.models["target"]), optimize=False)
    ids = np.random.default_rng(0).integers(0, trt_runner.vocab_size, 24).astype(np.int64)
    got = trt_runner.forward(ids).copy()
    want, _ = ref.run(ids, ref.empty_past())
    assert np.isfinite(got).all() and np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.9
    gen = load(out, backend="trt")
    assert gen.generate(PROMPT, 16, method="none").token_ids


def test_batched_engine_matches_the_onnx_runtime_batch_runner(llama_target, workdir):
    """`--max-batch 4`: one engine pass of slots with different lengths and new-token counts (prompt chunks, a verify,
    decodes) gives each slot the logits the ONNX Runtime batch runner gives (same graph, same padding rules)."""
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler import CompileSpec, EngineSpec, compile_bundle
    from specrt.runtime.backends import create_batch_runner

    bundle = compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "trt-batch", max_seq_len=64,
                                        max_draft_tokens=4, force=True, ort_graph="both",
                                        engines=EngineSpec("trt", precision="fp32", workspace=1 << 28, max_batch=4)))
    m = read_manifest(bundle)
    assert m.models["target"].profiles["decode"]["input_ids"]["max"] == [4, 1]
    trt_runner = create_batch_runner(m, "target", "trt", max_batch=4)
    ort_runner = create_batch_runner(m, "target", "ort-portable", max_batch=4)
    rng = np.random.default_rng(1)
    for sizes in ((7, 1, 3, 0), (1, 1, 5, 2), (1, 1, 1, 1)):
        call = [rng.integers(0, m.models["target"].vocab_size, n).astype(np.int64) for n in sizes]
        for got, ref in zip(trt_runner.forward_batch(call), ort_runner.forward_batch(call)):
            assert got.shape == ref.shape and (got.size == 0 or np.abs(got - ref).max() <= 1e-4)
    trt_runner.truncate(2, 4)
    ort_runner.truncate(2, 4)
    call = [np.array([3], np.int64)] * 3
    for got, ref in zip(trt_runner.forward_batch(call), ort_runner.forward_batch(call)):
        assert np.abs(got - ref).max() <= 1e-4
    # slots from an offset (the scheduler's passes over the slot range its calls cover)
    call = [np.array([5, 6], np.int64), np.array([7], np.int64)]
    for got, ref in zip(trt_runner.forward_batch(call, first=2), ort_runner.forward_batch(call, first=2)):
        assert np.abs(got - ref).max() <= 1e-4


def test_scheduler_batches_on_tensorrt(llama_target, workdir):
    """`specrt serve --backend trt`'s engine: continuous batching on the `--max-batch` engine (runtime/batch/
    slots.py); each request's greedy tokens as the Generator alone on TensorRT."""
    from specrt.compiler import CompileSpec, EngineSpec, compile_bundle
    from specrt.runtime import load
    from specrt.runtime.batch.engine import BatchEngine

    bundle = compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "trt-batch-serve", max_seq_len=64,
                                        max_draft_tokens=4, force=True, ort_graph="both",
                                        engines=EngineSpec("trt", precision="fp32", workspace=1 << 28, max_batch=4)))
    gen = load(bundle, backend="trt")
    prompts = [PROMPT, "def f(x):", "a b a b a b", "hello"]
    alone = [gen.generate(p, 12, method="ngram").token_ids for p in prompts]
    eng = BatchEngine(gen, max_batch=4)
    try:
        assert eng.scheduler.targets.batch.name == "trt"
        got = [r.token_ids for r in eng.generate_batch(prompts, 12, method="ngram")]
    finally:
        eng.close()
    assert got == alone


@pytest.fixture(scope="module")
def trt_head_bundle(llama_target, workdir):
    """Target + draft head (fc = [I | I], the target's own layer: untrained) with TensorRT engines, fp32."""
    import torch

    from specrt.compiler import CompileSpec, EngineSpec, compile_bundle
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import DraftHead, save_head

    decoder = open_checkpoint(llama_target).load_decoder(torch.float32)
    head = workdir / "gpu_head" / "head"
    save_head(DraftHead(decoder, torch.arange(decoder.config.vocab_size)), head)
    return compile_bundle(CompileSpec(llama_target, workdir / "gpu_head" / "bundle", f"head:{head}", max_seq_len=128,
                                      max_draft_tokens=4, force=True,
                                      engines=EngineSpec("trt", precision="fp32", workspace=1 << 28)))


def test_head_engine_matches_onnx_runtime(trt_head_bundle):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends.trt.head_runner import TrtHeadRunner
    from specrt.runtime.backends.head import HeadRunner

    m = read_manifest(trt_head_bundle)
    assert m.engines["draft_head"].profiles == ("decode", "prefill")
    trt_head, ort_head = TrtHeadRunner(m, 128), HeadRunner(m, 128)
    trt_head.max_rows = 6  # exercise the chunked path too
    rng = np.random.default_rng(0)
    position = 0
    for s in (9, 1, 5, 1):  # the prompt's last chunk (chunked), own features, a verify's rows
        feats = rng.standard_normal((s, m.draft_head.hidden_size)).astype(np.float32)
        ids = rng.integers(0, m.draft_head.draft_vocab_size, s)
        (a_logits, a_hidden), (b_logits, b_hidden) = trt_head(feats, ids, position), ort_head(feats, ids, position)
        position += s
        assert np.abs(a_logits - b_logits).max() <= 1e-4 + 1e-3 * np.abs(b_logits).max()
        assert np.abs(a_hidden - b_hidden).max() <= 1e-4 + 1e-3 * np.abs(b_hidden).max()


def test_head_greedy_equals_plain_on_tensorrt(trt_head_bundle):
    from specrt.runtime import load
    from specrt.runtime.backends.trt.head_runner import TrtHeadRunner

    gen = load(trt_head_bundle, backend="trt")
    plain = gen.generate(PROMPT, 32, method="none")
    spec = gen.generate(PROMPT, 32, method="head", num_speculative_tokens=3)
    assert spec.token_ids == plain.token_ids
    assert isinstance(gen._head_runner, TrtHeadRunner)
