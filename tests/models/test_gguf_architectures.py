"""GGUF input beyond Llama: Qwen2, Qwen3, Gemma 3 and Mistral files written with the `gguf` package (llama.cpp's
names and conventions, see gguf_writer.py) compile, and greedy output equals transformers loading the same
file, plainly and speculatively (n-gram). Each written file is first checked against the checkpoint it came from
(transformers on the GGUF == transformers on the checkpoint), so a wrong convention in the writer cannot hide."""


import pytest
import torch

from gguf_writer import write_gguf
from helpers import hf_config

from specrt.bundle.manifest import read_manifest
from specrt.compiler import CompileSpec, compile_bundle

PROMPTS = ("import os\ndef main(", "    parser.add_argument(")
GEMMA3_WINDOW = 6
GEMMA3_LAYERS = 7  # the GGUF leaves layer_types at transformers' default pattern (5 sliding, 1 global): 0-4, 6 / 5


def gemma3_gguf_config(vocab: int):
    """Gemma 3 with what a GGUF file can express: transformers rebuilds query_pre_attn_scalar (256), the layer
    pattern and plain ropes from its defaults, so the checkpoint uses those too."""
    import transformers as tf

    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    return tf.Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=GEMMA3_LAYERS,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                               sliding_window=GEMMA3_WINDOW, rope_parameters=rope, eos_token_id=0, bos_token_id=None,
                               pad_token_id=None, initializer_range=0.1)


def make_model(path, arch: str, tokenizer):
    import shutil

    import transformers as tf
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    torch.manual_seed(0)
    if arch == "gemma3":
        config = gemma3_gguf_config(vocab)
    elif arch == "qwen3":  # head_dim 32 != hidden / heads (16) and != Qwen3Config's default 128
        config = hf_config("qwen3", vocab)
    else:
        config = hf_config(arch, vocab)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms away from their init, so a wrong norm convention shows
                p.normal_(1.0 if arch != "gemma3" else 0.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(str(path))
    shutil.copy(tokenizer, path / "tokenizer.json")
    return path


# every test here uses the module fixture that writes and compiles four GGUF models
pytestmark = pytest.mark.slow

ARCHS = ("qwen2", "qwen3", "gemma3", "mistral")
EXPECTED = {"qwen2": ("Qwen2ForCausalLM", "qwen2"), "qwen3": ("Qwen3ForCausalLM", "qwen3"),
            "gemma3": ("Gemma3ForCausalLM", "gemma3"), "mistral": ("LlamaForCausalLM", "llama")}


@pytest.fixture(scope="module")
def gguf_cases(tmp_path_factory, tokenizer_path):
    """arch -> (GGUF file, compiled bundle, checkpoint it was written from)."""
    d = tmp_path_factory.mktemp("gguf-archs")
    out = {}
    for arch in ARCHS:
        ckpt = make_model(d / arch, arch, tokenizer_path)
        qtype = "Q8_0" if arch == "qwen2" else "F32"
        # llama.cpp writes Mistral as "llama", named after the model (e.g. "Mistral 7B Instruct v0.3")
        name = "Mistral Tiny Instruct" if arch == "mistral" else None
        gguf_file = write_gguf(ckpt, d / f"{arch}-{qtype}.gguf", qtype, name=name)
        bundle = compile_bundle(CompileSpec(gguf_file, d / f"{arch}-bundle", max_seq_len=96, max_draft_tokens=4))
        out[arch] = (gguf_file, bundle, ckpt)
    return out


def hf_from_gguf(gguf_file):
    """transformers reading the file. Its Qwen3 config mapping skips `attention.key_length` (head_dim falls back to
    128), so the head size is passed as the file states it, as specrt does."""
    import gguf
    import transformers as tf

    folder, name = str(gguf_file.parent), gguf_file.name
    config = tf.AutoConfig.from_pretrained(folder, gguf_file=name)
    field = gguf.GGUFReader(str(gguf_file)).fields.get("qwen3.attention.key_length")
    if field is not None:
        config.head_dim = int(field.parts[field.data[0]][0])
    return tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=config, dtype=torch.float32).eval()


def greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "qwen2"])  # qwen2 is written as Q8_0: not exact
def test_written_file_is_the_checkpoint(gguf_cases, arch):
    import transformers as tf

    gguf_file, _, ckpt = gguf_cases[arch]
    ids = torch.arange(3, 3 + 4 * GEMMA3_WINDOW)[None] % 200
    with torch.no_grad():
        want = tf.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()(ids).logits
        got = hf_from_gguf(gguf_file)(ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_transformers_on_the_gguf(gguf_cases, arch):
    from specrt.runtime import load

    gguf_file, bundle, _ = gguf_cases[arch]
    model = hf_from_gguf(gguf_file)
    assert type(model).__name__ == EXPECTED[arch][0]
    gen = load(bundle, backend="ort")
    for text in PROMPTS:
        ids = gen.tokenizer.encode(text, add_special_tokens=False)
        expected = greedy(model, ids, 24)
        for method in ("none", "ngram"):
            res = gen.generate(ids, 24, method=method)
            n = len(res.token_ids)
            assert res.token_ids == expected[:n] and (n == 24 or res.token_ids[-1] in gen.eos_ids), (arch, method)


@pytest.mark.parametrize("arch", ARCHS)
def test_manifest_records_architecture_and_quantization(gguf_cases, arch):
    m = read_manifest(gguf_cases[arch][1])
    src = m.models["target"].source
    assert m.models["target"].architecture == EXPECTED[arch][0]
    assert src["gguf_architecture"] == EXPECTED[arch][1]
    assert src["quantization"] == ("Q8_0" if arch == "qwen2" else "F32")


def test_qwen3_head_size_comes_from_the_file(gguf_cases):
    """transformers alone reads this file with Qwen3's default head_dim (128) and fails; specrt uses the file's."""
    m = read_manifest(gguf_cases["qwen3"][1])
    assert m.models["target"].decoder_config.head_dim == 32


def test_gemma3_window_survives_the_gguf(gguf_cases):
    cfg = read_manifest(gguf_cases["gemma3"][1]).models["target"].decoder_config
    assert cfg.sliding_window == GEMMA3_WINDOW
    assert [t == "full_attention" for t in cfg.layer_types] == [i == 5 for i in range(GEMMA3_LAYERS)]


def _other_architecture(path):
    """A valid GGUF file of an architecture specrt does not compile from GGUF (phi3)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("case, message", [("other-arch", "GGUF architecture 'phi3' is not supported"),
                                           ("named-mistral", "general.name is exactly 'mistral'")])
def test_unreadable_file_is_a_one_line_error(tmp_path, gguf_cases, case, message):
    """Architectures outside the supported list, and the one name transformers misroutes (general.name exactly
    "mistral": a Mistral tensor map the gguf package lacks), fail compile with one line and exit 2."""
    if case == "other-arch":
        bad = _other_architecture(tmp_path / f"{case}.gguf")
    else:
        bad = write_gguf(gguf_cases["mistral"][2], tmp_path / f"{case}.gguf", "F32", name="mistral")
    from helpers import run_cli

    proc = run_cli("compile", "--target", bad, "-o", tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{case}.gguf" in errors[0] and message in errors[0], proc.stderr
    assert not (tmp_path / "out").exists()
