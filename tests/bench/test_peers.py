"""`specrt bench --peer ort-genai | llama.cpp`: a one-line error when the library is missing (checked before
anything is measured), and, where the libraries are installed (`pip install 'specrt[peers]'`), real runs on
the tiny pair and a tiny GGUF: same tokens as ours, rows beside ours, the ratio line, cached builds."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from gguf_writer import write_llama_gguf

from specrt.bench.peer_ortgenai import precision_of
from specrt.bundle.entries import QuantizationEntry
from specrt.bench.peer_sources import Source
from specrt.bench.runner import BenchSettings
from specrt.cli.main import main
from specrt.core.errors import InvalidArgument

SMALL = ["--repeats", "1", "--max-new-tokens", "12", "--prompts-per-suite", "1", "--suite", "code,grounded",
         "--quiet"]
HAS_GENAI = importlib.util.find_spec("onnxruntime_genai") is not None
HAS_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_genai = pytest.mark.skipif(not HAS_GENAI, reason="needs onnxruntime-genai (pip install 'specrt[peers]')")
needs_llama = pytest.mark.skipif(not HAS_LLAMA, reason="needs llama-cpp-python (pip install 'specrt[peers]')")


def run_blocked(args, block):
    """`specrt bench ...` in a subprocess where the modules in `block` cannot be imported."""
    code = ("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in block) +
            "from specrt.cli.main import main\nmain(prog_name='specrt')")
    return subprocess.run([sys.executable, "-c", code, "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("peer, module", [("ort-genai", "onnxruntime_genai"), ("llama.cpp", "llama_cpp")])
def test_missing_peer_library_is_one_line_before_measuring(pair_bundle, tmp_path, peer, module):
    js = tmp_path / "r.json"
    proc = run_blocked([pair_bundle, *SMALL, "--peer", peer, "--json", js], block=[module])
    assert proc.returncode == 2
    assert proc.stderr == f"error: --peer {peer} needs {module}, which is not installed: pip install 'specrt[peers]'\n"
    assert not js.exists()


def test_llama_cpp_needs_a_bundle_from_a_gguf(pair_generator, pair_bundle, llama_target):
    from specrt.bench.peer_llamacpp import LlamaCppPeer

    with pytest.raises(InvalidArgument, match="needs a bundle compiled from a GGUF file"):
        LlamaCppPeer(pair_generator, BenchSettings(pair_bundle, target_checkpoint=llama_target))


def test_builder_precision_follows_the_bundles_quantization(llama_target):
    plain = Source("target", "hf", llama_target, "0" * 64)
    assert precision_of(plain) == ("fp32", [])
    q = QuantizationEntry(graphs={}, type="int4", block_size=32, symmetric=True, accuracy_level=4)
    assert precision_of(Source("target", "hf", llama_target, "0" * 64, q)) == (
        "int4", ["block_size=32", "is_symmetric=true", "accuracy_level=4"])


def test_unknown_peer_is_refused():
    with pytest.raises(InvalidArgument, match="--peer must be one of hf, ort-genai, llama.cpp"):
        BenchSettings("b", peer=("vllm",))


def bench(*args, env=None):
    return CliRunner().invoke(main, ["bench", *map(str, args)], env=env)


@pytest.mark.slow  # two runs of onnxruntime-genai's builder (subprocesses importing torch): ~17 s
@needs_genai
def test_ort_genai_on_the_pair(pair_bundle, llama_target, llama_draft, tmp_path):
    js, md = tmp_path / "og.json", tmp_path / "og.md"
    cache = tmp_path / "cache"
    res = bench(pair_bundle, *SMALL, "--methods", "draft,ngram", "--k", "2,auto", "--peer", "ort-genai",
                "--target-checkpoint", llama_target, "--draft-checkpoint", llama_draft, "--ttft-prompt-tokens", 100,
                "--json", js, "--markdown", md, env={"SPECRT_CACHE": str(cache)})
    assert res.exit_code == 0, res.output
    out = json.loads(js.read_text())
    peer = out["peers"]["ort-genai"]
    assert out["peer"] is None  # the transformers peer did not run
    assert peer["library"] == "onnxruntime-genai" and peer["precision"]["target"] == "fp32"
    assert peer["threads"] == out["machine"]["threads"]
    got = {(r["peer"], r["k"]) for r in peer["results"] if r["suite"] == "overall"}
    assert got == {("plain", 0), ("draft", 2), ("draft", "auto"), ("ngram", 2), ("ngram", "auto")}
    for r in peer["results"]:
        assert r["token_agreement"] == pytest.approx(1.0), r  # same fp32 weights, greedy
        assert r["ratio_ours_over_theirs"] > 0
    draft2 = next(r for r in peer["results"] if r["suite"] == "overall" and (r["peer"], r["k"]) == ("draft", 2))
    assert 0.0 <= draft2["acceptance_rate"] <= 1.0  # its own counters: drafting really ran
    assert peer["ratios"]["plain"]["ratio"] > 0 and len(peer["ratios"]["speculative"]) == 4
    configs = list((cache / "bench-peers" / "ort-genai").rglob("genai_config.json"))
    assert len(configs) == 3  # target, draft and the speculative composite, cached
    assert out["ttft"]["prompt_tokens"] == 100 and out["ttft"]["peers"]["ort-genai"]["seconds"]["median"] > 0
    text = md.read_text()
    assert "### Peer: onnxruntime-genai" in text and "ours / onnxruntime-genai, end to end: plain / plain" in text
    assert "### Time to first token" in text
    # a second run reuses the cached build (the builder is not run again); without the draft's checkpoint its
    # draft-model decoding is left out, with a note saying why
    stamp = {p: p.stat().st_mtime_ns for p in (cache / "bench-peers").rglob("genai_config.json")}
    res = bench(pair_bundle, *SMALL, "--methods", "draft,ngram", "--k", "2", "--peer", "ort-genai",
                "--target-checkpoint", llama_target, "--json", js, env={"SPECRT_CACHE": str(cache)})
    assert res.exit_code == 0, res.output
    assert {p: p.stat().st_mtime_ns for p in (cache / "bench-peers").rglob("genai_config.json")} == stamp
    peer = json.loads(js.read_text())["peers"]["ort-genai"]
    assert {(r["peer"], r["k"]) for r in peer["results"] if r["suite"] == "overall"} == {("plain", 0), ("ngram", 2)}
    assert "--draft-checkpoint" in peer["notes"][0]


@pytest.fixture(scope="module")
def gguf_bundle(tmp_path_factory, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle

    d = tmp_path_factory.mktemp("peer-gguf-bundle")
    gguf = write_llama_gguf(llama_target, d / "tiny.gguf", "F32")
    return gguf, compile_bundle(CompileSpec(gguf, d / "bundle", max_seq_len=128, max_draft_tokens=4))


@pytest.mark.slow  # a GGUF compile, llama.cpp's warm-up and timed runs: ~25 s
@needs_llama
def test_llama_cpp_on_the_gguf_the_bundle_came_from(gguf_bundle, tmp_path):
    gguf, bundle = gguf_bundle
    js = tmp_path / "ll.json"
    res = bench(bundle, *SMALL, "--methods", "ngram", "--k", "2,auto", "--peer", "llama.cpp",
                "--target-checkpoint", gguf, "--ttft-prompt-tokens", 100, "--json", js,
                env={"SPECRT_CACHE": str(tmp_path / "cache")})
    assert res.exit_code == 0, res.output
    peer = json.loads(js.read_text())["peers"]["llama.cpp"]
    assert peer["gguf"] == str(gguf) and peer["threads"] == json.loads(js.read_text())["machine"]["threads"]
    got = {(r["peer"], r["k"]) for r in peer["results"] if r["suite"] == "overall"}
    assert got == {("plain", 0), ("lookup", 2)}  # no adaptive k in llama.cpp's prompt lookup
    for r in peer["results"]:
        assert r["token_agreement"] == pytest.approx(1.0), r  # F32 GGUF: the weights we compiled
    assert peer["ratios"]["plain"]["ratio"] > 0


@pytest.mark.slow  # the GGUF compile above (8 s) when run alone
@needs_llama
def test_llama_cpp_refuses_another_gguf(gguf_bundle, tmp_path, llama_target):
    _, bundle = gguf_bundle
    other = write_llama_gguf(llama_target, tmp_path / "other.gguf", "Q8_0")
    res = bench(bundle, *SMALL, "--k", "2", "--peer", "llama.cpp", "--target-checkpoint", other)
    assert res.exit_code == 2 and "compiled from tiny.gguf" in res.output and "Traceback" not in res.output


def test_every_switch_between_engines_waits_untimed_for_spinning_threads(monkeypatch):
    """Another engine's pool threads spin for 10-50 ms after its run (measure.SETTLE_S): the peer session
    waits before each of the peer's runs (after ours, or after its other model) and before handing back."""
    from specrt.bench import peers
    from specrt.bench.peer_common import PeerConfig, PeerRun
    from specrt.bench.suites import Prompt

    events: list[str] = []
    monkeypatch.setattr(peers, "settle", lambda: events.append("settle"))

    class Recording:
        name = "recording"

        def configs(self):
            return [PeerConfig("plain", 0, "none"), PeerConfig("draft", 2, "draft")]

        def generate(self, prompt_ids, config, max_new_tokens=None):
            events.append(f"run {config.label}")
            return PeerRun([1, 2], 0.01, 0, 0)

    session = peers.Session(Recording(), [Prompt("code", "x")])
    session.measure(0, np.array([5, 6]), 0, [1, 2], lambda desc: None)
    assert events == ["settle", "run plain", "settle", "run draft k=2", "settle"]
