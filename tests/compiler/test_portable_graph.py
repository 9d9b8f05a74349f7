"""The cleaned portable graph (issue 13 #1): fewer nodes, weights in MatMul layout, same outputs, names kept."""

import shutil
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from specrt.bundle import graph_io
from specrt.compiler.export import sample_inputs
from specrt.compiler.portable_graph import clean_portable_graph
from specrt.models.checkpoint import open_checkpoint
from specrt.runtime.backends.pytorch.runner import decoder_from_onnx
from tests.helpers import make_checkpoint

from export_cache import onnx_from_decoder  # the real export, once per identical decoder in the session


def _feeds(decoder, new_tokens, past_len):
    ids, pos, past = sample_inputs(decoder, new_tokens=new_tokens, past_len=past_len, seed=3)
    feeds = {graph_io.INPUT_IDS: ids.numpy(), graph_io.POSITION_IDS: pos.numpy()}
    for i in range(decoder.config.num_layers):
        feeds[graph_io.past_key(i)] = past[2 * i].numpy()
        feeds[graph_io.past_value(i)] = past[2 * i + 1].numpy()
    return feeds


def _run(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


# one export each (~6 s on 2 cores): the fast lane keeps llama, the full run every architecture
@pytest.mark.parametrize("arch", ["llama", *(pytest.param(a, marks=pytest.mark.slow)
                                            for a in ("llama_tied_llama3", "qwen2", "gpt2"))])
def test_cleaned_graph_is_smaller_and_computes_the_same(tmp_path, tokenizer_path, arch):
    # the targets the parity tests compile (tests/models/test_transformers_parity.py): one export between them
    checkpoint = make_checkpoint(tmp_path / "ck", arch, tokenizer_path, layers=2, seed=0)
    decoder = open_checkpoint(checkpoint).load_decoder(torch.float32)
    (tmp_path / "raw").mkdir()
    exported = onnx_from_decoder(decoder, tmp_path / "raw" / "model.onnx")
    cleaned = tmp_path / "clean" / "model.onnx"
    cleaned.parent.mkdir()
    shutil.copy2(exported, cleaned)
    shutil.copy2(str(exported) + ".data", str(cleaned) + ".data")

    report = clean_portable_graph(cleaned)

    raw_model = onnx.load(str(exported), load_external_data=False)
    model = onnx.load(str(cleaned), load_external_data=False)
    assert report.nodes_before == len(raw_model.graph.node) and report.nodes_after == len(model.graph.node)
    assert report.nodes_after < 0.5 * report.nodes_before, report
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Constant"] == 0 and ops["CastLike"] == 0
    # no weight passes through a Transpose, except a tied embedding that the embedding Gather also reads
    initializers = {t.name for t in model.graph.initializer}
    gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    transposed = {n.input[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in initializers}
    assert transposed <= gathered, transposed
    if arch != "gpt2":  # GPT-2's Conv1D weights are already [in, out]: nothing to transpose there
        per_layer = 7  # q, k, v, o, gate, up, down
        assert report.transposed_weights >= per_layer * decoder.config.num_layers
        stored = [t for t in initializers if t.endswith(graph_io.TRANSPOSED)]
        assert len(stored) == report.transposed_weights
    # same outputs as the exported graph (prefill, decode and verify shapes)
    for new_tokens, past_len in [(7, 0), (1, 9), (5, 9)]:
        feeds = _feeds(decoder, new_tokens, past_len)
        before, after = _run(exported, feeds), _run(cleaned, feeds)
        for name, value in before.items():
            np.testing.assert_allclose(after[name], value, rtol=0, atol=1e-5, err_msg=name)
    # the PyTorch reference still rebuilds from the named (possibly transposed) weights
    rebuilt = decoder_from_onnx(cleaned, decoder.config)
    for (name, p), (name2, q) in zip(decoder.state_dict().items(), rebuilt.state_dict().items()):
        assert name == name2 and torch.equal(p, q), name
