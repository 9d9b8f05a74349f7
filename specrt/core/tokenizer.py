"""Tokenizer wrapper around `tokenizers`, and incremental detokenization for streaming.

`IncrementalDecoder` decodes only a short window of recent tokens per step (the prefix/read offset
method), so streaming costs O(1) per token instead of re-decoding the whole text.
"""

from __future__ import annotations

from pathlib import Path

from specrt.core.errors import BundleError


class Tokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise BundleError(f"cannot read tokenizer {path}: {exc}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)



class IncrementalDecoder:
    """Feed token ids as they are generated; get back only the newly completed text."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):  # wait for complete UTF-8 characters
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix):]
        return ""

    def flush(self) -> str:
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):]
