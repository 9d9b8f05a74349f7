"""The layer table and the one import walker: what each folder is, what it may import, and which modules the tree holds.

Read by scripts/import_graph.py (the diagram and docs/layout.md's folder table), tests/test_layering.py,
tests/test_import_graph.py, tests/test_import_cycles.py (`module_graph`, `cycles`), tests/test_module_size.py and
tests/test_wheel.py. The folder-to-package mapping itself is stated once, in
pyproject.toml (`[tool.setuptools] package-dir`; setup.py discovers the packages under it); this table names the
areas by import name. Nothing here imports specrt: the tree is read with `ast`.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

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
    form: str = "import"  # "import": a module the statement runs (`import a.b`, `from a import *`); "from": the a.b
    #                       of `from a.b import c` (what it takes is said by its members); "member": a.b.c
    lazy: bool = False         # inside a function: runs when the function first does, not when the module loads
    typing_only: bool = False  # under `if TYPE_CHECKING:`: never runs (annotations only)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(nodes: Iterable[ast.AST], lazy: bool = False, typing_only: bool = False
                ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """(import statement, inside a function, under TYPE_CHECKING) for every import statement in `nodes`."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy, typing_only
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _statements(ast.iter_child_nodes(node), True, typing_only)
        elif isinstance(node, ast.If) and _type_checking(node):
            yield from _statements(node.body, lazy, True)
            yield from _statements(node.orelse, lazy, typing_only)
        else:
            yield from _statements(ast.iter_child_nodes(node), lazy, typing_only)


def imports(name: str, is_pkg: bool, path: Path) -> Iterator[Import]:
    """Every import statement of a module, lazy ones inside functions included (marked `lazy`), and those under
    `if TYPE_CHECKING:` (marked `typing_only`); relative imports resolved."""
    package = name if is_pkg else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node, lazy, typing_only in _statements([tree]):
        if isinstance(node, ast.Import):
            yield from (Import(a.name, node.lineno, False, "import", lazy, typing_only) for a in node.names)
            continue
        if node.level:
            parts = package.split(".")
            mod = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        star = any(a.name == "*" for a in node.names)
        yield Import(mod, node.lineno, bool(node.level), "import" if star else "from", lazy, typing_only)
        yield from (Import(f"{mod}.{a.name}", node.lineno, bool(node.level), "member", lazy, typing_only)
                    for a in node.names if a.name != "*")


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


# ------------------------------------------------------------------------------------------ import cycles
def module_graph(root: Path = ROOT, within: tuple[str, ...] = ()) -> dict[str, dict[str, Import]]:
    """module -> {module it imports: the first statement that does}, every statement that runs counted (lazy ones
    inside functions too; `if TYPE_CHECKING:` ones never run and are left out). `from a import b` is an edge to
    a.b when that is a module, else to a; `import a.b` to a.b (the packages above a module are not edges: every
    import of a submodule runs them). `within`: only modules under these import prefixes, at both ends."""
    mods = {name for name, _, _ in modules(root)}
    keep = {m for m in mods if not within or any(m == w or m.startswith(w + ".") for w in within)}
    graph: dict[str, dict[str, Import]] = {m: {} for m in sorted(keep)}
    for name, is_pkg, path in modules(root):
        if name not in keep:
            continue
        for imp in imports(name, is_pkg, path):
            if imp.typing_only or imp.form == "from":
                continue
            parts = imp.target.split(".")
            if imp.form == "member":
                dst = imp.target if imp.target in mods else ".".join(parts[:-1])
            else:
                dst = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mods), "")
            if dst in keep and dst != name:
                graph[name].setdefault(dst, imp)
    return graph


def cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module (Tarjan's
    algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def cycle_path(graph: dict[str, dict[str, Import]], component: list[str], root: Path = ROOT) -> str:
    """One closed path through a cycle's modules, each step with the statement that makes it:
    `a -> b (a.py:12, lazy) -> a (b.py:3)`."""
    members, first = set(component), component[0]
    paths = {first: [first]}
    queue = [first]
    while queue:  # breadth first: the shortest way back to `first`
        node = queue.pop(0)
        for dst in sorted(graph[node]):
            if dst == first:
                steps = paths[node] + [first]
                return " -> ".join([steps[0]] + [f"{b} ({_where(graph[a][b], a, root)})"
                                                  for a, b in zip(steps, steps[1:])])
            if dst in members and dst not in paths:
                paths[dst] = paths[node] + [dst]
                queue.append(dst)
    return " <-> ".join(component)


def _where(imp: Import, module: str, root: Path) -> str:
    path = next(p for name, _, p in modules(root) if name == module)
    return f"{path.relative_to(root)}:{imp.line}" + (", lazy" if imp.lazy else "")
