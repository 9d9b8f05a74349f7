"""The batch runner over the batched portable graph (runtime/backends/batch.py) on real ONNX Runtime sessions:
several sequences of different lengths per pass, each slot's logits as the same call alone, rollback per slot,
the context boundary and bad input (the TensorRT batch runner shares this code; its GPU test is in tests/trt)."""

import numpy as np
import pytest

from specrt.bundle.manifest import read_manifest
from specrt.core.errors import BundleError, InvalidArgument
from specrt.runtime import open_batch_runner
from specrt.runtime.backends import create_batch_runner, create_runner

MAX_SEQ = 32


@pytest.fixture(scope="module")
def portable_bundle(workdir, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle

    return compile_bundle(CompileSpec(llama_target, workdir / "bundles" / "batch_portable", max_seq_len=MAX_SEQ,
                                      max_draft_tokens=4, ort_graph="both"))


@pytest.fixture(scope="module")
def manifest(portable_bundle):
    return read_manifest(portable_bundle)


def alone(manifest):
    """The batch-1 runner of the same portable graph: the reference of every slot."""
    return create_runner(manifest, "target", "ort-portable", capacity=MAX_SEQ, max_short_tokens=6, threads=1)


PROMPTS = [np.array([5, 17, 33, 2, 91, 40, 7], np.int64), np.array([12], np.int64),
           np.array([60, 61, 62, 63], np.int64)]


def greedy_alone(manifest, prompt, steps):
    """(logits per call, tokens) of prefill + `steps` one-token decodes, the sequence alone."""
    r = alone(manifest)
    rows = [r.forward(prompt).copy()]
    tokens = [int(rows[-1][-1].argmax())]
    for _ in range(steps):
        rows.append(r.forward(np.array(tokens[-1:], np.int64)).copy())
        tokens.append(int(rows[-1][-1].argmax()))
    return rows, tokens


def test_mixed_prefill_and_decode_in_one_pass_equal_each_sequence_alone(manifest):
    runner = create_batch_runner(manifest, "target", "ort-portable", max_batch=4, threads=1)
    refs = [greedy_alone(manifest, p, steps=6) for p in PROMPTS]
    # three prompts of 7, 1 and 4 tokens prefilled in ONE pass (right-padded), then decoded together
    out = runner.forward_batch(PROMPTS)
    tokens = [[int(o[-1].argmax())] for o in out]
    for (rows, _), o in zip(refs, out):
        np.testing.assert_allclose(o, rows[0], atol=1e-4, rtol=0)
    for step in range(6):
        out = runner.forward_batch([np.array(t[-1:], np.int64) for t in tokens])
        for b, o in enumerate(out):
            np.testing.assert_allclose(o, refs[b][0][step + 1], atol=1e-4, rtol=0)
            tokens[b].append(int(o[-1].argmax()))
    assert tokens == [t for _, t in refs]
    assert list(runner.lengths[:3]) == [p.size + 6 for p in PROMPTS] and runner.lengths[3] == 0


def test_verify_rollback_and_a_slot_that_sits_out(manifest):
    runner = create_batch_runner(manifest, "target", "ort-portable", max_batch=3, threads=1)
    ref0, ref1 = alone(manifest), alone(manifest)
    runner.forward_batch(PROMPTS[:2])
    ref0.forward(PROMPTS[0])
    ref1.forward(PROMPTS[1])
    drafts = np.array([3, 9, 27, 81], np.int64)
    # slot 0 verifies 4 tokens while slot 1 sits out (no rows): slot 1's length must not move
    out = runner.forward_batch([drafts, np.zeros(0, np.int64)])
    np.testing.assert_allclose(out[0], ref0.forward(drafts), atol=1e-4, rtol=0)
    assert out[1].shape == (0, manifest.models["target"].vocab_size) and runner.lengths[1] == 1
    runner.truncate(0, PROMPTS[0].size + 2)  # keep two drafts (rollback is the length)
    ref0.truncate(PROMPTS[0].size + 2)
    step = [np.array([44], np.int64), np.array([45, 46], np.int64)]
    out = runner.forward_batch(step)
    np.testing.assert_allclose(out[0], ref0.forward(step[0]), atol=1e-4, rtol=0)
    np.testing.assert_allclose(out[1], ref1.forward(step[1]), atol=1e-4, rtol=0)
    runner.reset(1)
    out = runner.forward_batch([np.array([1], np.int64), PROMPTS[2]])
    fresh = alone(manifest)
    np.testing.assert_allclose(out[1], fresh.forward(PROMPTS[2]), atol=1e-4, rtol=0)


def test_context_boundary_and_bad_input_leave_the_runner_usable(manifest):
    runner = create_batch_runner(manifest, "target", "ort-portable", max_batch=2, threads=1)
    ref = alone(manifest)
    full = np.arange(1, MAX_SEQ, dtype=np.int64)  # max_seq_len - 1 tokens: the block is full
    np.testing.assert_allclose(runner.forward_batch([full])[0][-1], ref.forward(full)[-1], atol=1e-4, rtol=0)
    last = runner.forward_batch([np.array([3], np.int64)])[0]  # the last position: its KV row is not kept
    np.testing.assert_allclose(last, ref.forward(np.array([3], np.int64)), atol=1e-4, rtol=0)
    assert runner.lengths[0] == MAX_SEQ
    before = runner.lengths.copy()
    bad_calls = {
        "exceed the compiled context": [np.array([1], np.int64)],
        "outside the vocabulary": [np.zeros(0, np.int64), np.array([10 ** 6], np.int64)],
        "token id -1 is outside": [np.zeros(0, np.int64), np.array([3, -1], np.int64)],
        "1..2 slots": [np.array([1], np.int64)] * 3,
        "at least one slot": [np.zeros(0, np.int64)],
        "1-D integer": [np.zeros(0, np.int64), np.array([[1]], np.int64)],
    }
    for message, call in bad_calls.items():
        with pytest.raises(InvalidArgument, match=message):
            runner.forward_batch(call)
    assert (runner.lengths == before).all()
    runner.truncate(0, 4)
    ref.truncate(4)
    np.testing.assert_allclose(runner.forward_batch([np.array([8, 9], np.int64), np.array([8, 9], np.int64)])[0],
                               ref.forward(np.array([8, 9], np.int64)), atol=1e-4, rtol=0)
    with pytest.raises(InvalidArgument, match="slot 5"):
        runner.reset(5)


def test_open_batch_runner_checks_the_bundle_and_refuses_graphs_without_past_lengths(portable_bundle, manifest):
    runner = open_batch_runner(portable_bundle, max_batch=2, threads=1)
    assert runner.describe()["backend"] == "ort-portable" and runner.max_batch == 2
    with pytest.raises(InvalidArgument, match="no 'draft' model"):
        open_batch_runner(portable_bundle, role="draft")
    with pytest.raises(InvalidArgument, match="ort-portable, torch, trt"):
        create_batch_runner(manifest, "target", "ort", max_batch=2)
    from specrt.runtime.backends.ort.batch_runner import OrtBatchRunner

    fused = manifest.path(manifest.models["target"].ort_fused_onnx)  # the fused graph has no past_lengths
    with pytest.raises(BundleError, match="no past_lengths input"):
        OrtBatchRunner(fused, manifest.models["target"].decoder_config, 2, MAX_SEQ)
    assert "past_lengths" in manifest.models["target"].graphs["portable"].optional_inputs
    assert manifest.models["target"].validation["batched"]["argmax_agree"] > 0


def test_the_pytorch_reference_batch_runner_matches_onnx_runtime(manifest):
    """Every backend of the batch contract follows the PyTorch reference: the same mixed passes on both."""
    ort_runner = create_batch_runner(manifest, "target", "ort-portable", max_batch=3, threads=1)
    torch_runner = create_batch_runner(manifest, "target", "torch", max_batch=3)
    calls = [PROMPTS, [np.array([7], np.int64), np.zeros(0, np.int64), np.array([1, 2, 3, 4, 5], np.int64)],
             [np.array([9], np.int64)] * 3]
    for call in calls:
        for got, ref in zip(torch_runner.forward_batch(call), ort_runner.forward_batch(call)):
            np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert (torch_runner.lengths == ort_runner.lengths).all()
    # a pass over slots [1, 3) only: slot 0 is neither read nor written
    before = ort_runner.keys[0][0].copy(), int(ort_runner.lengths[0])
    call = [np.array([4, 4], np.int64), np.array([8], np.int64)]
    for got, ref in zip(torch_runner.forward_batch(call, first=1), ort_runner.forward_batch(call, first=1)):
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert (torch_runner.lengths == ort_runner.lengths).all()
    np.testing.assert_array_equal(ort_runner.keys[0][0], before[0])
    assert int(ort_runner.lengths[0]) == before[1]


def test_a_pass_from_a_slot_offset_equals_the_slots_alone(manifest):
    """forward_batch(..., first=f) runs slots [f, f + B): the same logits as those sequences alone, and slot
    ranges past the runner are refused before any native call."""
    runner = create_batch_runner(manifest, "target", "ort-portable", max_batch=4, threads=1)
    refs = [greedy_alone(manifest, p, steps=2) for p in PROMPTS[:2]]
    out = runner.forward_batch(PROMPTS[:2], first=2)
    tokens = [[int(o[-1].argmax())] for o in out]
    assert list(runner.lengths) == [0, 0, PROMPTS[0].size, PROMPTS[1].size]
    for step in range(2):
        out = runner.forward_batch([np.array(t[-1:], np.int64) for t in tokens], first=2)
        for b, o in enumerate(out):
            np.testing.assert_allclose(o, refs[b][0][step + 1], atol=1e-4, rtol=0)
            tokens[b].append(int(o[-1].argmax()))
    assert tokens == [r[1][:3] for r in refs]
    with pytest.raises(InvalidArgument, match="from slot 3"):
        runner.forward_batch(PROMPTS[:2], first=3)
    with pytest.raises(InvalidArgument, match="slot 3: token id"):
        runner.forward_batch([np.array([1]), np.array([runner.vocab_size])], first=2)
