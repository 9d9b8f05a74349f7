"""The static import graph between folders (scripts/import_graph.py) is the one docs/layout.md shows, its
arrows between the top-level folders only go down, and click is imported only under specrt/cli."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(graph)

# top-level folders, lowest layer first: an import may only name a folder that comes earlier
LAYERS = ("specrt.core", "specrt.models", "specrt.bundle", "specrt.compiler", "specrt.runtime", "specrt.serve",
          "specrt.bench", "specrt.recipes", "specrt.cli")


def top(area: str) -> str:
    return next(layer for layer in LAYERS if area == layer or area.startswith(layer + "."))


def test_the_mapping_is_read_from_pyproject():
    dirs = graph.package_dirs()
    assert dirs["specrt.compiler"] == ROOT / "compiler" and dirs["specrt.runtime"] == ROOT / "runtime"
    names = {name for name, _, _ in graph.modules()}
    assert {"specrt.compiler.pipeline", "specrt.runtime.loop", "specrt.recipes.distill", "specrt.bundle.schema",
            "specrt.cli.main"} <= names
    assert not any(n.startswith(("compiler.", "runtime.", "recipes.")) for n in names)


def test_docs_layout_shows_the_current_graph():
    page = graph.PAGE.read_text()
    assert graph.generated_part(page) == graph.mermaid(), (
        "docs/layout.md's import graph is stale: run `python scripts/import_graph.py --write`")


def test_arrows_between_top_level_folders_only_go_down():
    edges = graph.edges()
    assert len(edges) > 20  # the walk saw the repository
    up = [f"{a} -> {b} ({n} imports)" for (a, b), n in edges.items()
          if top(a) != top(b) and LAYERS.index(top(b)) > LAYERS.index(top(a))]
    assert not up, "imports that climb a layer: " + ", ".join(up)


def test_a_climbing_import_is_seen(tmp_path, monkeypatch):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from specrt.cli.main import main\n")
    assert list(graph.imports("specrt.bench.x", False, bad)) == ["specrt.cli.main"]
    assert top(graph.area("specrt.bench.x")) == "specrt.bench" and top(graph.area("specrt.cli.main")) == "specrt.cli"


@pytest.mark.parametrize("library", ["click"])
def test_click_only_under_specrt_cli(library):
    users = sorted({name for name, is_pkg, path in graph.modules()
                    for target in graph.imports(name, is_pkg, path)
                    if target == library or target.startswith(library + ".")})
    assert users and all(u.startswith("specrt.cli.") or u == "specrt.cli" for u in users), users
