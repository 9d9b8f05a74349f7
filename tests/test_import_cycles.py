"""No import cycle among the modules of runtime/, specrt/bundle/ and compiler/ (issue #50), counting the imports
inside functions: a lazy import hides a cycle from Python's start-up, not from a reader, and the next change that
moves it to the top of its file turns it into an ImportError. Read with the one import walker (scripts/layers.py);
imports under `if TYPE_CHECKING:` never run and are not counted.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import layers  # noqa: E402  (scripts/layers.py: the layer table and the one import walker)

CHECKED = (layers.RUNTIME, layers.BUNDLE, layers.COMPILER)
ALLOWED: set = set()  # none: a cycle is broken by giving the shared piece its own module


def test_no_import_cycle_in_runtime_bundle_compiler():
    graph = layers.module_graph(within=CHECKED)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the walk really saw the three packages
    found = {tuple(c): c for c in layers.cycles(graph)}
    new = [f"{', '.join(c)}: {layers.cycle_path(graph, c)}" for key, c in found.items() if key not in ALLOWED]
    assert not new, "import cycles (move the piece both sides need into a module of its own):\n" + "\n".join(new)
    gone = ALLOWED - set(found)
    assert not gone, f"these allowed cycles are gone: remove them from ALLOWED: {sorted(gone)}"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"specrt" = "specrt", '
                                             '"specrt.runtime" = "runtime"}\n')
    for folder in ("specrt", "runtime", "runtime/sub"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    root = _tree(tmp_path, {
        "runtime/a.py": "from specrt.runtime.sub import b\n",
        "runtime/sub/b.py": "X = 1\n\ndef f():\n    from specrt.runtime.c import g\n    return g\n",
        "runtime/c.py": "import specrt.runtime.a\n\ndef g():\n    pass\n",
        # a name taken from a package's __init__ is an edge to the package, a submodule is an edge to it
        "runtime/d.py": "from specrt.runtime import sub, a\n",
    })
    graph = layers.module_graph(root)
    assert set(graph["specrt.runtime.d"]) == {"specrt.runtime.sub", "specrt.runtime.a"}
    assert graph["specrt.runtime.sub.b"]["specrt.runtime.c"].lazy
    assert layers.cycles(graph) == [["specrt.runtime.a", "specrt.runtime.c", "specrt.runtime.sub.b"]]
    path = layers.cycle_path(graph, layers.cycles(graph)[0], root)
    assert path == ("specrt.runtime.a -> specrt.runtime.sub.b (runtime/a.py:1) -> specrt.runtime.c "
                    "(runtime/sub/b.py:4, lazy) -> specrt.runtime.a (runtime/c.py:1)")


def test_type_checking_imports_are_not_a_cycle(tmp_path):
    root = _tree(tmp_path, {
        "runtime/a.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from specrt.runtime.b import B\n"
                        "else:\n    import json\n",
        "runtime/b.py": "from specrt.runtime.a import helper\n",
    })
    found = {i.target: i for i in layers.imports("specrt.runtime.a", False, root / "runtime/a.py")}
    assert found["specrt.runtime.b.B"].typing_only and not found["json"].typing_only
    graph = layers.module_graph(root)
    assert graph["specrt.runtime.a"] == {} and layers.cycles(graph) == []
    (root / "runtime/a.py").write_text("def f():\n    from specrt.runtime.b import B\n")  # one that runs
    assert layers.cycles(layers.module_graph(root)) == [["specrt.runtime.a", "specrt.runtime.b"]]

