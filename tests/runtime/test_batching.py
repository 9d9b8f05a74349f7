"""Continuous batching on real ONNX Runtime sessions: every request's greedy output equals its output alone,
whatever else is in the batch (1, 2, 4, 8 requests of mixed prompts and lengths; fp32 and int4 bundles)."""

import threading

import numpy as np
import pytest

from helpers import event_tokens, fixed_costs

from specrt.runtime.batch.engine import BatchEngine
from specrt.runtime.batch.goodput import CostTable, choose_ks, plan_step
from specrt.runtime.batch.sequence import DRAFT_KIND

PROMPTS = ["hello world", "def f(x): return x + 1\ndef g(x): return", "a b a b a b a b a b", "the quick brown fox",
           "x", "import os\nimport sys\nimport os\n", "one two three four five six seven eight nine ten", "b a"]
LENGTHS = [12, 20, 7, 16, 9, 24, 5, 14]


@pytest.fixture(scope="module")
def int4_bundle(workdir, llama_target, llama_draft):
    """Compiled once a session: pytest may set a module fixture up twice when it regroups parametrized tests of
    several modules (the second time the bundle is there)."""
    from specrt.compiler import CompileSpec, QuantizeSpec, compile_bundle

    out = workdir / "bundles" / "pair-int4"
    if (out / "manifest.json").exists():
        return out
    return compile_bundle(CompileSpec(llama_target, out, llama_draft, max_seq_len=128, max_draft_tokens=8,
                                      quantize=QuantizeSpec("int4", accuracy_level=4)))


@pytest.fixture(scope="module")
def engines(pair_bundle, int4_bundle):
    from specrt.runtime import load

    out = {}
    for name, bundle in (("fp32", pair_bundle), ("int4", int4_bundle)):
        gen = load(bundle, backend="ort")
        out[name] = (gen, BatchEngine(gen, max_batch=8))
    yield out
    for _, eng in out.values():
        eng.close()


def test_pool_batched_decode_matches_one_sequence_passes(engines):
    gen, eng = engines["fp32"]
    pool = eng.scheduler.targets
    assert pool.batched
    rng = np.random.default_rng(0)
    runners = [pool.acquire() for _ in range(3)]
    try:
        prompts = [rng.integers(0, gen.vocab_size, n) for n in (5, 11, 2)]
        for r, p in zip(runners, prompts):
            r.forward(p)
        nxt = np.array([7, 8, 9], np.int64)
        batched = pool.decode_batch(nxt).copy()
        singles = []
        for r, p, t in zip(runners, prompts, nxt):
            r.truncate(p.size)
            singles.append(r.forward(np.array([t]))[-1].copy())
        np.testing.assert_allclose(batched, np.stack(singles), atol=1e-4)
        assert [r.length for r in runners] == [6, 12, 3]
    finally:
        for r in reversed(runners):
            pool.release(r)
    assert pool.used == 0


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_greedy_output_equals_alone_at_every_batch_size(engines, precision, method):
    gen, eng = engines[precision]
    alone = [gen.generate(p, n, method=method).token_ids for p, n in zip(PROMPTS, LENGTHS)]
    for b in (1, 2, 4, 8):
        subs = [eng.submit(p, max_new_tokens=n, method=method) for p, n in zip(PROMPTS[:b], LENGTHS[:b])]
        for i, (seq, events) in enumerate(subs):
            got = event_tokens(events)
            assert got == alone[i], (precision, method, b, i)
    assert eng.scheduler.targets.used == 0


def test_batch_call_and_seeded_sampling_without_speculation(engines):
    gen, eng = engines["fp32"]
    res = eng.generate_batch(PROMPTS[:3], 8, method="none", temperature=0.9, seed=3)
    for r, p in zip(res, PROMPTS[:3]):
        assert r.token_ids == gen.generate(p, 8, method="none", temperature=0.9, seed=3).token_ids


SEEDED = [("a b a b a b a b a b", 3), ("def f(x): return x + 1\ndef g(x): return", 11), ("the quick brown fox", 29)]


@pytest.mark.parametrize("precision", ["fp32", pytest.param("int4", marks=pytest.mark.slow)])
@pytest.mark.parametrize("method,k", [("ngram", "auto"), ("draft", "auto"), ("hybrid", 3)])
def test_seeded_sampling_in_a_batch_gives_the_text_it_gives_alone(engines, precision, method, k, monkeypatch):
    # Which random numbers a step draws depends on its k: a seeded request keeps the k schedule it has alone,
    # whatever the plan (speculation cheap, dear, or the packed pass) and whatever else runs in the batch
    gen, eng = engines[precision]
    opts = dict(method=method, temperature=0.9, top_k=20, num_speculative_tokens=k)
    alone = [gen.generate(p, 14, seed=seed, **opts) for p, seed in SEEDED]
    assert sum(r.stats.drafted_tokens for r in alone) > 0  # the runs alone speculated
    cheap = CostTable(batch=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], rows=[0.1 + 0.001 * s for s in range(9)])
    dear = CostTable(batch=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1], rows=[5.0 + s for s in range(9)])
    for table in (cheap, dear, None):
        saved = _force_packed(eng.scheduler, monkeypatch) if table is None else fixed_costs(eng.scheduler,
                                                                                              monkeypatch, table)
        try:  # beside greedy requests and one unseeded sampling request
            others = [eng.submit(p, max_new_tokens=n, method="ngram") for p, n in zip(PROMPTS[3:6], LENGTHS[3:6])]
            others.append(eng.submit("hello world", max_new_tokens=9, method=method, temperature=0.9))
            subs = [eng.submit(p, max_new_tokens=14, seed=seed, **opts) for p, seed in SEEDED]
            got = [event_tokens(events) for _, events in subs]
            for _, events in others:
                event_tokens(events)
        finally:
            eng.scheduler.costs = saved
        assert got == [r.token_ids for r in alone], (precision, method, "packed" if table is None else table.rows[0])
    assert eng.scheduler.targets.used == 0


