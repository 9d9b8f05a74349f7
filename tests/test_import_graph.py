"""docs/layout.md's folder table and import graph (scripts/import_graph.py, from the layer table in
scripts/layers.py) are current, every package folder has its row in the table, the mapping is pyproject's, and
click is imported only under specrt/cli."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(graph)
layers = graph.layers


def test_the_mapping_is_read_from_pyproject():
    dirs = layers.package_dirs()
    assert dirs["specrt.compiler"] == ROOT / "compiler" and dirs["specrt.runtime"] == ROOT / "runtime"
    names = {name for name, _, _ in layers.modules()}
    assert {"specrt.compiler.pipeline", "specrt.runtime.loop", "specrt.recipes.distill", "specrt.bundle.schema",
            "specrt.cli.main", "specrt.runtime.batch.engine"} <= names
    assert not any(n.startswith(("compiler.", "runtime.", "recipes.")) for n in names)


def test_docs_layout_shows_the_current_table_and_graph():
    page = graph.PAGE.read_text()
    assert graph.part(page, graph.TABLE_BEGIN, graph.TABLE_END) == graph.table(), (
        "docs/layout.md's folder table is stale: run `python scripts/import_graph.py --write`")
    assert graph.generated_part(page) == graph.mermaid(), (
        "docs/layout.md's import graph is stale: run `python scripts/import_graph.py --write`")
    assert "`runtime/batch/` | `specrt.runtime.batch`" in page
    assert len(graph.edges()) > 20  # the walk saw the repository


def test_every_package_folder_has_a_row():
    """A package two levels below specrt (runtime/batch/, compiler/trt/, ...) is drawn and described: a new folder
    without a row in scripts/layers.py fails here."""
    rows = {a.name for a in layers.AREAS}
    missing = [p for p in layers.packages() if p.count(".") <= 2 and p != layers.ROOT_PACKAGE and p not in rows]
    assert not missing, f"add rows to scripts/layers.py for: {missing}"
    assert "specrt.runtime.batch" in rows


def test_a_missing_row_is_seen(tmp_path):
    """The row check on a tree with a package folder the table does not know."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"specrt" = "specrt", '
                                             '"specrt.runtime" = "runtime"}\n')
    for folder in ("specrt", "runtime", "runtime/newpart"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    assert "specrt.runtime.newpart" in layers.packages(tmp_path)
    assert layers.area("specrt.runtime.newpart.x") == "specrt.runtime"  # drawn as runtime/ until given a row


def test_a_climbing_import_is_seen(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from specrt.cli.main import main\n")
    assert [i.target for i in layers.imports("specrt.bench.x", False, bad)] == ["specrt.cli.main",
                                                                                 "specrt.cli.main.main"]
    assert layers.violation("specrt.bench.x", "specrt.cli.main")


@pytest.mark.parametrize("library", ["click"])
def test_click_only_under_specrt_cli(library):
    users = sorted({name for name, is_pkg, path in layers.modules()
                    for imp in layers.imports(name, is_pkg, path)
                    if imp.target == library or imp.target.startswith(library + ".")})
    assert users and all(u.startswith("specrt.cli.") or u == "specrt.cli" for u in users), users


def test_design_md_is_one_page_and_its_map_names_real_folders():
    """DESIGN.md <= 6 KB (measurements live in the docs pages), and every folder its module map names is
    a folder of the tree holding a row of the layer table."""
    import re

    text = (ROOT / "DESIGN.md").read_text()
    assert len(text.encode()) <= 6 * 1024
    folders = set(re.findall(r"`((?:specrt/)?[a-z_]+(?:/[a-z_]+)*/)`", text))
    assert "runtime/batch/" in folders and "compiler/" in folders
    rows = {layers.folder_of(a.name) for a in layers.AREAS}
    assert not folders - rows, f"DESIGN.md names folders without a row in scripts/layers.py: {folders - rows}"
