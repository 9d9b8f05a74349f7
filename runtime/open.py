"""Opening a bundle's models: the runners (and tokenizer) a `Generator` holds, and `open_batch_runner`.

Nothing here decodes; `load` (runtime/generator.py) validates the manifest and calls `open_models`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specrt.bundle.manifest import Manifest, read_manifest, verify_files
from specrt.core.errors import InvalidArgument
from specrt.core.tokenizer import Tokenizer
from specrt.runtime import backends
from specrt.runtime.arguments import check_threads

SMALL_DRAFT_PARAMETERS = 50_000_000  # a draft below this runs on one thread


@dataclasses.dataclass
class OpenedModels:
    target: Any  # Runner
    draft: Any  # Runner or None
    tokenizer: Tokenizer


def open_models(manifest: Manifest, backend: str, threads: int | None, target_device: str | None,
                draft_device: str | None) -> OpenedModels:
    """The target (and draft) runners of `manifest` on `backend` (resolved), and the tokenizer."""
    capacity, short = manifest.max_seq_len, manifest.max_draft_tokens + 2
    draft_entry = manifest.models.get("draft")
    # A small draft runs fastest on one thread (no pool synchronisation per tiny matmul); a larger one
    # gets a thread pool too, and then the two sessions must not spin against each other.
    small = draft_entry is not None and (draft_entry.num_parameters or 0) < SMALL_DRAFT_PARAMETERS
    draft_threads = 1 if small else threads
    alternating = draft_entry is not None and (draft_threads or backends.default_threads()) > 1

    def target_runner():
        return backends.create_runner(manifest, "target", backend, capacity=capacity, max_short_tokens=short,
                                      threads=threads,
                                      want_hidden=manifest.medusa is not None or manifest.draft_head is not None,
                                      device=target_device, alternating=alternating)

    def tokenizer():
        return Tokenizer(manifest.path(manifest.tokenizer.path))

    if backend == "ort":  # the tokenizer loads while ONNX Runtime initializes the target's session
        from specrt.runtime.backends.ort.overlap import alongside

        target, tok = alongside(target_runner, tokenizer)
    else:
        tok = tokenizer()
        target = target_runner()
    draft = None
    if draft_entry is not None:
        try:
            draft = backends.create_runner(manifest, "draft", backend, capacity=capacity, max_short_tokens=short,
                                           threads=draft_threads, device=draft_device, alternating=alternating)
        except BaseException:
            target.close()
            raise
    return OpenedModels(target, draft, tok)


def open_batch_runner(bundle: str | Path, role: str = "target", backend: str = "ort-portable", *, max_batch: int = 8,
                      threads: int | None = None, device: str | None = None, verify_checksums: bool = True):
    """One model of a bundle as a `BatchRunner` (runtime/backends/batch.py): several sequences per pass on the
    batched portable graph, "ort-portable" (ONNX Runtime, CPU), "torch" (the PyTorch reference, CPU or CUDA) or
    "trt" (engines compiled with `--max-batch`).
    The manifest and the checksums of the files it opens are checked first, as by `load`."""
    check_threads(threads)
    manifest = read_manifest(bundle, verify_checksums=False)
    if role not in manifest.models:
        raise InvalidArgument(f"the bundle has no {role!r} model (it has {', '.join(manifest.models)})")
    if verify_checksums:
        verify_files(manifest, backends.files_to_verify(manifest, backend))
    return backends.create_batch_runner(manifest, role, backend, max_batch=max_batch, threads=threads, device=device)


def open_constraints(manifest: Manifest, vocab_size: int, eos_ids) -> tuple[Any, Any]:
    """(ConstraintCompiler on the bundle's tokenizer, MaskWorker): a Generator's, built on its first constrained
    call (the tokenizer is converted once, ~1 s)."""
    from specrt.runtime.constrained import MaskWorker
    from specrt.runtime.constraint import ConstraintCompiler

    text = manifest.path(manifest.tokenizer.path).read_text(encoding="utf-8")
    return ConstraintCompiler(text, vocab_size, sorted(eos_ids)), MaskWorker()


def close_models(gen) -> None:
    """`Generator.close`: its batch engines, then (once a generation in progress has ended) its runners, the draft
    head's and Medusa heads' sessions and the constraint mask thread. Idempotent."""
    if gen.closed:
        return
    for engine in list(gen._engines):
        engine.close()
    with gen._lock.hold():
        gen.closed = True
        for runner in (gen.target, gen.draft, gen._head_runner, *gen._medusa_cache.values()):
            if runner is not None and hasattr(runner, "close"):
                runner.close()
        gen._head_runner = None
        gen._medusa_cache.clear()
        if gen._constraints is not None:
            gen._constraints[1].close()
        gen._constraints, gen._policies = None, {}
