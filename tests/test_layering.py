"""The layering rule of scripts/layers.py's table (each top-level folder imports only what its row allows).

Checked twice: statically (every import statement of every module, relative imports resolved, by the one import
walker in scripts/layers.py) and at run time (a fresh interpreter that imports specrt.runtime and decodes from an
ONNX Runtime bundle never loads the compiler, the recipes or torch's ONNX exporter).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import layers  # noqa: E402  (scripts/layers.py: the layer table and the one import walker)


def test_every_import_respects_the_layers():
    assert len(list(layers.modules())) > 100  # the walk really saw the package
    problems = layers.violations()
    assert not problems, "\n".join(problems)


def test_the_static_check_catches_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from ...compiler.pipeline import compile_bundle\nfrom . import loop\n"
                   "def f():\n    from specrt import recipes\n")
    names = {imp.target for imp in layers.imports("specrt.runtime.backends.x", False, bad)}
    assert {"specrt.compiler.pipeline", "specrt.runtime.backends.loop", "specrt.recipes"} <= names
    bad_ones = sorted({n for n in names if layers.violation("specrt.runtime.backends.x", n)})
    assert bad_ones == ["specrt.compiler.pipeline", "specrt.compiler.pipeline.compile_bundle", "specrt.recipes"]
    # the one exception is the bundle's, not everyone's
    assert not layers.violation("specrt.bundle.schema", "specrt.models.config")
    assert layers.violation("specrt.core.errors", "specrt.models.config")


PROBE = """
import json, sys
import specrt.runtime as rt
gen = rt.load(sys.argv[1], backend="ort")
res = gen.generate("def f(x):", max_new_tokens=6, method="ngram")
loaded = [m for m in sys.modules if m.startswith(("specrt.compiler", "specrt.recipes", "torch.onnx"))]
print(json.dumps({"tokens": len(res.token_ids), "loaded": loaded}))
"""


@pytest.mark.slow
def test_runtime_never_loads_the_compiler(self_bundle):
    out = subprocess.run([sys.executable, "-c", PROBE, str(self_bundle)], capture_output=True, text=True,
                         timeout=300, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["tokens"] >= 1
    assert report["loaded"] == []


def test_imports_are_absolute():
    """Every import in the four folders names its target in full (`from specrt.bundle import ...`), so a reader
    (and a static tool) sees from the file where an import lands; a relative import that climbs out of its
    folder hides that."""
    relative = sorted({f"{path.relative_to(ROOT)}:{imp.line}" for name, is_pkg, path in layers.modules()
                       for imp in layers.imports(name, is_pkg, path) if imp.relative})
    assert not relative, "relative imports: " + ", ".join(relative)
