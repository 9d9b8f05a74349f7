"""The head's data in one pass: the target's answers and what training reads, from the same decoder steps.

The features of an answer's tokens (the residual stream after `layers` and the final hidden state) and the target's
top-K logits after each token are exactly what the target computes while it generates that answer, so the PyTorch
decoder generates the answers itself, with a KV cache, several sequences per step (continuous batching over
`slots` rows), and keeps them at every step: no second, teacher-forced pass.

- Each request's prompt is prefilled once (right-padded groups of `PREFILL_GROUP`; causal, so padding never
  changes a row) and its KV rows are copied into the slot of each of its answers (greedy + samples).
- A step feeds every active row its last token at its own position (`past_lengths`: row b's past is cache rows
  [0, L_b)), keeps the row's features and top-K, and picks the next token with the runtime's own rule
  (`runtime.step.pick_token`: argmax, or the inverse-CDF draw of the request's seeded generator after temperature):
  the same seeds give the same answers as the batch engine wherever the two backends' logits pick the same token.
- An answer ends after feeding EOS or its `max_new`-th token (that row's features and top-K are stored too, as the
  teacher-forced pass stores them), or at the decoder's `max_position_embeddings`.
- The cache is laid out so the decoder's attention reads it without a copy: keys [B, Hkv, D, P] and values
  [B, Hkv, P, D] per layer, passed as [B, P, Hkv, D] views (specrt/models/layers.attend permutes them back).
- Requests of several chunks share the slots: the next chunk's answers start as the last ones of a chunk end, and
  `done(chunk, seqs, meta, feats)` is called when a chunk's last answer is made (its shard is written there).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from specrt.models.base import Decoder
from specrt.models.draft_head_fused import layer_taps
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.step import pick_token

PREFILL_GROUP = 4  # prompts per prefill call (right-padded)


@dataclass
class Prompt:
    ids: list[int]
    rows: tuple  # (feats [T, F, D] fp16, top_ids [T, K] int32, top_logits [T, K] fp16) of the prompt's rows
    keys: list  # per layer [Hkv, D, T]
    values: list  # per layer [Hkv, T, D]
    last: np.ndarray  # [V] fp32: the logits after the prompt's last token


@dataclass
class Answer:
    chunk: int
    prompt: Prompt
    params: SamplingParams
    max_new: int
    rng: np.random.Generator = None
    tokens: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # per fed token (feats [F, D], top_ids [K], top_logits [K])


def _features(got: list, res, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """feats [B, S, F, D] fp16, top_ids [B, S, K] int32, top_logits [B, S, K] fp16 of one decoder call."""
    feats = torch.stack([*got, res.hidden_states], dim=2).to(torch.float16)
    v, t = res.logits.topk(top_k, dim=-1)
    return feats, t.to(torch.int32), v.to(torch.float16)


def prefill(decoder: Decoder, got: list, prompts: list[list[int]], top_k: int) -> list[Prompt]:
    """Every prompt's rows, KV cache and last logits (the taps `got` registered by the caller)."""
    c = decoder.config
    out: list = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for a in range(0, len(order), PREFILL_GROUP):
        idx = order[a:a + PREFILL_GROUP]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([prompts[i] + [prompts[i][-1]] * (width - len(prompts[i])) for i in idx], dtype=torch.long)
        empty = torch.zeros(len(idx), 0, c.num_kv_heads, c.head_dim)
        res = decoder(ids, torch.arange(width).expand(len(idx), width), (empty,) * c.num_layers,
                      (empty,) * c.num_layers)
        feats, top_ids, top_logits = _features(got, res, top_k)
        for j, i in enumerate(idx):
            n = len(prompts[i])
            out[i] = Prompt(list(prompts[i]), (feats[j, :n].numpy(), top_ids[j, :n].numpy(), top_logits[j, :n].numpy()),
                            [k[j, :n].permute(1, 2, 0).clone() for k in res.new_keys],
                            [v[j, :n].transpose(0, 1).clone() for v in res.new_values], res.logits[j, n - 1].numpy())
    return out


class Slots:
    """The KV cache of up to `rows` sequences: rows [0, n) active, row b's past in cache rows [0, lengths[b])."""

    def __init__(self, decoder: Decoder, rows: int, capacity: int) -> None:
        c = decoder.config
        self.decoder, self.rows, self.capacity = decoder, rows, capacity
        self.keys = [torch.zeros(rows, c.num_kv_heads, c.head_dim, capacity) for _ in range(c.num_layers)]
        self.values = [torch.zeros(rows, c.num_kv_heads, capacity, c.head_dim) for _ in range(c.num_layers)]
        self.lengths = torch.zeros(rows, dtype=torch.long)
        self.n = 0

    def put(self, row: int, p: Prompt) -> None:
        t = len(p.ids)
        for store, k in zip(self.keys, p.keys):
            store[row, :, :, :t] = k
        for store, v in zip(self.values, p.values):
            store[row, :, :t] = v
        self.lengths[row] = t

    def move(self, src: int, dst: int) -> None:
        t = int(self.lengths[src])
        for store in self.keys:
            store[dst, :, :, :t] = store[src, :, :, :t]
        for store in self.values:
            store[dst, :, :t] = store[src, :, :t]
        self.lengths[dst] = t

    def step(self, ids: list[int]):
        """Feed rows [0, n) one token each (ids [n]) at their positions; returns the decoder's output [n, 1, ...]."""
        n = self.n
        lengths = self.lengths[:n]
        past = int(lengths.max())
        keys = tuple(k[:n, :, :, :past].permute(0, 3, 1, 2) for k in self.keys)  # [n, P, Hkv, D] views
        values = tuple(v[:n, :, :past].transpose(1, 2) for v in self.values)
        res = self.decoder(torch.tensor(ids, dtype=torch.long)[:, None], lengths[:, None].clone(), keys, values,
                           past_lengths=lengths.clone())
        rows = torch.arange(n)
        for store, k in zip(self.keys, res.new_keys):
            store[rows, :, :, lengths] = k[:, 0]  # [n, Hkv, D] at column L_b of row b
        for store, v in zip(self.values, res.new_values):
            store[rows, :, lengths] = v[:, 0]
        self.lengths[:n] += 1
        return res


