"""Q4_K and Q6_K encoders for test GGUF files: the `gguf` package dequantizes K-quants but cannot write them
(`gguf.quants.quantize` raises NotImplementedError for Q4_K / Q6_K), and llama.cpp's Q4_K_M files carry both.

Simple round-to-nearest encoders (not llama.cpp's search for the best scales): they produce valid blocks in the
exact byte layout that the `gguf` package's `dequantize` reads, which is what a reader of the file must handle.
`encode(x, "Q6_K")` -> uint8 [rows, bytes per row], like `gguf.quants.quantize`. Rows must be a multiple of 256.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    """[n, 256] -> [n, 210]: ql (128) | qh (64) | int8 scales (16) | fp16 d."""
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    s = np.abs(sub).max(axis=2) / 31.0
    d = (np.abs(s).max(axis=1) / 127.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(s / np.where(d == 0, 1, d)[:, None]), -127, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    q = np.clip(np.round(sub / np.where(step == 0, 1, step)[:, :, None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(n, 2, 128).astype(np.uint8)  # two halves of 128 values
    low, high = q & 0x0F, q >> 4
    ql = low[:, :, :64] | (low[:, :, 64:] << 4)                      # [n, 2, 64]
    h = high.reshape(n, 2, 4, 32)
    qh = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)  # [n, 2, 32]
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), _f16(d)], axis=1)


def _pack_6bit(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 scales and 8 mins of 6 bits -> the 12 bytes Q4_K stores them in."""
    lo_sc = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_mn = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    rest = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo_sc, lo_mn, rest], axis=1).astype(np.uint8)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    """[n, 256] -> [n, 144]: fp16 d | fp16 dmin | 12 bytes of 6-bit scales/mins | qs (128)."""
    n = blocks.shape[0]
    sub = blocks.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0.0)
    scale = (sub.max(axis=2) - lo) / 15.0
    d = (scale.max(axis=1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(axis=1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d == 0, 1, d)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / np.where(dmin == 0, 1, dmin)[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    offset = dmin[:, None] * mn
    q = np.clip(np.round((sub + offset[:, :, None]) / np.where(step == 0, 1, step)[:, :, None]), 0, 15)
    q = q.astype(np.uint8).reshape(n, 4, 2, 32)
    qs = q[:, :, 0] | (q[:, :, 1] << 4)  # [n, 4, 32]
    return np.concatenate([_f16(d), _f16(dmin), _pack_6bit(sc, mn), qs.reshape(n, 128)], axis=1)


ENCODERS = {"Q6_K": _q6_k, "Q4_K": _q4_k}


def encode(x: np.ndarray, qtype: str) -> np.ndarray:
    rows, cols = x.shape
    if cols % QK_K:
        raise ValueError(f"{qtype} needs rows of a multiple of {QK_K} values, got {cols}")
    blocks = ENCODERS[qtype](x.astype(np.float32).reshape(-1, QK_K))
    return blocks.reshape(rows, -1)
