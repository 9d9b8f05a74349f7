"""Shared fixtures: a real tokenizer, tiny transformers checkpoints and compiled bundles (session scope)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# ONNX Runtime's process-wide thread pool (runtime/backends/ort/threads.py) refuses every later session with a pool of
# its own, and a test worker runs many files: the in-process servers and benches keep per-session pools here, and
# tests/runtime/test_shared_pool.py turns the shared pool on in processes of its own.
os.environ["SPECRT_SHARED_POOL"] = "0"

from helpers import make_checkpoint, train_tokenizer  # noqa: E402
import export_cache  # noqa: E402


def pytest_runtest_setup(item):
    export_cache.install()  # in-process compiles reuse the export of an identical decoder (export_cache.py)


def pytest_sessionfinish(session, exitstatus):
    export_cache.cleanup()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("specrt")


@pytest.fixture(scope="session")
def tokenizer_path(workdir) -> Path:
    return train_tokenizer(workdir / "tok" / "tokenizer.json")


@pytest.fixture(scope="session")
def llama_target(workdir, tokenizer_path) -> Path:
    return make_checkpoint(workdir / "llama_target", "llama", tokenizer_path, layers=2, seed=0)


@pytest.fixture(scope="session")
def llama_draft(workdir, tokenizer_path) -> Path:
    """An unrelated random draft (almost everything is rejected)."""
    return make_checkpoint(workdir / "llama_draft", "llama", tokenizer_path, layers=1, seed=1)


@pytest.fixture(scope="session")
def pair_bundle(workdir, llama_target, llama_draft) -> Path:
    """target + unrelated draft, compiled once for the whole session."""
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "pair", llama_draft, max_seq_len=128,
                          max_draft_tokens=8))


@pytest.fixture(scope="session")
def self_bundle(workdir, llama_target) -> Path:
    """target used as its own draft: every draft is accepted."""
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "self", llama_target, max_seq_len=128,
                          max_draft_tokens=8))


@pytest.fixture(scope="session")
def target_only_bundle(workdir, llama_target) -> Path:
    """the target alone (no draft: n-gram and plain decoding only), compiled once for the whole session."""
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "target_only", max_seq_len=64, max_draft_tokens=4))


@pytest.fixture(scope="session")
def int4_self8_bundle(workdir, llama_target) -> Path:
    """int4 target at the default settings (accuracy level 4 for this Llama: two-row decode calls) with the
    int8 copy of the target as its draft, every graph kept (--keep-fp32 --ort-graph both); compiled once for
    the whole session."""
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "q4_self8", "self:int8", max_seq_len=256,
                                      max_draft_tokens=8, quantize=QuantizeSpec("int4"), keep_fp32=True,
                                      ort_graph="both"))


@pytest.fixture(scope="session")
def lean_int4_bundle(workdir, llama_target) -> Path:
    """`--quantize int4 --draft self:int4` as compiled by default: a lean bundle (only the int4 fused graph)."""
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "lean_q4", "self:int4", max_seq_len=256,
                                      max_draft_tokens=8, quantize=QuantizeSpec("int4")))


@pytest.fixture(scope="session")
def pair_generator(pair_bundle):
    from specrt.runtime import load

    return load(pair_bundle, backend="ort")


@pytest.fixture(scope="session")
def self_generator(self_bundle):
    from specrt.runtime import load

    return load(self_bundle, backend="ort")


@pytest.fixture(scope="session")
def medusa_generator(workdir, llama_target):
    """target + 3 random Medusa heads (3 drafts per step at most)."""
    import json

    import torch
    from safetensors.torch import save_file

    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.runtime import load

    heads_dir = workdir / "medusa_heads"
    heads_dir.mkdir(exist_ok=True)
    cfg = json.loads((llama_target / "config.json").read_text())
    d, heads = cfg["hidden_size"], 3
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(heads):
        tensors[f"heads.{i}.weight"] = torch.randn(d, d, generator=gen) * 0.05
        tensors[f"heads.{i}.bias"] = torch.zeros(d)
    save_file(tensors, str(heads_dir / "medusa.safetensors"))
    (heads_dir / "medusa_config.json").write_text(json.dumps({
        "medusa_num_heads": heads, "medusa_num_layers": 1, "hidden_size": d, "vocab_size": cfg["vocab_size"],
        "shares_target_lm_head": True}))
    bundle = compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "medusa", max_seq_len=128,
                                        max_draft_tokens=6, medusa=heads_dir))
    return load(bundle, backend="ort")
