"""`BatchRunnerPool`: the scheduler's KV pool over a `BatchRunner` (runtime/backends/batch.py), so continuous batching
runs on the batched portable graph too: ONNX Runtime on the CPU ("ort-portable"), the PyTorch reference ("torch")
and TensorRT engines compiled with `--max-batch` ("trt").

It implements the scheduler's pool contract (`KVPool`, protocol.py) as a `RegionPool` (pool.py) does: `acquire` /
`release` / `region_of`, `decode_batch` and `packed().run(calls)`, with one `SlotRunner` per slot standing in for a
region's runner (`forward`, `forward_last`, `length`, `truncate`, `reset`, `cache.reserve`). Regions are virtual:
region i is `runners[i]`, whose slot never changes, so releasing a region moves no KV rows (a RegionPool copies the
regions above it down). A pass runs over the slot range its calls cover (`forward_batch(..., first=lo)`), the slots
in between that have no call sitting it out (one dummy row each); `acquire` takes the lowest free slot, so the range
stays short.

Right padding makes every slot of a pass pay the pass's longest call: a prompt chunk of 256 tokens beside seven
one-token decodes would cost 8 x 256 rows. So `run` gives each call longer than `pad_limit` rows (a prompt chunk;
default: the longest verify, max_draft_tokens + 1) a pass of its own, and runs the others together.

Unlike the fused CPU graph (bit-identical to each call alone), a batched pass has other shapes than the call
alone, so its logits equal the call alone within float tolerance (test_batch_runner.py: 1e-4), not bit for bit:
a greedy token can differ where two logits tie to ~1e-5, as on any batching engine (vLLM, TensorRT-LLM).
"""

from __future__ import annotations

import numpy as np

from specrt.core.errors import InvalidArgument


