"""An exact greedy LM head for large vocabularies: an int8 screen, then fp32 logits for the candidates only.

A decode step of a small model with a large vocabulary reads the LM head more than anything else (Gemma 3
270M: 63% of its weights; docs/gemma3.md). A greedy step only needs the argmax of each logits row, and that can be
found exactly from much less:

1. a = x W8^T, the head with int8 weights (blocks of 128, 64 or 32 along the hidden size, round to nearest, one
   scale per block), as ONNX Runtime's MatMulNBits with accuracy level 4 (activations quantized to int8 per row
   block);
2. a bound: for every token r, |x w_r - a_r| <= eps_r, computed per block b of B values along K (the kernel
   quantizes the activations per block too, round to nearest, scale sa_b = max_b |x| / 127, and corrects the
   weights' zero point with the quantized sum, so a = x^ . w^ up to fp32 rounding):
       eps_r = sum_b sa_b W1_rb + 2 sum_b d_rb (X1_b + B sa_b / 2) + X1 g_r
   with W1_rb = sum_b |w_r|, X1_b = sum_b |x|, d_rb the largest weight rounding error of block b of row r, and
   g_r = (K + 2) 2^-23 max|w_r| for fp32 rounding. The first two terms are twice the exact worst case of
   |(x - x^) w| + |x^ (w - w^)| with |x - x^| <= sa_b / 2 and |x^| <= |x| + sa_b / 2 (the factor 2 covers other
   rounding rules); per-block activation steps keep one outlier activation from loosening every block's bound;
3. u = a + eps is an upper bound of every exact logit; C = the `CANDIDATES` (256) tokens with the largest u;
4. e = x W_C^T in fp32 for those rows only (a Gather of 256 rows and a small MatMul);
5. if the smallest u in C is below max(e) for every row, no token outside C can reach max(e): the logits row
   is e at C and -inf elsewhere, whose argmax is the full head's. Otherwise (a flat distribution) the graph
   computes the full fp32 head after all.

The screened head is an `If` on the graph input `lm_head_full` (a bool, default true: every row's full
logits, as before). A runner sets it false for calls whose rows only feed an argmax (greedy decoding without a
constraint: `Runner.set_argmax_only`; a greedy draft model's drafting too); sampling, constrained decoding,
scoring and batching read full rows. Only an fp32 fused graph gets it (a quantized head is already cheap), target
or draft, when the head is large (`screen_wanted`).
"""

from __future__ import annotations

import numpy as np

from specrt.bundle.graph_io import LM_HEAD_FULL  # graph input: bool [], default true (full logits rows)
from specrt.compiler.fused_layers import softcap as capped
from specrt.compiler.graph_builder import MS, GraphBuilder

CANDIDATES = 256  # tokens whose fp32 logits a screened row computes (at most a quarter of the vocabulary)
BLOCKS = (128, 64, 32)  # int8 weight block along the hidden size: the largest that divides it (fewer scales to
# read; the bound grows a little: docs/gemma3.md, "The screened greedy head")
MIN_VOCAB = 32768  # below this the head is small enough that the screen's fixed costs do not pay
MIN_HEAD_SHARE = 0.25  # the head's share of the weights a decode step reads (see screen_wanted)


def screen_wanted(mode: str, vocab_size: int, hidden_size: int, layer_weights: int) -> bool:
    """`mode` "on" / "off", or "auto": a vocabulary of at least MIN_VOCAB tokens whose head is at least
    MIN_HEAD_SHARE of a step's weights (head + layers): where the head's bytes dominate a step (the measurements
    behind the threshold: docs/gemma3.md, "The screened greedy head")."""
    if mode in ("on", "off"):
        return mode == "on"
    head = vocab_size * hidden_size
    return vocab_size >= MIN_VOCAB and head >= MIN_HEAD_SHARE * (head + layer_weights)


