"""The draft head's TensorRT engine: everything but TensorRT itself, on the CPU.

`compile --engines trt` with `--draft head:DIR` builds `draft_head/head.<precision>.engine` with the head's two
profiles (bundle/profiles.head_profiles). Here the engine build is replaced by a recorder (TensorRT cannot be
installed on this machine), and what is checked is real: the profiles against the head's exported ONNX graph,
the manifest record and checksums `load` trusts, the chunked calls the TensorRT runner relies on (run on ONNX
Runtime's head runner), and that a 'trt' generator routes the head to its engine. The engine itself runs in
tests/trt/test_gpu.py (skipped without a GPU).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from specrt.bundle.graph_io import HEAD_ENGINE_ROLE, HEAD_INPUTS, HEAD_OUTPUTS
from specrt.bundle.profiles import HEAD_PHASES, PREFILL_CHUNK_MAX, head_phase, head_profiles

MAX_SEQ_LEN = 128


@pytest.fixture(scope="module")
def head_dir(workdir, llama_target):
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import DraftHead, save_head

    decoder = open_checkpoint(llama_target).load_decoder(torch.float32)
    out = workdir / "trt_head" / "head"
    save_head(DraftHead(decoder, torch.arange(decoder.config.vocab_size)), out)
    return out


@pytest.fixture(scope="module")
def trt_head_bundle(workdir, llama_target, head_dir):
    """A target + head bundle compiled with --engines trt --precision fp16, the engine build recorded, not run."""
    from specrt.compiler import CompileSpec, EngineSpec, compile_bundle
    import specrt.compiler.trt.build as build
    import specrt.compiler.trt.compile_steps as steps
    import specrt.core.trt as core_trt

    calls = []

    def fake_build(trt, onnx_path, engine_path, profiles, options, order=build.PHASE_ORDER):
        calls.append({"onnx": onnx_path, "engine": engine_path, "profiles": profiles, "order": order,
                      "precision": options.precision, "max_batch": options.max_batch})
        engine_path.parent.mkdir(parents=True, exist_ok=True)
        engine_path.write_bytes(b"engine " + engine_path.name.encode())

    facts = {"tensorrt_version": "10.9.0", "cuda_version": "12.8", "gpu_name": "NVIDIA H200",
             "compute_capability": "9.0"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "build_engine", fake_build)
        mp.setattr(steps, "check_trt_available", lambda device="cuda:0": None)
        mp.setattr(core_trt, "import_trt", lambda: object())
        mp.setattr(core_trt, "installed_facts", lambda device="cuda:0": facts)
        out = compile_bundle(CompileSpec(llama_target, workdir / "trt_head" / "bundle", f"head:{head_dir}",
                                         max_seq_len=MAX_SEQ_LEN, max_draft_tokens=4, ort_graph="portable",
                                         engines=EngineSpec("trt", precision="fp16", workspace=1 << 28)))
    return out, calls


def _graph_inputs(path):
    g = onnx.load(str(path), load_external_data=False).graph
    dims = lambda v: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
    return {v.name: dims(v) for v in g.input}, [v.name for v in g.output]


def test_head_profiles_fit_the_heads_graph_and_every_call_the_proposer_makes(trt_head_bundle):
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler.trt.build import polygraphy_profiles

    bundle, _ = trt_head_bundle
    m = read_manifest(bundle)
    profiles = head_profiles(m.draft_head, m.max_seq_len)
    assert tuple(profiles) == HEAD_PHASES
    inputs, outputs = _graph_inputs(m.path(m.draft_head.onnx))
    assert set(inputs) == set(HEAD_INPUTS) and set(outputs) == set(HEAD_OUTPUTS)
    for phase, shapes in profiles.items():
        assert set(shapes) == set(inputs), phase
        for name, s in shapes.items():
            static = inputs[name]
            for which in ("min", "opt", "max"):  # rank and every static dimension of the exported graph
                assert len(s[which]) == len(static), (phase, name)
                assert all(not isinstance(d, int) or d == 0 or d == v for d, v in zip(static, s[which])), \
                    (phase, name, static, s[which])
            assert all(a <= b <= c for a, b, c in zip(s["min"], s["opt"], s["max"])), (phase, name)
    # the calls: one row (its own features), a verify's k + 1 rows, the prompt's last chunk, at any past length
    assert head_phase(profiles, 1, 0) == "decode" and head_phase(profiles, 1, MAX_SEQ_LEN - 1) == "decode"
    assert head_phase(profiles, 5, 40) == "prefill"
    assert head_phase(profiles, min(PREFILL_CHUNK_MAX, MAX_SEQ_LEN), 0) == "prefill"
    with pytest.raises(ValueError, match="no draft-head profile covers S=3 rows at past length 128"):
        head_phase(profiles, 3, MAX_SEQ_LEN)
    # polygraphy takes them, in the engine's profile order
    assert [phase for phase, _ in polygraphy_profiles(profiles, HEAD_PHASES)] == list(HEAD_PHASES)


def test_compile_records_the_head_engine_beside_the_models(trt_head_bundle):
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends import files_to_verify

    bundle, calls = trt_head_bundle
    m = read_manifest(bundle)
    head_calls = [c for c in calls if c["order"] == HEAD_PHASES]
    assert len(head_calls) == 1 and len(calls) == 1 + len(m.models)
    call = head_calls[0]
    assert call["onnx"].name == "head.onnx" and call["precision"] == "fp16" and call["max_batch"] == 1
    assert call["profiles"] == head_profiles(m.draft_head, m.max_seq_len)
    entry = m.engines[HEAD_ENGINE_ROLE]
    assert entry.path == "draft_head/head.fp16.engine" and entry.profiles == HEAD_PHASES
    assert entry.precision == "fp16" and entry.gpu_name == "NVIDIA H200"
    # listed with its checksum, so `load` trusts it, and among the files the 'trt' backend verifies
    assert entry.path in m.files and entry.path in files_to_verify(m, "trt")
    assert (bundle / entry.path).read_bytes() == b"engine head.fp16.engine"


def test_a_ptq_bundles_head_engine_is_fp16():
    from specrt.compiler.trt.options import BuildOptions
    from specrt.compiler.trt.compile_steps import head_build_options

    assert head_build_options(BuildOptions(precision="int8")).precision == "fp16"
    assert head_build_options(BuildOptions(precision="bf16")).precision == "bf16"


def test_chunked_head_calls_equal_one_call(trt_head_bundle):
    """The TensorRT runner feeds more rows than its largest profile in chunks (`HeadRunner.max_rows`): the same
    logits, features and cache as one call, on ONNX Runtime's head runner."""
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.backends.head import HeadRunner

    m = read_manifest(trt_head_bundle[0])
    rng = np.random.default_rng(0)
    d = m.draft_head.hidden_size
    feats = rng.standard_normal((9, d)).astype(np.float32)
    ids = rng.integers(0, m.draft_head.draft_vocab_size, 9)
    whole, chunked = HeadRunner(m, 64), HeadRunner(m, 64)
    chunked.max_rows = 4
    for r in (whole, chunked):
        r(feats[:2], ids[:2], 10)  # a cached past first
    a_logits, a_hidden = whole(feats[2:], ids[2:], 12)
    b_logits, b_hidden = chunked(feats[2:], ids[2:], 12)
    assert a_logits.shape == b_logits.shape == (7, m.draft_head.draft_vocab_size)
    assert whole.length == chunked.length == 9
    np.testing.assert_allclose(b_logits, a_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b_hidden, a_hidden, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(chunked.keys[:, :9], whole.keys[:, :9], rtol=1e-4, atol=1e-5)


def test_a_trt_generator_routes_the_head_to_its_engine(trt_head_bundle):
    from specrt.bundle.manifest import read_manifest
    from specrt.core.errors import BackendUnavailable
    from specrt.core.trt import trt_import_error
    from specrt.runtime.backends.head import HeadRunner, open_head_runner

    m = read_manifest(trt_head_bundle[0])
    assert type(open_head_runner(m, 32, "ort")) is HeadRunner  # any other backend: ONNX Runtime on the CPU
    if trt_import_error() is None:
        pytest.skip("TensorRT is installed here: tests/trt/test_gpu.py runs the head engine")
    with pytest.raises(BackendUnavailable, match="TensorRT"):
        open_head_runner(m, 32, "trt")


def test_the_memory_plan_counts_the_head_engine_on_the_targets_gpu(trt_head_bundle, tmp_path):
    import shutil

    from specrt.bundle.manifest import read_manifest
    from specrt.compiler.trt.memory import kv_cache_bytes, memory_plan

    bundle, _ = trt_head_bundle
    m = read_manifest(bundle)
    rows = {r["model"]: r for r in memory_plan(m, devices={"target": "cuda:1"})["rows"]}
    head, target = rows[HEAD_ENGINE_ROLE], rows["target"]
    t = m.models["target"].decoder_config
    stored = sum((bundle / p).stat().st_size for p in (m.draft_head.onnx, m.draft_head.onnx_data) if p)
    embed = t.vocab_size * t.hidden_size * 2  # the fp16 input embedding, kept at 2 bytes in the fp16 engine
    assert head["device"] == "cuda:1" and head["precision"] == "fp16"
    assert head["weights_bytes"] == (stored - embed) // 2 + embed
    # one layer's KV cache (the head's own), at the engine's 2 bytes per element
    one_layer = {"num_layers": 1, "num_kv_heads": m.draft_head.num_kv_heads, "head_dim": m.draft_head.head_dim}
    assert head["kv_cache_bytes"] == kv_cache_bytes(one_layer, m.max_seq_len, m.max_draft_tokens, 2)
    assert head["kv_cache_bytes"] * t.num_layers == target["kv_cache_bytes"]
    assert head["workspace_bytes"] == m.engines[HEAD_ENGINE_ROLE].workspace_bytes
    # without its engine the head runs on ONNX Runtime: a CPU row, the graph's bytes as stored
    cpu = tmp_path / "b"
    shutil.copytree(bundle, cpu)
    manifest = (cpu / "manifest.json")
    import json

    data = json.loads(manifest.read_text())
    del data["engines"][HEAD_ENGINE_ROLE]
    manifest.write_text(json.dumps(data))
    rows = {r["model"]: r for r in memory_plan(read_manifest(cpu, verify_checksums=False))["rows"]}
    assert rows[HEAD_ENGINE_ROLE]["device"] == "cpu" and rows[HEAD_ENGINE_ROLE]["weights_bytes"] == stored
    assert rows[HEAD_ENGINE_ROLE]["workspace_bytes"] == 0


def test_the_budget_check_counts_a_head_that_gets_an_engine(trt_head_bundle, head_dir, llama_target):
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler.trt.compile_steps import check_budget_before_build, head_row_before_build
    from specrt.core.errors import InvalidArgument
    from specrt.models.checkpoint import open_checkpoint

    bundle, _ = trt_head_bundle
    m = read_manifest(bundle)
    # the estimate from the head's directory and the target's config: the compiled fp32 graph's weights
    from onnx import numpy_helper

    graph = onnx.load(str(bundle / m.draft_head.onnx))
    weights = sum(numpy_helper.to_array(t).nbytes for t in graph.graph.initializer)
    est = head_row_before_build(head_dir, open_checkpoint(llama_target).config, "fp32", MAX_SEQ_LEN, 4, 0)
    assert abs(est["weights_bytes"] - weights) <= 0.01 * weights
    opts = {"engines": "trt", "precision": "fp16", "workspace": 1 << 20}
    without = check_budget_before_build(opts | {"gpu_memory_budget": 1 << 40}, llama_target, None, MAX_SEQ_LEN, 4)
    plan = check_budget_before_build(opts | {"gpu_memory_budget": 1 << 40}, llama_target, None, MAX_SEQ_LEN, 4,
                                     head_dir)
    assert [r["model"] for r in plan["rows"]] == ["target", HEAD_ENGINE_ROLE]
    head = plan["rows"][1]
    assert plan["per_device"]["cuda:0"] == without["per_device"]["cuda:0"] + head["total_bytes"]
    between = without["per_device"]["cuda:0"] + head["total_bytes"] // 2
    check_budget_before_build(opts | {"gpu_memory_budget": between}, llama_target, None, MAX_SEQ_LEN, 4)
    with pytest.raises(InvalidArgument, match="draft_head: weights"):
        check_budget_before_build(opts | {"gpu_memory_budget": between}, llama_target, None, MAX_SEQ_LEN, 4,
                                  head_dir)
