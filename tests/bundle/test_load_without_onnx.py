"""Loading a bundle never imports the `onnx` package (seconds of a cold start): the load-time graph checks read
what they need with specrt/bundle/graph_scan.py, which must agree with onnx's own parser on every graph."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import onnx
import pytest

from import_blocker import run_blocked
from specrt.bundle.graph_scan import scan_graph
from specrt.bundle.manifest import read_manifest
from specrt.core.errors import BundleError


def onnx_facts(path: Path):
    model = onnx.load_model(str(path), load_external_data=False)

    def values(vs):
        return [(v.name, v.type.tensor_type.elem_type,
                 tuple(d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim))
                for v in vs]

    return (values(model.graph.input), values(model.graph.output),
            {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"},
            Counter(n.op_type for n in model.graph.node))


@pytest.mark.parametrize("name", ["pair_bundle", "int4_self8_bundle", "lean_int4_bundle"])
def test_scan_agrees_with_onnx_on_every_graph(request, name):
    bundle = request.getfixturevalue(name)
    graphs = sorted(bundle.rglob("*.onnx"))
    assert graphs and (any("int4" in g.name for g in graphs) or name == "pair_bundle")
    for graph in graphs:
        facts = scan_graph(graph)
        got = ([(v.name, v.elem_type, v.dims) for v in facts.inputs], [(v.name, v.elem_type, v.dims)
                                                                        for v in facts.outputs],
               set(facts.external_locations), facts.op_counts)
        assert got == onnx_facts(graph), graph


def test_truncated_graph_is_refused_in_one_line(tmp_path, target_only_bundle):
    b = Path(shutil.copytree(target_only_bundle, tmp_path / "b"))
    graph = b / "target" / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:-7])
    data = json.loads((b / "manifest.json").read_text())
    from specrt.bundle.manifest import file_entries

    data["files"] = file_entries(b)  # a tamperer who also fixes the checksums
    (b / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="target/model.onnx .*not a readable ONNX graph"):
        read_manifest(b)


LOAD_AND_GENERATE = """
import sys
from specrt.runtime.generator import load
g = load({bundle!r})
out = [g.generate("def main(args):", 8, method=m, num_speculative_tokens=2, temperature=0).token_ids for m in {methods!r}]
assert all(o == out[0] for o in out), out
from specrt.cli.main import main
try:
    main(["generate", {bundle!r}, "--prompt", "hi", "--max-new-tokens", "2"])
except SystemExit as exc:
    assert not exc.code, exc.code
print("onnx" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize("name,methods", [("pair_bundle", ["none", "draft", "ngram"]),
                                          ("lean_int4_bundle", ["none", "draft", "ngram"])])
def test_load_and_generate_never_import_onnx(request, name, methods):
    bundle = str(request.getfixturevalue(name))
    read_manifest(Path(bundle))  # loads in this process (onnx is imported here by the test itself)
    proc = run_blocked(["onnx"], LOAD_AND_GENERATE.format(bundle=bundle, methods=methods))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"
