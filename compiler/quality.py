"""What quantization costs, measured at compile time on the portable graph I/O (graph_io.py).

`compare_quality`: teacher-forced over a token sequence, the quantized graph against the unquantized one:
greedy agreement (fraction of positions where both pick the same next token) and the perplexity of each
on the text's true next tokens (ratio = quantized / reference). The text runs in windows of at most
`window` tokens, each from an empty cache.

`verify_consistency`: at real positions of a text, the logits rows of one (k+1)-token pass against k+1
one-token passes of the same graph (the speculative verify pass against plain decoding): rows compared,
rows with the same argmax (and their fraction), the largest difference. Lossless greedy speculation needs
equal argmaxes. The scorer may be a `GraphScorer` or a `FusedScorer` (compiler/fused_scorer.py).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from specrt.bundle import graph_io
from specrt.bundle.graph_io import pad_rows
from specrt.core.errors import InvalidArgument

MAX_QUALITY_TOKENS = 4096
MAX_WINDOW = 256
HELDOUT = "heldout"


def heldout_text() -> str:
    """The built-in held-out text (self-written prose shipped in specrt/assets/quality)."""
    return resources.files("specrt.assets.quality").joinpath("heldout.txt").read_text(encoding="utf-8")


def text_token_ids(tokenizer_path: Path, text: str, what: str) -> np.ndarray:
    """Token ids of `text` (at most MAX_QUALITY_TOKENS) with the bundle's tokenizer."""  # -> [N]
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer_path)).encode(text, add_special_tokens=False).ids
    if len(ids) < 2:
        raise InvalidArgument(f"{what} has {len(ids)} token(s); measuring quality needs at least 2")
    return np.asarray(ids[:MAX_QUALITY_TOKENS], dtype=np.int64)


def quality_texts(tokenizer_path: Path, calibration_text: str | None = None,
                  calibration_name: str | None = None) -> dict[str, np.ndarray]:
    """The texts quality is measured on, as token ids: the built-in held-out text, and the user's
    --calibration-data when given (key "calibration")."""
    texts = {HELDOUT: text_token_ids(tokenizer_path, heldout_text(), "the built-in held-out text")}
    if calibration_text is not None:
        texts["calibration"] = text_token_ids(tokenizer_path, calibration_text,
                                              f"--calibration-data {calibration_name}")
    return texts


def scorer_session(onnx_path: Path, threads: int | None, optimize: bool = True):
    """An ONNX Runtime CPU session for compile-time measurements (no spinning: compile may share the cores).
    `optimize=False` runs every node as written: Q/DQ graphs then compute the fake-quantized function they
    describe (optimized, ONNX Runtime fuses Q/DQ pairs into its CPU int8 kernels, which gave greedy agreement
    0.02 for an int8 graph on an AVX2 CPU without VNNI: that measures the CPU, not the graph)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


class GraphScorer:
    """One ONNX Runtime CPU session over a graph with the portable I/O; calls with explicit past arrays."""

    def __init__(self, onnx_path: Path, dims: dict[str, int], threads: int | None = None, min_rows: int = 1,
                 optimize: bool = True) -> None:
        self.session = scorer_session(onnx_path, threads, optimize)
        self.layers, self.kv = dims["num_layers"], (dims["num_kv_heads"], dims["head_dim"])
        self.min_rows = min_rows  # pad shorter calls with their last token, as the ONNX Runtime runners do

    def empty_past(self) -> list[np.ndarray]:
        return [np.zeros((1, 0, *self.kv), np.float32) for _ in range(2 * self.layers)]

    def run(self, ids: np.ndarray, past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits [S, V] for `ids` [S] after `past`, and the past extended by the S new rows."""
        p, s = past[0].shape[1], ids.size
        ids = pad_rows(ids, self.min_rows)
        feeds = {graph_io.INPUT_IDS: ids[None].astype(np.int64),
                 graph_io.POSITION_IDS: np.arange(p, p + ids.size, dtype=np.int64)[None]}
        names = [graph_io.LOGITS]
        for i in range(self.layers):
            feeds[graph_io.past_key(i)], feeds[graph_io.past_value(i)] = past[2 * i], past[2 * i + 1]
            names += [graph_io.new_key(i), graph_io.new_value(i)]
        logits, *new = self.session.run(names, feeds)
        return logits[0, :s], [np.concatenate([a, b[:, :s]], axis=1) for a, b in zip(past, new)]


def _log_probs_of(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log softmax(logits)[targets] per row."""  # logits: [S, V], targets: [S] -> [S]
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
    return x[np.arange(len(targets)), targets] - lse


def compare_quality(reference: GraphScorer, quantized: GraphScorer, ids: np.ndarray,
                    window: int = MAX_WINDOW) -> dict[str, Any]:
    """Teacher-forced greedy agreement and perplexities of `quantized` against `reference` on `ids` [N]."""
    agree = total = 0
    nll_ref = nll_q = 0.0
    for start in range(0, ids.size - 1, window):
        chunk = ids[start:start + window + 1]
        if chunk.size < 2:
            break
        inputs, targets = chunk[:-1], chunk[1:]
        ref, _ = reference.run(inputs, reference.empty_past())
        q, _ = quantized.run(inputs, quantized.empty_past())
        agree += int((ref.argmax(axis=1) == q.argmax(axis=1)).sum())
        total += targets.size
        nll_ref -= float(_log_probs_of(ref, targets).sum())
        nll_q -= float(_log_probs_of(q, targets).sum())
    ppl_ref, ppl_q = float(np.exp(nll_ref / total)), float(np.exp(nll_q / total))
    return {"tokens": total, "greedy_agreement": agree / total, "ppl_reference": ppl_ref,
            "ppl_quantized": ppl_q, "ppl_ratio": ppl_q / ppl_ref}


def verify_consistency(scorer: GraphScorer, ids: np.ndarray, k: int, trials: int = 4,
                       prefix: int = 16) -> dict[str, Any]:
    """(k+1)-token passes against one-token passes at `trials` positions of `ids` [N]."""
    rows = equal = 0
    worst = 0.0
    span = prefix + k + 1
    starts = np.linspace(0, max(0, ids.size - span), trials).astype(int) if ids.size >= span else []
    for start in starts:
        seq = ids[start:start + span]
        _, past = scorer.run(seq[:prefix], scorer.empty_past())
        verify, _ = scorer.run(seq[prefix:], past)
        for j, token in enumerate(seq[prefix:]):
            single, past = scorer.run(seq[prefix + j:prefix + j + 1], past)
            rows += 1
            equal += int(single[0].argmax() == verify[j].argmax())
            worst = max(worst, float(np.abs(single[0] - verify[j]).max()))
    return {"rows": rows, "argmax_equal": equal, "identical_fraction": equal / rows if rows else 1.0,
            "max_abs_diff": worst, "draft_tokens": k}
