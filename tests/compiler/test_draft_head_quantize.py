"""A quantized draft head (MatMulNBits, GatherBlockQuantized embedding): int8 by default in a quantized bundle, or
`--draft-quantize int4|int8`; validated against the fp32 head at compile, loaded by the runtime; greedy output still
equals plain decoding.

The head (fc = [I | I], the target's own last layer, norm and full LM head) is untrained:
what is checked is the graph, the manifest and the losslessness, not the acceptance.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch


def _save_head(target, out):
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import DraftHead, save_head

    decoder = open_checkpoint(target).load_decoder(torch.float32)
    save_head(DraftHead(decoder, torch.arange(decoder.config.vocab_size)), out)
    return out


@pytest.fixture(scope="module")
def int4_head_bundle(workdir, llama_target):
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle

    base = workdir / "int4_head"
    head = _save_head(llama_target, base / "head")
    return compile_bundle(CompileSpec(llama_target, base / "bundle", f"head:{head}", max_seq_len=128,
                                      max_draft_tokens=4, quantize=QuantizeSpec(target="int4", draft="int4")))


def _ops(path):
    import onnx

    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_int4_bundle_has_a_quantized_head(int4_head_bundle):
    from specrt.bundle.manifest import read_manifest

    m = read_manifest(int4_head_bundle)
    entry = m.draft_head
    assert entry.precision == "int4" and entry.onnx == "draft_head/head.int4.onnx"
    assert not (int4_head_bundle / "draft_head" / "head.onnx").exists()  # the fp32 graph is not shipped
    ops = _ops(m.path(entry.onnx))
    assert ops.count("MatMulNBits") == 9 and "GatherBlockQuantized" in ops  # fc, q/k/v/o, gate/up/down, LM head
    assert "Gather" not in ops
    q = entry.quantization
    assert q["quantized_matmuls"] == 9 and q["unquantized_weight_matmuls"] == 0 and q["bits"] == 4
    assert q["embedding"]["storage"] == "GatherBlockQuantized"
    v = q["validation"]
    assert v["top1_agreement"] >= v["min_top1_agreement"] and v["logits_cosine"] >= v["min_cosine"]


def test_int4_head_greedy_output_equals_plain(int4_head_bundle):
    from specrt.runtime import load

    gen = load(int4_head_bundle, backend="ort")
    for prompt in ("def main(argv):\n    ", "import os\nimport json\n\n\nclass Config:\n"):
        plain = gen.generate(prompt, 40, method="none")
        for method in ("head", "hybrid-head"):
            spec = gen.generate(prompt, 40, method=method, num_speculative_tokens=3)
            assert spec.token_ids == plain.token_ids
            assert spec.stats.drafted_tokens > 0


def _broken_copy(bundle, tmp_path, scale):
    """The bundle's quantized head graph with the LM head's scales multiplied by `scale`."""
    import onnx
    from onnx import numpy_helper

    src = bundle / "draft_head" / "head.int4.onnx"
    model = onnx.load(str(src), load_external_data=True)
    inits = {t.name: t for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits" and "logits" in n.output)  # LM head
    scales = numpy_helper.to_array(inits[node.input[2]]) * np.float32(scale)
    inits[node.input[2]].CopyFrom(numpy_helper.from_array(scales, node.input[2]))
    from specrt.compiler.onnx_io import save_onnx

    save_onnx(model, tmp_path / "broken.onnx")
    return tmp_path / "broken.onnx"


@pytest.mark.parametrize("scale,message", [(-1.0, "drafts unlike the fp32 head"), (np.nan, "non-finite")])
def test_a_broken_quantized_head_is_refused(int4_head_bundle, llama_target, tmp_path, scale, message):
    from specrt.compiler.draft_head_quantize import target_rows, validate_quantized_head
    from specrt.compiler.validate import ValidationError
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import load_head

    decoder = open_checkpoint(llama_target).load_decoder(torch.float32)
    head, _ = load_head(int4_head_bundle.parent / "head", decoder)
    rows = target_rows(decoder, np.arange(3, 60))
    validate_quantized_head(head, int4_head_bundle / "draft_head" / "head.int4.onnx", *rows)  # the real one passes
    with pytest.raises(ValidationError, match=message):
        validate_quantized_head(head, _broken_copy(int4_head_bundle, tmp_path, scale), *rows)


@pytest.fixture(scope="module")
def int8_head_on_fp32_target(workdir, llama_target):
    """`specrt compile --draft head:DIR --draft-quantize int8`: the head quantized, the target left fp32."""
    from click.testing import CliRunner

    from specrt.cli.main import main

    base = workdir / "int8_head"
    head = _save_head(llama_target, base / "head")
    res = CliRunner().invoke(main, ["compile", "--target", str(llama_target), "--draft", f"head:{head}",
                                    "--draft-quantize", "int8", "-o", str(base / "bundle"), "--max-seq-len", "64",
                                    "--max-draft-tokens", "4"])
    assert res.exit_code == 0, res.output
    return base / "bundle"


@pytest.mark.slow
def test_cli_int8_head_on_an_fp32_target(int8_head_on_fp32_target):
    from click.testing import CliRunner

    from specrt.bundle.manifest import read_manifest
    from specrt.cli.main import main

    m = read_manifest(int8_head_on_fp32_target)
    assert m.models["target"].quantization is None
    assert m.draft_head.precision == "int8" and m.draft_head.quantization["bits"] == 8
    assert _ops(m.path(m.draft_head.onnx)).count("MatMulNBits") == 9
    res = CliRunner().invoke(main, ["inspect", str(int8_head_on_fp32_target)], terminal_width=200)
    assert res.exit_code == 0 and "draft head: int8" in res.output, res.output
    res = CliRunner().invoke(main, ["generate", str(int8_head_on_fp32_target), "--prompt", "import os", "--method",
                                    "head", "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{"):])["stats"]["method"] == "head"


@pytest.mark.slow
def test_seeded_auto_k_costs_the_head_by_its_weights(int4_head_bundle, int8_head_on_fp32_target):
    """CountOnlyAdaptiveK's draft cost for a head: its streamed weights (embedding excluded) over the target's."""
    from specrt.bundle.manifest import read_manifest
    from specrt.runtime.policy import NGRAM_DRAFT_COST, head_weight_bytes, model_draft_cost, weight_bytes

    int4, int8 = read_manifest(int4_head_bundle), read_manifest(int8_head_on_fp32_target)
    assert 0 < head_weight_bytes(int4) < head_weight_bytes(int8)
    for m in (int4, int8):
        cost = model_draft_cost("head", m)
        assert cost == pytest.approx(head_weight_bytes(m) / weight_bytes(m, "target")) and cost > NGRAM_DRAFT_COST
        assert model_draft_cost("hybrid", m) == model_draft_cost("hybrid-head", m) == cost  # no draft model


def test_head_precision_follows_the_options():
    """A quantized target gets an int8 head (HEAD_QUANT_TYPE), --draft-quantize overrides, fp32 stays fp32."""
    from specrt.compiler import QuantizeSpec
    from specrt.compiler.quantize_prepare import head_quantization

    def kind(**kw):
        cfg = head_quantization(QuantizeSpec(**kw).options())
        return cfg.type if cfg else None

    assert kind() is None and kind(target="int8") == kind(target="int4") == "int8"
    assert kind(target="int4", draft="int4") == kind(draft="int4") == "int4"
    cfg = head_quantization(QuantizeSpec(target="int4", block_size=64, symmetric=False).options())
    assert (cfg.block_size, cfg.symmetric) == (64, False)


def test_draft_quantize_without_a_draft_is_still_refused(tmp_path, llama_target):
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle
    from specrt.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="needs a draft checkpoint"):
        compile_bundle(CompileSpec(llama_target, tmp_path / "b", quantize=QuantizeSpec(draft="int4")))
    assert not (tmp_path / "b").exists()


def test_asymmetric_head_keeps_its_fp16_embedding(tmp_path, llama_target):
    """GatherBlockQuantized is used without zero points: with --quant-asymmetric the MatMuls are quantized and the
    embedding stays the head's fp16 table (recorded as such); the graph still validates."""
    from specrt.compiler.draft_head import export_head
    from specrt.compiler.draft_head_quantize import quantize_head, target_rows, validate_quantized_head
    from specrt.compiler.quantize import QuantizeConfig
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import load_head

    decoder = open_checkpoint(llama_target).load_decoder(torch.float32)
    head, _ = load_head(_save_head(llama_target, tmp_path / "head"), decoder)
    fp32 = export_head(head, tmp_path / "head.onnx")
    record = quantize_head(fp32, tmp_path / "head.int4.onnx", QuantizeConfig("int4", symmetric=False))
    assert record["embedding"]["storage"] == "fp16" and record["quantized_matmuls"] == 9
    ops = _ops(tmp_path / "head.int4.onnx")
    assert "Gather" in ops and "GatherBlockQuantized" not in ops
    validate_quantized_head(head, tmp_path / "head.int4.onnx", *target_rows(decoder, np.arange(3, 60)))


def test_timed_auto_k_starts_from_the_heads_cost(int4_head_bundle):
    """The head is not timed at load: the timed controller starts from its weight-bytes cost, not from zero."""
    from specrt.runtime import load
    from specrt.runtime.policy import model_draft_cost

    gen = load(int4_head_bundle, backend="ort")
    verify = gen._load_costs[0]
    for method in ("head", "hybrid-head", "hybrid"):
        cost = gen.make_policy("auto", method).draft_cost
        assert cost == pytest.approx(model_draft_cost(method, gen.manifest) * verify[0]) and cost > 0
    assert gen.make_policy("auto", "ngram").draft_cost == 0.0
