"""Measure structured-output libraries for specrt: per-token mask cost and schema correctness.

    python scripts/structured_libs.py --tokenizer DIR_WITH_tokenizer.json [--wide 262144] [--libs ...]

For each library (llguidance, xgrammar, outlines-core) and vocabulary (the given tokenizer, and a byte-level BPE
widened to `--wide` entries by adding merges of existing token pairs: a Gemma-3-sized vocabulary built from
SmolLM2's), it compiles every schema of the JSON extraction suite (specrt/bench/json_cases.py), then walks
the schema's example document token by token (canonical tokenization), timing the mask computation before each
token. Correctness: the example's tokens must all be accepted and end in an accepting state; the example with
one required key removed must be refused. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import numpy as np

from specrt.bench.json_cases import CASES


def widen_bpe(tokenizer_json: str, size: int) -> str:
    """A byte-level BPE tokenizer.json with `size` entries: merges of existing (token, token) pairs appended."""
    tj = json.loads(tokenizer_json)
    model = tj["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = model["merges"]
    as_pairs = isinstance(merges[0], list)
    base = sorted(vocab, key=vocab.get)[:20000]
    rng = np.random.default_rng(0)
    next_id = max(max(vocab.values()), max((t["id"] for t in tj.get("added_tokens", [])), default=0)) + 1
    while next_id < size:
        a, b = base[rng.integers(len(base))], base[rng.integers(len(base))]
        if a + b in vocab:
            continue
        vocab[a + b] = next_id
        merges.append([a, b] if as_pairs else f"{a} {b}")
        next_id += 1
    return json.dumps(tj)


def documents(case):
    doc = json.dumps(case.example, separators=(",", ":"))
    bad = copy.deepcopy(case.example)
    req = case.schema.get("required", [])
    if req:
        del bad[req[0]]
    return doc, (json.dumps(bad, separators=(",", ":")) if req else None)


class LLG:
    name = "llguidance"

    def __init__(self, tok_json: str, eos: int):
        import llguidance
        self.llg = llguidance
        self.tok = llguidance.LLTokenizer(tok_json, eos_token=eos)
        self.mask = np.zeros((self.tok.vocab_size + 31) // 32, dtype=np.int32)

    def compile(self, schema):
        g = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def step(self, m):
        m.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.mask.nbytes)

    def consume(self, m, t):
        return m.consume_token(t)

    def accepting(self, m):
        return m.is_accepting()


class XGR:
    name = "xgrammar"

    def __init__(self, tok_json: str, eos: int):
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        from tokenizers import Tokenizer
        self.x = xgrammar
        self.eos = eos
        hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok_json))
        info = xgrammar.TokenizerInfo.from_huggingface(hf, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema):
        g = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        return self.x.GrammarMatcher(g)

    def step(self, m):
        m.fill_next_token_bitmask(self.mask)

    def consume(self, m, t):
        return m.accept_token(t)

    def accepting(self, m):
        return m.accept_token(self.eos) and m.is_terminated()


class OTL:
    name = "outlines-core"

    def __init__(self, tok_json: str, eos: int):
        import outlines_core
        self.o = outlines_core
        tj = json.loads(tok_json)
        byte_of = _bytes_decoder()
        table: dict[bytes, list[int]] = {}
        for tok, i in tj["model"]["vocab"].items():
            if i == eos:
                continue
            try:
                b = bytes(byte_of[c] for c in tok)
            except KeyError:
                continue
            table.setdefault(b, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, table)
        self.n = max(tj["model"]["vocab"].values()) + 1
        self.mask = np.zeros((self.n + 31) // 32, dtype=np.int32)

    def compile(self, schema):
        regex = self.o.json_schema.build_regex_from_schema(json.dumps(schema), "")
        return self.o.Guide(self.o.Index(regex, self.vocab))

    def step(self, m):
        m.write_mask_into(self.mask.ctypes.data, self.mask.size, 4)

    def consume(self, m, t):
        try:
            m.advance(t)
            return True
        except Exception:
            return False

    def accepting(self, m):
        return m.is_finished()


def _bytes_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (byte-level BPE token text -> bytes)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def run(lib, encode, cases):
    compile_s, mask_s, ok, refused, errors = [], [], 0, 0, []
    for case in cases:
        doc, bad = documents(case)
        t0 = time.perf_counter()
        try:
            m = lib.compile(case.schema)
        except Exception as exc:  # noqa: BLE001 - a measurement: record and go on
            errors.append(f"{case.name}: {str(exc)[:80]}")
            continue
        compile_s.append(time.perf_counter() - t0)
        good = True
        for t in encode(doc):
            t0 = time.perf_counter()
            lib.step(m)
            mask_s.append(time.perf_counter() - t0)
            if not lib.consume(m, t):
                good = False
                break
        ok += good and lib.accepting(m)
        if bad is not None:
            m2 = lib.compile(case.schema)
            accepted_all = all(lib.consume(m2, t) for t in encode(bad)) and lib.accepting(m2)
            refused += not accepted_all
    return compile_s, mask_s, ok, refused, errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, type=Path)
    ap.add_argument("--wide", type=int, default=262144)
    ap.add_argument("--libs", default="llguidance,xgrammar,outlines-core")
    ap.add_argument("--eos", type=int, default=2)
    args = ap.parse_args()
    from tokenizers import Tokenizer
    base = (args.tokenizer / "tokenizer.json").read_text()
    vocabs = [("SmolLM2", base)]
    if args.wide:
        vocabs.append((f"widened to {args.wide}", widen_bpe(base, args.wide)))
    libs = {"llguidance": LLG, "xgrammar": XGR, "outlines-core": OTL}
    n_bad = sum(1 for c in CASES if c.schema.get("required"))
    print("| library | vocabulary | setup s | compile ms (median / max) | mask us per token (median / p90 / max) "
          "| examples accepted | broken examples refused | not compiled |")
    print("|---|---|---|---|---|---|---|---|")
    for vname, tj in vocabs:
        tok = Tokenizer.from_str(tj)
        encode = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
        for lname in args.libs.split(","):
            t0 = time.perf_counter()
            lib = libs[lname](tj, args.eos)
            setup = time.perf_counter() - t0
            c, m, ok, refused, errors = run(lib, encode, CASES)
            ms = sorted(m)
            print(f"| {lname} | {vname} ({len(tok.get_vocab())}) | {setup:.1f} | "
                  f"{1e3 * statistics.median(c):.1f} / {1e3 * max(c):.0f} | "
                  f"{1e6 * statistics.median(ms):.0f} / {1e6 * ms[int(0.9 * len(ms))]:.0f} / {1e6 * ms[-1]:.0f} | "
                  f"{ok}/{len(CASES)} | {refused}/{n_bad} | {len(errors)} {'; '.join(errors)[:200]} |", flush=True)


if __name__ == "__main__":
    main()
