"""Byte-level BPE tokenizer training and corpus encoding.

The tokenizer is a byte-level BPE (GPT-2 style, ``add_prefix_space=False``) with a
single special token ``<|endoftext|>`` (id 0) used as EOS and document separator.
There is no BOS token.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specrt.recipes.corpus import EOS_TOKEN


def train_tokenizer(docs: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 4096,
                    model_max_length: int = 1024) -> Tokenizer:
    """Train a byte-level BPE on ``docs`` and save ``tokenizer.json`` and
    ``tokenizer_config.json`` into ``out_dir``.  Returns the tokenizer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(docs), trainer=trainer)
    assert tok.token_to_id(EOS_TOKEN) == 0, "EOS must be id 0"
    tok.save(str(out / "tokenizer.json"))
    write_tokenizer_config(out, model_max_length)
    return tok


def write_tokenizer_config(out_dir: str | os.PathLike, model_max_length: int = 1024) -> None:
    """Write the ``tokenizer_config.json`` that lets ``AutoTokenizer`` load the tokenizer."""
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
    }
    (Path(out_dir) / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a ``tokenizer.json`` (path to the file or to its directory)."""
    p = Path(path)
    return Tokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p))


def encode_documents(encode_batch, docs: Sequence[str], eos_id: int,
                     dtype=np.int32) -> np.ndarray:
    """Encode documents into one flat token stream, with ``eos_id`` after each one.

    ``encode_batch`` maps a list of strings to a list of token-id lists (for example
    ``lambda b: [e.ids for e in tok.encode_batch(b)]``).  This is equivalent to
    encoding the documents joined with the EOS token, without risking a merge
    across the boundary.
    """
    parts: list[np.ndarray] = []
    for start in range(0, len(docs), 64):
        for ids in encode_batch(list(docs[start:start + 64])):
            parts.append(np.asarray(ids, dtype=dtype))
            parts.append(np.asarray([eos_id], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def hf_encoder(hf_tokenizer):
    """Return an ``encode_batch`` function for a transformers tokenizer (no special tokens)."""
    def encode_batch(batch):
        return hf_tokenizer(batch, add_special_tokens=False)["input_ids"]
    return encode_batch


def prepare_stdlib_tokens(run_dir: str | os.PathLike, vocab_size: int = 4096) -> dict:
    """Train (or reuse) the demo tokenizer on the stdlib train split and cache the
    train/held-out token streams as ``.npy`` files in ``run_dir``."""
    from specrt.recipes.corpus import read_text_files, stdlib_corpus

    run = Path(run_dir)
    tok_dir = run / "tokenizer"
    info_path = run / "corpus.json"
    corpus = stdlib_corpus()
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(read_text_files(corpus["train_files"]), tok_dir, vocab_size)
    tok = load_tokenizer(tok_dir)
    enc = lambda b: [e.ids for e in tok.encode_batch(b)]  # noqa: E731
    out = {}
    for split in ("train", "heldout"):
        path = run / f"tokens_{split}.npy"
        if not path.exists():
            arr = encode_documents(enc, read_text_files(corpus[f"{split}_files"]), 0, np.uint16)
            np.save(path, arr)
        out[split] = np.load(path)
    if not info_path.exists():
        info = {k: corpus[k] for k in ("root", "train_names", "heldout_names", "train_bytes", "heldout_bytes")}
        info.update(train_tokens=int(len(out["train"])), heldout_tokens=int(len(out["heldout"])),
                    vocab_size=tok.get_vocab_size())
        info_path.write_text(json.dumps(info, indent=1) + "\n")
    out["tokenizer_dir"] = tok_dir
    out["info"] = json.loads(info_path.read_text())
    return out
