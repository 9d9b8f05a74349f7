"""Medusa proposer: the target's own extra heads draft up to H tokens from one hidden state.

After each verify pass the hidden state at the last accepted position (index j of the pass) is the
input of the heads: the target's lm_head there gave the token just emitted (t + 1) and head i gives the
token at t + i + 2. Drafts are the heads' top-1 tokens (a point mass, so sampling stays lossless) —
Medusa-1's single chain; the heads graph runs once per step on one position.
"""

from __future__ import annotations

import numpy as np

from specrt.core.errors import BackendUnavailable
from specrt.runtime.proposers.base import Proposal


class MedusaHeadsRunner:
    """ONNX Runtime session for `medusa/heads.onnx`: hidden [N, D] -> logits [N, H, V]."""

    def __init__(self, onnx_path, threads: int | None = None) -> None:
        from specrt.runtime.backends.ort.runner import import_ort, small_session_options

        try:
            ort = import_ort()
        except BackendUnavailable as exc:
            raise BackendUnavailable(f"Medusa heads run on ONNX Runtime: {exc}") from None
        opts = small_session_options(ort, threads or 1)  # one position per step: tiny matmuls
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        return self.session.run(["medusa_logits"], {"hidden_states": hidden.astype(np.float32, copy=False)})[0]

    def close(self) -> None:
        """Release the session (idempotent); the Generator closes it with its runners."""
        self.session = None


class MedusaProposer:
    name = "medusa"

    def __init__(self, heads: MedusaHeadsRunner, num_heads: int) -> None:
        self.heads = heads
        self.num_heads = num_heads
        self._hidden: np.ndarray | None = None  # [1, D] hidden state at the last accepted position

    @classmethod
    def from_manifest(cls, manifest, cache: dict | None = None) -> "MedusaProposer":
        """Heads from the bundle's `medusa` entry; `cache` keeps the heads session across requests."""
        cache = cache if cache is not None else {}
        if "heads" not in cache:
            cache["heads"] = MedusaHeadsRunner(manifest.path(manifest.medusa.onnx))
        return cls(cache["heads"], manifest.medusa.num_heads)

    def start(self, tokens: np.ndarray, n: int, target_hidden: np.ndarray | None = None) -> None:
        # The prefill's last position predicted the first generated token (tokens[n - 1]).
        if target_hidden is None:
            raise ValueError("the Medusa proposer needs the target's hidden states (want_hidden=True)")
        self._hidden = target_hidden[-1:].copy()

    def propose(self, tokens: np.ndarray, n: int, k: int) -> Proposal:
        logits = self.heads(self._hidden)[0]  # [H, V]
        return Proposal.point_mass(logits[: min(k, self.num_heads)].argmax(axis=-1).astype(np.int64), calls=1)

    def observe(self, n: int, num_accepted: int, target_hidden: np.ndarray | None = None) -> None:
        # Row j of the verify pass: the last accepted position (its lm_head gave the token just emitted).
        self._hidden = target_hidden[num_accepted:num_accepted + 1].copy()
