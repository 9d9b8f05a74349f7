"""Fast end-to-end test of the training recipes on a tiny synthetic corpus."""
from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from specrt.recipes.corpus import EOS_TOKEN, read_text_files, split_files
from specrt.recipes.distill import distill_draft
from specrt.recipes.medusa import (MedusaHeads, final_hidden, head_logits, load_medusa,
                                   save_medusa, train_medusa)
from specrt.recipes.tokenizer import encode_documents, train_tokenizer
from specrt.recipes.train_target import target_config, train_target

VOCAB = 300


def _write_corpus(root):
    root.mkdir()
    for i in range(12):
        body = "".join(
            f"def func_{i}_{j}(x, y={j}):\n    \"\"\"Return x plus {j}.\"\"\"\n"
            f"    if x > {i}:\n        return x + y * {j}\n    return [x for _ in range({j})]\n\n"
            for j in range(25))
        (root / f"mod_{i:02d}.py").write_text(body)
    return root


def test_recipes_end_to_end(tmp_path):
    torch.manual_seed(0)
    data = _write_corpus(tmp_path / "data")
    docs = read_text_files([data])
    assert len(docs) == 12
    train, held = split_files(sorted(data.iterdir()), every=5)
    assert [p.name for p in held] == ["mod_00.py", "mod_05.py", "mod_10.py"] and len(train) == 9

    # tokenizer: byte-level BPE, EOS = id 0, loadable by transformers
    tok_dir = tmp_path / "tok"
    tok = train_tokenizer(docs, tok_dir, vocab_size=VOCAB, model_max_length=256)
    assert tok.token_to_id(EOS_TOKEN) == 0 and tok.get_vocab_size() == VOCAB
    hf_tok = AutoTokenizer.from_pretrained(tok_dir)
    assert hf_tok.eos_token_id == 0 and hf_tok.bos_token_id is None
    text = "def f(x):\n    return x\n"
    assert hf_tok.decode(hf_tok(text)["input_ids"]) == text
    tokens = encode_documents(lambda b: [e.ids for e in tok.encode_batch(b)], docs, 0)
    assert (tokens == 0).sum() == len(docs)

    # target: a few steps, saved in HF format; re-running resumes (no extra steps)
    cfg = target_config(vocab_size=VOCAB, hidden=32, layers=2, heads=2, kv_heads=1,
                        intermediate=64, max_positions=256)
    kw = dict(config=cfg, steps=3, max_minutes=None, seq_len=32, batch_size=2, progress=False)
    stats = train_target(tokens, tmp_path / "target", tok_dir, **kw)
    assert stats["steps_done"] == 3 and np.isfinite(stats["final_loss"])
    again = train_target(tokens, tmp_path / "target", tok_dir, **kw)
    assert again["steps_done"] == 3
    target_dir = tmp_path / "target" / "final"

    # draft distillation through the public API
    m = distill_draft(target_dir, [data], tmp_path / "draft", layers=1, hidden=16, heads=2,
                      intermediate=32, steps=3, seq_len=32, batch_size=2, lr=1e-3,
                      progress=False, eval_prompts=2)
    assert m["train"]["steps_done"] == 3
    assert 0.0 <= m["acceptance"]["greedy_acceptance"] <= 1.0
    assert m["per_token_cost_ratio"] < 1.0
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assert draft.config.vocab_size == target.config.vocab_size == VOCAB
    assert draft.config.num_hidden_layers == 1 and draft.config.hidden_size == 16
    assert (tmp_path / "draft" / "tokenizer.json").exists()
    assert json.loads((tmp_path / "draft" / "generation_config.json").read_text())["eos_token_id"] == 0

    # Medusa: zero-initialised heads reproduce the base LM head exactly
    x = torch.from_numpy(tokens[:20].astype(np.int64))[None]
    with torch.no_grad():
        h, logits = final_hidden(target, x)
        for lg in head_logits(target, MedusaHeads(2, 32), h):
            torch.testing.assert_close(lg, logits, rtol=1e-4, atol=1e-4)

    heads, mstats = train_medusa(target, tokens, tmp_path / "medusa_run", num_heads=2, steps=2,
                                 max_minutes=None, seq_len=16, batch_size=2, progress=False)
    assert mstats["steps_done"] == 2
    save_medusa(heads, tmp_path / "medusa", VOCAB)
    cfg_m = json.loads((tmp_path / "medusa" / "medusa_config.json").read_text())
    assert cfg_m == {"medusa_num_heads": 2, "medusa_num_layers": 1, "hidden_size": 32,
                     "vocab_size": VOCAB, "shares_target_lm_head": True}
    tensors = load_file(str(tmp_path / "medusa" / "medusa.safetensors"))
    assert sorted(tensors) == ["heads.0.bias", "heads.0.weight", "heads.1.bias", "heads.1.weight"]
    assert tensors["heads.1.weight"].shape == (32, 32) and tensors["heads.1.bias"].shape == (32,)
    assert tensors["heads.0.weight"].dtype == torch.float16
    loaded, _ = load_medusa(tmp_path / "medusa")
    torch.testing.assert_close(loaded.heads[1].weight, heads.heads[1].weight.half().float())
