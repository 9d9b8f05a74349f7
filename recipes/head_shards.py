"""Self-distilled draft-head data at scale: the target's own answers with what training reads, cached in shards.

Prompts: every prompt of the set (specrt/assets/head/prompts.txt or the user's) in several styles (STYLES: the
prompt as is, plus an instruction on the answer's form), so that 545 prompts give ~4,400 varied requests.
`check_not_benchmark` refuses any prompt that is one of Spec-Bench's questions (they measure the head).
Held-out prompts (`heldout(base)`) get only their plain greedy answer and are never trained on.

Each shard (`RUN/shards/shard-NNNNN/`, written to a temporary sibling and renamed, so a shard is whole or
absent) holds one chunk of `batch` requests: their greedy answer and `samples` sampled ones (temperature 0.8, a
seed per answer), with what training reads. Two makers write the same shards:

- "onepass" (the default; recipes/head_onepass.py): the PyTorch decoder answers, `slots` sequences per step with a
  KV cache, and keeps each row's features and top-K as it computes them (one pass: ~1.7x less CPU per token);
- "engine": the bundle's batch engine answers (continuous batching on ONNX Runtime,
  `Generator.engine().generate_batch`), then one teacher-forced pass of the PyTorch decoder per few sequences
  (`sequence_features`) computes the same rows again.

The same seeds and sampling rule (runtime.step.pick_token) give the same answers (PyTorch and ONNX Runtime logits
differ by fp32 noise, so a rare near-tie can pick another token); the rows agree within fp16 rounding.

    ids.npy        [N] int32           the tokens of all sequences, concatenated
    starts.npy     [n + 1] int64       sequence i is rows starts[i]:starts[i+1]
    meta.json      per sequence: prompt_len, base prompt index, style, greedy
    feats.npy      [N, F, D] fp16      the residual stream after each of `layers` (low, middle, high) and the
                                       final hidden state (after the final norm: the graphs' hidden_states), F = 4
    top_ids.npy    [N, K] int32        the target's K most likely next tokens
    top_logits.npy [N, K] fp16         their logits

Making resumes by shard, whichever maker wrote it: a chunk whose shard exists is skipped (the request order: the
held-out requests, then the training ones, each in a fixed shuffle of `seed`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specrt.models.base import Decoder
from specrt.models.draft_head_fused import layer_taps

TOP_K = 32
SAMPLE_TEMPERATURE = 0.8
STYLES = ("", " Answer briefly.", " Explain step by step.", " Use a short list.", " Explain it to a child.",
          " Give an example.", " Answer in one paragraph.", " Be detailed.")
HELDOUT_EVERY = 10  # base prompt i is held out when i % 10 == 9 (as recipes/train_head.py)


def heldout(base: int) -> bool:
    return base % HELDOUT_EVERY == HELDOUT_EVERY - 1


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Low, middle and high layers (0-based; the residual stream after each), as EAGLE-3 picks them (distinct:
    fewer on a target of fewer than 3 layers)."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)}))


def shard_layers(shard_dir: Path) -> tuple[int, ...] | None:
    """The feature layers the shards in `shard_dir` hold (layers.json), None before any was made."""
    path = Path(shard_dir) / "layers.json"
    return tuple(json.loads(path.read_text())) if path.exists() else None


def benchmark_questions() -> set[str]:
    """Every turn of Spec-Bench's questions (specrt/assets/spec_bench), normalised."""
    from importlib import resources

    out = set()
    for line in resources.files("specrt.assets.spec_bench").joinpath("question.jsonl").read_text("utf-8").splitlines():
        if line.strip():
            out.update(" ".join(t.split()).lower() for t in json.loads(line)["turns"])
    return out


def check_not_benchmark(prompts: list[str]) -> None:
    """Refuse a prompt set holding a Spec-Bench question (the benchmark measures the head: never train on it)."""
    from specrt.core.errors import InvalidArgument

    bench = benchmark_questions()
    for i, p in enumerate(prompts):
        if " ".join(p.split()).lower() in bench:
            raise InvalidArgument(f"prompt {i + 1} is a Spec-Bench question ({p[:60]!r}...): the benchmark measures "
                                  "the head, never train on it")


def requests_of(prompts: list[str], styles: tuple[str, ...] = STYLES) -> list[dict]:
    """[{base, style, text}]: every training prompt in every style; a held-out prompt only as it is."""
    check_not_benchmark(prompts)
    out = []
    for b, p in enumerate(prompts):
        for s, suffix in enumerate(styles[:1] if heldout(b) else styles):
            out.append({"base": b, "style": s, "text": p + suffix})
    return out


