"""GGUF tensor types a real file carries (llama.cpp's F16/BF16, the legacy Q4_0..Q5_1 quants, K-quants, files that
mix them), tied output, and a SentencePiece ("llama") tokenizer: each compiles, and greedy output (plain and
`auto`) equals transformers loading the same file. The `gguf` package cannot write K-quants, so
tests/gguf_kquants.py encodes them; its blocks are first checked against the package's own dequantizer."""

import numpy as np
import pytest
from gguf import GGUFValueType as T

from gguf_kquants import encode
from gguf_writer import transformers_greedy, write_gguf
from helpers import make_checkpoint

from specrt.bundle.manifest import read_manifest
from specrt.compiler import CompileSpec, compile_bundle

PROMPTS = ("import os\ndef main(", "    parser.add_argument(")
K_MIXED = {"token_embd.weight": "Q6_K", "output.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K"}  # like Q4_K_M
EXTRA_META = {"general.tags": (["a", "b"], T.ARRAY), "quantize.imatrix.file": ("x.dat", T.STRING),
              "llama.unknown.key": (3, T.UINT32), "tokenizer.ggml.eot_token_id": (5, T.UINT32)}  # ignored
CASES = {  # name: (checkpoint hidden size, write_gguf options, quantization recorded in the manifest)
    "F16": (64, dict(qtype="F16"), "F16"),
    "BF16": (64, dict(qtype="BF16", meta=EXTRA_META), "BF16"),
    "Q4_1": (64, dict(qtype="Q4_1"), "Q4_1"),
    "Q5_0": (64, dict(qtype="Q5_0"), "Q5_0"),
    "Q5_1": (64, dict(qtype="Q5_1"), "Q5_1"),
    "Q4_K_M": (256, dict(qtype="Q4_K", types=K_MIXED), "Q4_K"),  # K-quants need rows of 256 values
    "tied-spm-Q4_0": (64, dict(qtype="Q4_0", types={"token_embd.weight": "Q8_0"}, drop=("output.weight",),
                               tokenizer="llama"), "Q4_0"),
}


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_kquant_encoder_matches_the_gguf_dequantizer(qtype):
    import gguf

    x = np.random.default_rng(0).normal(0, 0.1, (4, 512)).astype(np.float32)
    back = gguf.quants.dequantize(encode(x, qtype), getattr(gguf.GGMLQuantizationType, qtype))
    step = {"Q4_K": 15, "Q6_K": 31}[qtype]
    assert back.shape == x.shape and np.abs(back - x).max() < 2 * np.abs(x).max() / step


@pytest.fixture(scope="module")
def typed(tmp_path_factory, tokenizer_path, llama_target):
    d = tmp_path_factory.mktemp("gguf-types")
    wide = make_checkpoint(d / "wide", "llama", tokenizer_path, layers=1, hidden=256, seed=0)
    out = {}
    for name, (hidden, kw, _) in CASES.items():
        f = write_gguf(wide if hidden == 256 else llama_target, d / f"{name}.gguf", **kw)
        out[name] = (f, compile_bundle(CompileSpec(f, d / f"{name}-bundle", max_seq_len=96, max_draft_tokens=4)))
    return out


@pytest.mark.slow  # seven GGUF compiles (module fixture)
@pytest.mark.parametrize("name", CASES)
def test_greedy_equals_transformers(typed, name):
    import transformers as tf

    from specrt.runtime import load

    gguf_file, bundle = typed[name]
    src = read_manifest(bundle).models["target"].source
    assert src["quantization"] == CASES[name][2]
    hf_tok = tf.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    gen = load(bundle, backend="ort")
    for text in PROMPTS:
        ids = hf_tok.encode(text)
        assert gen.tokenizer.encode(text) == ids, "the bundle tokenizes like transformers (BOS included)"
        expected = transformers_greedy(gguf_file, ids, 16)
        for method in ("none", "auto"):
            res = gen.generate(ids, 16, method=method)
            n = len(res.token_ids)
            assert res.token_ids == expected[:n] and (n == 16 or res.token_ids[-1] in gen.eos_ids), method
