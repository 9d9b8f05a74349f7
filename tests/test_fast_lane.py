"""The fast lane (`pytest -m "not slow"`) reaches every module: each module of the four folders is imported,
directly or through other modules, by a test file that has at least one test outside the slow marker.
Static (ast), so it costs nothing; a module reached only by slow tests, or by none, fails here."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import layers  # noqa: E402  (scripts/layers.py: the layer table and the one import walker)

# run, not imported: `python -m specrt` (real-process tests in the fast lane run it); the demo pair's training
# recipe and its model card writer have no test (training the packaged pair takes hours)
NOT_IMPORTED = {"specrt.__main__", "specrt.recipes.train_demo", "specrt.recipes.model_card"}


def named_modules(path: Path):
    """The absolute imports of a file (layers.imports: the one walker; relative ones are not followed)."""
    return [imp.target for imp in layers.imports("tests._file", False, path) if not imp.relative]


def has_fast_test(tree: ast.Module) -> bool:
    if any(isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n) and "slow" in ast.unparse(n.value)
           for n in tree.body):
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
               and not any("slow" in ast.unparse(d) for d in n.decorator_list) for n in tree.body)


def reached_by(test_files) -> set[str]:
    mods = {name: (is_pkg, path) for name, is_pkg, path in layers.modules()}
    reached: set[str] = set()
    frontier: list[str] = []

    def add(name: str) -> None:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            m = ".".join(parts[:i])
            if m in mods and m not in reached:
                reached.add(m)
                frontier.append(m)

    for path in test_files:
        for name in named_modules(path):
            add(name)
    while frontier:
        m = frontier.pop()
        is_pkg, path = mods[m]
        for imp in layers.imports(m, is_pkg, path):
            add(imp.target)
        if m == "specrt.cli.main":  # registers every module of specrt.cli.commands by name
            for cmd in (ROOT / "specrt" / "cli" / "commands").glob("*.py"):
                add(f"specrt.cli.commands.{cmd.stem}")
    return reached


def fast_files():
    files = [ROOT / "tests" / "conftest.py", ROOT / "tests" / "helpers.py"]
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if has_fast_test(ast.parse(path.read_text())):
            files.append(path)
    return files


def test_every_module_is_reached_by_the_fast_lane():
    modules = {name for name, _, _ in layers.modules()}
    assert len(modules) > 100
    missing = sorted(modules - reached_by(fast_files()) - NOT_IMPORTED)
    assert not missing, f"modules no fast-lane test reaches: {missing}"


def test_a_module_only_slow_tests_import_is_reported(tmp_path):
    slow = tmp_path / "test_x.py"
    slow.write_text("import pytest\nfrom specrt.recipes.distill import x\n\n@pytest.mark.slow\ndef test_a():\n    pass\n")
    fast = tmp_path / "test_y.py"
    fast.write_text("from specrt.recipes.distill import x\n\ndef test_b():\n    pass\n")
    assert not has_fast_test(ast.parse(slow.read_text())) and has_fast_test(ast.parse(fast.read_text()))
    assert "specrt.recipes.distill" in reached_by([fast])
    assert "specrt.recipes.distill" not in reached_by([])
