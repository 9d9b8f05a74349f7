"""The screened greedy LM head (compiler/lm_head_screen.py): the error bound holds for ONNX Runtime's int8 kernel,
the head alone picks the exact argmax (and falls back to the full head on a flat row), and in compiled bundles
greedy decoding through it equals the full head's, while sampling, constrained calls and batches get full rows."""

import json

import numpy as np
import pytest

from helpers import make_checkpoint

from specrt.bundle.graph_io import LM_HEAD_FULL
from specrt.compiler.lm_head_screen import (block_size, bound_features, bound_terms, candidates, quantize_head,
                                           screen_supported,
                                           screen_wanted, screened_head)

V, K = 8192, 96


def _weights(kind: str, seed: int = 0, k: int = K) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((V, k)).astype(np.float32) * 0.05
    if kind == "outliers":  # a few large weights per row, as trained embeddings have
        w[rng.integers(0, V, 300), rng.integers(0, k, 300)] *= 40
    return w


def _head_session(w: np.ndarray, softcap=None):
    """The screened head alone: input rows [M, K] -> logits [M, V], with the `lm_head_full` switch."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from specrt.compiler.export import ONNX_IR_VERSION, ONNX_OPSET
    from specrt.compiler.graph_builder import MS, GraphBuilder

    g = GraphBuilder()
    head = g.weight("head", w)
    out = screened_head(g, "rows", head, w, softcap)
    g.nodes.append(helper.make_node("Identity", [out], ["logits"]))
    graph = helper.make_graph(g.nodes, "head", [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["M", K]),
                                                helper.make_tensor_value_info(LM_HEAD_FULL, TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["M", V])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid(MS, 1)],
                              ir_version=ONNX_IR_VERSION)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda x, full: session.run(None, {"rows": x, LM_HEAD_FULL: np.array(full)})[0]


def _kernel_error_and_bound(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|x w_r - a_r|, eps_r) for ONNX Runtime's own a: the int8 head alone (MatMulNBits, 8 bits, level 4)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from specrt.compiler.graph_builder import MS

    k = w.shape[1]
    packed, scales = quantize_head(w)
    node = helper.make_node("MatMulNBits", ["x", "q", "s"], ["y"], domain=MS, K=k, N=V, bits=8,
                            block_size=block_size(k), accuracy_level=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", V])],
                              [numpy_helper.from_array(packed, "q"), numpy_helper.from_array(scales, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    approx = session.run(None, {"x": x})[0]
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    eps = bound_features(x).astype(np.float64) @ bound_terms(w, packed, scales).astype(np.float64)
    return np.abs(exact - approx), eps


@pytest.mark.parametrize("kind, k", [("gaussian", 96), ("outliers", 96), ("gaussian", 256), ("outliers", 640)])
def test_the_bound_holds_for_onnx_runtimes_int8_kernel(kind, k):
    """|x w_r - a_r| <= eps_r for the kernel's own a (MatMulNBits, 8 bits, accuracy level 4) on rows of every
    scale, with outliers in x and in w, for each block size (96: 32, 256 and 640: 128): the screen's exactness
    rests on this."""
    w = _weights(kind, k=k)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, k)).astype(np.float32) * np.logspace(-3, 2, 64, dtype=np.float32)[:, None]
    x[::7, rng.integers(0, k)] *= 30  # activation outliers
    error, eps = _kernel_error_and_bound(w, x)
    assert (error <= eps).all()
    assert (error > 0).any()  # the kernel is approximate: the bound is doing work


def test_the_kernel_quantizes_activations_per_block():
    """The bound takes each block's own activation step. Were the kernel's steps per row, the small activations
    of a block beside one huge activation would round to 0 and row 0 (zero weights under the huge activation,
    0.05 under the small ones) would be off by 0.05 x 128 = 6.4, far above its bound (~0.05)."""
    k = 256  # two blocks of 128
    w = _weights("gaussian", k=k)
    w[0, :128], w[0, 128:] = 0.0, 0.05
    x = np.zeros((1, k), np.float32)
    x[0, 0], x[0, 128:] = 1000.0, 1.0
    error, eps = _kernel_error_and_bound(w, x)
    assert (error <= eps).all()
    assert eps[0, 0] < 0.1


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_the_screened_head_picks_the_exact_argmax(softcap):
    w = _weights("outliers")
    run = _head_session(w, softcap)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, K)).astype(np.float32)
    full, screened = run(x, True), run(x, False)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    if softcap:
        ref = softcap * np.tanh(ref / softcap)
    np.testing.assert_allclose(full, ref, rtol=1e-4, atol=1e-4)
    assert (np.isfinite(screened).sum(axis=1) == candidates(V)).all()  # the screen was taken on every row
    assert (screened.argmax(axis=1) == ref.argmax(axis=1)).all()
    finite = np.isfinite(screened)
    np.testing.assert_allclose(screened[finite], full[finite], rtol=1e-5, atol=1e-5)


def test_a_flat_row_falls_back_to_the_full_head():
    """x = 0: every logit is 0, no candidate set can prove its maximum: the full row comes back. A row whose best
    tokens tie exactly keeps the full head's first index."""
    w = _weights("gaussian")
    w[1500] = w[900]  # an exact tie between two rows
    run = _head_session(w)
    flat = run(np.zeros((1, K), np.float32), False)
    assert np.isfinite(flat).all() and (flat == 0).all()
    x = (w[900] * 50).astype(np.float32)[None, :]  # 900 and 1500 are the best, tied
    full, screened = run(x, True), run(x, False)
    assert full.argmax() == screened.argmax() == 900


