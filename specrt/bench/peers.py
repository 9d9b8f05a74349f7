"""The peer libraries of `specrt bench --peer NAME` (repeatable) and one peer's measurements in a run.

    hf          Hugging Face transformers (peer_hf.py; runs after our measurements)
    ort-genai   onnxruntime-genai, plain / draft / n-gram (peer_ortgenai.py)
    llama.cpp   llama-cpp-python on the bundle's GGUF, plain / prompt lookup (peer_llamacpp.py)

ort-genai and llama.cpp are interleaved with ours: per repeat and prompt, after our configurations.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from specrt.bench.measure import settle
from specrt.bench.peer_common import Peer, PeerConfig, agreement, ratios, result_rows

# name -> (module that must be importable, the extra that installs it)
PEERS: dict[str, tuple[str, str]] = {
    "hf": ("transformers", "bench"),
    "ort-genai": ("onnxruntime_genai", "peers"),
    "llama.cpp": ("llama_cpp", "peers"),
}
INTERLEAVED = ("ort-genai", "llama.cpp")


def create(name: str, gen, settings, progress: Callable[[str], None] | None = None) -> Peer:
    if name == "ort-genai":
        from specrt.bench.peer_ortgenai import OrtGenaiPeer

        return OrtGenaiPeer(gen, settings, progress)
    if name == "llama.cpp":
        from specrt.bench.peer_llamacpp import LlamaCppPeer

        return LlamaCppPeer(gen, settings, progress)
    raise ValueError(f"not an interleaved peer: {name!r}")


class Session:
    """One peer's timings, agreement with our greedy output and counters over a bench run."""

    def __init__(self, peer: Peer, prompts):
        self.peer = peer
        self.prompts = prompts
        self.configs = peer.configs()
        self.timings: dict[PeerConfig, list[tuple[str, int, float]]] = {c: [] for c in self.configs}
        self.agree: dict[PeerConfig, list[float]] = {c: [] for c in self.configs}
        self.counters: dict[PeerConfig, list[int]] = {c: [0, 0] for c in self.configs}  # drafted, accepted

    def runs_per_prompt(self, repeats: int) -> int:
        return len(self.warm_up_configs()) + repeats * len(self.configs)

    def warm_up_configs(self) -> list[PeerConfig]:
        """Plain and one configuration per kind (the largest integer k)."""
        by_kind: dict[str, PeerConfig] = {}
        for c in self.configs:
            if c.kind not in by_kind or (c.k != "auto" and (by_kind[c.kind].k == "auto" or c.k > by_kind[c.kind].k)):
                by_kind[c.kind] = c
        return list(by_kind.values())

    def warm_up(self, prompt_ids: np.ndarray, tick: Callable[[str], None]) -> None:
        for c in self.warm_up_configs():
            tick(f"peer {self.peer.name} warm-up {c.label}")
            self.peer.generate(prompt_ids.tolist(), c)

    def measure(self, i: int, prompt_ids: np.ndarray, repeat: int, reference: list[int],
                tick: Callable[[str], None]) -> None:
        order = self.configs if repeat % 2 == 0 else self.configs[::-1]
        suite = self.prompts[i].suite
        for c in order:
            tick(f"peer {self.peer.name} repeat {repeat + 1} {suite} #{i} {c.label}")
            settle()  # after ours, or after the peer's other model (plain / speculative)
            run = self.peer.generate(prompt_ids.tolist(), c)
            self.timings[c].append((suite, repeat, len(run.token_ids) / run.seconds if run.seconds > 0 else 0.0))
            self.counters[c][0] += run.drafted
            self.counters[c][1] += run.accepted
            if repeat == 0:
                self.agree[c].append(agreement(reference, run.token_ids))
        settle()  # before ours (or the next peer) runs again

    def result(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        results = result_rows(self.configs, self.timings, self.agree, self.prompts, rows, self.counters)
        return {**self.peer.describe(), "throughput": "end to end (prefill included) for both sides",
                "results": results, "ratios": ratios(results, rows)}
