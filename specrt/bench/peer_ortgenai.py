"""`--peer ort-genai`: onnxruntime-genai on the same checkpoints, prompts, token budget and threads.

Its model builder (`python -m onnxruntime_genai.models.builder -e cpu`) exports each checkpoint, fp32, or
int4 / int8 (MatMulNBits, the bundle's block size, symmetry and accuracy level) when the bundle's model is
quantized; a GGUF source goes through transformers' GGUF reader first (the weights specrt compiled). Builds
are cached under `peer_cache_dir()/ort-genai/<version>/`, keyed by the checkpoint's sha256 and precision.

Measured, greedy, prompt token ids fed directly (our tokenizer), EOS = the bundle's EOS ids, intra-op
threads = ours (the draft's session gets our draft's threads):

    plain        the target alone
    draft k      its speculative decoding: `model.type = "speculative"` with the draft as `model.draft`,
                 `set_speculative_options(max_draft_tokens=k)`; k=auto: `min_adaptive_k=2` (its adaptive width)
    ngram k      its n-gram decoding on the target: `ngram_size=4` (the last 3 tokens, our longest n-gram),
                 `max_draft_tokens=k`; k=auto: `min_adaptive_k=2`
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from specrt.core.errors import SpecrtError
from specrt.bench.peer_common import Peer, PeerConfig, PeerRun
from specrt.bench.peer_sources import Source, cached, hf_checkpoint, peer_cache_dir, resolve

NGRAM_SIZE = 4
ADAPTIVE_START = 2
MAX_K = 16  # its limit on max_draft_tokens
BUILD_TIMEOUT_S = 3600


class PeerError(SpecrtError):
    """The peer library failed (its builder, its runtime): the message quotes its last line."""

    exit_code = 1


def precision_of(source: Source) -> tuple[str, list[str]]:
    """Builder precision and extra options matching the bundle's quantization of this model."""
    q = source.quantization
    if q is None or q.type not in ("int4", "int8"):
        return "fp32", []
    symmetric = True if q.symmetric is None else bool(q.symmetric)
    extra = [f"block_size={int(q.block_size or 32)}", f"is_symmetric={str(symmetric).lower()}"]
    if q.accuracy_level is not None:
        extra.append(f"accuracy_level={int(q.accuracy_level)}")
    return q.type, extra


def _version() -> str:
    import onnxruntime_genai as og

    return og.__version__


def build(source: Source, progress=None) -> Path:
    """The builder's output directory for `source` (cached)."""
    precision, extra = precision_of(source)
    name = "-".join([precision, source.key, *(e.replace("=", "") for e in extra)])
    final = peer_cache_dir() / "ort-genai" / _version() / name
    if final.exists():
        return final
    checkpoint = hf_checkpoint(source)
    if progress:
        progress(f"peer ort-genai: build {source.role} ({precision})")

    def run(tmp: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="og-hf-cache-") as hf_cache:
            cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(tmp),
                   "-p", precision, "-e", "cpu", "-c", hf_cache]
            if extra:
                cmd += ["--extra_options", *extra]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise PeerError(f"onnxruntime-genai's builder took over {BUILD_TIMEOUT_S}s on {checkpoint}") from None
        if proc.returncode != 0 or not (tmp / "genai_config.json").is_file():
            last = ([line for line in proc.stderr.splitlines() if line.strip()] or ["no output"])[-1]
            raise PeerError(f"onnxruntime-genai's builder failed on {checkpoint} ({precision}): {last}")

    return cached(final, run)


