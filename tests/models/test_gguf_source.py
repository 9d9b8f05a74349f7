"""GGUF input: files written with the `gguf` package from tiny checkpoints compile, and greedy output equals
transformers loading the same GGUF file."""

import json
import sys
import zipfile

import numpy as np
import pytest

from gguf_writer import transformers_greedy, write_llama_gguf
from helpers import run_cli

from specrt.bundle.manifest import read_manifest
from specrt.compiler import CompileSpec, compile_bundle
from specrt.core.errors import CheckpointError
from specrt.models.gguf_source import gguf_from_archive, sha256_file

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory, llama_target):
    d = tmp_path_factory.mktemp("gguf")
    return {q: write_llama_gguf(llama_target, d / f"tiny-{q}.gguf", q, chat_template=CHAT) for q in ("F32", "Q8_0")}


@pytest.fixture(scope="module")
def gguf_bundles(tmp_path_factory, gguf_files):
    d = tmp_path_factory.mktemp("gguf-bundles")
    return {q: compile_bundle(CompileSpec(f, d / q, max_seq_len=96, max_draft_tokens=4)) for q, f in gguf_files.items()}


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.slow  # two GGUF compiles (module fixture)
def test_gguf_greedy_equals_transformers(gguf_files, gguf_bundles, qtype):
    import transformers as tf

    from specrt.runtime import load

    gguf_file = gguf_files[qtype]
    hf_tok = tf.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    gen = load(gguf_bundles[qtype], backend="ort")
    for text in ("import os\ndef main(", "    parser.add_argument("):
        ids = hf_tok.encode(text, add_special_tokens=False)
        assert gen.tokenizer.encode(text, add_special_tokens=False) == ids, "the bundle tokenizes like transformers"
        expected = transformers_greedy(gguf_file, ids, 24)
        for method in ("none", "ngram"):
            res = gen.generate(ids, 24, method=method)
            n = len(res.token_ids)
            assert res.token_ids == expected[:n] and (n == 24 or res.token_ids[-1] in gen.eos_ids)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.slow
def test_manifest_records_the_source(gguf_files, gguf_bundles, qtype):
    m = read_manifest(gguf_bundles[qtype])
    src = m.models["target"].source
    assert src["format"] == "gguf" and src["quantization"] == qtype and src["gguf_architecture"] == "llama"
    assert src["sha256"] == sha256_file(gguf_files[qtype])
    assert m.tokenizer.chat_template is not None


@pytest.mark.slow
def test_quantized_file_really_differs_from_f32(gguf_bundles):
    """Q8_0 dequantized weights are not the F32 ones (the quantized path is exercised, not bypassed)."""
    import onnx
    from onnx import numpy_helper

    def embedding(b):
        model = onnx.load(str(b / "target" / "model.onnx"))
        return next(numpy_helper.to_array(t) for t in model.graph.initializer if "embed_tokens" in t.name)

    f32, q8 = embedding(gguf_bundles["F32"]), embedding(gguf_bundles["Q8_0"])
    assert 0 < np.abs(f32 - q8).max() < 0.02 * np.abs(f32).max()


@pytest.mark.slow
def test_chat_template_from_gguf_metadata(gguf_bundles):
    from specrt.runtime import load
    from specrt.runtime.chat_template import ChatFormatter, chat_prompt_ids

    gen = load(gguf_bundles["F32"], backend="ort")
    fmt = ChatFormatter.from_manifest(gen.manifest)
    assert fmt.kind == "checkpoint"
    assert fmt.render([{"role": "user", "content": "hi"}]) == ("<user>hi\n<assistant>", False)
    ids = chat_prompt_ids(gen, "hi", "be brief")
    assert gen.tokenizer.decode(ids) == "<system>be brief\n<user>hi\n<assistant>"


specrt = run_cli  # in-process (tests/helpers.py)


@pytest.mark.slow
def test_cli_generate_chat_and_inspect(gguf_bundles):
    proc = specrt("generate", gguf_bundles["F32"], "--chat", "hi", "--system", "be brief", "--max-new-tokens", 8,
                  "--json")
    assert proc.returncode == 0, proc.stderr
    from specrt.runtime import load
    from specrt.runtime.chat_template import chat_prompt_ids

    gen = load(gguf_bundles["F32"], backend="ort")
    expected = gen.generate(chat_prompt_ids(gen, "hi", "be brief"), 8, method="none").token_ids
    assert json.loads(proc.stdout)["token_ids"] == expected
    proc = specrt("inspect", gguf_bundles["Q8_0"])
    assert proc.returncode == 0, proc.stderr
    assert "chat template: tokenizer/" in proc.stdout and "GGUF tiny-Q8_0.gguf (Q8_0, llama)" in proc.stdout
    assert "greedy agreement" in proc.stdout


def test_cli_chat_without_template_falls_back_with_a_note(pair_bundle):
    proc = specrt("generate", pair_bundle, "--chat", "hi", "--max-new-tokens", 4, "--method", "none")
    assert proc.returncode == 0, proc.stderr
    assert "no chat template" in proc.stderr


@pytest.mark.parametrize("args, match", [(["--prompt", "x", "--chat", "y"], "exactly one"),
                                         ([], "exactly one"), (["--prompt", "x", "--system", "s"], "--system needs")])
def test_cli_generate_prompt_or_chat(pair_bundle, args, match):
    proc = specrt("generate", pair_bundle, *args)
    assert proc.returncode == 2 and match in proc.stderr and "Traceback" not in proc.stderr


def test_archive_must_hold_exactly_one_gguf(tmp_path, gguf_files):
    none, two = tmp_path / "none.whl", tmp_path / "two.zip"
    with zipfile.ZipFile(none, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
    with zipfile.ZipFile(two, "w") as zf:
        zf.write(gguf_files["F32"], "a/x.gguf")
        zf.write(gguf_files["F32"], "b/y.gguf")
    for archive, n in ((none, 0), (two, 2)):
        with pytest.raises(CheckpointError, match=f"exactly one .gguf file, found {n}"):
            gguf_from_archive(archive, tmp_path)
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    proc = specrt("compile", "--target", tmp_path / "bad.whl", "-o", tmp_path / "out")
    assert proc.returncode == 2 and "not a valid wheel/zip" in proc.stderr and not (tmp_path / "out").exists()


def test_corrupt_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    proc = specrt("compile", "--target", bad, "-o", tmp_path / "out")
    assert proc.returncode == 2 and "broken.gguf" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [bad]


def test_missing_extra_names_it(tmp_path, gguf_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    with pytest.raises(CheckpointError, match=r"pip install 'specrt\[gguf\]'"):
        compile_bundle(CompileSpec(gguf_files["F32"], tmp_path / "out", max_seq_len=64, max_draft_tokens=4))
