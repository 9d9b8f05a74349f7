"""`specrt train-head` on tiny random targets of every architecture: data, training, resume, card, compile, decode."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from helpers import make_checkpoint

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "gpt2")
PROMPTS = "\n".join(f"def f{i}(x):" for i in range(10)) + "\n"


def _train(target, out, prompts, steps, **kw):
    from specrt.recipes.train_head import train_head_for_target

    return train_head_for_target(target, out, prompts=prompts, draft_vocab=64, answer_tokens=10, samples=1,
                                 steps=steps, max_minutes=None, batch_size=2, max_rows=16, progress=False, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_train_head_compile_and_decode(workdir, tokenizer_path, arch):
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.runtime import load

    base = workdir / "train_head" / arch
    # the parity tests' targets (tests/models): their export is reused (tests/export_cache.py)
    target = make_checkpoint(base / "target", arch, tokenizer_path, layers=3 if arch == "gemma3" else 2, seed=0)
    prompts = base / "prompts.txt"
    prompts.write_text(PROMPTS)
    out = base / "head"
    metrics = _train(target, out, prompts, steps=3)
    acc = metrics["heldout_acceptance"]
    assert acc["positions"] > 0 and len(acc["per_position"]) == 3 and 0.0 <= acc["acceptance"] <= 1.0
    assert metrics["heldout_answers"] == 2 and metrics["train_answers"] == 18  # prompt 9 held out, greedy + 1 sample
    cfg = json.loads((out / "head_config.json").read_text())
    assert len(cfg["vocab_ids"]) == 64 == metrics["draft_vocab_size"] and 0 in cfg["vocab_ids"]  # EOS kept
    assert "Held-out greedy acceptance" in (out / "README.md").read_text()
    assert (base / "head_run" / "data.pt").exists() and (base / "head_run" / "ckpt.pt").exists()

    bundle = compile_bundle(CompileSpec(target, base / "bundle", f"head:{out}", max_seq_len=64, max_draft_tokens=4))
    gen = load(bundle, backend="ort")
    for prompt in ("def main(argv):\n    ", "import os\n"):
        plain = gen.generate(prompt, 24, method="none")
        for method in ("head", "hybrid"):
            spec = gen.generate(prompt, 24, method=method, num_speculative_tokens=3)
            assert spec.token_ids == plain.token_ids, (arch, method)
    sampled = gen.generate("import os\n", 16, method="head", temperature=0.8, seed=2, num_speculative_tokens=3)
    assert 1 <= len(sampled.token_ids) <= 16 and sampled.stats.drafted_tokens > 0


@pytest.mark.slow
def test_train_head_resumes_and_refuses_to_overwrite(workdir, tokenizer_path, capsys):
    from specrt.core.errors import InvalidArgument

    base = workdir / "train_head_resume"
    target = make_checkpoint(base / "target", "llama", tokenizer_path, layers=1, seed=5)
    prompts = base / "prompts.txt"
    prompts.write_text(PROMPTS)
    out = base / "head"
    first = _train(target, out, prompts, steps=2)
    assert first["train"]["steps_done"] == 2
    with pytest.raises(InvalidArgument, match="--force"):
        _train(target, out, prompts, steps=4)
    second = _train(target, out, prompts, steps=2, force=True)  # same run dir: data cached, training resumed
    assert "resumed from" in capsys.readouterr().out
    assert second["train"]["steps_done"] == 2 and second["train_tokens"] == first["train_tokens"]
    assert second["heldout_acceptance"] == first["heldout_acceptance"]  # the same weights came back
    third = _train(target, out, prompts, steps=5, force=True)  # resumed with more steps: the new total wins
    assert "training to step 5" in capsys.readouterr().out
    assert third["train"]["steps_done"] == 5 and third["train"]["total_steps"] == 5


def test_cli_train_head_bad_input_is_one_line(tmp_path, llama_target):
    from specrt.cli.main import main

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    runner = CliRunner()
    res = runner.invoke(main, ["train-head", "--target", str(llama_target), "-o", str(taken)])
    assert res.exit_code == 2 and "--force" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, ["train-head", "--target", str(llama_target), "-o", str(tmp_path / "h"),
                               "--prompts", str(tmp_path / "missing.txt")])
    assert res.exit_code == 2 and "missing.txt" in res.output
    res = runner.invoke(main, ["train-head", "--target", str(tmp_path / "nothing"), "-o", str(tmp_path / "h")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    res = runner.invoke(main, ["train-head", "--target", str(llama_target), "-o", str(tmp_path / "h"),
                               "--answers-bundle", str(tmp_path)])
    assert res.exit_code == 2 and "is not a bundle" in res.output and not (tmp_path / "h").exists()
    res = runner.invoke(main, ["train-head", "--target", str(llama_target), "-o", str(tmp_path / "h"),
                               "--answer-batch", "0"])
    assert res.exit_code == 2 and "--answer-batch must be >= 1" in res.output and not (tmp_path / "h").exists()


def test_shipped_prompt_set_is_distinct_from_the_benchmark_prompts():
    """The head's training prompts hold no duplicate and none of the fresh benchmark prompts (never trained on)."""
    from pathlib import Path

    from specrt.recipes.head_data import read_prompts

    shipped = read_prompts(None)
    assert len(shipped) >= 500 and len(set(shipped)) == len(shipped)
    fresh = read_prompts(Path(__file__).resolve().parents[2] / "benchmarks" / "head_fresh_prompts.txt")
    assert fresh and not set(fresh) & set(shipped)