def speculative_dir(target_dir: Path, draft_dir: Path) -> Path:
    """A composite model: genai_config.json with `model.draft`, target/ and draft/ linked (it refuses '..')."""
    final = peer_cache_dir() / "ort-genai" / _version() / f"spec-{target_dir.name}-{draft_dir.name}"

    def run(tmp: Path) -> None:
        t = json.loads((target_dir / "genai_config.json").read_text())
        d = json.loads((draft_dir / "genai_config.json").read_text())
        (tmp / "target").symlink_to(target_dir.resolve(), target_is_directory=True)
        (tmp / "draft").symlink_to(draft_dir.resolve(), target_is_directory=True)
        model = {key: v for key, v in t["model"].items() if key != "decoder"}
        decoder, draft = copy.deepcopy(t["model"]["decoder"]), copy.deepcopy(d["model"]["decoder"])
        decoder["filename"] = f"target/{decoder['filename']}"
        draft["filename"] = f"draft/{draft['filename']}"
        model.update(type="speculative", decoder=decoder, draft=draft)
        config = {"model": model, "search": t["search"], "speculative": {"max_draft_tokens": 4}}
        (tmp / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")

    return cached(final, run)


class OrtGenaiPeer(Peer):
    name = "ort-genai"

    def __init__(self, gen, settings, progress=None):
        import onnxruntime_genai as og

        self.og = og
        self.settings = settings
        self.max_new_tokens = settings.max_new_tokens
        self.eos = sorted(gen.eos_ids)
        self.threads = gen.target.describe().get("threads")
        self.draft_threads = gen.draft.describe().get("threads") if gen.draft is not None else None
        target, draft = resolve(gen.manifest, settings, self.name)
        self.sources = {"target": target, "draft": draft}
        self.notes = []
        if gen.draft is not None and draft is None:
            self.notes.append("its draft-model decoding was not measured: the draft's checkpoint is not recorded "
                              "in the bundle (pass --draft-checkpoint)")
        self.dirs = {"target": build(target, progress)}
        if draft is not None and (not settings.methods or "draft" in settings.methods) and not settings.simulate:
            self.dirs["draft"] = build(draft, progress)
            self.dirs["speculative"] = speculative_dir(self.dirs["target"], self.dirs["draft"])
        if progress:
            progress("peer ort-genai: load")
        self.plain = self._load(self.dirs["target"])
        self.spec = self._load(self.dirs["speculative"], draft=True) if "speculative" in self.dirs else None

    def _load(self, path: Path, draft: bool = False):
        og = self.og
        config = og.Config(str(path))
        model: dict[str, Any] = {"eos_token_id": self.eos, "pad_token_id": self.eos[0] if self.eos else 0}
        if self.threads:
            model["decoder"] = {"session_options": {"intra_op_num_threads": int(self.threads)}}
        if draft and self.draft_threads:
            model["draft"] = {"session_options": {"intra_op_num_threads": int(self.draft_threads)}}
        config.overlay(json.dumps({"model": model}))
        try:
            return og.Model(config)
        except Exception as exc:  # its errors are RuntimeError with the reason
            raise PeerError(f"onnxruntime-genai cannot load {path}: {str(exc).splitlines()[0]}") from None

    def configs(self) -> list[PeerConfig]:
        out = [PeerConfig("plain", 0, "none")]
        if self.settings.simulate:
            return out
        methods = self.settings.methods or ("draft", "ngram")
        ks = [k for k in self.settings.ks if k == "auto" or int(k) <= MAX_K]
        if self.spec is not None and "draft" in methods:
            out += [PeerConfig("draft", k, "draft") for k in ks]
        if "ngram" in methods:
            out += [PeerConfig("ngram", k, "ngram") for k in ks]
        return out

    def _options(self, config: PeerConfig) -> dict[str, Any] | None:
        if config.kind == "plain":
            return None
        opts: dict[str, Any] = {"ngram_size": NGRAM_SIZE} if config.kind == "ngram" else {}
        if config.k == "auto":
            opts.update(min_adaptive_k=ADAPTIVE_START, max_draft_tokens=16)
        else:
            opts["max_draft_tokens"] = int(config.k)
        return opts

    def generate(self, prompt_ids: list[int], config: PeerConfig, max_new_tokens: int | None = None) -> PeerRun:
        og = self.og
        model = self.spec if config.kind == "draft" else self.plain
        options = self._options(config)
        ids = np.asarray([prompt_ids], dtype=np.int32)
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        budget = max_new_tokens or self.max_new_tokens
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + budget)
        if options:
            params.set_speculative_options(**options)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        seconds = time.perf_counter() - t0
        out = [int(t) for t in generator.get_sequence(0)][len(prompt_ids):]
        drafted = accepted = 0
        if options:
            stats = generator.get_speculative_stats()
            drafted, accepted = int(stats["draft_tokens_evaluated"]), int(stats["draft_tokens_accepted"])
        return PeerRun(out, seconds, drafted, accepted)

    def describe(self) -> dict[str, Any]:
        from importlib import metadata

        target, draft = self.sources["target"], self.sources["draft"]
        return {"library": "onnxruntime-genai", "version": _version(),
                "onnxruntime": metadata.version("onnxruntime"),
                "precision": {"target": precision_of(target)[0], "draft": precision_of(draft)[0] if draft else None},
                "threads": self.threads, "draft_threads": self.draft_threads if self.spec else None,
                "ngram_size": NGRAM_SIZE, "adaptive_start": ADAPTIVE_START,
                "target_checkpoint": str(target.path), "draft_checkpoint": str(draft.path) if draft else None,
                "builds": {k: str(v) for k, v in self.dirs.items()}, "execution_provider": "cpu", "notes": self.notes,
                "title": f"onnxruntime-genai {_version()} (CPU, {precision_of(target)[0]}, "
                         f"{self.threads} intra-op threads = ours)"}

    def close(self) -> None:
        self.plain = self.spec = None