@torch.no_grad()
def sequence_features(decoder: Decoder, seqs: list[list[int]], layers: tuple[int, ...], batch: int = 4) -> list:
    """Per sequence (feats [T, F, D] fp16, top_ids [T, K] int32, top_logits [T, K] fp16), F = len(layers) + 1:
    teacher-forced passes over `batch` sequences at a time, right-padded (causal: padding never changes a row)."""
    got, handles = layer_taps(decoder, layers)
    out: list = [None] * len(seqs)
    try:
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        for a in range(0, len(order), batch):
            idx = order[a:a + batch]
            width = max(len(seqs[i]) for i in idx)
            ids = torch.tensor([seqs[i] + [seqs[i][-1]] * (width - len(seqs[i])) for i in idx], dtype=torch.long)
            c = decoder.config
            empty = torch.zeros(len(idx), 0, c.num_kv_heads, c.head_dim)
            keys = values = (empty,) * c.num_layers
            res = decoder(ids, torch.arange(width).expand(len(idx), width), keys, values)
            feats = torch.stack([*got, res.hidden_states], dim=2).to(torch.float16)  # [b, T, F, D]
            v, t = res.logits.topk(TOP_K, dim=-1)
            for j, i in enumerate(idx):
                n = len(seqs[i])
                out[i] = (feats[j, :n].numpy(), t[j, :n].to(torch.int32).numpy(), v[j, :n].to(torch.float16).numpy())
    finally:
        for h in handles:
            h.remove()
    return out