def candidates(vocab_size: int) -> int:
    """How many tokens a screened row computes exactly: CANDIDATES, at most a quarter of the vocabulary."""
    return max(1, min(CANDIDATES, vocab_size // 4))


def block_size(hidden_size: int) -> int | None:
    """The int8 head's block along the hidden size (see BLOCKS), None when none divides it."""
    return next((b for b in BLOCKS if hidden_size % b == 0), None)


def screen_supported(hidden_size: int) -> str | None:
    """None when the screen can be built for this hidden size, else why not."""
    if block_size(hidden_size) is None:
        return f"hidden size {hidden_size} is not a multiple of {BLOCKS[-1]} (the int8 head's blocks)"
    return None


def quantize_head(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [V, K] fp32 -> (packed uint8 [V, K/B, B] with zero point 128, scales [V * K/B] fp32), B = block_size(K)."""
    v, k = w.shape
    block = block_size(k)
    blocks = w.reshape(v, k // block, block)
    scale = np.abs(blocks).max(axis=-1) / np.float32(127.0)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[..., None]), -127, 127)
    return (q + 128).astype(np.uint8), scale.reshape(-1)


def bound_terms(w: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[2 nb + 1, V] (nb blocks of B along K): eps = [sa_b, X1_b + B sa_b / 2, X1] @ this, per the module
    docstring: sum_b sa_b W1_rb + 2 sum_b d_rb (X1_b + B sa_b / 2) + X1 g_r, with W1_rb = sum over block b of
    |w_r|, d_rb its largest rounding error, g_r the fp32 rounding term."""
    v, k = w.shape
    block = block_size(k)
    nb = k // block
    blocks = w.reshape(v, nb, block).astype(np.float64)
    deq = (packed.astype(np.float64) - 128) * scales.reshape(v, nb, 1)
    w1 = np.abs(blocks).sum(axis=-1)  # [V, nb]
    d = np.abs(blocks - deq).max(axis=-1)  # [V, nb]
    g = (k + 2) * 2.0**-23 * np.abs(w).max(axis=1).astype(np.float64)
    terms = np.concatenate([w1.T, 2.0 * d.T, g[None, :]])
    return (terms * (1 + 2.0**-20)).astype(np.float32)  # rounded up a little: fp32 storage


def bound_features(x: np.ndarray) -> np.ndarray:
    """[M, 2 nb + 1] for rows x [M, K]: what `bound_terms` is multiplied by (the graph computes the same)."""
    m, k = x.shape
    block = block_size(k)
    absx = np.abs(x).reshape(m, k // block, block)
    sa = absx.max(axis=-1) / np.float32(127.0)
    x1 = absx.sum(axis=-1)
    return np.concatenate([sa, x1 + block / 2 * sa, absx.sum(axis=(1, 2))[:, None]], axis=1)


def screened_head(g, rows2d: str, head: str, w: np.ndarray, softcap: float | None) -> str:
    """Add the head to the fused graph builder `g` (compiler/fused_graph.py): rows2d [M, K] fp32, `head` the
    name of the [V, K] fp32 weight initializer (the tied embedding or the head's own), w its values. Returns the
    logits [M, V] name."""
    from onnx import TensorProto, helper

    v, k = w.shape
    m = candidates(v)
    block = block_size(k)
    packed, scales = quantize_head(w)
    g.inits.append(_u8(packed, "lm_head.int8.weight"))
    g.weight("lm_head.int8.scales", scales)
    g.weight("lm_head.screen_bound", bound_terms(w, packed, scales))
    g.weight("lm_head.inv127", np.array(1.0 / 127.0, np.float32))
    g.weight("lm_head.half_block", np.array(block / 2, np.float32))
    g.const_i64("lm_head.blocks_shape", [0, k // block, block])
    g.const_i64("lm_head.axis2", [2])
    g.const_i64("lm_head.axes12", [1, 2])
    g.const_i64("lm_head.candidates", [m])
    g.const_i64("lm_head.last_candidate", [m - 1])
    g.const_i64("lm_head.axis1", [1])
    g.inits.append(_bool(True, LM_HEAD_FULL))  # the input's default

    def full(name: str) -> "helper.GraphProto":
        b = GraphBuilder()
        out = capped(b, b.op("Gemm", [rows2d, head], transB=1, name=f"{name}/gemm"), softcap, f"{name}/softcap")
        return _branch(b, name, out)

    s = GraphBuilder()
    approx = s.op("MatMulNBits", [rows2d, "lm_head.int8.weight", "lm_head.int8.scales"], domain=MS, K=k, N=v,
                  bits=8, block_size=block, accuracy_level=4, name="lm_head/screen/int8")
    absx = s.op("Reshape", [s.op("Abs", [rows2d], name="lm_head/screen/abs"), "lm_head.blocks_shape"],
                name="lm_head/screen/abs_blocks")  # [M, nb, B]
    sa = s.op("Mul", [s.op("ReduceMax", [absx, "lm_head.axis2"], keepdims=0, name="lm_head/screen/amax"),
                      "lm_head.inv127"], name="lm_head/screen/sa")  # [M, nb]: the kernel's activation steps
    x1 = s.op("ReduceSum", [absx, "lm_head.axis2"], keepdims=0, name="lm_head/screen/x1")  # [M, nb]
    x1_hat = s.op("Add", [x1, s.op("Mul", [sa, "lm_head.half_block"], name="lm_head/screen/half_steps")],
                  name="lm_head/screen/x1_hat")
    total = s.op("ReduceSum", [absx, "lm_head.axes12"], keepdims=0, name="lm_head/screen/x1_total")
    total = s.op("Unsqueeze", [total, "lm_head.axis1"], name="lm_head/screen/x1_total2")  # [M, 1]
    feats = s.op("Concat", [sa, x1_hat, total], axis=1, name="lm_head/screen/feats")  # [M, 2 nb + 1]
    eps = s.op("MatMul", [feats, "lm_head.screen_bound"], name="lm_head/screen/eps")
    upper = s.op("Add", [approx, eps], name="lm_head/screen/upper")
    top, idx = s.op("TopK", [upper, "lm_head.candidates"], n_out=2, axis=1, largest=1, sorted=1,
                    name="lm_head/screen/topk")
    rows = s.op("Gather", [head, idx], axis=0, name="lm_head/screen/rows")  # [M, C, K]
    exact = s.op("MatMul", [s.op("Unsqueeze", [rows2d, "lm_head.axis1"], name="lm_head/screen/x3"),
                            s.op("Transpose", [rows], perm=[0, 2, 1], name="lm_head/screen/rows_t")],
                 name="lm_head/screen/exact3")  # [M, 1, C]
    exact = s.op("Squeeze", [exact, "lm_head.axis1"], name="lm_head/screen/exact")  # [M, C]
    best = s.op("ReduceMax", [exact, "lm_head.axis1"], keepdims=0, name="lm_head/screen/best")  # [M]
    outside = s.op("Squeeze", [s.op("Gather", [top, "lm_head.last_candidate"], axis=1,
                                    name="lm_head/screen/outside2"), "lm_head.axis1"], name="lm_head/screen/outside")
    ok_rows = s.op("Cast", [s.op("Less", [outside, best], name="lm_head/screen/less")], to=TensorProto.INT32,
                   name="lm_head/screen/ok_i")
    ok = s.op("Cast", [s.op("ReduceMin", [ok_rows], keepdims=0, name="lm_head/screen/all")], to=TensorProto.BOOL,
              name="lm_head/screen/ok")

    sparse = GraphBuilder()
    ninf = sparse.op("ConstantOfShape", [sparse.op("Shape", [approx], name="lm_head/sparse/shape")],
                     value=helper.make_tensor("ninf", TensorProto.FLOAT, [1], [-np.inf]), name="lm_head/sparse/ninf")
    values = capped(sparse, exact, softcap, "lm_head/sparse/softcap")
    out = sparse.op("ScatterElements", [ninf, idx, values], axis=1, name="lm_head/sparse/scatter")
    s.op("If", [ok], outputs=["lm_head/screen/logits"], name="lm_head/screen/if",
         then_branch=_branch(sparse, "lm_head/sparse", out), else_branch=full("lm_head/fallback"))
    screen = _branch(s, "lm_head/screen", "lm_head/screen/logits")
    return g.op("If", [LM_HEAD_FULL], outputs=["lm_head/logits"], name="lm_head/if",
                then_branch=full("lm_head/full"), else_branch=screen)


def _branch(b, name: str, out: str):
    """A subgraph of the nodes (and constants) `b` collected, with `out` [M, V] as its only output. Each
    branch gets its own output name (ONNX names are unique across a model's subgraphs)."""
    from onnx import TensorProto, helper

    final = f"{name}/out"
    nodes = list(b.nodes) + [helper.make_node("Identity", [out], [final], name=f"{name}/identity")]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(final, TensorProto.FLOAT, None)],
                             b.inits)


def _u8(array: np.ndarray, name: str):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.uint8), name)


def _bool(value: bool, name: str):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, dtype=np.bool_), name)
