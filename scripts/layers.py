"""The layer table and the one import walker: what each folder is, what it may import, and which modules the tree holds.

Read by scripts/import_graph.py (the diagram and docs/layout.md's folder table), tests/test_layering.py,
tests/test_import_graph.py and tests/test_wheel.py. The folder-to-package mapping itself is stated once, in
pyproject.toml (`[tool.setuptools] package-dir`; setup.py discovers the packages under it); this table names the
areas by import name. Nothing here imports specrt: the tree is read with `ast`.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Area:
    name: str                     # import name: "specrt.runtime.batch"
    layer: str                    # base | compile | run | front end | training (sub-areas repeat their top's)
    role: str                     # one line for docs/layout.md
    may_import: tuple[str, ...] = ()  # top-level areas only: the other top-level areas its modules may import


CORE, MODELS, BUNDLE = "specrt.core", "specrt.models", "specrt.bundle"
COMPILER, RUNTIME, RECIPES = "specrt.compiler", "specrt.runtime", "specrt.recipes"
CLI, SERVE, BENCH = "specrt.cli", "specrt.serve", "specrt.bench"

# Top-level areas, lowest layer first; an area's `may_import` lists only areas above it in this table.
TOP = (
    Area(CORE, "base", "errors, tokenizer, the one TensorRT import"),
    Area(MODELS, "base", "PyTorch decoders (one file per family), checkpoint reading", (CORE,)),
    Area(BUNDLE, "base", "the compile <-> run contract (typed manifest, graph I/O, profiles)", (CORE,)),
    Area(COMPILER, "compile", "checkpoint -> ONNX -> validation -> bundle", (CORE, MODELS, BUNDLE)),
    Area(RUNTIME, "run", "load + decode: loop, acceptance, policy, kv_cache, the Generator API",
         (CORE, MODELS, BUNDLE)),
    Area(SERVE, "front end", "OpenAI-compatible server", (CORE, MODELS, BUNDLE, RUNTIME)),
    Area(BENCH, "front end", "benchmark (measures through the Generator)", (CORE, MODELS, BUNDLE, COMPILER, RUNTIME)),
    Area(RECIPES, "training", "demo pair, draft distillation, Medusa and draft heads",
         (CORE, MODELS, BUNDLE, COMPILER, RUNTIME)),
    Area(CLI, "front end", "the `specrt` command (demo, inspect, reference)",
         (CORE, MODELS, BUNDLE, COMPILER, RUNTIME, SERVE, BENCH, RECIPES)),
)
# Sub-folders drawn as their own node; every package two levels below `specrt` must be one of these (a new
# folder is added here, or tests/test_import_graph.py fails).
SUB = (
    Area("specrt.compiler.trt", "compile", "TensorRT engines: precision, PTQ, build, memory"),
    Area("specrt.runtime.backends", "run", "runners: ort/, pytorch/, trt/ (one folder per backend), the draft head's"),
    Area("specrt.runtime.proposers", "run", "drafting methods, one file each (draft model, n-gram, hybrid, heads)"),
    Area("specrt.runtime.batch", "run", "continuous batching: KV slot pool, packed passes, scheduler, BatchEngine"),
    Area("specrt.cli.commands", "front end", "the commands, grouped by area"),
)
AREAS = TOP + SUB
ROOT_PACKAGE = "specrt"  # version constants and `python -m specrt`: imports of it are always allowed
# exceptions to the layers: the decoder config dataclass and the head config validator (no torch) are part of
# the manifest's contract
EXCEPTIONS = {BUNDLE: ("specrt.models.config", "specrt.models.head_config")}


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """pyproject.toml's package-dir: import prefix -> folder (the one place the mapping is stated)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return {prefix: root / folder for prefix, folder in config["tool"]["setuptools"]["package-dir"].items()}


def _owner(path: Path, dirs: dict[str, Path]) -> str:
    """The import prefix whose folder holds `path` most closely (a mapped sub-folder wins over its parent)."""
    return max((p for p, d in dirs.items() if path.is_relative_to(d)), key=lambda p: len(dirs[p].parts))


def modules(root: Path = ROOT) -> Iterator[tuple[str, bool, Path]]:
    """(module name, is package, path) for every .py file under the mapped folders (packaged assets skipped)."""
    dirs = package_dirs(root)
    for prefix, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            if _owner(path, dirs) != prefix:
                continue
            rel = path.relative_to(folder).with_suffix("").parts
            if rel and rel[0] == "assets":
                continue
            is_pkg = path.name == "__init__.py"
            name = ".".join((prefix,) + rel)
            yield (name[: -len(".__init__")] if is_pkg else name), is_pkg, path


class Import(NamedTuple):
    target: str      # the module named ("from a.b import c" gives "a.b" and "a.b.c": c may be a module)
    line: int
    relative: bool   # written with leading dots


def imports(name: str, is_pkg: bool, path: Path) -> Iterator[Import]:
    """Every import statement of a module, lazy ones inside functions included; relative imports resolved."""
    package = name if is_pkg else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (Import(a.name, node.lineno, False) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                mod = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield Import(mod, node.lineno, bool(node.level))
            yield from (Import(f"{mod}.{a.name}", node.lineno, bool(node.level)) for a in node.names if a.name != "*")


def area(module: str) -> str | None:
    """The most specific area (a row of AREAS) holding a module; None outside specrt's areas."""
    found = [a.name for a in AREAS if module == a.name or module.startswith(a.name + ".")]
    return max(found, key=len) if found else None


def top(module: str) -> str | None:
    """The top-level area holding a module."""
    return next((a.name for a in TOP if module == a.name or module.startswith(a.name + ".")), None)


def violation(source: str, target: str) -> bool:
    """True when module `source` may not import module `target` under the layer table."""
    src, dst = top(source), top(target)
    if src is None or dst is None or src == dst:
        return False  # the package root, third-party modules and imports inside one area are free
    if target.startswith(EXCEPTIONS.get(src, ())):
        return False
    return dst not in next(a for a in TOP if a.name == src).may_import


def violations(root: Path = ROOT) -> list[str]:
    """Every import statement of the tree that breaks the layer table, as `module imports target (file:line)`."""
    found = []
    for name, is_pkg, path in modules(root):
        for imp in imports(name, is_pkg, path):
            if violation(name, imp.target):
                found.append(f"{name} imports {imp.target} ({path.relative_to(root)}:{imp.line})")
    return sorted(set(found))


def packages(root: Path = ROOT) -> list[str]:
    """Every regular package (a folder with __init__.py) of the tree, by import name."""
    return sorted(name for name, is_pkg, _ in modules(root) if is_pkg)


def folder_of(prefix: str, root: Path = ROOT) -> str:
    """The folder of an import prefix, relative to the repository: specrt.runtime.batch -> runtime/batch/."""
    dirs = package_dirs(root)
    best = max((p for p in dirs if prefix == p or prefix.startswith(p + ".")), key=len)
    rest = prefix[len(best):].lstrip(".").replace(".", "/")
    return (dirs[best].relative_to(root) / rest).as_posix().rstrip("/") + "/"
