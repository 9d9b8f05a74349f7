"""A draft head stored as int8 compiles to a head graph that drafts what the fp16 one drafts (#52: the shipped head
is int8).

Quick: compile's head step (`draft_head_step`: load the head directory, dequantize, export, validate) on a tiny
random fused head saved once in fp16 and once in int8, the two graphs run on the target's own features and layers:
the same draft (argmax) on every row whose fp16 top-2 margin exceeds twice the largest logit difference (int8 can
only flip near-ties), and those are nearly all rows. Slow: the oracle of tests/runtime/test_draft_head.py (a
one-layer target whose attention output is zero; a head with fc = [0 | I] and the target's own layer computes the
target's next-token logits) compiled into two whole bundles, fp16 and int8: both draft every greedy token of the
target, so the same tokens, with outputs equal to plain.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from helpers import fp32_decoder as _decoder, random_fused_head

PROMPTS = ("def main(argv):\n    ", "import os\nimport json\n\n\nclass Config:\n")
LAYERS = (0, 1)


@pytest.fixture(scope="module")
def int8_step(llama_target, tmp_path_factory):
    """(the fp16 head directory, the int8 one, compile's head step's graph and manifest entry for the int8 one) of
    one random fused head (tests/helpers.random_fused_head)."""
    from specrt.compiler.draft_head import draft_head_step
    from specrt.models.draft_head_fused import save_fused_head

    head = random_fused_head(_decoder(llama_target), LAYERS)
    base = tmp_path_factory.mktemp("int8_head_step")
    save_fused_head(head, base / "head_float16", dtype=torch.float16)
    save_fused_head(head, base / "head_int8", dtype=torch.int8)
    (base / "graph").mkdir()
    manifest = types.SimpleNamespace()
    draft_head_step(base / "head_int8", llama_target)(base / "graph", manifest)
    return base / "head_float16", base / "head_int8", base / "graph" / manifest.draft_head.onnx, manifest.draft_head


def test_int8_head_step_drafts_what_fp16_drafts(int8_step, llama_target):
    """The int8 directory's compiled head graph against the fp16 directory's head (which its own compile reproduces
    within 1e-4: the step's validation) on the target's features and layers of 47 rows: logits within 3% of their
    range, the same draft on >= 95% of rows and on every row whose fp16 top-2 margin exceeds twice the largest
    difference (a random head's logits are flat: ~half the rows; the shipped head's figures are in its card)."""
    import onnxruntime as ort

    from specrt.models.base import empty_past
    from specrt.models.draft_head_fused import layer_taps, load_fused_head

    fp16_dir, int8_dir, graph, entry = int8_step
    assert entry.precision == "fp32" and entry.validation["max_abs_diff"] < 1e-4  # dequantized, then exported
    dec = _decoder(llama_target)
    ids = torch.randint(0, dec.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1))
    got, handles = layer_taps(dec, LAYERS)
    with torch.no_grad():
        final = dec(ids, torch.arange(48)[None], *empty_past(dec.config)).hidden_states
    for h in handles:
        h.remove()
    c = dec.config
    empty = torch.zeros(1, 0, c.num_kv_heads, c.head_dim)
    layers = torch.stack(got, dim=2)[:, :-1]
    with torch.no_grad():
        a = load_fused_head(fp16_dir, dec)(final[:, :-1], ids[:, 1:], torch.arange(47)[None], empty, empty,
                                           layers)[0][0].numpy()  # [S, V']
    feeds = {"features": final[:, :-1].numpy(), "layer_features": layers.numpy(), "input_ids": ids[:, 1:].numpy(),
             "position_ids": np.arange(47, dtype=np.int64)[None], "past_key": empty.numpy(),
             "past_value": empty.numpy()}
    b = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0][0]
    diff = float(np.abs(a - b).max())
    assert 0 < diff <= 0.03 * float(a.max() - a.min())
    top2 = np.sort(a, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * diff
    same = a.argmax(-1) == b.argmax(-1)
    assert same.mean() >= 0.95 and same[clear].all() and clear.sum() >= 10


@pytest.fixture(scope="module")
def oracle_bundles(workdir, tokenizer_path):
    """{"float16": bundle, "int8": bundle} of the same oracle head."""
    from helpers import oracle_head_target
    from specrt.compiler import CompileSpec, compile_bundle
    from specrt.models.draft_head import DraftHead, save_head

    base = workdir / "int8_oracle_head"
    target, decoder = oracle_head_target(base / "target", tokenizer_path)
    head = DraftHead(decoder, torch.arange(decoder.config.vocab_size))
    d = decoder.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat((torch.zeros(d, d), torch.eye(d)), dim=1))
    out = {}
    for dtype in (torch.float16, torch.int8):
        name = str(dtype)[6:]
        save_head(head, base / f"head_{name}", dtype=dtype)
        out[name] = compile_bundle(CompileSpec(target, base / f"bundle_{name}", f"head:{base / f'head_{name}'}",
                                               max_seq_len=128, max_draft_tokens=6))
    return out


@pytest.mark.slow
def test_int8_bundle_drafts_what_the_fp16_bundle_drafts(oracle_bundles):
    """Two whole bundles (~50 s each to compile on 2 busy cores)."""
    from specrt.runtime import load

    gens = {name: load(path, backend="ort") for name, path in oracle_bundles.items()}
    try:
        for prompt in PROMPTS:
            plain = gens["float16"].generate(prompt, 40, method="none")
            stats = {}
            for name, gen in gens.items():
                spec = gen.generate(prompt, 40, method="head", num_speculative_tokens=3)
                assert spec.token_ids == plain.token_ids, name
                stats[name] = (spec.stats.drafted_tokens, spec.stats.accepted_tokens)
            assert stats["int8"] == stats["float16"] and stats["int8"][0] == stats["int8"][1] > 0, stats
    finally:
        for gen in gens.values():
            gen.close()