def test_when_the_screen_is_built():
    assert screen_wanted("auto", 262_144, 640, 100_000_000)  # Gemma 3 270M: the head is 63% of a step
    assert not screen_wanted("auto", 49_152, 576, 106_000_000)  # SmolLM2-135M: 21%
    assert screen_wanted("auto", 262_144, 1152, 700_000_000)  # Gemma 3 1B: 30%
    assert not screen_wanted("auto", 320, 64, 10_000)  # a tiny vocabulary: never worth it
    assert screen_wanted("on", 320, 64, 10_000) and not screen_wanted("off", 262_144, 640, 1)
    assert screen_supported(640) is None and "multiple of 32" in screen_supported(100)
    assert (block_size(640), block_size(576), block_size(96)) == (128, 64, 32)


@pytest.fixture(scope="module")
def screened_bundles(workdir, tokenizer_path):
    from specrt.compiler import CompileSpec, compile_bundle

    base = workdir / "lm_head_screen"
    target = make_checkpoint(base / "gemma3", "gemma3", tokenizer_path, layers=2, seed=3)
    on = compile_bundle(CompileSpec(target, base / "on", max_seq_len=96, max_draft_tokens=4, lm_head_screen="on"))
    off = compile_bundle(CompileSpec(target, base / "off", max_seq_len=96, max_draft_tokens=4, lm_head_screen="off"))
    return on, off


def test_a_compiled_bundle_decodes_greedy_through_the_screen_exactly(screened_bundles):
    from specrt.runtime import load

    on, off = screened_bundles
    entry = json.loads((on / "manifest.json").read_text())["models"]["target"]["graphs"]["fused"]
    assert entry["optional_inputs"] == [LM_HEAD_FULL]
    assert "screen taken in" in entry["validation"]["lm_head_screen"]
    assert "lm_head_screen" not in json.loads((off / "manifest.json").read_text())["models"]["target"]["graphs"][
        "fused"]["validation"]
    screened, plain = load(on), load(off)
    assert screened.target.describe()["lm_head"] == "screened (greedy)" and "lm_head" not in plain.target.describe()
    seen = []
    screened.target.forward = _spy(screened.target.forward, seen)
    for prompt in ("def main(argv):\n    ", "import json\nimport json\nimport"):
        for method, k in (("none", 0), ("ngram", 3)):
            a = screened.generate(prompt, 24, method=method, num_speculative_tokens=k, temperature=0)
            b = plain.generate(prompt, 24, method=method, num_speculative_tokens=k, temperature=0)
            assert a.token_ids == b.token_ids
    assert any(not np.isfinite(rows).all() for rows in seen)  # rows came back screened (some -inf)
    assert screened.target._full_rows[()]  # full rows again after the call


def test_inspect_says_the_head_is_screened(screened_bundles):
    from helpers import run_cli

    on, off = screened_bundles
    out = run_cli("inspect", str(on))
    assert out.returncode == 0
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert "screened head for greedy calls: int8 screen + exact fp32 candidates (screen taken in" in text
    assert "screened head" not in " ".join(run_cli("inspect", str(off)).stdout.split())


def _spy(forward, seen):
    def call(ids):
        out = forward(ids)
        seen.append(out.copy())
        return out
    return call


