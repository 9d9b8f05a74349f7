"""A random-weight Llama of a chosen size, for `--simulate-acceptance` on a realistic-size target.

    make("artifacts/random-120m", "120M")      # then: specrt compile --target artifacts/random-120m -o BUNDLE

The tokenizer is a byte-level BPE (vocab 4096) trained in seconds on Python standard-library source,
so prompts tokenize as they would for the demo pair. Shapes: hidden 768 / 12 heads / MLP 3072 from
about 60M parameters up (GPT-2-small-like; 120M gives 12 layers), narrower below; the number of layers
is solved from the parameter count. Weights use initializer_range 0.1 so that greedy argmax near-ties
(which could flip between a decode and a verify pass) are unlikely.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

from specrt.core.errors import InvalidArgument

VOCAB = 4096
TEXT_MODULES = ("os", "json", "textwrap", "argparse", "collections", "typing", "pathlib", "inspect", "dataclasses")


def parse_params(text: str | int) -> int:
    """'120M' -> 120_000_000; '1.5B', '800k' and plain integers too."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbB]?)\s*", str(text))
    if not m:
        raise InvalidArgument(f"--params must look like 120M, 1.5B or 800k, got {text!r}")
    scale = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def shape_for(params: int, vocab: int = VOCAB) -> dict[str, int]:
    """hidden / heads / intermediate / layers for about `params` parameters (untied embeddings)."""
    if params >= 60_000_000:
        hidden, heads, inter = 768, 12, 3072
    elif params >= 10_000_000:
        hidden, heads, inter = 512, 8, 2048
    else:
        hidden, heads, inter = 128, 4, 512
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((params - 2 * vocab * hidden - hidden) / per_layer))
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": heads,
            "intermediate_size": inter, "num_hidden_layers": layers}


def train_tokenizer(path: Path, vocab: int = VOCAB) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = "\n".join(Path(importlib.import_module(m).__file__).read_text(encoding="utf-8") for m in TEXT_MODULES)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer)
    tok.save(str(path))
    return path


def make(out: str | Path, params: str | int = "120M", seed: int = 0, max_positions: int = 2048,
         force: bool = False) -> dict:
    """Write a random LlamaForCausalLM (safetensors, fp32) and its tokenizer to `out`; return a summary.
    `out` follows compile's output rule (compiler/output_dir.py): an existing one needs `force`."""
    from specrt.compiler.output_dir import HF_CHECKPOINT, staged_output

    out = Path(out)
    n = parse_params(params)
    if n < 100_000:
        raise InvalidArgument(f"--params {params}: too small for a Llama (use at least 100k)")
    if n > 100_000_000_000:
        raise InvalidArgument(f"--params {params}: too large for a random test target (at most 100B)")
    with staged_output(out, force, (), HF_CHECKPOINT) as staging:
        summary = _write(staging, n, seed, max_positions)
    return {**summary, "path": str(out), "tokenizer": str(out / "tokenizer.json")}


def _write(out: Path, n: int, seed: int, max_positions: int) -> dict:
    import torch
    import transformers as tf

    tok_path = train_tokenizer(out / "tokenizer.json")
    shape = shape_for(n)
    config = tf.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=max_positions, eos_token_id=0,
                            bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                            initializer_range=0.1, **shape)
    tf.utils.logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).eval()
    model.save_pretrained(str(out))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "model_max_length": max_positions}))
    count = sum(p.numel() for p in model.parameters())
    return {"path": str(out), "parameters": count, "tokenizer": str(tok_path), **shape}