def test_compile_refuses_a_bad_head_dir(tmp_path, llama_target):
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.core.errors import CheckpointError

    (tmp_path / "head").mkdir()
    with pytest.raises(CheckpointError, match="train-head"):
        compile_bundle(CompileSpec(llama_target, tmp_path / "b", f"head:{tmp_path / 'head'}", max_seq_len=64, max_draft_tokens=4))
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_cli_compile_with_head(tmp_path, llama_target):
    """`specrt compile --draft head:DIR` (a head saved straight from the module) then `generate --method head`."""
    import torch

    from specrt.cli.main import main
    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import DraftHead, save_head

    decoder = open_checkpoint(llama_target).load_decoder(torch.float32)
    save_head(DraftHead(decoder, torch.arange(50)), tmp_path / "head")
    runner = CliRunner()
    res = runner.invoke(main, ["compile", "--target", str(llama_target), "--draft", f"head:{tmp_path / 'head'}",
                               "-o", str(tmp_path / "b"), "--max-seq-len", "64", "--max-draft-tokens", "4"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["generate", str(tmp_path / "b"), "--prompt", "import os", "--method", "head",
                               "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["stats"]["method"] == "head"


def test_chat_encoder_reads_chat_template_jinja(tmp_path, llama_target):
    """A checkpoint whose template is in chat_template.jinja (SmolLM2's GGUF conversion): the answers are made in it."""
    import shutil

    from tokenizers import Tokenizer

    from specrt.recipes.head_data import chat_encoder

    ck = tmp_path / "ck"
    shutil.copytree(llama_target, ck)
    plain = chat_encoder(ck)("hello")
    (ck / "chat_template.jinja").write_text("{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}"
                                            "{% if add_generation_prompt %}<<assistant>>{% endif %}")
    ids = chat_encoder(ck)("hello")
    text = Tokenizer.from_file(str(ck / "tokenizer.json")).decode(ids)
    assert text == "<<user>>hello<<assistant>>" and ids != plain


def test_training_rows_and_acceptance_are_aligned(tmp_path, tokenizer_path):
    """The oracle head of tests/runtime/test_draft_head.py (exactly the target when attention is off): the recipe's
    acceptance measure must accept every draft, and its loss must see matching features (feature term ~ 0)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    from specrt.models.checkpoint import open_checkpoint
    from specrt.models.draft_head import DraftHead
    from specrt.recipes.head_data import generate_features
    from specrt.recipes.head_train import acceptance_per_position, make_batch, reduced_index, row_losses

    target = make_checkpoint(tmp_path / "t", "llama", tokenizer_path, layers=1, seed=3)
    w = load_file(str(target / "model.safetensors"))
    for name in list(w):
        if name.endswith("o_proj.weight"):
            w[name] = torch.zeros_like(w[name])
        if name.endswith("embed_tokens.weight"):
            w[name] = w[name].half().float()
    save_file(w, str(target / "model.safetensors"), metadata={"format": "pt"})
    dec = open_checkpoint(target).load_decoder(torch.float32).eval()
    head = DraftHead(dec, torch.arange(dec.config.vocab_size)).eval()
    d = dec.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat((torch.zeros(d, d), torch.eye(d)), dim=1))
    seqs = [generate_features(dec, [5 + i, 9, 12], 20, set(), 0.0, torch.Generator()) for i in range(3)]
    acc = acceptance_per_position(head, seqs, k=3)
    assert acc["positions"] > 30 and acc["per_position"] == [1.0, 1.0, 1.0]
    lookup = reduced_index(head.vocab_ids, dec.config.vocab_size)
    batch = make_batch(seqs, [0, 1], 12, np.random.default_rng(0), lookup)
    with torch.no_grad():
        _, hidden = row_losses(head, *batch)
    assert torch.allclose(hidden, batch[3], atol=1e-3)  # the head's output feature = the target's next feature


def test_answers_from_a_bundle_equal_the_reference_path(tmp_path, llama_target, target_only_bundle, llama_draft):
    """`--answers-bundle`: the compiled target writes the answers (batched), the PyTorch decoder computes features
    in one teacher-forced pass: greedy answers and features equal the incremental reference path's; a bundle of
    another model is refused."""
    import torch

    from specrt.core.errors import InvalidArgument
    from specrt.models.checkpoint import open_checkpoint
    from specrt.recipes.head_data import (answers_from_bundle, chat_encoder, dataset_from_answers,
                                          generate_features)

    ck = open_checkpoint(llama_target)
    decoder = ck.load_decoder(torch.float32).eval()
    encode = chat_encoder(llama_target)
    prompts = [f"def f{i}(x):" for i in range(5)]
    eos = set(ck.config.eos_token_ids)
    answers = answers_from_bundle(target_only_bundle, ck.config, encode, prompts, tmp_path, max_new=12, samples=1,
                                  max_batch=3)
    assert [a["prompt"] for a in answers if a["greedy"]] == list(range(5)) and len(answers) == 10
    data = dataset_from_answers(decoder, answers, tmp_path)
    for a, seq in zip(answers, data):
        if not a["greedy"]:
            assert a["ids"][:a["prompt_len"]] == encode(prompts[a["prompt"]])
            continue
        ref = generate_features(decoder, encode(prompts[a["prompt"]]), 12, eos, 0.0, torch.Generator())
        assert seq["ids"].tolist() == ref["ids"].tolist()
        torch.testing.assert_close(seq["features"].float(), ref["features"].float(), atol=2e-2, rtol=1e-2)
        assert (seq["top_ids"][:, 0] == ref["top_ids"][:, 0]).all()
    again = answers_from_bundle(target_only_bundle, ck.config, encode, prompts, tmp_path, max_new=12, samples=1)
    assert again == answers  # cached in the run directory
    other = open_checkpoint(llama_draft).config  # one layer: not the bundle's target
    with pytest.raises(InvalidArgument, match="not compiled from this target"):
        answers_from_bundle(target_only_bundle, other, encode, prompts, tmp_path / "o", max_new=4, samples=0)


def test_the_printed_next_command_compiles(tmp_path, llama_target, monkeypatch):
    """`specrt train-head ... -o artifacts/my-head` (docs/draft-head.md) prints a `next: specrt compile` line that
    runs as printed: its bundle is not the head's own directory (it was `-o artifacts/my-head`: exit 2)."""
    import shlex

    from specrt.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    runner = CliRunner()
    res = runner.invoke(main, ["train-head", "--target", str(llama_target), "-o", "artifacts/my-head", "--prompts",
                               "prompts.txt", "--draft-vocab", "64", "--answer-tokens", "10", "--steps", "1",
                               "--batch-size", "2", "--max-rows", "16"])
    assert res.exit_code == 0, res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("next: ")]
    args = shlex.split(line.removeprefix("next: specrt "))
    assert args[args.index("-o") + 1] == "artifacts/my-bundle"
    res = runner.invoke(main, [*args, "--max-seq-len", "64", "--max-draft-tokens", "4"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "artifacts" / "my-bundle" / "manifest.json").is_file()
    from specrt.cli.commands.train_head import next_compile_line

    assert next_compile_line("t", "artifacts/my-bundle").endswith(" -o artifacts/my-bundle-bundle")
