"""No module outside specrt/bundle reads the manifest as a raw dict by string keys (issue 11): a static check
over every module's syntax tree. It catches `manifest["tokenizer"]`, `manifest.get("engines")`,
`manifest.data`, and a string key on an entry (`m.models["target"]["onnx"]`, `m.engines[role]["path"]`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = [ROOT / "specrt", ROOT / "compiler", ROOT / "runtime", ROOT / "recipes"]
ENTRY_MAPS = ("models", "engines", "files", "graphs")  # Manifest / ModelEntry attributes holding entries


def _name(node: ast.AST) -> str:
    """The last identifier of `a.b.c` / `c` (empty for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_manifest(node: ast.AST) -> bool:
    return "manifest" in _name(node).lower() and _name(node) != "MANIFEST"


def _str_key(node: ast.Subscript) -> bool:
    return isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)


def raw_accesses(source: str, filename: str = "<test>") -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Subscript) and _str_key(node):
            inner = node.value
            if _is_manifest(inner):
                found.append(f"{where}: manifest[{node.slice.value!r}]")
            elif isinstance(inner, ast.Subscript) and _name(inner.value) in ENTRY_MAPS:
                found.append(f"{where}: .{_name(inner.value)}[...][{node.slice.value!r}]")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _is_manifest(node.func.value):
            found.append(f"{where}: manifest.get(...)")
        elif isinstance(node, ast.Attribute) and node.attr == "data" and _is_manifest(node.value):
            found.append(f"{where}: manifest.data")
    return found


def test_the_check_finds_raw_access():
    code = ('a = manifest["tokenizer"]\nb = gen.manifest.get("demo")\nc = self.manifest.data\n'
            'd = m.models["target"]["onnx"]\ne = manifest.engines[role]["path"]\n'
            'ok = manifest.models["target"].onnx, manifest.engines.get(role), root / MANIFEST\n')
    assert len(raw_accesses(code)) == 5


def test_no_module_outside_the_bundle_package_reads_the_manifest_by_string_keys():
    bundle = ROOT / "specrt" / "bundle"
    found = []
    for folder in FOLDERS:
        for path in sorted(folder.rglob("*.py")):
            if bundle not in path.parents:
                found += raw_accesses(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []
