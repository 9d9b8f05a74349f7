"""The fused draft head's recipe (#52): shards made by the batch engine, training-time test, held-out measure."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specrt.models.draft_head_fused import FusedDraftHead, ttt_layer, ttt_mask


def _decoder(path):
    from specrt.models.checkpoint import open_checkpoint

    return open_checkpoint(path).load_decoder(torch.float32).eval().requires_grad_(False)


def _head(decoder, vocab=None, seed=0):
    torch.manual_seed(seed)
    ids = torch.arange(decoder.config.vocab_size) if vocab is None else torch.tensor(vocab)
    head = FusedDraftHead(decoder, ids, (0, 1, 1))
    with torch.no_grad():  # away from the identity start, so every input and depth matters
        for p in head.trained_parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return head.eval()


def test_ttt_mask_is_the_drafting_cache():
    m = ttt_mask(4, 2)  # depth 2, row 3: depth-0 keys of rows <= 1, the depth-1 key of row 2, itself
    assert m[3].tolist() == [True, True, False, False] + [False, False, True, False] + [False, False, False, True]
    assert m[1].tolist()[:4] == [False] * 4 and m[1, 9]  # no anchor yet: only itself


@pytest.fixture(params=["llama", "smollm3"])
def ttt_target(request, llama_target, workdir, tokenizer_path):
    """The Llama target, and a SmolLM3 one whose last layer (the head's) has no rope."""
    if request.param == "llama":
        return llama_target
    from helpers import make_checkpoint

    return make_checkpoint(workdir / "ttt" / "smollm3", "smollm3", tokenizer_path, layers=4, seed=0)


@torch.no_grad()
def test_ttt_depth0_equals_the_layer(ttt_target):
    dec = _decoder(ttt_target)
    head = _head(dec)
    c = dec.config
    x = torch.randn(2, 7, c.hidden_size)
    pos = torch.arange(7).expand(2, 7)
    cos, sin = head.rotary.cos_sin(pos)
    empty = torch.zeros(2, 0, c.num_kv_heads, c.head_dim)
    want, _, _ = head.layer(x, cos, sin, empty, empty)
    got = ttt_layer(head, x, pos, [], [], 0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_batched_acceptance_equals_real_drafting(llama_target):
    """The training-time-test pass measures what a head drafting with its own cache row by row accepts."""
    from specrt.recipes.head_ttt import drafting_acceptance, heldout_acceptance

    dec = _decoder(llama_target)
    vocab = [5, 9, 17, 40]  # a tiny head vocabulary: its guesses are right often enough to count
    head = _head(dec, vocab, seed=3)
    d = dec.config.hidden_size
    total, counted = np.zeros(3), 0
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        t = 30
        seq = {"ids": torch.tensor(vocab)[torch.randint(0, 4, (t,), generator=g)],
               "feats": torch.randn(t, 4, d, generator=g).half(), "prompt_len": 4, "greedy": True}
        # make the answer partly the head's own greedy chains, so that deep drafts are accepted too
        c = dec.config
        empty = torch.zeros(1, 0, c.num_kv_heads, c.head_dim)
        for a in range(3, t - 3, 3):
            rows = t - 1
            logits = head(seq["feats"][None, :rows, -1].float(), seq["ids"][None, 1:], torch.arange(rows)[None],
                          empty, empty, seq["feats"][None, :rows, :-1].float())[0]
            seq["ids"][a + 2] = int(head.vocab_ids[int(logits[0, a].argmax())])
        real = drafting_acceptance(head, seq, k=3)
        batched = heldout_acceptance(head, [seq], k=3)
        assert [round(r / batched["positions"], 4) for r in real] == batched["per_position"]
        total += real
        counted += batched["positions"]
    assert total[0] > 0 and total[1] > 0  # both depths were exercised


def test_spec_bench_questions_are_refused():
    from specrt.core.errors import InvalidArgument
    from specrt.recipes.head_shards import benchmark_questions, requests_of

    question = sorted(benchmark_questions())[0]
    with pytest.raises(InvalidArgument, match="Spec-Bench question"):
        requests_of(["Explain DNS.", question.upper()])
    reqs = requests_of([f"prompt {i}" for i in range(10)])
    assert sum(r["base"] == 9 for r in reqs) == 1 and sum(r["base"] == 0 for r in reqs) > 1  # held out: plain only


def test_shards_in_one_pass_then_training_resumes(workdir, llama_target, target_only_bundle, tokenizer_path):
    """Answers by the default (one-pass) maker, features of three layers + the final one, shards resumed; a few training steps,
    the learning curve written and resumed from its checkpoint."""
    from specrt.recipes.head_data import chat_encoder
    from specrt.recipes.head_fit import fit_fused_head
    from specrt.recipes.head_shards import make_shards, requests_of
    from specrt.recipes.head_shardset import ShardSet

    dec = _decoder(llama_target)
    run = workdir / "fused_head"
    reqs = requests_of([f"def f{i}(x):" for i in range(10)], styles=("", " return"))
    made = make_shards(target_only_bundle, dec, chat_encoder(llama_target), reqs, run / "shards", max_new=8,
                       samples=1, batch=8, layers=(0, 1))
    assert made == 3 and make_shards(target_only_bundle, dec, None, reqs, run / "shards", max_new=8, samples=1,
                                     batch=8, layers=(0, 1)) == 3  # all made: nothing is generated again
    data = ShardSet(run / "shards")
    assert len(data.train) == 36 and len(data.heldout) == 1  # 18 training requests x (greedy + 1 sample)
    seq = data.sequence(data.train[0])
    c = dec.config
    with torch.no_grad():
        empty = torch.zeros(1, 0, c.num_kv_heads, c.head_dim)
        out = dec(seq["ids"][None], torch.arange(seq["ids"].numel())[None], (empty,) * 2, (empty,) * 2)
    torch.testing.assert_close(seq["feats"][:, -1].float(), out.hidden_states[0], atol=2e-3, rtol=2e-3)
    assert (seq["top_ids"][:, 0] == out.logits[0].argmax(-1).int()).all()

    fit_fused_head(dec, run / "shards", run, steps=4, draft_vocab=64, batch_size=2, rows=16, eval_every=2,
                   min_train_tokens=10, progress=False, say=lambda _: None)
    curve = [json.loads(x) for x in (run / "curve.jsonl").read_text().splitlines()]
    assert [x["step"] for x in curve] == [2, 4] and len(curve[-1]["heldout_per_position"]) == 3
    said = []
    fit_fused_head(dec, run / "shards", run, steps=6, draft_vocab=64, batch_size=2, rows=16, eval_every=2,
                   min_train_tokens=10, progress=False, say=said.append)
    assert said[0].startswith("resumed at step 4") and (run / "curve.jsonl").read_text().count("\n") == 3
    # the best measure's head is kept apart (the last steps may be worse): rebuilt, it measures what its line says
    from specrt.recipes.head_fit import best_fused_head
    from specrt.recipes.head_ttt import heldout_acceptance

    curve = [json.loads(x) for x in (run / "curve.jsonl").read_text().splitlines()]
    head, line = best_fused_head(dec, run)
    top = max(x["heldout_acceptance"] for x in curve)
    assert line["heldout_acceptance"] == top and line["step"] == max(x["step"] for x in curve
                                                                      if x["heldout_acceptance"] == top)
    got = heldout_acceptance(head, [data.sequence(r) for r in data.heldout])
    assert got["per_position"] == line["heldout_per_position"] and got["tf_top1"] == line["heldout_tf_top1"]
    # shipped: that head in fp16 (the trained parameters only) with a card holding the learning curve
    from specrt.models.draft_head_fused import load_fused_head
    from specrt.recipes.head_export import export_fused_head

    (run / "fit").mkdir()
    for name in ("best.pt", "curve.jsonl"):
        (run / name).rename(run / "fit" / name)
    m = export_fused_head(dec, run, workdir / "shipped", about={"data": "toy prompts"})
    back = load_fused_head(workdir / "shipped", dec)
    assert m["steps"] == line["step"] and all(torch.equal(v, head.trained_state()[k].half().float())
                                             for k, v in back.trained_state().items())
    from safetensors import safe_open

    with safe_open(str(workdir / "shipped" / "head.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    card = (workdir / "shipped" / "README.md").read_text()
    assert "toy prompts" in card and all(f"| {x['step']} |" in card for x in curve)


def test_cli_fused_recipe_writes_a_fused_head(workdir, llama_target, target_only_bundle):
    """`specrt train-head --recipe fused`: shards, training, a version-2 head directory that loads back exactly and
    that compile takes (tests/runtime/test_fused_head.py compiles and runs one)."""
    from click.testing import CliRunner

    from specrt.cli.main import main
    from specrt.compiler.draft_head import draft_head_step
    from specrt.models.draft_head_fused import load_fused_head

    base = workdir / "fused_cli"
    base.mkdir()
    prompts = base / "prompts.txt"
    prompts.write_text("\n".join(f"def g{i}(y):" for i in range(10)) + "\n")
    out = base / "head"
    args = ["train-head", "--target", str(llama_target), "-o", str(out), "--prompts", str(prompts), "--recipe", "fused",
            "--answers-bundle", str(target_only_bundle), "--answer-tokens", "6", "--samples", "1", "--steps", "3",
            "--draft-vocab", "64", "--batch-size", "2", "--max-rows", "16", "--answer-batch", "32", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    got = json.loads(res.output[res.output.index("{"):])
    assert got["recipe"] == "fused" and len(got["heldout_acceptance"]["per_position"]) == 3
    assert "Held-out greedy acceptance" in (out / "README.md").read_text()
    cfg = json.loads((out / "head_config.json").read_text())
    assert cfg["version"] == 2 and cfg["feature_layers"] == [0, 1]  # a 2-layer target: two distinct layers
    head = load_fused_head(out, _decoder(llama_target))
    assert head.fc.weight.shape[1] == 4 * head.config.hidden_size
    assert callable(draft_head_step(out, llama_target))  # before #52's export: refused as a fused head
    i = args.index("--answers-bundle")  # without a bundle: the one-pass maker (recipes/head_onepass.py)
    no_bundle = CliRunner().invoke(main, args[:i] + args[i + 2:] + ["--force", "--run-dir", str(base / "run1")])
    assert no_bundle.exit_code == 0, no_bundle.output
    assert any((base / "run1" / "shards").iterdir())


@torch.no_grad()
def test_heldout_measure_starts_where_the_runtime_drafts(llama_target):
    """The answer's first token comes from the prefill and is never drafted: the first chain is anchored at row
    prompt_len - 1 (it drafts token prompt_len + 1). Both held-out measures count exactly the runtime's anchors."""
    from specrt.models.draft_head import DraftHead
    from specrt.recipes.head_train import acceptance_per_position
    from specrt.recipes.head_ttt import heldout_acceptance

    dec = _decoder(llama_target)
    d, t, p, k = dec.config.hidden_size, 20, 6, 3
    g = torch.Generator().manual_seed(0)
    seq = {"ids": torch.randint(0, 50, (t,), generator=g), "feats": torch.randn(t, 4, d, generator=g).half(),
           "prompt_len": p, "greedy": True}
    plain = {**seq, "features": seq["feats"][:, -1]}
    assert acceptance_per_position(DraftHead(dec, torch.arange(64)), [plain], k=k)["positions"] == t - p - k
    assert heldout_acceptance(_head(dec), [seq], k=k)["positions"] == t - p - k


@pytest.mark.parametrize("layers, message", [([1, 1], "distinct"), ([0, 7], "outside the target's 2 layers"),
                                             ("2,15", "distinct"), ([True], "distinct")])
def test_fused_head_config_checks_its_layers(layers, message):
    from specrt.core.errors import CheckpointError, ManifestError
    from specrt.models.head_config import check_head_config

    target = {"num_layers": 2, "vocab_size": 10}
    cfg = {"format": "specrt-draft-head", "version": 2, "vocab_ids": [0, 1], "feature_layers": [0, 1], "target": target}
    assert check_head_config(cfg, "h.json", target=target, versions=(2,)) == [0, 1]
    with pytest.raises(ManifestError, match="where a plain head"):  # compile / load: plain heads only
        check_head_config(cfg, "h.json", target=target)
    with pytest.raises(CheckpointError, match=message):
        check_head_config({**cfg, "feature_layers": layers}, "h.json", target=target, versions=(2,),
                          error=CheckpointError)


def test_windows_train_on_answer_rows_only():
    """Prompt rows are context (keys and values), not loss: the head never drafts inside a prompt."""
    from specrt.recipes.head_shardset import make_windows

    t, p, d = 12, 5, 8
    seq = {"ids": torch.arange(t), "feats": torch.zeros(t, 4, d).half(), "top_ids": torch.zeros(t, 2, dtype=torch.int32),
           "top_logits": torch.zeros(t, 2).half(), "prompt_len": p}
    w = make_windows([seq], 64, np.random.default_rng(0), torch.arange(t))
    assert w["mask"][0].tolist() == [False] * (p - 2) + [True] * (t - 1 - (p - 2))  # row t guesses token t + 2
