"""`--peer llama.cpp`: llama-cpp-python on the very GGUF file the bundle was compiled from.

Only for bundles compiled from a GGUF (`models.target.source.format == "gguf"`): llama.cpp runs the file as
it is (e.g. SmolLM2's Q4_1 weights, where specrt dequantized them to fp32), so token agreement measures
what the quantized weights change, not a bug. Greedy (`temp=0`: its greedy sampler; top_k 1, no repeat
penalty), prompt token ids fed directly, our EOS ids, `n_threads = n_threads_batch` = our threads, the
context cleared before every run (no prefix reuse between runs):

    plain      `Llama.generate`
    lookup k   `Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=k))`, its
               prompt-lookup decoding (longest n-gram 3, like ours); integer k only (it has no adaptive k).
               A separate instance: its speculation needs logits for every position (`logits_all`),
               which the plain instance does not pay for.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from specrt.core.errors import InvalidArgument
from specrt.bench.peer_common import Peer, PeerConfig, PeerRun
from specrt.bench.peer_sources import resolve

MAX_NGRAM = 3  # our n-gram proposer's longest match (runtime/proposers/ngram.py DEFAULT_MAX_N)


@contextlib.contextmanager
def _quiet_stderr():
    """llama.cpp prints model-loading chatter on the C stderr even with verbose=False."""
    fd = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


class LlamaCppPeer(Peer):
    name = "llama.cpp"

    def __init__(self, gen, settings, progress=None):
        target, _ = resolve(gen.manifest, settings, self.name)
        if target.kind != "gguf":
            raise InvalidArgument("--peer llama.cpp needs a bundle compiled from a GGUF file (or --target-checkpoint "
                                  f"FILE.gguf); the target's source is a checkpoint directory ({target.path})")
        self.source = target
        self.settings = settings
        self.eos = frozenset(int(e) for e in gen.eos_ids)
        self.threads = int(gen.target.describe().get("threads") or os.cpu_count() or 1)
        self.n_ctx = int(gen.max_seq_len) + 32  # prompt + budget fit our context; room for its last drafts
        if progress:
            progress("peer llama.cpp: load")
        self.plain = self._load(None)
        self.lookup = None
        if not settings.simulate and (not settings.methods or "ngram" in settings.methods) and self._ks():
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            self.lookup = self._load(LlamaPromptLookupDecoding(max_ngram_size=MAX_NGRAM, num_pred_tokens=self._ks()[0]))

    def _ks(self) -> list[int]:
        return [int(k) for k in self.settings.ks if k != "auto"]

    def _load(self, draft_model):
        from llama_cpp import Llama

        with _quiet_stderr():
            return Llama(model_path=str(self.source.path), n_ctx=self.n_ctx, n_threads=self.threads,
                         n_threads_batch=self.threads, draft_model=draft_model, seed=0, verbose=False)

    def configs(self) -> list[PeerConfig]:
        out = [PeerConfig("plain", 0, "none")]
        if self.lookup is not None:
            out += [PeerConfig("lookup", k, "ngram") for k in self._ks()]
        return out

    def generate(self, prompt_ids: list[int], config: PeerConfig, max_new_tokens: int | None = None) -> PeerRun:
        llm = self.plain if config.kind == "plain" else self.lookup
        if config.kind != "plain":
            llm.draft_model.num_pred_tokens = int(config.k)
        budget = max_new_tokens or self.settings.max_new_tokens
        out: list[int] = []
        t0 = time.perf_counter()
        llm.reset()
        for token in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if token in self.eos or len(out) >= budget:
                break
        return PeerRun(out, time.perf_counter() - t0)

    def describe(self) -> dict[str, Any]:
        from importlib import metadata

        version = metadata.version("llama_cpp_python")
        quant = None
        with contextlib.suppress(Exception):
            quant = self.plain.metadata.get("general.file_type")
        return {"library": "llama.cpp", "llama_cpp_python": version, "version": version,
                "gguf": str(self.source.path), "gguf_sha256": self.source.sha256, "gguf_file_type": quant,
                "threads": self.threads, "max_ngram_size": MAX_NGRAM,
                "title": f"llama-cpp-python {version} (CPU, {self.source.path.name} as is, "
                         f"{self.threads} threads = ours)"}

    def close(self) -> None:
        for llm in (self.plain, self.lookup):
            if llm is not None:
                with contextlib.suppress(Exception):
                    llm.close()
        self.plain = self.lookup = None
