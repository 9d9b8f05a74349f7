"""Profiles: phase selection (most specific first), recorded-profile checks, Polygraphy profiles on the CPU."""

from __future__ import annotations

import types

import pytest

from specrt.bundle import graph_io
from specrt.bundle.profiles import PREFILL_CHUNK_MAX, phase_for, phase_in_profiles, profile_ranges, profiles_for_model

CONFIG = types.SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=16)


def test_phase_for_prefers_decode_then_verify_then_prefill():
    assert phase_for(1, 0, 128, 8) == "decode"
    assert phase_for(1, 127, 128, 8) == "decode"
    assert phase_for(9, 50, 128, 8) == "verify"
    assert phase_for(100, 0, 128, 8) == "prefill"
    assert phase_for(20, 100, 128, 8) == "prefill"  # draft catch-up at P > 0


def test_prefill_covers_chunks_at_any_past_and_is_capped():
    r = profile_ranges(2048, 8)
    assert r["prefill"]["P"] == (0, 0, 2047)
    assert r["prefill"]["S"][2] == PREFILL_CHUNK_MAX
    assert profile_ranges(64, 8)["prefill"]["S"][2] == 64
    with pytest.raises(ValueError, match="S=257"):
        phase_for(257, 0, 2048, 8)


def test_runtime_chunks_fit_the_prefill_profile():
    import inspect

    from specrt.runtime import loop
    from specrt.runtime.proposers.draft_model import DraftModelProposer

    assert loop.PREFILL_CHUNK <= PREFILL_CHUNK_MAX
    default = inspect.signature(DraftModelProposer.__init__).parameters["prefill_chunk"].default
    assert default <= PREFILL_CHUNK_MAX


def test_phase_in_recorded_profiles():
    profiles = profiles_for_model(CONFIG, 128, 8)
    assert profiles["verify"][graph_io.past_key(1)]["max"] == [1, 126, 2, 16]
    assert phase_in_profiles(profiles, 1, 5) == "decode"
    assert phase_in_profiles(profiles, 4, 5) == "verify"
    assert phase_in_profiles(profiles, 128, 0) == "prefill"
    with pytest.raises(ValueError, match="S=129.*prefill: S 1..128"):
        phase_in_profiles(profiles, 129, 0)


def test_polygraphy_profiles_in_engine_order():
    from specrt.compiler.trt.build import PHASE_ORDER, polygraphy_profiles

    profiles = profiles_for_model(CONFIG, 128, 8)
    built = polygraphy_profiles(profiles)
    assert [phase for phase, _ in built] == list(PHASE_ORDER)
    decode = dict(built)["decode"]
    assert decode[graph_io.INPUT_IDS].min == (1, 1) and decode[graph_io.INPUT_IDS].max == (1, 1)
    assert decode[graph_io.past_value(0)].max == (1, 127, 2, 16)
    with pytest.raises(ValueError, match="verify"):
        polygraphy_profiles({k: v for k, v in profiles.items() if k != "verify"})