def write_shard(path: Path, seqs: list[list[int]], meta: list[dict], feats: list) -> None:
    """One shard directory, whole or absent (a temporary sibling renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "ids.npy", np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs]))
    np.save(tmp / "starts.npy", np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64))
    for j, name in enumerate(("feats", "top_ids", "top_logits")):
        np.save(tmp / f"{name}.npy", np.concatenate([f[j] for f in feats]))
    (tmp / "meta.json").write_text(json.dumps(meta))
    os.replace(tmp, path)


MAKERS = ("onepass", "engine")


def chunk_plan(reqs: list[dict], c: int, samples: int, seed: int) -> list[tuple[int, int, int | None]]:
    """The answers of chunk `c` as (request i, answer j, seed): every request's greedy answer (j = 0, no seed), then
    `samples` sampled ones of the training requests (held-out ones: greedy only)."""
    return [(i, j, None if j == 0 else seed * 1_000_003 + c * 4096 + i * 8 + j)
            for j in range(1 + samples) for i, r in enumerate(reqs) if j == 0 or not heldout(r["base"])]


def make_shards(bundle: Path | None, decoder: Decoder, encode: Callable[[str], list[int]], requests: list[dict],
                shard_dir: Path, *, max_new: int, samples: int, seed: int = 0, batch: int = 32,
                layers: tuple[int, ...] | None = None, deadline: float | None = None, engine_batch: int = 24,
                say: Callable[[str], None] = lambda _: None, maker: str = "onepass", slots: int = 96) -> int:
    """Shards for every chunk of `batch` requests not made yet (see the module docstring); past `deadline`
    (time.time()) no further chunk is started. `maker` "onepass" (recipes/head_onepass.py: the PyTorch decoder
    answers, `slots` sequences per step, and keeps the features as it goes; `bundle` unused; the KV cache of the
    slots is L x 2 x slots x Hkv x D x (longest prompt + max_new) fp32: ~1.2 GB for SmolLM2-135M at 96 slots,
    192 new tokens and prompts of <= 76 tokens) or "engine" (the bundle's batch engine answers, `engine_batch` at a
    time, then a teacher-forced pass). Returns the number of shards present."""
    from specrt.core.errors import InvalidArgument

    if maker not in MAKERS:
        raise InvalidArgument(f"maker must be one of {', '.join(MAKERS)}, got {maker!r}")
    if slots < 1 or engine_batch < 1:
        raise InvalidArgument(f"slots and engine_batch must be >= 1, got {slots} and {engine_batch}")
    layers = tuple(layers or default_feature_layers(decoder.config.num_layers))
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    have_layers = shard_layers(shard_dir)
    if have_layers is not None and have_layers != layers:
        raise InvalidArgument(f"{shard_dir} holds the features of layers {list(have_layers)}, not {list(layers)}")
    (shard_dir / "layers.json").write_text(json.dumps(list(layers)))
    # held-out requests first (the learning curve has its measure from the first shards), then a fixed shuffle
    rng = np.random.default_rng(seed)
    order = [i for i in rng.permutation(len(requests)).tolist() if heldout(requests[i]["base"])]
    order += [i for i in rng.permutation(len(requests)).tolist() if not heldout(requests[i]["base"])]
    chunks = [[requests[r] for r in order[a:a + batch]] for a in range(0, len(order), batch)]
    todo = [c for c in range(len(chunks)) if not (shard_dir / f"shard-{c:05d}").is_dir()]
    if todo:
        make = _onepass_shards if maker == "onepass" else _engine_shards
        make(bundle, decoder, encode, chunks, todo, shard_dir, max_new=max_new, samples=samples, seed=seed,
             layers=layers, deadline=deadline, width=slots if maker == "onepass" else engine_batch, say=say)
    return sum((shard_dir / f"shard-{c:05d}").is_dir() for c in range(len(chunks)))


def _meta(reqs: list[dict], plan: list, prompt_lens: list[int]) -> list[dict]:
    return [{"prompt_len": n, "base": reqs[i]["base"], "style": reqs[i]["style"], "greedy": j == 0}
            for (i, j, _), n in zip(plan, prompt_lens)]


def _onepass_shards(bundle, decoder, encode, chunks, todo, shard_dir, *, max_new, samples, seed, layers, deadline,
                    width, say) -> None:
    from specrt.recipes.head_onepass import answer_chunks
    from specrt.runtime.sampling import SamplingParams

    plans = {c: chunk_plan(chunks[c], c, samples, seed) for c in todo}
    clock = [time.time()]

    def take():
        for c in todo:
            params = [SamplingParams() if s is None else SamplingParams(temperature=SAMPLE_TEMPERATURE, seed=s)
                      for _, _, s in plans[c]]
            yield c, [encode(r["text"]) for r in chunks[c]], [(i, p) for (i, _, _), p in zip(plans[c], params)]

    def done(c, seqs, prompt_lens, feats):
        # the prompts are prefilled once per request: a sequence's prompt rows are its request's
        write_shard(shard_dir / f"shard-{c:05d}", seqs, _meta(chunks[c], plans[c], prompt_lens), feats)
        say(f"shard {c} ({len(seqs)} sequences, {sum(map(len, seqs))} tokens): one pass {time.time() - clock[0]:.0f} s")
        clock[0] = time.time()

    answer_chunks(decoder, take(), done, max_new=max_new, layers=layers, top_k=TOP_K,
                  eos={int(e) for e in decoder.config.eos_token_ids}, slots=width, deadline=deadline)


def _engine_shards(bundle, decoder, encode, chunks, todo, shard_dir, *, max_new, samples, seed, layers, deadline,
                   width, say) -> None:
    from specrt.core.errors import InvalidArgument
    from specrt.models.draft_head import target_fingerprint
    from specrt.runtime.generator import load
    from specrt.runtime.request import GenerationRequest

    if bundle is None:
        raise InvalidArgument("the engine maker answers with a bundle's batch engine: give --answers-bundle BUNDLE")
    gen = load(bundle, threads=1, warmup=False)
    have, want = target_fingerprint(gen.manifest.models["target"].decoder_config), target_fingerprint(decoder.config)
    if have != want:
        raise InvalidArgument(f"--answers-bundle {bundle} was not compiled from this target ({have} vs {want})")
    engine = gen.engine(max_batch=width)
    try:
        for c in todo:
            if deadline is not None and time.time() > deadline:
                break
            t0 = time.time()
            reqs = chunks[c]
            prompt_ids = [encode(r["text"]) for r in reqs]
            # the greedy and the sampled answers of the chunk in one call: continuous batching refills the slots
            # of answers that ended early (three calls of `batch` ran each at its longest answer's pace)
            plan = chunk_plan(reqs, c, samples, seed)
            options = [GenerationRequest(max_new_tokens=max_new, method="none", temperature=0.0) if s is None else
                       GenerationRequest(max_new_tokens=max_new, method="none", temperature=SAMPLE_TEMPERATURE, seed=s)
                       for _, _, s in plan]
            results = engine.generate_batch([prompt_ids[i] for i, _, _ in plan], requests=options)
            seqs = [list(prompt_ids[i]) + list(res.token_ids) for (i, _, _), res in zip(plan, results)]
            t1 = time.time()
            write_shard(shard_dir / f"shard-{c:05d}", seqs, _meta(reqs, plan, [len(prompt_ids[i]) for i, _, _ in plan]),
                        sequence_features(decoder, seqs, layers))
            say(f"shard {c} ({len(seqs)} sequences, {sum(map(len, seqs))} tokens): answers {t1 - t0:.0f} s, "
                f"features {time.time() - t1:.0f} s")
    finally:
        engine.close()
