"""Optimization profiles: min / opt / max shapes per graph input for prefill, decode and verify.

They are recorded in the manifest for every bundle and become TensorRT optimization profiles (one
execution context each) when engines are built. The runtime checks every call against them in Python.

S = new tokens per call, P = past length (positions already cached). Prefill covers P > 0 as well:
the loop prefills long prompts in chunks of at most PREFILL_CHUNK_MAX tokens, and the draft runner
catches up on accepted tokens in chunks of the same size at any P. Keep runtime/loop.PREFILL_CHUNK and
the draft proposer's prefill_chunk <= PREFILL_CHUNK_MAX (tests/trt/test_trt_profiles.py checks it).
"""

from __future__ import annotations

from typing import Any

from specrt.bundle import graph_io

PREFILL_CHUNK_MAX = 256  # largest S of one prefill / catch-up call (bounds TensorRT activation memory)
PHASE_PREFERENCE = ("decode", "verify", "prefill")  # most specific profile first


def profile_ranges(max_seq_len: int, max_draft_tokens: int, max_prefill: int | None = None
                   ) -> dict[str, dict[str, tuple[int, int, int]]]:
    """(min, opt, max) of S (new tokens) and P (past length) per phase."""
    prefill_max = min(max_prefill or PREFILL_CHUNK_MAX, max_seq_len)
    verify_max = max_draft_tokens + 1
    return {
        "prefill": {"S": (1, min(128, prefill_max), prefill_max), "P": (0, 0, max_seq_len - 1)},
        "decode": {"S": (1, 1, 1), "P": (0, max_seq_len // 2, max_seq_len - 1)},
        "verify": {"S": (2, verify_max, verify_max), "P": (0, max_seq_len // 2, max_seq_len - 2)},
    }


def batch_ranges(max_batch: int) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of B (sequences per pass) per phase: batch-1 bundles keep (1, 1, 1); with a batch,
    decode and verify are optimised for a full batch, prefill for one prompt (chunks of several prompts fit)."""
    n = max_batch
    return {"prefill": (1, 1, n), "decode": (1, n, n), "verify": (1, n, n)}


def profiles_for_model(config: Any, max_seq_len: int, max_draft_tokens: int, max_batch: int = 1,
                       past_lengths: bool = False, tree: bool = False) -> dict[str, Any]:
    """Per phase, per input name: {"min": shape, "opt": shape, "max": shape}. `max_batch` > 1: every phase
    takes 1..max_batch sequences; a batched pass binds each slot's whole past block (P = max_seq_len - 1, the
    batch runner's static cache: runtime/backends/batch.py), so verify's P range reaches it too.
    `past_lengths`: the graph has the `past_lengths [B]` input (compiler/past_lengths.py). `tree`: the graph has the
    `tree_mask [S', S']` input (docs/trees.md): [1, 1] (the chain) in every call but a tree verify, up to [S, S]."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out: dict[str, Any] = {}
    kv = (config.num_kv_heads, config.head_dim)
    batches = batch_ranges(max_batch)
    for phase, r in profile_ranges(max_seq_len, max_draft_tokens).items():
        if max_batch > 1:
            r = dict(r, P=(r["P"][0], r["P"][1], max_seq_len - 1))
        shapes: dict[str, Any] = {}
        for which, idx in (("min", 0), ("opt", 1), ("max", 2)):
            s, p, b = r["S"][idx], r["P"][idx], batches[phase][idx]
            shapes.setdefault(graph_io.INPUT_IDS, {})[which] = [b, s]
            shapes.setdefault(graph_io.POSITION_IDS, {})[which] = [b, s]
            for i in range(config.num_layers):
                for name in (graph_io.past_key(i), graph_io.past_value(i)):
                    shapes.setdefault(name, {})[which] = [b, p, *kv]
            if past_lengths:
                shapes.setdefault(graph_io.PAST_LENGTHS, {})[which] = [b]
            if tree:
                t = 1 if phase != "verify" or which == "min" else s
                shapes.setdefault(graph_io.TREE_MASK, {})[which] = [t, t]
        out[phase] = shapes
    return out


def profiles_max_batch(profiles: dict[str, Any]) -> int:
    """The largest batch the recorded profiles take (1 for bundles without a batch range)."""
    return min(p[graph_io.INPUT_IDS]["max"][0] for p in profiles.values())


def phase_in_profiles(profiles: dict[str, Any], new_tokens: int, past_len: int, batch: int = 1) -> str:
    """Which recorded profile ({phase: {input: {min, opt, max}}}, most specific first) covers a call of `batch`
    sequences with S new tokens at past length P (ValueError if none)."""
    for phase in [p for p in PHASE_PREFERENCE if p in profiles] + [p for p in profiles if p not in PHASE_PREFERENCE]:
        ids, past = profiles[phase][graph_io.INPUT_IDS], profiles[phase].get(graph_io.past_key(0))
        ok = ids["min"][1] <= new_tokens <= ids["max"][1] and ids["min"][0] <= batch <= ids["max"][0]
        if past is not None:
            ok = ok and past["min"][1] <= past_len <= past["max"][1]
        if ok:
            return phase
    batched = profiles_max_batch(profiles) > 1
    ranges = ", ".join(f"{ph}: " + (f"B {v[graph_io.INPUT_IDS]['min'][0]}..{v[graph_io.INPUT_IDS]['max'][0]}, "
                                    if batched else "")
                       + f"S {v[graph_io.INPUT_IDS]['min'][1]}..{v[graph_io.INPUT_IDS]['max'][1]}"
                       + (f", P {v[graph_io.past_key(0)]['min'][1]}..{v[graph_io.past_key(0)]['max'][1]}"
                          if graph_io.past_key(0) in v else "")
                       for ph, v in profiles.items())
    what = f"{batch} sequences of " if batched or batch != 1 else ""
    raise ValueError(f"no optimization profile covers {what}S={new_tokens} new tokens at past length {past_len} ({ranges})")


# ------------------------------------------------------------------------------------------ the draft head
HEAD_PHASES = ("decode", "prefill")  # the head engine's profiles, in profile order (decode first: most calls)


def head_profiles(head: Any, max_seq_len: int) -> dict[str, Any]:
    """The draft head's profiles (`draft_head/head.onnx`: features [1,S,D], input_ids / position_ids [1,S],
    past_key / past_value [1,P,Hkv,D]), a function of the manifest's `draft_head` record and max_seq_len, so
    nothing but the phase names is stored: `decode` (S = 1: the k - 1 calls on its own features) and `prefill`
    (S 1..PREFILL_CHUNK_MAX: the prompt's last chunk of features, and the rows committed since its last draft;
    the TensorRT head runner feeds longer runs in chunks). P covers the head's cache of max_seq_len rows."""
    kv = (head.num_kv_heads, head.head_dim)
    top = max_seq_len - 1
    ranges = {"decode": ((1, 1, 1), (0, max_seq_len // 2, top)),
              "prefill": ((1, min(16, PREFILL_CHUNK_MAX), min(PREFILL_CHUNK_MAX, max_seq_len)), (0, 0, top))}
    out: dict[str, Any] = {}
    for phase in HEAD_PHASES:
        (s_range, p_range) = ranges[phase]
        shapes: dict[str, Any] = {}
        for which, idx in (("min", 0), ("opt", 1), ("max", 2)):
            s, p = s_range[idx], p_range[idx]
            shapes.setdefault("features", {})[which] = [1, s, head.hidden_size]
            shapes.setdefault(graph_io.INPUT_IDS, {})[which] = [1, s]
            shapes.setdefault(graph_io.POSITION_IDS, {})[which] = [1, s]
            for name in ("past_key", "past_value"):
                shapes.setdefault(name, {})[which] = [1, p, *kv]
        out[phase] = shapes
    return out


def head_phase(profiles: dict[str, Any], rows: int, past_len: int) -> str:
    """The head profile that covers a call of `rows` new rows at past length P (ValueError if none)."""
    for phase, shapes in profiles.items():
        ids, past = shapes[graph_io.INPUT_IDS], shapes["past_key"]
        if ids["min"][1] <= rows <= ids["max"][1] and past["min"][1] <= past_len <= past["max"][1]:
            return phase
    ranges = ", ".join(f"{ph}: S {v[graph_io.INPUT_IDS]['min'][1]}..{v[graph_io.INPUT_IDS]['max'][1]}, "
                       f"P {v['past_key']['min'][1]}..{v['past_key']['max'][1]}" for ph, v in profiles.items())
    raise ValueError(f"no draft-head profile covers S={rows} rows at past length {past_len} ({ranges})")