class _SlotCache:
    """The `KVCache` fields the scheduler reads and writes, kept by the batch runner (its lengths per slot)."""

    def __init__(self, batch, slot: int) -> None:
        self.batch, self.slot = batch, slot
        self.capacity = batch.max_seq_len

    @property
    def length(self) -> int:
        return int(self.batch.lengths[self.slot])

    @length.setter
    def length(self, n: int) -> None:
        self.batch.lengths[self.slot] = n

    def reserve(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise InvalidArgument(f"{n} new token(s) at position {self.length} exceed the compiled context of "
                                  f"{self.capacity} tokens")


class SlotRunner:
    """One slot of the batch runner, with the single-sequence calls the scheduler makes of a region's runner."""

    min_rows = 1  # calls are never padded (the int4 two-row rule is the fused CPU graph's)

    def __init__(self, pool: "BatchRunnerPool", slot: int) -> None:
        self.pool, self.slot = pool, slot
        self.cache = _SlotCache(pool.batch, slot)

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def vocab_size(self) -> int:
        return self.pool.config.vocab_size

    def reset(self) -> None:
        self.pool.batch.reset(self.slot)

    def truncate(self, n: int) -> None:
        self.pool.batch.truncate(self.slot, n)

    def forward(self, token_ids: np.ndarray) -> np.ndarray:
        """token_ids [S] -> logits [S, V]: a pass of this slot alone."""
        return self.pool.batch.forward_batch([np.asarray(token_ids, np.int64)], first=self.slot)[0]

    def forward_last(self, token_ids: np.ndarray) -> np.ndarray:
        return self.forward(token_ids)[-1]


class BatchRunnerPool:
    def __init__(self, batch, pad_limit: int) -> None:
        """`batch`: a `BatchRunner` (its slots are this pool's); `pad_limit`: the longest call that shares a
        pass with others (longer ones run alone)."""
        self.batch, self.config, self.max_batch = batch, batch.config, batch.max_batch
        self.capacity, self.pad_limit = batch.max_seq_len, max(1, pad_limit)
        self.batched = True  # decode_batch is one pass
        self.runners = [SlotRunner(self, s) for s in range(self.max_batch)]  # region i is runners[i]
        self.used = 0
        self._rows = np.empty((self.max_batch, self.config.vocab_size), np.float32)  # decode_batch's logits

    def packed(self) -> "BatchRunnerPool":
        """The pool runs mixed passes itself (`run`), as a RegionPool's packed passes do."""
        return self

    @property
    def sessions(self) -> list:
        return []

    def kv_bytes_per_slot(self) -> int:
        from specrt.runtime.batch.pool import kv_bytes  # fp32 rows; a half-precision engine's are half as large

        half = str(getattr(self.batch, "dtype", "float32")).endswith(("float16", "bfloat16"))
        return kv_bytes(self.config, self.batch.past_rows) // (2 if half else 1)

    # ------------------------------------------------------------------------------------- slots
    def acquire(self) -> SlotRunner:
        """The runner of the lowest free slot, as region `used` (empty). Raises when every slot is in use."""
        if self.used >= self.max_batch:
            raise InvalidArgument(f"all {self.max_batch} slots are in use")
        free = min(range(self.used, self.max_batch), key=lambda i: self.runners[i].slot)
        runner = self.runners.pop(free)
        self.runners.insert(self.used, runner)
        runner.reset()
        self.used += 1
        return runner

    def release_all(self) -> None:
        """Free every region (their requests were ended): the next `acquire` resets the runner it hands out."""
        self.used = 0

    def region_of(self, runner: SlotRunner) -> int:
        return self.runners.index(runner, 0, self.used)

    def release(self, runner: SlotRunner) -> None:
        """Free `runner`'s region: the regions above it move down one (their runners, not their KV)."""
        i = self.runners.index(runner, 0, self.used)
        self.runners.pop(i)
        self.used -= 1
        self.runners.insert(self.used, runner)
        runner.reset()

    # ------------------------------------------------------------------------------------ passes
    def decode_batch(self, ids: np.ndarray) -> np.ndarray:
        """ids [B]: one new token for each of regions [0, B) -> logits [B, V] (a view valid until the next call).
        One pass."""
        bsz = ids.size
        if not 0 < bsz <= self.used:
            raise InvalidArgument(f"decode_batch of {bsz} sequences with {self.used} regions in use")
        outs = self.run([(b, ids[b:b + 1], self.runners[b].length, (0, 1)) for b in range(bsz)])
        rows = self._rows[:bsz]  # regions and slots need not share an order: one copy into a preallocated buffer
        for b, o in enumerate(outs):
            rows[b] = o[0]
        return rows

    def run(self, calls: list[tuple]) -> list[np.ndarray]:
        """calls (`PassCall`s): (region, token ids [S], past length, (first, count) logit rows[, attn_rows]) with
        distinct regions -> per call the logits of its rows [first, first + count). Writes each call's S key/value
        rows at [past, past + S) of its slot (the slot's length is set to `past` first: the scheduler passes the length
        it has; a cost measurement passes any). Calls longer than `pad_limit` rows get passes of their own."""
        slots = {}
        for region, ids, past, *_ in calls:
            if not 0 <= region < self.max_batch or region in slots:
                raise InvalidArgument(f"batched pass: region {region} is out of range or given twice")
            if past + ids.size > self.capacity:
                raise InvalidArgument(f"batched pass: {past} + {ids.size} positions exceed the compiled context "
                                      f"{self.capacity}")
            slots[region] = self.runners[region].slot
        for region, _, past, *_ in calls:
            self.batch.lengths[slots[region]] = past
        out: list = [None] * len(calls)
        shared = [i for i, c in enumerate(calls) if c[1].size <= self.pad_limit]
        groups = [shared] if shared else []
        groups += [[i] for i, c in enumerate(calls) if c[1].size > self.pad_limit]
        for group in groups:
            by_slot = {slots[calls[i][0]]: i for i in group}
            lo, hi = min(by_slot), max(by_slot)
            empty = np.empty(0, np.int64)
            logits = self.batch.forward_batch(
                [np.asarray(calls[by_slot[s]][1], np.int64) if s in by_slot else empty for s in range(lo, hi + 1)],
                first=lo)
            for s, i in by_slot.items():
                first, count = calls[i][3]
                rows = logits[s - lo][first:first + count]
                out[i] = rows.copy() if len(groups) > 1 else rows  # a runner's views last until its next pass
        return out


def batch_backend(gen) -> str | None:
    """The batch runner backend (BATCH_BACKENDS) for a Generator whose target is not the fused CPU graph: its own
    backend, "ort-portable" for "ort" on a bundle without a fused graph; None where there is none (ort-cuda...)."""
    from specrt.runtime.backends import BATCH_BACKENDS

    name = "ort-portable" if gen.backend == "ort" else gen.backend
    return name if name in BATCH_BACKENDS else None


def slot_pool(gen, max_batch: int) -> BatchRunnerPool:
    """The BatchRunnerPool of a Generator whose backend has a batch runner (`batch_backend`): the target's batch runner
    with `max_batch` slots, on the Generator's threads / device, on the weights the Generator's target runner has
    loaded where the backend can share them (torch, trt: `create_batch_runner`)."""
    from specrt.runtime.backends import create_batch_runner

    backend = batch_backend(gen)
    batch = create_batch_runner(gen.manifest, "target", backend, max_batch=max_batch, threads=gen.threads,
                                device=gen.target_device, weights_from=gen.target if backend == gen.backend else None)
    return BatchRunnerPool(batch, pad_limit=gen.max_draft_tokens + 1)