def test_cancel_frees_the_slot_within_a_step(engines):
    gen, eng = engines["fp32"]
    stream = eng.stream_tokens("hello world", max_new_tokens=100, method="none")
    next(stream)
    stream.close()  # cancels
    for _ in range(200):
        if eng.scheduler.targets.used == 0:
            break
        threading.Event().wait(0.01)
    assert eng.scheduler.targets.used == 0
    assert eng.generate_batch(["hi"], 3, method="none")[0].token_ids


def test_requests_ending_in_one_step_free_their_regions_without_moving_each_other(engines, monkeypatch):
    # a freed region moves every region above it down one (a copy of their KV rows): the scheduler frees the
    # highest first, so four requests admitted together that end together cost no move, and each is still alone
    gen, eng = engines["fp32"]
    pool = eng.scheduler.targets
    moves = []
    real_move = pool._move
    monkeypatch.setattr(pool, "_move", lambda src, dst: (moves.append((src, dst)), real_move(src, dst)))
    prompts = PROMPTS[:4]
    alone = [gen.generate(p, 6, method="none") for p in prompts]
    assert all(r.finish_reason == "length" for r in alone)  # so the batch's four end in the same step
    got = eng.generate_batch(prompts, 6, method="none")
    assert [r.token_ids for r in got] == [r.token_ids for r in alone]
    assert moves == [] and pool.used == 0
    # one that ends before the others still moves the regions above it (their rows are copied, then decoded on)
    lengths = [3, 6, 6, 6]
    subs = [eng.submit(p, max_new_tokens=n, method="none") for p, n in zip(prompts, lengths)]
    assert [event_tokens(ev) for _, ev in subs] == [r.token_ids[:n] for r, n in zip(alone, lengths)]
    assert pool.used == 0


def test_goodput_never_chooses_speculation_that_loses():
    # a batched pass of 4 costs barely more than one row; a 4-row pass costs like 4 rows: speculation loses
    table = CostTable(batch=[1.0, 1.05, 1.1, 1.15], rows=[1.0, 1.9, 2.8, 3.7])
    assert choose_ks([0.9] * 4, [4] * 4, [True] * 4, [0.0] * 4, table) == [0, 0, 0, 0]
    # alone, with cheap multi-row passes and high acceptance, speculation wins; at low acceptance k stays small
    cheap = CostTable(batch=[1.0], rows=[1.0, 1.02, 1.04, 1.06])
    assert choose_ks([0.9], [4], [True], [0.0], cheap) == [4]
    assert choose_ks([0.9], [0], [True], [0.0], cheap) == [0]


def test_stop_strings_cut_the_batch_call(engines):
    gen, eng = engines["fp32"]
    full = gen.generate("hello world", 16, method="none")
    stop = full.text[3:6]
    assert stop
    res = eng.generate_batch(["hello world"], 16, method="none", stop=[stop])[0]
    assert res.finish_reason == "stop" and res.text == full.text[:full.text.find(stop)]
    # several requests: each leaves at the step its stop string appears, whenever the caller reads it (the calls
    # are read in order, after the first request's end); its tokens end with that step
    prompts = ["hello world", "the quick brown fox", "x", "b a"]
    alone = [gen.generate(p, 40, method="none") for p in prompts]
    stops = [a.text[2:4] for a in alone]
    assert all(stops)
    for _ in range(3):
        got = eng.generate_batch(prompts, 40, method="none", stop=stops)
        for g, a, st in zip(got, alone, stops):
            cut = a.text.find(st)
            assert g.finish_reason == "stop" and g.text == a.text[:cut]
            assert g.token_ids == a.token_ids[:len(g.token_ids)] and g.stats.new_tokens == len(g.token_ids)
            assert len(g.token_ids) == _stop_step(gen, a.token_ids, st) + 1  # a step is one token here (none)


def _stop_step(gen, ids, stop):
    """The index of the token with which a stream of `ids`, one per step, reaches `stop`."""
    from specrt.core.tokenizer import IncrementalDecoder, StopText

    dec, stopper = IncrementalDecoder(gen.tokenizer), StopText([stop])
    for i, t in enumerate(ids):
        if stopper.push(dec.push([t]))[1]:
            return i
    raise AssertionError(f"{stop!r} never reached")


def test_the_batch_refuses_what_the_generator_refuses(engines):
    from specrt.core.errors import InvalidArgument

    gen, eng = engines["fp32"]
    long = gen.tokenizer.decode([gen.tokenizer.encode("a")[0]] * 120)
    ids = gen.encode_prompt(long)
    n = gen.max_seq_len - ids.size + 4  # 4 tokens past the context
    with pytest.raises(InvalidArgument, match="exceeds the bundle's context") as alone:
        gen.generate(ids.tolist(), n, method="none", strict=True)
    for call, where in ((lambda: eng.generate_batch([ids.tolist()], n, method="none", strict=True), "prompt 0: "),
                        (lambda: eng.submit(ids.tolist(), max_new_tokens=n, method="none", strict=True), "")):
        with pytest.raises(InvalidArgument) as batched:
            call()
        assert str(batched.value) == where + str(alone.value)  # generate_batch names the prompt's index
    assert len(eng.generate_batch([ids.tolist()], n, method="none")[0].token_ids) == gen.max_seq_len - ids.size
    with pytest.raises(InvalidArgument, match="a list of prompts"):
        eng.generate_batch("hello world", 4)
    with pytest.raises(InvalidArgument, match="got NoneType"):
        eng.submit(None, max_new_tokens=4)
    with pytest.raises(InvalidArgument, match="batch engine"):
        gen.generate(["a", "b"], 4)
    assert eng.scheduler.targets.used == 0


