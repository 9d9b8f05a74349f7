"""`run_bench(settings)`: the whole benchmark on one bundle, one backend, one set of prompts.

Order of work (all on the same Generator, so backend, threads, prompts and token budget are shared):
1. the verify-cost curve V(k) of the target (also warms every verify shape);
2. per prompt: a plain run (the warm-up and, for --simulate-acceptance, the replay reference) and one
   warm-up run per method;
3. per repeat and prompt: P C1 P C2 ... Cn P (P = plain), each configuration's speedup taken against the
   mean of the two plain runs next to it; the configuration order is reversed on odd repeats;
   with the interleaved peers (--peer ort-genai, llama.cpp) run after ours on the same prompt;
4. optionally the Hugging Face peer on the same checkpoints and prompts.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specrt.core.errors import InvalidArgument
from specrt.bench import aggregate, measure, suites, ttft
from specrt.bench.aggregate import Config, Sample
from specrt.bench.method_label import check_labels

SCHEMA = "specrt.bench/1"
TOP_KEYS = ("schema", "command", "machine", "settings", "prompts", "verify_cost", "results", "memory", "peer",
            "peers", "ttft", "identical", "elapsed_s")


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    bundle: Path
    backend: str = "auto"
    threads: int | None = None
    suites: tuple[str, ...] = suites.SUITES
    prompts_file: Path | None = None
    prompts_per_suite: int = 2
    methods: tuple[str, ...] | None = None  # None: every method the bundle has
    ks: tuple[int | str, ...] = (1, 2, 4, 8, "auto")
    max_new_tokens: int = 96
    repeats: int = 3
    temperature: float = 0.0
    seed: int = 0
    simulate: tuple[float, ...] = ()  # replay acceptances; replaces the methods when given
    peer: tuple[str, ...] | str | None = ()  # peer libraries (peers.PEERS); a single name is accepted
    target_checkpoint: Path | None = None
    draft_checkpoint: Path | None = None
    verify_reps: int = 7
    ttft_prompt_tokens: int | None = None  # also time the first token on a prompt of this many tokens

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise InvalidArgument(f"--repeats must be >= 1, got {self.repeats}")
        if self.max_new_tokens < 2:
            raise InvalidArgument(f"--max-new-tokens must be >= 2, got {self.max_new_tokens}")
        if not self.ks:
            raise InvalidArgument("--k needs at least one value")
        for a in self.simulate:
            if not 0.0 <= a <= 1.0:
                raise InvalidArgument(f"--simulate-acceptance values must be in [0, 1], got {a}")
        if self.simulate and self.temperature != 0:
            raise InvalidArgument("--simulate-acceptance replays greedy outputs: use --temperature 0")
        from specrt.bench.peers import PEERS

        names = (self.peer,) if isinstance(self.peer, str) else tuple(dict.fromkeys(self.peer or ()))
        for name in names:
            if name not in PEERS:
                raise InvalidArgument(f"--peer must be one of {', '.join(PEERS)}, got {name!r}")
        object.__setattr__(self, "peer", names)


def build_configs(gen, settings: BenchSettings) -> list[Config]:
    for k in settings.ks:
        if k != "auto" and not 1 <= int(k) <= gen.max_draft_tokens:
            raise InvalidArgument(f"--k {k} is outside [1, {gen.max_draft_tokens}] (the bundle's --max-draft-tokens; "
                                  "k = 0 is the plain baseline, always measured)")
    if settings.simulate:
        return [Config("replay", k, a) for a in settings.simulate for k in settings.ks]
    methods = settings.methods or tuple(m for m in gen.methods if m != "none")
    out: list[Config] = []
    for m in methods:
        if m == "none":
            continue
        check_labels(gen, [m])  # a method, or auto[SOURCES] (method_label.py)
        heads = gen.manifest.medusa.num_heads if m == "medusa" else None
        for k in settings.ks:
            k = min(int(k), heads) if heads and k != "auto" else k  # medusa drafts at most one token per head
            if Config(m, k) not in out:
                out.append(Config(m, k))
    return out


def select_prompts(settings: BenchSettings) -> list[suites.Prompt]:
    if settings.prompts_file is not None:
        return suites.load_prompts(settings.prompts_file, list(settings.suites) if settings.suites != suites.SUITES else None)
    return suites.builtin_prompts(list(settings.suites), settings.prompts_per_suite)


def fit_prompts(gen, prompts: list[suites.Prompt], max_new_tokens: int) -> tuple[list[np.ndarray], list[int | None]]:
    """Token ids per prompt, left-truncated where prompt + max_new_tokens would not fit the bundle's context
    (so every configuration gets the full token budget); returns (ids, original length or None)."""
    room = gen.max_seq_len - max_new_tokens - 1
    if room < 1:
        raise InvalidArgument(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the bundle's "
                              f"max_seq_len={gen.max_seq_len}")
    ids, truncated = [], []
    for p in prompts:
        full = gen.tokenizer.encode(p.text) or p.text  # an empty encoding: let encode_prompt use BOS or explain
        ids.append(gen.encode_prompt(full[-room:] if len(full) > room else full))
        truncated.append(len(full) if len(full) > room else None)
    return ids, truncated


def _peer_sessions(gen, settings: BenchSettings, prompts, progress) -> list:
    """The interleaved peers, built and loaded before anything is measured."""
    from specrt.bench import peers

    names = [n for n in settings.peer if n in peers.INTERLEAVED]
    if not names:
        return []
    note = (lambda desc: progress(desc, None)) if progress else None
    return [peers.Session(peers.create(n, gen, settings, note), prompts) for n in names]


def _count_runs(n_prompts: int, configs: list[Config], settings: BenchSettings) -> int:
    methods = {c.method for c in configs}
    per_prompt = 1 + (0 if settings.simulate else len(methods)) + settings.repeats * (2 * len(configs) + 1)
    return n_prompts * per_prompt


def run_bench(settings: BenchSettings, progress: Callable[[str, int], None] | None = None,
              command: str | None = None) -> dict[str, Any]:
    """Run everything; `progress(description, total)` is called before each run (total = all runs)."""
    import time

    from specrt.runtime import load
    from specrt.runtime.proposers.replay import ReplayProposer
    from specrt.runtime.sampling import SamplingParams

    started = time.perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    gen = load(settings.bundle, backend=settings.backend, threads=settings.threads)
    configs = build_configs(gen, settings)
    prompts = select_prompts(settings)
    prompt_ids, truncated = fit_prompts(gen, prompts, settings.max_new_tokens)
    if settings.ttft_prompt_tokens is not None:
        ttft.long_prompt(gen, settings.ttft_prompt_tokens)  # a bad length fails before anything is measured
    params = SamplingParams(temperature=settings.temperature, seed=settings.seed)
    int_ks = [int(k) for k in settings.ks if k != "auto"]
    past = int(np.median([ids.size for ids in prompt_ids])) + settings.max_new_tokens // 2
    verify = measure.verify_curve(gen.target, past, range(0, max(int_ks + [gen.max_draft_tokens]) + 1),
                                  reps=settings.verify_reps)
    rss_before = measure.rss_mb()
    sessions = _peer_sessions(gen, settings, prompts, progress)  # loaded after our memory was read
    rss_peers = measure.rss_mb() - rss_before if sessions else None
    total = _count_runs(len(prompts), configs, settings)
    total += sum(len(prompts) * s.runs_per_prompt(settings.repeats) for s in sessions)
    total += settings.repeats if settings.ttft_prompt_tokens is not None else 0
    if "hf" in settings.peer:
        from specrt.bench import peer_hf

        total += 1 + peer_hf.count_runs(settings, len(prompts), gen.draft is not None)
    tick = (lambda desc: progress(desc, total)) if progress else (lambda desc: None)

    def run(i: int, config: Config | None, repeat: int, reference: list[int] | None = None):
        if config is None:
            return measure.run_once(gen, prompt_ids[i], settings.max_new_tokens, "none", 0, params)
        proposer = None
        if config.method == "replay":
            rng = np.random.default_rng([settings.seed, i, repeat, int(config.acceptance * 1000)])
            proposer = ReplayProposer(reference, prompt_ids[i].size, config.acceptance, gen.vocab_size, rng)
        return measure.run_once(gen, prompt_ids[i], settings.max_new_tokens, config.method, config.k, params, proposer)

    references: list[list[int]] = []
    for i, p in enumerate(prompts):  # warm-up (and replay references)
        tick(f"warm-up {p.suite} #{i}")
        references.append(run(i, None, -1).token_ids)
        if not settings.simulate:
            for m in dict.fromkeys(c.method for c in configs):
                tick(f"warm-up {p.suite} #{i} {m}")
                run(i, max((c for c in configs if c.method == m), key=lambda c: -1 if c.k == "auto" else c.k), -1)
        for session in sessions:
            session.warm_up(prompt_ids[i], tick)

    samples: dict[Config, list[Sample]] = {c: [] for c in configs}
    plain_runs: list[tuple[str, int, Any]] = []
    rss: dict[Config, float] = {}
    greedy = params.greedy
    for r in range(settings.repeats):
        order = configs if r % 2 == 0 else configs[::-1]
        for i, p in enumerate(prompts):
            tick(f"repeat {r + 1}/{settings.repeats} {p.suite} #{i} plain")
            before = run(i, None, r)
            plain_runs.append((p.suite, r, before))
            for config in order:
                tick(f"repeat {r + 1}/{settings.repeats} {p.suite} #{i} {config.label}")
                res = run(i, config, r, references[i])
                rss[config] = max(rss.get(config, 0.0), measure.rss_mb() - (rss_peers or 0.0))  # ours only
                tick(f"repeat {r + 1}/{settings.repeats} {p.suite} #{i} plain")
                after = run(i, None, r)
                plain_runs.append((p.suite, r, after))
                samples[config].append(Sample(
                    p.suite, i, r, res,
                    (before.stats.decode_tokens_per_second + after.stats.decode_tokens_per_second) / 2,
                    (before.stats.tokens_per_second + after.stats.tokens_per_second) / 2,
                    (res.token_ids == references[i]) if greedy else None))
                before = after
            for session in sessions:
                session.measure(i, prompt_ids[i], r, references[i], tick)

    suite_names = list(dict.fromkeys(p.suite for p in prompts))
    rows = aggregate.build_rows(configs, suite_names, samples, plain_runs, verify)
    for row in rows:
        cfg = Config(row["method"], row["k"], row["simulated_acceptance"]) if row["method"] != "none" else None
        row["rss_mb"] = rss.get(cfg) if cfg else rss_before
    memory = {"peak_rss_mb": measure.peak_rss_mb(), "rss_after_load_mb": rss_before,
              "device": measure.device_memory(), "interleaved_peers_rss_mb": rss_peers}

    first_token = None
    if settings.ttft_prompt_tokens is not None:
        first_token = ttft.measure(gen, sessions, settings.ttft_prompt_tokens, settings.repeats, tick)
    peers: dict[str, Any] = {}
    for session in sessions:
        peers[session.peer.name] = session.result(rows)
        session.peer.close()
    if "hf" in settings.peer:
        from specrt.bench import peer_hf
        from specrt.bench.peer_common import ratios

        tick("peer: Hugging Face transformers")
        measure.settle()
        peers["hf"] = peer_hf.run_peer(gen, settings, prompts, prompt_ids, references, rows, progress=tick)
        peers["hf"]["ratios"] = ratios(peers["hf"]["results"], rows)
    if peers:
        memory["peak_rss_mb_with_peer"] = measure.peak_rss_mb()

    return {
        "schema": SCHEMA,
        "command": command or f"run_bench({settings!r})",
        "machine": {**measure.machine(gen), "load_average_start": load_start},
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(settings).items()},
                     "backend_resolved": gen.backend, "configs": [c.label for c in configs]},
        "prompts": [{"suite": p.suite, "prompt": p.text, "prompt_tokens": int(ids.size), "truncated_from": t,
                     "reference_tokens": len(ref)} for p, ids, ref, t in zip(prompts, prompt_ids, references, truncated)],
        "verify_cost": verify,
        "results": rows,
        "memory": memory,
        "peer": peers.get("hf"),  # the transformers peer (kept for readers of earlier JSON)
        "peers": peers,  # every peer by name
        "ttft": first_token,
        "identical": None if not greedy else all(r["identical"] for r in rows if r["suite"] == "overall"),
        "elapsed_s": time.perf_counter() - started,
    }
