"""Tiny checkpoints written the way they are published: a hub-style `config.json` (older top-level keys such as
`rope_theta` / `rope_scaling`, as released models ship them, kept verbatim) with random weights from transformers,
plus the tests' tokenizer; and transformers' own greedy continuation to compare a compiled bundle with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def hub_checkpoint(path: Path, raw: dict, tokenizer: Path, dtype: str = "float32", seed: int = 0) -> Path:
    """Write `raw` as config.json, random weights (norms and biases randomised too, so they matter) in `dtype`."""
    import torch
    import transformers as tf

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.from_pretrained(path)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.normal_(1.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    (path / "config.json").write_text(json.dumps({**raw, "torch_dtype": dtype}, indent=2))  # as published
    (path / "generation_config.json").unlink(missing_ok=True)
    shutil.copy(tokenizer, path / "tokenizer.json")
    return path


def hf_greedy(path: Path, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation of `ids` (fp32; EOS from the checkpoint's generation config)."""
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                             temperature=None, top_p=None, top_k=None)
    return out[0, len(ids):].tolist()


def gpt2_config(vocab: int, **over) -> dict:
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
            "n_positions": 256, "vocab_size": vocab, "activation_function": "gelu_new", "initializer_range": 0.1,
            "bos_token_id": 0, "eos_token_id": 0, **over}


def llama_config(vocab: int, **over) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
            "initializer_range": 0.1, "bos_token_id": None, "eos_token_id": 0, "tie_word_embeddings": False, **over}


def qwen2_config(vocab: int, **over) -> dict:
    """Qwen2.5 as published: tied, sliding_window set but use_sliding_window false (full attention)."""
    return {**llama_config(vocab), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 21,
            "tie_word_embeddings": True, **over}
