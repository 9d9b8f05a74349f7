"""A randomly initialised Gemma 3 with Gemma 3 270M's exact shape, saved by transformers, for speed measurements
(speed depends on shapes, not on weight values; no real Gemma 3 checkpoint is reachable offline here).

    python scripts/gemma3_shape.py artifacts/gemma3-270m-shape

The configuration is the one of google/gemma-3-270m's config.json (hidden 640, 18 layers, 4 heads / 1 KV head,
head_dim 256, intermediate 2048, vocab 262,144, sliding window 512, every 6th layer global, rope bases 10k
local / 1M global, query_pre_attn_scalar 256, tied embeddings); `config_differences` lists what differs from
transformers' Gemma3TextConfig defaults. The tokenizer is a byte-level BPE of 4,096 tokens trained on Python
standard-library source (specrt.bench.random_target) padded to 262,144 entries with `<unused_N>` tokens, so
every id the random model emits decodes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB = 262_144
GEMMA3_270M = {
    "vocab_size": VOCAB, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    "query_pre_attn_scalar": 256, "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "tie_word_embeddings": True, "eos_token_id": 0, "bos_token_id": None, "pad_token_id": None,
}


def config_differences() -> dict[str, tuple]:
    """{key: (Gemma 3 270M value, transformers' Gemma3TextConfig default)} for the keys that differ."""
    import transformers as tf

    ours, default = tf.Gemma3TextConfig(**GEMMA3_270M).to_dict(), tf.Gemma3TextConfig().to_dict()
    return {k: (ours[k], default.get(k)) for k in GEMMA3_270M if ours[k] != default.get(k)}


def padded_tokenizer(path: Path) -> Path:
    from specrt.bench.random_target import train_tokenizer

    train_tokenizer(path, 4096)
    raw = json.loads(path.read_text())
    vocab = raw["model"]["vocab"]
    vocab.update({f"<unused_{i}>": i for i in range(len(vocab), VOCAB)})
    path.write_text(json.dumps(raw))
    return path


def make(out: Path, seed: int = 0) -> dict:
    import torch
    import transformers as tf

    out.mkdir(parents=True, exist_ok=True)
    padded_tokenizer(out / "tokenizer.json")
    config = tf.Gemma3TextConfig(**GEMMA3_270M)
    torch.manual_seed(seed)
    model = tf.Gemma3ForCausalLM(config).eval()
    model.save_pretrained(str(out))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return {"path": str(out), "parameters": sum(p.numel() for p in model.parameters()),
            "differs_from_transformers_defaults": config_differences()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    print(json.dumps(make(ap.parse_args().out), indent=1, default=str))
