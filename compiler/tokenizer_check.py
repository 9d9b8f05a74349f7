"""Draft and target must tokenize identically: compare their `tokenizer.json` vocabularies."""

from __future__ import annotations

from pathlib import Path

from specrt.core.errors import CheckpointError


def load_vocab(path: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read tokenizer {path}: {exc}") from None


def check_same_vocab(target_tok: Path, draft_tok: Path) -> int:
    """Raise CheckpointError if the vocabularies differ; return the vocabulary size."""
    t, d = load_vocab(target_tok), load_vocab(draft_tok)
    if t != d:
        only_t = len(set(t.items()) - set(d.items()))
        only_d = len(set(d.items()) - set(t.items()))
        raise CheckpointError(
            f"draft and target vocabularies differ (target {len(t)} tokens, draft {len(d)} tokens; "
            f"{only_t} entries only in the target, {only_d} only in the draft): the draft must use the "
            "target's tokenizer"
        )
    return len(t)
