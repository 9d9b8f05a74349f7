"""Trust in the bundle (issue 10 #9-#11): every opened file listed and verified, nothing outside the root,
manifest values validated with typed errors naming the key."""

import json
import shutil
from pathlib import Path

import pytest

from specrt.bundle.manifest import read_manifest
from specrt.core.errors import BundleError, ManifestError


@pytest.fixture
def bundle(tmp_path, pair_bundle):
    return Path(shutil.copytree(pair_bundle, tmp_path / "b"))


def edit(bundle: Path, fn) -> None:
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def test_empty_file_list_is_refused(bundle):
    (bundle / "target" / "model.onnx.data").write_bytes(b"\0" * 100)  # corrupted, and nothing would notice
    edit(bundle, lambda m: m.update(files={}))
    with pytest.raises(ManifestError, match="no file list"):
        read_manifest(bundle)


def test_model_entry_pointing_at_an_unlisted_file_is_refused(bundle):
    shutil.copy(bundle / "target" / "model.onnx", bundle / "target" / "other.onnx")
    edit(bundle, lambda m: m["models"]["target"].update(onnx="target/other.onnx"))
    with pytest.raises(ManifestError, match="models.target.onnx.*not in the manifest's file list"):
        read_manifest(bundle)


def test_unlisted_files_are_never_opened(pair_generator):
    with pytest.raises(BundleError, match="not listed"):
        pair_generator.manifest.path("target/other.onnx")


def test_directory_symlink_out_of_the_bundle_is_refused(bundle, tmp_path):
    shutil.move(bundle / "target", tmp_path / "elsewhere")
    (bundle / "target").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(BundleError, match="outside the bundle"):
        read_manifest(bundle)


@pytest.mark.parametrize("value", [256, 10**15, 1e15, "128", None])
def test_edited_max_seq_len_is_refused(bundle, value):
    edit(bundle, lambda m: m.update(max_seq_len=value))
    with pytest.raises(ManifestError, match="max_seq_len"):
        read_manifest(bundle)


def test_decoder_config_must_match_the_graph(bundle):
    edit(bundle, lambda m: m["models"]["target"]["decoder_config"].update(num_kv_heads=4))
    with pytest.raises(ManifestError, match="num_kv_heads"):
        read_manifest(bundle)


@pytest.mark.parametrize("tamper, key", [
    (lambda m: m["models"]["target"].pop("onnx"), "models.target.onnx"),
    (lambda m: m["models"].update(target=[1, 2]), "models.target"),
    (lambda m: m["models"]["target"]["decoder_config"].pop("hidden_size"), "decoder_config"),
    (lambda m: m.update(tokenizer="tok.json"), "tokenizer"),
    (lambda m: m["files"]["target/model.onnx"].update(size="big"), "size"),
    (lambda m: m.update(max_draft_tokens=-1), "max_draft_tokens"),
    (lambda m: m["tokenizer"].update(vocab_size="320"), "tokenizer.vocab_size"),  # was accepted
])
def test_malformed_manifest_values_name_the_key(bundle, tamper, key):
    edit(bundle, tamper)
    with pytest.raises(ManifestError, match=key.replace(".", r"\.")):
        read_manifest(bundle)


def specrt_generate(bundle):
    from helpers import run_cli

    return run_cli("generate", bundle, "--prompt", "x", "--max-new-tokens", "2", "--backend", "ort")


@pytest.mark.parametrize("content", [b"[1, 2, 3]", b"\xff\xfe{\x00", b'{"format": "specrt-bundle", "format_version": 1}'])
def test_malformed_manifest_exits_2_with_one_line(bundle, content):
    (bundle / "manifest.json").write_bytes(content)
    proc = specrt_generate(bundle)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "AttributeError" not in proc.stderr and "KeyError" not in proc.stderr


def test_tampered_config_via_cli_is_one_line_exit_2(bundle):
    edit(bundle, lambda m: m["models"]["target"]["decoder_config"].update(head_dim=32, num_kv_heads=1))
    proc = specrt_generate(bundle)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "decoder_config" in proc.stderr


def test_format_version_1_bundles_still_load(pair_bundle):
    m = read_manifest(pair_bundle)
    assert m.format_version == 1 and m.max_seq_len == 128


def test_available_memory_is_what_psutil_reports():
    import psutil

    from specrt.bundle.checks import available_memory

    assert abs(available_memory() - psutil.virtual_memory().available) < 512 * 2**20  # moves between the reads


def test_a_manifest_path_with_a_nul_character_is_refused(bundle):
    """A file name no file system holds: was `ValueError: embedded null byte` (exit 1) from load and inspect."""
    edit(bundle, lambda m: m["files"].update({"target/\x00x": {"sha256": "0" * 64, "size": 1}}))
    with pytest.raises(BundleError, match="NUL character"):
        read_manifest(bundle)
    proc = specrt_generate(bundle)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_bundle_path_that_is_a_file_says_so(tmp_path):
    (tmp_path / "bundle").write_text("not a bundle")
    with pytest.raises(BundleError, match="is a file, not a bundle directory"):
        read_manifest(tmp_path / "bundle")


@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_bundle_name_too_long_for_the_file_system_is_one_line(tmp_path, command):
    """Was `OSError: [Errno 36] File name too long` (exit 1) from inspect, generate and load."""
    from helpers import run_cli

    long = tmp_path / ("x" * 300)
    with pytest.raises(BundleError, match="File name too long"):
        read_manifest(long)
    extra = ("--prompt", "x") if command == "generate" else ()
    proc = run_cli(command, long, *extra)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "File name too long" in proc.stderr and "OSError" not in proc.stderr, proc.stderr


def test_a_truncated_data_file_with_a_rewritten_manifest_entry_is_refused(bundle):
    """Sizes and sha256 edited to match a cut external-data file: was ONNX Runtime's multi-kilobyte `Deserialize
    tensor ... failed` (BackendError, exit 1) at the first session, and `inspect` reported the bundle as fine."""
    import hashlib

    m = json.loads((bundle / "manifest.json").read_text())
    rel = m["models"]["target"]["graphs"]["fused"]["onnx_data"]
    data = bundle / rel
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    edit(bundle, lambda m: m["files"].update({rel: {"sha256": hashlib.sha256(data.read_bytes()).hexdigest(),
                                                    "size": data.stat().st_size}}))
    with pytest.raises(ManifestError, match=f"reads \\d+ bytes of {rel}, which holds {data.stat().st_size}"):
        read_manifest(bundle)
    from helpers import run_cli

    proc = run_cli("inspect", bundle)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