def test_request_finished_by_its_prefill_token_gets_no_decode_step(engines):
    # A request whose first token (picked from the prefill) already ends it (EOS, or max_new_tokens=1) must leave
    # before the step's batched decode; it used to be decoded once more and emit a second token (seen on SmolLM2:
    # "What is the capital of France?..." answers EOS at once alone, but [EOS, 198] from the engine).
    gen, eng = engines["fp32"]
    lengths = [1, 6, 1, 9, 1, 3]
    alone = [gen.generate(p, n, method="none").token_ids for p, n in zip(PROMPTS, lengths)]
    assert [len(a) for a in alone[::2]] == [1, 1, 1]
    got = [r.token_ids for r in eng.generate_batch(PROMPTS[:len(lengths)], 1, method="none")]
    assert got == [a[:1] for a in alone]
    subs = [eng.submit(p, max_new_tokens=n, method="none") for p, n in zip(PROMPTS, lengths)]
    for i, (seq, events) in enumerate(subs):
        ids = event_tokens(events)
        assert ids == alone[i], (i, lengths[i])
        assert seq.stats.new_tokens == len(alone[i])
    # EOS as the first token: make the prompt's own greedy first token an end token for this generator
    first = alone[0][0]
    saved = gen.eos_ids
    try:
        gen.eos_ids = frozenset(saved) | {first}
        ref = gen.generate(PROMPTS[0], 5, method="none").token_ids
        assert ref == [first]
        res = eng.generate_batch([PROMPTS[0], PROMPTS[1]], 5, method="none")
        assert res[0].token_ids == ref and res[0].finish_reason == "stop"
    finally:
        gen.eos_ids = saved
    assert eng.scheduler.targets.used == 0


def test_plan_picks_the_regime_with_more_tokens_per_second():
    # alone: its own pass over pending + drafts (the single-sequence loop), never a batched pass besides it
    cheap = CostTable(batch=[1.0, 1.1], rows=[1.0, 1.02, 1.04, 1.06, 1.08])
    plan = plan_step([0.9], [4], [0.0], cheap)
    assert plan.ks == [4] and not plan.batched and plan.goodput > 1 / cheap.t_batch(1)
    # two requests, one that matches well and one that does not: the batched pass runs, only the first drafts
    plan = plan_step([0.95, 0.05], [4, 4], [0.0, 0.0], cheap)
    assert plan.batched and plan.ks[0] > 0 and plan.ks[1] == 0
    # nothing to draft (k capped at 0 everywhere): plain batched decoding
    assert plan_step([0.9, 0.9], [0, 0], [0.0, 0.0], cheap) == plan_step([0.1, 0.1], [0, 0], [0.0, 0.0], cheap)
    assert plan_step([0.9, 0.9], [0, 0], [0.0, 0.0], cheap).ks == [0, 0]
    # a costly draft model makes speculation lose even at high acceptance
    assert plan_step([0.9], [4], [5.0], cheap).ks == [0]


@pytest.mark.parametrize("rows", [[1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08],
                                  [0.5, 0.51, 0.52, 0.53, 0.54, 0.55, 0.56, 0.57, 0.58]])
def test_speculating_requests_in_a_batch_keep_their_greedy_output(engines, rows, monkeypatch):
    # Cost tables that make speculation win (cheap multi-token passes): the requests that draft run their own
    # verify pass, then (batched regime) the batched pass gives every request one more token. Outputs equal alone.
    gen, eng = engines["fp32"]
    prompts = ["a b a b a b a b a b", "import os\nimport sys\nimport os\n", "hello world", "x y x y x y"]
    lengths = [14, 12, 10, 16]
    alone = [gen.generate(p, n, method="ngram").token_ids for p, n in zip(prompts, lengths)]
    saved = fixed_costs(eng.scheduler, monkeypatch, CostTable(batch=[1.0, 1.02, 1.04, 1.06], rows=rows))
    try:
        res = eng.generate_batch(prompts, 16, method="ngram")
        subs = [eng.submit(p, max_new_tokens=n, method="ngram") for p, n in zip(prompts, lengths)]
        got = []
        for seq, events in subs:
            ids = event_tokens(events)
            got.append((ids, seq.stats))
    finally:
        eng.scheduler.costs = saved
    assert [g[0] for g in got] == alone
    assert sum(st.drafted_tokens for _, st in got) > 0  # speculation did run
    assert all(r.token_ids == gen.generate(p, 16, method="ngram").token_ids for r, p in zip(res, prompts))


def test_requests_the_batch_does_not_run_take_the_one_request_loop_beside_it(engines):
    # a constraint (structured output) is not batched: the engine runs it on the Generator's loop while other
    # requests keep decoding on the batch; both outputs equal their outputs alone
    import json as _json

    from specrt.runtime.constraint import ConstraintSpec

    gen, eng = engines["fp32"]
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "maximum": 99}},
              "additionalProperties": False}
    spec = ConstraintSpec.json_schema(schema)
    alone = gen.generate("import os\n", 40, method="ngram", constraint=spec)
    plain_alone = gen.generate("hello world", 20, method="none").token_ids
    side = eng.stream_tokens("hello world", max_new_tokens=20, method="none")
    first = next(side)[0]
    got = eng.generate_batch(["import os\n"], 40, method="ngram", constraint=spec)[0]
    rest = [t for ids, _ in side for t in ids]
    assert got.token_ids == alone.token_ids and got.stats.constraint
    assert "n" in _json.loads(got.text)
    assert first + rest == plain_alone


