"""Tokenizer wrapper around `tokenizers`, and incremental detokenization for streaming.

`IncrementalDecoder` decodes only a short window of recent tokens per step (the prefix/read offset
method), so streaming costs O(1) per token instead of re-decoding the whole text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from specrt.core.errors import BundleError, InvalidArgument
from specrt.core.text import lone_surrogate


class Tokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:
            raise BundleError(f"cannot read tokenizer {path}: {exc}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        except TypeError:
            where = lone_surrogate(text) if isinstance(text, str) else None
            if where is None:
                raise
            raise InvalidArgument(f"the text to tokenize holds a lone surrogate ({where}): not valid Unicode "
                                  "text") from None

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


class StopText:
    """Cut the text before the first stop string; hold back a tail that may still become one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """-> (text safe to emit now, whether a stop string was found)."""
        if not self.stops:
            return piece, False
        buf = self.pending + piece
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[:min(hits)], True
        hold = 0
        for s in self.stops:  # longest suffix of buf that is a proper prefix of a stop string
            for n in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:n]):
                    hold = n
                    break
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TextStage:
    """The one detokenize + stop-string stage of every front end (Generator.generate / stream / stream_tokens,
    BatchEngine.generate_batch / stream_tokens, the server's worker): token ids in, text out, cut before the first
    stop string. `stopped` turns True on the step whose text reaches one; nothing is emitted after it.

    With stop strings the tokens are read one at a time, so the output ends at the token whose text completes the
    first stop string (as vLLM's per-token check), however a speculative step grouped the tokens: `kept` is how many
    of the last step's ids belong to the output (the rest of that step, past the stop, is dropped by every front end
    from its ids, token counts and logprobs)."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()) -> None:
        self.dec = IncrementalDecoder(tokenizer)
        self.stopper = StopText(stops)
        self.stopped = False
        self.kept = 0

    def push(self, ids: list[int]) -> str:
        """The text of one step's new tokens that is safe to emit now ("" after the stop)."""
        if self.stopped:
            self.kept = 0
            return ""
        self.kept = len(ids)
        if not self.stopper.stops:
            return self.dec.push(ids)
        parts = []
        for i, token in enumerate(ids):
            piece, self.stopped = self.stopper.push(self.dec.push([int(token)]))
            parts.append(piece)
            if self.stopped:
                self.kept = i + 1
                break
        return "".join(parts)

    def finish(self) -> str:
        """The rest of the text once the generation has ended (held-back tails, cut at a stop string)."""
        if self.stopped:
            return ""
        piece, self.stopped = self.stopper.push(self.dec.flush())
        return piece if self.stopped else piece + self.stopper.flush()


def text_pieces(tokenizer: Tokenizer, chunks):
    """Text pieces of a stream of token-id chunks (incremental detokenization, the tail flushed at the end)."""
    dec = IncrementalDecoder(tokenizer)
    for chunk in chunks:
        piece = dec.push(chunk)
        if piece:
            yield piece
    tail = dec.flush()
    if tail:
        yield tail
