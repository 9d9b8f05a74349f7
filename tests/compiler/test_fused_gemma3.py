"""The fused ONNX Runtime graph of Gemma 3 (compiler/fused_gemma3.py): its structure, validation against the
PyTorch module across the sliding window (and a wrong window caught), and in compiled bundles: fused ==
portable == transformers greedy with every proposer, the fused runner equal to the portable one across the
window and a rollback, quantized fused graphs (int8, int4) validated and run, `inspect`'s LM head share."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from helpers import GEMMA3_WINDOW, make_checkpoint

from specrt.bundle.graph_io import TREE_WINDOW_SLACK
from specrt.compiler.fused_graph import build_fused_model, fused_onnx_from_decoder, fused_unsupported_reason
from specrt.compiler.fused_validate import validate_fused_onnx
from specrt.compiler.validate import ValidationError, validation_shapes, window_shapes
from specrt.models.checkpoint import open_checkpoint

CAPACITY = 64
PROMPTS = ("def main(argv):\n    ", "import json\nimport json\nimport json\nimport")


@pytest.fixture(scope="module", params=("gemma3", "gemma3_untied"))
def gemma_decoder(request, workdir, tokenizer_path):
    path = make_checkpoint(workdir / "fused_gemma3" / request.param, request.param, tokenizer_path, layers=3, seed=0)
    return open_checkpoint(path).load_decoder()


def _shapes(c):
    shapes = validation_shapes(CAPACITY, 4) + window_shapes(c, CAPACITY, 4) + [(20, 0), (3, 30)]
    assert any(p > c.sliding_window for _, p in shapes)  # a verify whose past crosses the window
    return shapes


def test_structure_window_and_folded_norms(gemma_decoder):
    c = gemma_decoder.config
    assert fused_unsupported_reason(c) is None
    model = build_fused_model(gemma_decoder, CAPACITY)
    ops = [n.op_type for n in model.graph.node if not n.name.startswith("tree/")]  # tree: once per pass
    layers = c.num_layers
    assert ops.count("GroupQueryAttention") == layers
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 * layers  # input (from layer 1) + pre-ff + final
    assert ops.count("SimplifiedLayerNormalization") == 1 + 2 * layers + 2 * layers  # layer 0, post norms, q/k
    assert ops.count("MatMul") == 4 * layers + (0 if c.tie_word_embeddings else 1)
    assert "Tanh" in ops and "Transpose" not in ops and "Cast" not in ops  # final soft-capping on the rows
    for i, node in enumerate(n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: a for a in node.attribute}
        window = attrs["local_window_size"].i if "local_window_size" in attrs else None
        if window is not None:  # the kernel's window is widened, the exact one is in the bias (compiler/fused_tree.py)
            window -= TREE_WINDOW_SLACK
            assert node.input[10].startswith(f"tree/window{c.layer_window(i)}/")
        assert window == c.layer_window(i) and (window is None) == (c.layer_types[i] == "full_attention")
        assert np.isclose(attrs["scale"].f, c.query_pre_attn_scalar ** -0.5)
        assert node.input[7] == ("cos_cache_local" if window else "cos_cache")
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layer = gemma_decoder.model.layers[0]
    assert np.array_equal(inits["layers.0.post_feedforward_layernorm.weight"],
                          (1.0 + layer.post_feedforward_layernorm.weight.float()).detach().numpy())  # (1 + w), fp32
    assert np.array_equal(inits["layers.0.attn.q_norm.weight"], (1.0 + layer.self_attn.q_norm.weight).detach().numpy())
    assert inits["embed_scale"] == np.float32(c.hidden_size ** 0.5)
    assert not np.allclose(inits["cos_cache"], inits["cos_cache_local"])  # two rope bases


def test_validates_across_the_window_and_catches_a_wrong_one(gemma_decoder, tmp_path):
    from specrt.models import build_decoder

    c = gemma_decoder.config
    path = fused_onnx_from_decoder(gemma_decoder, tmp_path / "m.onnx", CAPACITY)
    stats = validate_fused_onnx(gemma_decoder, path, _shapes(c), capacity=CAPACITY)
    assert stats["max_abs_diff"] < 1e-4 and stats["argmax_agree"] == stats["argmax_positions"]
    wider = build_decoder(dataclasses.replace(c, sliding_window=GEMMA3_WINDOW + 1))  # same weights, window + 1
    wider.load_state_dict(gemma_decoder.state_dict())
    wrong = fused_onnx_from_decoder(wider.eval(), tmp_path / "wrong.onnx", CAPACITY)
    with pytest.raises(ValidationError, match="differs from PyTorch"):
        validate_fused_onnx(gemma_decoder, wrong, _shapes(c), capacity=CAPACITY)
    # within the window the two agree: the difference is the window alone
    validate_fused_onnx(gemma_decoder, wrong, [(GEMMA3_WINDOW, 0)], capacity=CAPACITY)


@pytest.fixture(scope="module")
def gemma_pair(workdir, tokenizer_path):
    """A tiny Gemma 3 target (tied, soft-capped) + a smaller Gemma 3 draft + 3 random Medusa heads."""
    from safetensors.torch import save_file

    from specrt.compiler import CompileSpec, compile_bundle

    base = workdir / "fused_gemma3" / "pair"
    target = make_checkpoint(base / "target", "gemma3", tokenizer_path, layers=3, seed=0)
    draft = make_checkpoint(base / "draft", "gemma3", tokenizer_path, layers=2, hidden=32, seed=5)
    heads_dir = base / "medusa"
    heads_dir.mkdir(exist_ok=True)
    cfg = json.loads((target / "config.json").read_text())
    gen = torch.Generator().manual_seed(0)
    save_file({k: v for i in range(3) for k, v in ((f"heads.{i}.weight", torch.randn(64, 64, generator=gen) * 0.05),
                                                   (f"heads.{i}.bias", torch.zeros(64)))},
              str(heads_dir / "medusa.safetensors"))
    (heads_dir / "medusa_config.json").write_text(json.dumps({
        "medusa_num_heads": 3, "medusa_num_layers": 1, "hidden_size": 64, "vocab_size": cfg["vocab_size"],
        "shares_target_lm_head": True}))
    bundle = compile_bundle(CompileSpec(target, base / "bundle", draft, max_seq_len=96, max_draft_tokens=6,
                                        medusa=heads_dir))
    return target, bundle


@pytest.mark.slow  # the Gemma 3 pair's compile (~20 s on 2 cores)
def test_bundle_has_fused_graphs_validated_across_the_window(gemma_pair):
    from specrt.bundle.manifest import read_manifest

    m = read_manifest(gemma_pair[1])
    for role in ("target", "draft"):
        e = m.models[role]
        assert "fused" in e.graphs and e.fused_skipped is None
        assert any(p > GEMMA3_WINDOW for _, p in e.graphs["fused"].validation["shapes"])


@pytest.mark.slow
def test_every_proposer_on_fused_equals_portable_and_transformers(gemma_pair):
    import transformers

    from specrt.runtime import load

    target, bundle = gemma_pair
    hf = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    fused, portable = load(bundle, backend="ort"), load(bundle, backend="ort-portable")
    assert fused.target.describe()["graph"] == "fused" and fused.draft.describe()["graph"] == "fused"
    assert set(fused.methods) == {"none", "ngram", "recycle", "draft", "hybrid", "medusa", "auto"}
    for prompt in PROMPTS:
        ids = fused.tokenizer.encode(prompt)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=0, pad_token_id=0)
        expected = out[0, len(ids):].tolist()
        assert len(ids) + len(expected) > 4 * GEMMA3_WINDOW
        assert portable.generate(prompt, 40, method="none").token_ids == expected
        for method, k in (("none", 0), ("ngram", 3), ("draft", 4), ("hybrid", 4), ("medusa", 3), ("draft", "auto")):
            assert fused.generate(prompt, 40, method=method, num_speculative_tokens=k).token_ids == expected, \
                (prompt, method, k)


@pytest.mark.slow
def test_fused_runner_equals_portable_across_the_window_and_rollback(gemma_pair):
    from specrt.runtime import load

    fused, portable = load(gemma_pair[1], backend="ort").target, load(gemma_pair[1], backend="ort-portable").target
    ids = np.random.default_rng(0).integers(0, fused.vocab_size, size=40).astype(np.int64)
    for r in (fused, portable):
        r.reset()
    for chunk in (ids[:9], ids[9:10], ids[10:17], ids[17:18], ids[18:25]):
        a, b = fused.forward(chunk).copy(), portable.forward(chunk).copy()
        assert np.allclose(a, b, atol=1e-4, rtol=1e-4), np.abs(a - b).max()
    for r in (fused, portable):
        r.truncate(12)  # back below a window's worth of rows written since, then on
    a, b = fused.forward(ids[30:36]).copy(), portable.forward(ids[30:36]).copy()
    assert np.allclose(a, b, atol=1e-4, rtol=1e-4)
    for r in (fused, portable):
        r.reset()
    assert np.allclose(fused.prefill(ids[:30], chunk=8), portable.prefill(ids[:30], chunk=8), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["int8", "int4"])
def test_quantized_fused_gemma3(workdir, tokenizer_path, qtype):
    from specrt.bundle.manifest import read_manifest
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle
    from specrt.runtime import load

    base = workdir / "fused_gemma3" / f"q_{qtype}"
    target = make_checkpoint(base / "target", "gemma3", tokenizer_path, layers=3, seed=0)
    bundle = compile_bundle(CompileSpec(target, base / "bundle", f"self:{qtype}", max_seq_len=96,
                                        max_draft_tokens=6, quantize=QuantizeSpec(qtype)))
    q = read_manifest(bundle).models["target"].quantization
    assert "fused" in q.graphs
    assert any(p > GEMMA3_WINDOW for _, p in q.graphs["fused"].validation["shapes"])
    gen = load(bundle, backend="ort")
    assert gen.target.describe()["graph"] == "fused"
    for prompt in PROMPTS:
        plain = gen.generate(prompt, 40, method="none").token_ids
        for method, k in (("ngram", 3), ("draft", 4), ("hybrid", 4)):
            assert gen.generate(prompt, 40, method=method, num_speculative_tokens=k).token_ids == plain, (method, k)


@pytest.mark.slow
def test_inspect_states_the_lm_head_share(gemma_pair):
    from specrt.cli.describe import bundle_summary, lm_head_share

    models = bundle_summary(gemma_pair[1])["models"]
    h = models["target"]["lm_head"]
    assert h["head_weights"] == 64 * models["target"]["vocab_size"]
    # 3 layers: q (4 heads x 32) k, v (2 x 32) from 64, o back, gate/up/down 64 <-> 128
    assert h["layer_weights"] == 3 * (64 * (128 + 2 * 64) + 128 * 64 + 3 * 64 * 128)
    assert h["share"] == round(h["head_weights"] / (h["head_weights"] + h["layer_weights"]), 4)
    c = open_checkpoint(gemma_pair[0]).config  # Gemma 3 270M's shape: the head is 62.6% of a step's weights
    c270 = dataclasses.replace(c, vocab_size=262_144, hidden_size=640, num_layers=18, num_heads=4, num_kv_heads=1,
                               head_dim=256, intermediate_size=2048, layer_types=())
    assert lm_head_share(c270) == {"head_weights": 167_772_160, "layer_weights": 100_270_080, "share": 0.6259}