def test_cost_table_is_measured_once_per_graph_and_device_then_cached(engines, tmp_path, monkeypatch):
    from specrt.runtime.batch import costs
    from specrt.runtime.batch.pool import RegionPool

    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path))
    gen, _ = engines["fp32"]
    pool = RegionPool(gen.target, 3)
    first = costs.cost_table(gen, pool, 3)
    assert len(first.batch) == 3 and all(t > 0 for t in first.batch) and first.rows
    assert costs.cache_path(gen, 3).is_file()

    def no_measuring(*_):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs, "measure_batch", no_measuring)
    assert costs.cost_table(gen, pool, 3) == first  # cached
    monkeypatch.setenv("SPECRT_REMEASURE", "1")
    with pytest.raises(AssertionError, match="measured again"):
        costs.cost_table(gen, pool, 3)
    monkeypatch.delenv("SPECRT_REMEASURE")
    with pytest.raises(AssertionError, match="measured again"):  # another batch size: another key
        costs.cost_table(gen, RegionPool(gen.target, 2), 2)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_speculative_sampling_in_a_batch_follows_the_target_distribution(engines, method, monkeypatch):
    """Seeded 3-token samples (temperature 1.5, top-k 3, k = 2), 8 requests per batch with speculation forced on by
    a cost table where it always pays: the joint of the samples is the exact target-only joint."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_loop import _exact_joint

    from specrt.runtime.sampling import SamplingParams

    gen, eng = engines["fp32"]
    base = gen.tokenizer.encode(PROMPTS[0])
    prompt = base + gen.generate(base, 8, method="none").token_ids + base  # the n-gram branch finds matches
    exact = _exact_joint(gen, prompt, SamplingParams(temperature=1.5, top_k=3), 3)
    table = CostTable(batch=[1.0] * 8, rows=[0.1 + 0.001 * s for s in range(9)])
    saved = fixed_costs(eng.scheduler, monkeypatch, table)
    n, counts, drafted = 2400, {}, 0
    rng = np.random.default_rng(1)
    try:
        for _ in range(n // 8):
            subs = [eng.submit(prompt, max_new_tokens=3, method=method, temperature=1.5, top_k=3,
                               num_speculative_tokens=2, seed=int(rng.integers(1 << 30))) for _ in range(8)]
            for seq, events in subs:
                ids = event_tokens(events)
                counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
                drafted += seq.stats.drafted_tokens
    finally:
        eng.scheduler.costs = saved
    assert drafted > n // 4  # speculation ran (n-gram: only where the context matches)
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(exact.get(k, 0.0) - counts.get(k, 0) / n) for k in set(exact) | set(counts))
    # 27 outcomes, 2400 draws: sampling noise of the TV estimate is about 0.045
    assert tv < 0.09, f"total variation {tv:.3f} between batched speculative samples and the exact target joint"


def test_a_target_with_two_row_decode_calls_never_runs_the_one_row_batched_pass(engines, monkeypatch):
    # MatMulNBits accuracy level 4 (min_rows 2): a one-token row of the batched pass would round differently from
    # the two-row calls the request makes alone (measured on SmolLM2 int4: logits 0.6 apart); each request runs its
    # own passes instead, so outputs stay identical to alone
    gen, eng = engines["int4"]
    assert gen.target.min_rows == 2 and not eng.scheduler.batched_decode
    assert engines["fp32"][1].scheduler.batched_decode
    calls = []
    monkeypatch.setattr(eng.scheduler.targets, "decode_batch", lambda ids: calls.append(ids) or 1 / 0)
    res = eng.generate_batch(PROMPTS[:4], 8, method="ngram")
    assert calls == []
    assert [r.token_ids for r in res] == [gen.generate(p, 8, method="ngram").token_ids for p in PROMPTS[:4]]
    assert plan_step([0.1, 0.1], [0, 0], [0.0, 0.0], CostTable([1.0, 1.0], [1.0]), batched_ok=False).batched is False


# ------------------------------------------------------------------------------------------- the packed pass
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_packed_pass_rows_equal_each_sequence_alone_bit_for_bit(engines, precision, pair_bundle, int4_bundle):
    # one pass: region 0 decodes one token (two rows when the target pads to min_rows), region 1 verifies 3 drafts,
    # region 3 prefills; region 2 holds a sequence that is not in the call: its KV must stay untouched
    from specrt.runtime import load

    gen, eng = engines[precision]
    alone = load({"fp32": pair_bundle, "int4": int4_bundle}[precision], backend="ort").target  # its own session
    pool, mr = eng.scheduler.targets, gen.target.min_rows
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, gen.vocab_size, n) for n in (5, 11, 7, 9)]
    runners = [pool.acquire() for _ in range(4)]
    try:
        for r, p in zip(runners[:3], prompts[:3]):
            r.forward(p)
        marker = pool.keys[0][2, :, :7].copy()
        step = [np.array([17]), np.array([3, 4, 5, 6]), None, prompts[3]]
        calls = []
        for b, ids in enumerate(step):
            if ids is None:
                continue
            calls.append((b, ids, runners[b].length, (0, ids.size), mr))  # padded to mr rows in attention only
        got = [o.copy() for o in pool.packed().run(calls)]
        np.testing.assert_array_equal(pool.keys[0][2, :, :7], marker)
        for (b, ids, past, _, _), logits in zip(calls, got):
            alone.reset()
            if b != 3:
                alone.forward(prompts[b])
            want = alone.forward(ids)  # alone pads a short call with the token repeated (through every op)
            np.testing.assert_array_equal(logits, want, err_msg=f"region {b}")
    finally:
        for r in reversed(runners):
            pool.release(r)


def _force_packed(sched, monkeypatch) -> CostTable:
    """A cost table where the packed pass is nearly free and every other pass dear, without calibration: the
    packed family every step."""
    from specrt.runtime.batch import family

    monkeypatch.setattr(family, "MIN_FAMILY_STEPS", 0)
    monkeypatch.setattr(sched.chooser, "packed_ratio", 1.0)
    return fixed_costs(sched, monkeypatch, CostTable(
        batch=[10.0] * 8, rows=[10.0] * 9, packed=[[0.01 + 0.0001 * r for r in (1, 2, 4, 9)]] * 4,
        packed_b=[1, 2, 4, 8], packed_r=[1, 2, 4, 9]))


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("method", ["none", pytest.param("ngram", marks=pytest.mark.slow),
                                    pytest.param("draft", marks=pytest.mark.slow)])
def test_greedy_output_equals_alone_in_the_packed_family(engines, precision, method, monkeypatch):
    # a prompt budget of 3 tokens per step: prompts are prefilled over several steps, inside the packed passes of
    # the requests already decoding
    gen, eng = engines[precision]
    sched = eng.scheduler
    packed_steps = []
    real = sched.targets.packed().run
    monkeypatch.setattr(sched.targets.packed(), "run", lambda calls: packed_steps.append(len(calls)) or real(calls))
    alone = [gen.generate(p, n, method=method).token_ids for p, n in zip(PROMPTS, LENGTHS)]
    saved = _force_packed(sched, monkeypatch)
    monkeypatch.setattr(sched, "prefill_chunk", 3)
    try:
        for b in (2, 4, 8):
            subs = [eng.submit(p, max_new_tokens=n, method=method) for p, n in zip(PROMPTS[:b], LENGTHS[:b])]
            got = [(event_tokens(events), seq.stats) for seq, events in subs]
            assert [g[0] for g in got] == alone[:b], (precision, method, b)
            if method != "none":
                assert sum(st.drafted_tokens for _, st in got) > 0
    finally:
        sched.costs = saved
    assert packed_steps and max(packed_steps) >= 4
    assert sched.targets.used == 0


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_a_request_ending_at_its_first_token_in_a_packed_pass_leaves_the_others_intact(engines, precision,
                                                                                      monkeypatch):
    # three prompts prefilled in one packed pass beside a decoding request; the first ends at its first token
    # (max_new_tokens=1) and frees its region at once, so the two above it move down: their prompt rows must be
    # committed before that move (they were not: only one row each was copied, and their second token was wrong;
    # seen on SmolLM2 fp32 at 8 clients)
    gen, eng = engines[precision]
    sched = eng.scheduler
    saved = _force_packed(sched, monkeypatch)
    lengths = [20, 1, 12, 12]
    alone = [gen.generate(p, n, method="none").token_ids for p, n in zip(PROMPTS[:4], lengths)]
    passes = []
    real = sched.targets.packed().run
    monkeypatch.setattr(sched.targets.packed(), "run", lambda calls: passes.append([c[1].size for c in calls])
                        or real(calls))
    # the step after the first request's first token waits until the three are queued, then admits them with it
    arrived, admit = threading.Event(), sched._admit

    def admit_when_all_are_in():
        if sched.running and not arrived.is_set():
            assert arrived.wait(timeout=120)
            for seq in eng._inbox.get_nowait():
                sched.add(seq)
        admit()

    monkeypatch.setattr(sched, "_admit", admit_when_all_are_in)
    try:
        subs = [eng._sequence(p, max_new_tokens=n, method="none") for p, n in zip(PROMPTS[1:4], lengths[1:])]
        first, events0 = eng.submit(PROMPTS[0], max_new_tokens=lengths[0], method="none")
        head = events0.get(timeout=120)  # the first request decodes before the others arrive
        eng._inbox.put([seq for seq, _ in subs])
        arrived.set()
        got = [event_tokens(events) for _, events in subs]
        rest = event_tokens(events0)
    finally:
        sched.costs = saved
    assert any(len(sizes) == 4 and sum(sizes) > 8 for sizes in passes), passes[:6]  # the prompts rode one packed pass
    assert [list(head[1]) + rest] + got == alone
    assert sched.targets.used == 0


def test_the_family_of_passes_switches_only_for_a_clear_gain():
    # packed vs fused (batched / separate) by predicted goodput scaled by each family's realized / predicted
    # goodput, smoothed over steps, with hysteresis and a minimum stay: a switch between the two sessions costs a
    # pass's worth of contention
    from specrt.runtime.batch.family import MIN_FAMILY_STEPS, SWITCH_MARGIN, FamilyChooser

    def due(packed_cost: float, family: str, stayed: int = MIN_FAMILY_STEPS, calibration=None,
            switch_free: bool = False) -> str:
        table = CostTable(batch=[1.0] * 4, rows=[1.0] * 4, packed=[[packed_cost] * 2] * 2, packed_b=[1, 4],
                          packed_r=[1, 2])
        chooser = FamilyChooser(table, packed=True, batched_decode=True, switch_free=switch_free)
        chooser.family, chooser.family_steps = family, stayed
        chooser.calibration = calibration or {"fused": 1.0, "packed": 1.0}
        chosen, plan = chooser.choose([0.0] * 4, [0] * 4, [0.0] * 4, prefilling=False)
        assert chosen == chooser.family and plan.packed == (chosen == "packed")  # the chosen family's k plan
        return chosen

    slightly = 1.0 / (1.0 + (SWITCH_MARGIN - 1) / 2)  # the packed pass a little cheaper: within the margin
    assert due(slightly, "fused") == "fused" and due(slightly, "packed") == "packed"
    assert due(0.2, "fused") == "packed" and due(5.0, "packed") == "fused"
    assert due(0.2, "fused", stayed=0) == "fused"  # too soon after the last switch
    assert due(0.2, "fused", calibration={"fused": 1.0, "packed": 0.1}) == "fused"  # packed steps disappointed
    # on one shared thread pool (backends/ort/threads.py) a switch is free: each step takes the better family,
    # at once and for any gain, and still by the calibrated prediction
    assert due(slightly, "fused", stayed=0, switch_free=True) == "packed"
    assert due(1.0 / slightly, "packed", stayed=0, switch_free=True) == "fused"
    assert due(0.2, "fused", calibration={"fused": 1.0, "packed": 0.1}, switch_free=True) == "fused"
    chooser = FamilyChooser(CostTable(batch=[1.0], rows=[1.0], packed=[[9.0]], packed_b=[1], packed_r=[2]),
                            packed=True, batched_decode=False, switch_free=False)
    assert chooser.choose([0.0, 0.0], [0, 0], [0.0, 0.0], prefilling=False) == ("packed", None)  # no batched pass
    assert chooser.choose([0.0], [0], [0.0], prefilling=False)[0] == "fused"  # one request alone: its own session
    assert chooser.choose([0.0], [0], [0.0], prefilling=True)[0] == "packed"  # ... unless a prompt rides along


def test_a_family_left_after_a_disappointment_is_tried_again():
    # per-session pools (switches rationed): steps in the fused family as predicted move the packed family's
    # calibrations toward the fused ones, so an early low one (steps with prefill work riding along) does not keep
    # the packed family off for the rest of the run once its predictions are clearly better
    from specrt.runtime.batch.family import MIN_FAMILY_STEPS, FamilyChooser

    table = CostTable(batch=[1.0] * 4, rows=[1.0] * 4, packed=[[0.5] * 2] * 2, packed_b=[1, 4], packed_r=[1, 2])
    chooser = FamilyChooser(table, packed=True, batched_decode=True, switch_free=False)
    chooser.family_steps = MIN_FAMILY_STEPS
    chooser.calibration, chooser.spec_calibration = {"fused": 1.0, "packed": 0.3}, {"fused": 1.0, "packed": 0.3}
    steps = 0
    while chooser.choose([0.0] * 4, [0] * 4, [0.0] * 4, prefilling=False)[0] != "packed":
        assert chooser.family == "fused"
        chooser.calibrate(4.0, 4.0, drafted=False)  # a fused step as predicted
        steps += 1
        assert steps < 300
    assert steps > MIN_FAMILY_STEPS  # not at once: the disappointment is remembered for a while
    assert chooser.calibration["fused"] == 1.0 and 0.3 < chooser.calibration["packed"] < 1.0
    assert 0.3 < chooser.spec_calibration["packed"] < 1.0


def test_packed_plan_never_speculates_at_a_loss():
    from specrt.runtime.batch.goodput import SPEC_MARGIN, plan_packed

    # rows cost in proportion: a draft accepted 10% of the time does not pay for its row
    linear = CostTable(batch=[1.0], rows=[1.0], packed=[[1.0 * r for r in (1, 2, 4)]] * 2, packed_b=[1, 4],
                       packed_r=[1, 2, 4])
    assert plan_packed([0.1] * 4, [4] * 4, [0.0] * 4, linear).ks == [0] * 4
    # drafting that costs more than it saves stays off; well-accepted drafts on cheap rows are taken
    assert plan_packed([0.9] * 4, [4] * 4, [5.0] * 4, linear).ks == [0] * 4
    # a draft's price is the pass's extra row plus its own drafting, whatever was drafted before it: with rows
    # free and drafting at 0.5 s a token, each next draft of a request accepted 95% gains less than it costs
    # once its chance falls below a pass's worth (1 s step for 1 token: G ~ 1 token/s)
    free_rows = CostTable(batch=[1.0], rows=[1.0], packed=[[1.0, 1.0, 1.0]] * 2, packed_b=[1, 4], packed_r=[1, 2, 4])
    plan = plan_packed([0.95], [8], [0.5], free_rows)
    expected_tokens = 1 + sum(0.95 ** j for j in range(1, plan.ks[0] + 1))
    assert plan.goodput == pytest.approx(expected_tokens / (1.0 + 0.5 * plan.ks[0]))
    assert 0 < plan.ks[0] < 8
    for k in range(plan.ks[0] + 1, 9):  # no longer plan would have had more tokens per second
        longer = (1 + sum(0.95 ** j for j in range(1, k + 1))) / (1.0 + 0.5 * k)
        assert longer <= plan.goodput * SPEC_MARGIN
    flat = CostTable(batch=[1.0], rows=[1.0], packed=[[1.0, 1.01, 1.03]] * 2, packed_b=[1, 4], packed_r=[1, 2, 4])
    plan = plan_packed([0.9, 0.9, 0.0, 0.9], [3, 3, 3, 0], [0.0] * 4, flat)
    assert plan.ks == [3, 3, 0, 0] and plan.packed


def test_acceptance_is_estimated_per_kind_of_proposal():
    # an n-gram proposal from a 3-token match is accepted far more often than one from a 1-token match: the plan
    # reads the estimate of this step's kind (the request's overall estimate until that kind has been judged)
    from specrt.runtime.batch.sequence import PRIOR_ACCEPTANCE, BatchSequence
    from specrt.runtime.proposers.ngram import NgramProposer

    seq = BatchSequence(0, np.zeros(1, np.int64), None, "ngram", 4, lambda *_: None, None)
    for _ in range(10):
        seq.kind = 3
        seq.observe_acceptance(4, 4)
        seq.kind = 1
        seq.observe_acceptance(4, 0)
    seq.kind = 3
    high = seq.acceptance
    seq.kind = 1
    low = seq.acceptance
    seq.kind = 2
    overall = seq.acceptance
    assert high > 0.85 and low < 0.1 and low < overall < high
    fresh = BatchSequence(0, np.zeros(1, np.int64), None, "ngram", 4, lambda *_: None, None)
    assert fresh.acceptance == PRIOR_ACCEPTANCE
    prop = NgramProposer(max_n=3)
    toks = np.array([5, 6, 7, 8, 5, 6, 7, 0, 0], np.int64)
    prop.start(toks, 7)
    assert prop.propose(toks, 7, 2).token_ids.tolist() == [8, 5] and prop.matched == 3
    prop.propose(np.array([9, 9, 9, 9, 9, 9, 4], np.int64), 7, 2)
    assert prop.matched == 0


def test_a_draft_model_request_planned_at_k0_alone_still_probes():
    # A draft-model request is judged only when it drafts: planned at k = 0 from a low estimate it must still
    # draft one token every PROBE_AFTER steps when it decodes alone, or its estimate would never move again.
    from types import SimpleNamespace

    from specrt.runtime.batch.plan import PROBE_AFTER, Prepared, request_ks

    draft_req = SimpleNamespace(draft=object(), idle=0, policy=None)
    ngram_req = SimpleNamespace(draft=None, idle=0, policy=None)
    drafted = []
    for _ in range(3 * PROBE_AFTER):  # decoding alone (probes run there only)
        drafted += request_ks(Prepared([draft_req], [4], [None], [0.0]), [0], packed=False)
    assert drafted.count(1) == 3 and drafted[PROBE_AFTER - 1] == 1
    for _ in range(PROBE_AFTER):  # alone in a packed pass: no probes
        assert request_ks(Prepared([draft_req], [4], [None], [0.0]), [0], packed=True) == [0]
    for _ in range(2 * PROBE_AFTER):  # with another request in the batch: no probes
        ks = request_ks(Prepared([draft_req, ngram_req], [4, 4], [None, None], [0.0, 0.0]), [0, 0], packed=False)
        assert ks == [0, 0]  # and n-gram drafts, judged for free every step, are never forced
    seeded = SimpleNamespace(draft=None, idle=0, policy=object())  # a seeded request drafts its own policy's k
    assert request_ks(Prepared([seeded, ngram_req], [3, 4], [None, None], [0.0, 0.0]), [0, 2], packed=False) == [3, 2]


def test_a_lazy_draft_prefills_on_its_first_draft_and_drafts_the_same(pair_generator):
    # the scheduler's draft proposers start lazily: a request whose plans never draft never pays the draft's
    # prefill, and one that drafts gets the same drafts as an eagerly started draft (real ONNX Runtime draft)
    from specrt.runtime.proposers.draft_model import DraftModelProposer
    from specrt.runtime.sampling import SamplingParams

    gen = pair_generator
    tokens = np.array(gen.encode_prompt("def f(x): return x + 1\ndef g(x): return"), np.int64)
    n = tokens.size
    drafts = []
    for lazy in (False, True):
        p = DraftModelProposer(gen.draft, SamplingParams(temperature=0.0), np.random.default_rng(0), gen.vocab_size,
                               lazy=lazy)
        p.start(tokens, n)
        assert gen.draft.length == (0 if lazy else n - 1)
        drafts.append(p.propose(tokens, n, 4).token_ids.tolist())
        assert gen.draft.length == n + 3
    assert drafts[0] == drafts[1]


def test_hybrid_drafts_for_free_where_prompt_lookup_matches_and_a_stale_draft_waits_in_a_batch():
    # in a batch a hybrid request's n-gram branch is free like the ngram method's (its model drafts only where
    # prompt lookup finds nothing), and with other requests decoding a draft model whose catch-up (the whole
    # prompt at first) would cost more than a batched pass is not restarted (it would hold every request)
    from types import SimpleNamespace

    from specrt.runtime.batch.plan import prepare
    from specrt.runtime.proposers.hybrid import HybridProposer
    from specrt.runtime.proposers.ngram import NgramProposer

    def request(tokens, draft_length):
        hybrid = HybridProposer(NgramProposer(), SimpleNamespace(name="draft"))
        hybrid.ngram.start(tokens, tokens.size, None)
        return SimpleNamespace(proposer=hybrid, draft=SimpleNamespace(length=draft_length), tokens=tokens,
                               n=tokens.size, max_k=4, remaining=100, kind=None, policy=None, error=None)

    repeating = np.array([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], np.int64)  # "8 9 5 6 ..." follows "5 6 7"
    fresh = np.arange(20, 33, dtype=np.int64)  # nothing repeats
    table = CostTable(batch=[0.03] * 3, rows=[0.03], draft_token=0.01)  # a catch-up of 3 tokens or fewer fits
    running = [request(repeating, 0), request(fresh, 0), request(fresh, fresh.size - 1)]
    prepared = prepare(running, table, 256)
    max_ks, free, dcost = prepared.max_ks, prepared.free, prepared.draft_costs
    assert free[0].source == "ngram" and free[0].token_ids.tolist()[:2] == [8, 9] and dcost[0] == 0.0
    assert max_ks[0] == free[0].token_ids.size and running[0].kind == running[0].proposer.ngram.matched
    assert free[1] is None and max_ks[1] == 0  # no match, and its draft saw nothing: 12 tokens behind
    assert free[2] is None and max_ks[2] == 4 and dcost[2] == 0.01  # its draft is current: it may draft
    assert running[2].kind == DRAFT_KIND  # its model's proposal: judged apart from its n-gram ones
    # alone: a stale draft may catch up (the single-sequence loop does)
    assert prepare([request(fresh, 0)], table, 256).max_ks == [4]
    table.draft_token = 0.0  # drafting priced free (the sampling test's table): a stale draft restarts in a batch
    assert prepare([request(fresh, 0), request(fresh, 0)], table, 256).max_ks == [4, 4]


def test_a_hybrid_requests_draft_model_is_judged_apart_from_its_n_gram_proposals():
    # hybrid's n-gram branch is judged every step for free, so its judgements outnumber the draft model's: the
    # model's proposals have their own estimate, which starts from the prior, not from the n-gram record
    from specrt.runtime.batch.sequence import PRIOR_ACCEPTANCE, BatchSequence

    seq = BatchSequence(0, np.zeros(1, np.int64), None, "hybrid", 4, lambda *_: None, None)
    for _ in range(20):  # 1-token n-gram matches: rejected
        seq.kind = 1
        seq.observe_acceptance(4, 0)
    seq.kind = DRAFT_KIND
    assert seq.acceptance == PRIOR_ACCEPTANCE  # not the n-gram record (near 0)
    for _ in range(5):
        seq.observe_acceptance(4, 4)
    model = seq.acceptance
    seq.kind = 1
    assert model > 0.85 and seq.acceptance < 0.1
    seq.kind = None  # the overall estimate counts both
    assert seq.by_kind[1][0] / seq.by_kind[1][1] < seq.acceptance < model


def test_drafting_stops_where_its_realized_goodput_disappoints_and_is_retried_later():
    # `FamilyChooser.plan`: a drafting plan runs only while its prediction, scaled by how drafting steps realized
    # their predictions, beats the plain plan's scaled by how plain steps did; `calibrate` keeps the two apart and
    # lets the drafting calibration drift back while drafting is off
    from specrt.runtime.batch.family import FamilyChooser
    from specrt.runtime.batch.goodput import plan_packed

    table = CostTable(batch=[1.0, 1.05], rows=[1.0, 1.02, 1.04, 1.06])
    chooser = FamilyChooser(table, packed=True, batched_decode=True, switch_free=False)
    acceptance, max_ks, dcost = [0.9, 0.1], [3, 3], [0.0, 0.0]
    plan = plan_step(acceptance, max_ks, dcost, table)
    assert any(plan.ks)
    assert chooser.plan("fused", acceptance, max_ks, dcost, plan) is plan
    assert chooser.plan("fused", acceptance, max_ks, dcost).ks == plan.ks  # planned here when not given
    # drafting steps realized 60% of their prediction, plain steps all of theirs: the plain plan
    for _ in range(20):
        chooser.calibrate(0.6 * plan.goodput, plan.goodput, drafted=True)
    assert chooser.spec_calibration["fused"] < 0.7 and chooser.calibration["fused"] == 1.0
    plain = chooser.plan("fused", acceptance, max_ks, dcost, plan)
    assert plain.ks == [0, 0] and plain.batched and plain.goodput == pytest.approx(2 / table.t_batch(2))
    # plain steps as predicted: the drafting calibration drifts back to the plain one, and drafting resumes
    steps = 0
    while not any(chooser.plan("fused", acceptance, max_ks, dcost, plan).ks):
        chooser.calibrate(plain.goodput, plain.goodput, drafted=False)
        steps += 1
        assert steps < 200
    assert steps > 5  # not at once: a disappointment is remembered for a while
    # the packed family is judged by its own calibrations, against its own plain plan
    chooser.costs = CostTable(batch=[1.0] * 2, rows=[1.0] * 4, packed=[[1.0, 1.01, 1.02, 1.03]] * 2,
                              packed_b=[1, 2], packed_r=[1, 2, 4, 9])
    packed = plan_packed(acceptance, max_ks, dcost, chooser.costs)
    assert any(packed.ks)
    chooser.spec_calibration["packed"] = 0.4  # (2 + 0.9 + 0.81 + 0.73 + 0.1) / 1.03 * 0.4 < 2 / 1.0
    assert chooser.plan("packed", acceptance, max_ks, dcost, packed).ks == [0, 0]
    chooser.spec_calibration["packed"] = 1.0
    assert chooser.plan("packed", acceptance, max_ks, dcost, packed) is packed


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("packed", [False, True])
def test_identical_prompts_share_one_prefill_and_keep_their_output(engines, precision, packed, monkeypatch):
    # runtime/batch/shared_prompt.py: the prompt is prefilled over several steps (3 tokens a step); the sequences with
    # the same prompt wait for it, copy its rows, and still give what each gives alone (int4: two-row decode calls);
    # packed: the prompt chunks ride in the packed passes of the requests already decoding
    gen, eng = engines[precision]
    sched = eng.scheduler
    monkeypatch.setattr(sched, "prefill_chunk", 3)
    prompts = [PROMPTS[1], PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[2]]
    alone = [gen.generate(p, 12, method="ngram").token_ids for p in prompts]
    before = sched.sharing.tokens
    saved = _force_packed(sched, monkeypatch) if packed else sched.costs
    try:
        assert [r.token_ids for r in eng.generate_batch(prompts, 12, method="ngram")] == alone
    finally:
        sched.costs = saved
    assert sched.sharing.tokens - before == 2 * len(gen.encode_prompt(PROMPTS[1]))
    assert sched.targets.used == 0