def test_sampling_constraints_and_batches_read_full_rows(screened_bundles):
    from specrt.runtime import load

    on, off = screened_bundles
    screened, plain = load(on), load(off)
    seen = []
    screened.target.forward = _spy(screened.target.forward, seen)
    a = screened.generate("def main(argv):\n    ", 16, method="none", temperature=0.8, seed=7)
    b = plain.generate("def main(argv):\n    ", 16, method="none", temperature=0.8, seed=7)
    assert a.token_ids == b.token_ids
    from specrt.runtime import ConstraintSpec

    a = screened.generate("x = ", 8, method="none", temperature=0, constraint=ConstraintSpec("regex", "[0-9]+"))
    assert a.text.isdigit()
    assert seen and all(np.isfinite(rows).all() for rows in seen)
    prompts = ["def main(argv):\n    ", "import os\n", "class A:\n    def"]
    engine = screened.engine(max_batch=3)
    try:
        batched = engine.generate_batch(prompts, max_new_tokens=12, temperature=0)
    finally:
        engine.close()
    assert [r.token_ids for r in batched] == [plain.generate(p, 12, method="none", temperature=0).token_ids
                                               for p in prompts]


@pytest.mark.slow
def test_a_screened_draft_model_drafts_greedy_on_its_screen(workdir, tokenizer_path):
    """A draft compiled with the screen drafts greedy argmaxes from screened rows, and sampled drafts from full
    rows (its probabilities are part of the acceptance rule): both outputs equal the unscreened pair's."""
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.runtime import load

    base = workdir / "lm_head_screen_pair"
    target = make_checkpoint(base / "target", "gemma3", tokenizer_path, layers=2, seed=3)
    draft = make_checkpoint(base / "draft", "gemma3", tokenizer_path, layers=1, seed=4)
    on = load(compile_bundle(CompileSpec(target, base / "on", draft, max_seq_len=96, max_draft_tokens=4,
                                         lm_head_screen="on")))
    off = load(compile_bundle(CompileSpec(target, base / "off", draft, max_seq_len=96, max_draft_tokens=4,
                                          lm_head_screen="off")))
    assert on.draft.describe()["lm_head"] == "screened (greedy)"
    seen = []
    on.draft.forward = _spy(on.draft.forward, seen)
    for prompt in ("def main(argv):\n    ", "class A:\n    def"):
        a = on.generate(prompt, 20, method="draft", num_speculative_tokens=3, temperature=0)
        assert a.token_ids == off.generate(prompt, 20, method="draft", num_speculative_tokens=3,
                                           temperature=0).token_ids
        assert a.token_ids == off.generate(prompt, 20, method="none", temperature=0).token_ids
    assert seen and all(not np.isfinite(rows).all() for rows in seen)
    seen.clear()
    a = on.generate("def main(argv):\n    ", 16, method="draft", num_speculative_tokens=3, temperature=0.9, seed=5)
    b = off.generate("def main(argv):\n    ", 16, method="draft", num_speculative_tokens=3, temperature=0.9, seed=5)
    assert a.token_ids == b.token_ids
    assert seen and all(np.isfinite(rows).all() for rows in seen)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_untied"])
def test_other_architectures_decode_greedy_through_the_screen_exactly(arch, workdir, tokenizer_path):
    """Untied heads (their own [V, K] weight) and the Llama / Qwen fused graphs: greedy through the screen equals
    the portable graph's greedy output, and the screen decided calls."""
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.runtime import load

    base = workdir / "lm_head_screen_arch" / arch
    target = make_checkpoint(base / "ckpt", arch, tokenizer_path, layers=2, seed=5)
    bundle = compile_bundle(CompileSpec(target, base / "bundle", max_seq_len=64, max_draft_tokens=4,
                                        lm_head_screen="on", ort_graph="both"))
    screened, portable = load(bundle), load(bundle, backend="ort-portable")
    seen = []
    screened.target.forward = _spy(screened.target.forward, seen)
    for method, k in (("none", 0), ("ngram", 3)):
        a = screened.generate("import json\nimport json\nimport", 20, method=method, num_speculative_tokens=k,
                              temperature=0)
        assert a.token_ids == portable.generate("import json\nimport json\nimport", 20, method="none",
                                                temperature=0).token_ids
    assert any(not np.isfinite(rows).all() for rows in seen)


def test_forcing_the_screen_where_it_cannot_be_built_is_one_line_and_exit_2(workdir, tokenizer_path, tmp_path):
    from helpers import run_cli

    target = make_checkpoint(workdir / "lm_head_screen_h48", "qwen3", tokenizer_path, layers=1, hidden=48, seed=2)
    out = run_cli("compile", "--target", target, "-o", tmp_path / "b", "--max-seq-len", "32", "--lm-head-screen", "on")
    assert out.returncode == 2
    assert "--lm-head-screen on: hidden size 48 is not a multiple of 32" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "b").exists()
