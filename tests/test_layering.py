"""The layering rule: core <- bundle <- compiler; core <- bundle <- runtime <- front ends (cli, serve, bench).

Checked twice: statically (every import statement of every module, relative imports resolved) and at run
time (a fresh interpreter that imports specrt.runtime and decodes from an ONNX Runtime bundle never loads
the compiler, the recipes or torch's ONNX exporter).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the folder-to-package mapping, read from the one place it is stated (pyproject.toml's package-dir)
FOLDERS = {prefix: ROOT / folder for prefix, folder in
           tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}

# package -> packages it may not import (prefix match)
FORBIDDEN = {
    "specrt.core": ("specrt.bundle", "specrt.models", "specrt.compiler", "specrt.runtime", "specrt.recipes",
                    "specrt.cli", "specrt.serve", "specrt.bench"),
    "specrt.bundle": ("specrt.models", "specrt.compiler", "specrt.runtime", "specrt.recipes", "specrt.cli",
                      "specrt.serve", "specrt.bench"),
    "specrt.models": ("specrt.compiler", "specrt.runtime", "specrt.recipes", "specrt.cli", "specrt.serve",
                      "specrt.bench"),
    "specrt.compiler": ("specrt.runtime", "specrt.recipes", "specrt.cli", "specrt.serve", "specrt.bench"),
    "specrt.runtime": ("specrt.compiler", "specrt.recipes", "specrt.cli", "specrt.serve", "specrt.bench"),
    "specrt.serve": ("specrt.compiler", "specrt.recipes", "specrt.cli", "specrt.bench"),
}


# the one exception: the decoder config dataclass (no torch module) is part of the manifest's contract
ALLOWED = ("specrt.models.config",)


def modules():
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if prefix == "specrt" and rel and rel[0] == "assets":
                continue
            name = ".".join((prefix,) + rel)
            is_pkg = path.name == "__init__.py"
            if is_pkg:
                name = name[: -len(".__init__")]
            yield name, is_pkg, path


def imported_names(name: str, is_pkg: bool, path: Path):
    package = name if is_pkg else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names)


def test_every_import_respects_the_layers():
    found = 0
    problems = []
    for name, is_pkg, path in modules():
        rules = [v for k, v in FORBIDDEN.items() if name == k or name.startswith(k + ".")]
        if not rules:
            continue
        found += 1
        for imported in imported_names(name, is_pkg, path):
            if imported.startswith(ALLOWED):
                continue
            for bad in rules[0]:
                if imported == bad or imported.startswith(bad + "."):
                    problems.append(f"{name} imports {imported}")
    assert found > 30  # the walk really saw the package
    assert not problems, "\n".join(problems)


def test_the_static_check_catches_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from ...compiler.pipeline import compile_bundle\nfrom . import loop\n")
    names = set(imported_names("specrt.runtime.backends.x", False, bad))
    assert "specrt.compiler.pipeline" in names and "specrt.runtime.backends.loop" in names


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
    relative = []
    for name, _is_pkg, path in modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                relative.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not relative, "relative imports: " + ", ".join(relative)