@torch.no_grad()
def answer_chunks(decoder: Decoder, chunks: Iterator[tuple[int, list[list[int]], list[tuple[int, SamplingParams]]]],
                  done: Callable[[int, list, list, list], None], *, max_new: int, layers: tuple[int, ...],
                  top_k: int, eos: set[int], slots: int = 96, deadline: float | None = None) -> None:
    """For each chunk (c, prompts [ids], answers [(prompt index, sampling params)]) from the iterator: the answers
    (greedy or sampled), then `done(c, seqs, prompt_lens, feats)` with seqs[a] = prompt + answer a and feats[a] =
    (feats [T, F, D] fp16, top_ids [T, K] int32, top_logits [T, K] fp16) for every row. Past `deadline`
    (time.time()) no further chunk is taken from the iterator; the chunks started are finished."""
    cap = int(decoder.config.max_position_embeddings)
    got, handles = layer_taps(decoder, layers)
    queue: deque[Answer] = deque()
    left: dict[int, list] = {}  # chunk -> [answers not finished, its answers]
    active: list[Answer] = []
    slot_rows: Slots | None = None
    try:
        while True:
            while len(active) < slots:
                if not queue:
                    if deadline is not None and time.time() > deadline:
                        break
                    nxt = next(chunks, None)
                    if nxt is None:
                        break
                    c, prompts, plan = nxt
                    ready = prefill(decoder, got, prompts, top_k)
                    answers = [Answer(c, ready[i], params, max(1, min(max_new, cap - len(prompts[i]))))
                               for i, params in plan]
                    left[c] = [len(answers), answers]
                    queue.extend(answers)
                    need = max(len(p) for p in prompts) + max_new
                    if slot_rows is None or slot_rows.capacity < need:
                        slot_rows = _grow(slot_rows, decoder, slots, min(need, cap))
                    continue
                ans = queue.popleft()
                ans.rng = ans.params.rng()
                ans.tokens.append(pick_token(ans.prompt.last, ans.params, ans.rng))
                slot_rows.put(len(active), ans.prompt)
                active.append(ans)
                slot_rows.n = len(active)
            if not active:
                break
            res = slot_rows.step([a.tokens[-1] for a in active])
            feats, top_ids, top_logits = _features(got, res, top_k)
            logits = res.logits[:, 0].numpy()
            finished = []
            for b, ans in enumerate(active):
                ans.rows.append((feats[b, 0].numpy(), top_ids[b, 0].numpy(), top_logits[b, 0].numpy()))
                if ans.tokens[-1] in eos or len(ans.tokens) >= ans.max_new:
                    finished.append(b)
                else:
                    ans.tokens.append(pick_token(logits[b], ans.params, ans.rng))
            for b in reversed(finished):  # the last active row fills the hole: rows [0, n) stay active
                ans, last = active[b], len(active) - 1
                if b != last:
                    slot_rows.move(last, b)
                    active[b] = active[last]
                active.pop()
                slot_rows.n = len(active)
                entry = left[ans.chunk]
                entry[0] -= 1
                if entry[0] == 0:
                    del left[ans.chunk]
                    done(ans.chunk, *_sequences(entry[1]))
    finally:
        for h in handles:
            h.remove()


def _grow(old: Slots | None, decoder: Decoder, rows: int, capacity: int) -> Slots:
    new = Slots(decoder, rows, capacity)
    if old is not None:  # a longer prompt arrived: the active rows move over
        for a, b in zip(old.keys, new.keys):
            b[:, :, :, :old.capacity] = a
        for a, b in zip(old.values, new.values):
            b[:, :, :old.capacity] = a
        new.lengths[:] = old.lengths
        new.n = old.n
    return new


def _sequences(answers: list[Answer]) -> tuple[list, list, list]:
    seqs, prompt_lens, feats = [], [], []
    for a in answers:
        seqs.append(a.prompt.ids + a.tokens)
        prompt_lens.append(len(a.prompt.ids))
        rows = list(zip(*a.rows))
        feats.append(tuple(np.concatenate((p, np.stack(r))) for p, r in zip(a.prompt.rows, rows)))
    return seqs, prompt_lens, feats
