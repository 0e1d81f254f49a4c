"""The import graph of the SDK and the reference plugins, read from the source.

Rules (DESIGN.md, "Rooms"):
* no circle among modules imported when a module loads (a lazy import inside
  a function or a ``TYPE_CHECKING`` block does not count: it never runs at
  load time);
* no circle at all inside ``cni_skel.types``, counting every import (lazy ones
  inside functions and ``TYPE_CHECKING`` blocks too): the version modules
  register their converters in ``cni_skel.types.registry``, which imports none
  of them (Go's pkg/types/internal/convert.go);
* the SDK (``cni_skel``) never imports a plugin (``cni_skel_plugins``);
* the modules a launcher loads on every call (``cni_skel.warm.client``,
  ``cni_skel.warm.protocol``) import, when they load, nothing of the project
  but the protocol, and only the stdlib modules the interpreter starts with
  (the one-shot fallback imports the skel inside a function, when needed);
* test helpers (``cni_skel.harness``, ``cni_skel.testing``) never import the CLI.
"""

from __future__ import annotations

import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"cni_skel": os.path.join(ROOT, "cni_skel"),
            "cni_skel_plugins": os.path.join(ROOT, "plugins")}
# What a launcher may import: modules compiled into the interpreter or
# already loaded by `python -IS` before any code runs.
LAUNCHER_OK = {"os", "sys", "_socket", "__future__", "marshal", "posix", "errno"}


def _modules() -> dict[str, str]:
    """module name -> file path, for every module of both packages."""
    found = {}
    for pkg, top in PACKAGES.items():
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, top)
            parts = [pkg] + ([] if rel == "." else rel.split(os.sep))
            for fn in filenames:
                if not fn.endswith(".py"):
                    continue
                name = ".".join(parts if fn == "__init__.py" else [*parts, fn[:-3]])
                found[name] = os.path.join(dirpath, fn)
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _load_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module loads: top level, and
    inside top-level ``if``/``try``/``with`` blocks (not ``if TYPE_CHECKING``)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.append(node)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody,
                              *(h.body for h in node.handlers)):
                    walk(block)
            elif isinstance(node, ast.With):
                walk(node.body)

    walk(tree.body)
    return out


def _every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, wherever it is (functions, ``TYPE_CHECKING``)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute names a statement in ``module`` imports (project or not)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        is_pkg = MODULES.get(module, "").endswith("__init__.py")
        base = module.split(".")
        base = base if is_pkg else base[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # `from pkg import sub` imports the module pkg.sub when it is one.
    subs = [f"{prefix}.{a.name}" for a in node.names if f"{prefix}.{a.name}" in MODULES]
    return subs or [prefix]


def _graph(imports=_load_time_imports) -> dict[str, set[str]]:
    """module -> what it imports: by default only when it loads."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        with open(path, encoding="utf-8") as fp:
            tree = ast.parse(fp.read(), path)
        edges = set()
        for node in imports(tree):
            edges.update(_targets(name, node))
        graph[name] = edges
    return graph


GRAPH = _graph()
FULL_GRAPH = _graph(_every_import)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(old)
    return found


def test_graph_sees_the_project():
    assert "cni_skel.skel" in GRAPH and "cni_skel_plugins.bridge" in GRAPH
    assert "cni_skel.env" in GRAPH["cni_skel.skel"]


def test_no_import_circle():
    assert _cycles(GRAPH) == []


def test_no_import_circle_in_types_even_lazily():
    types = {m: {t for t in FULL_GRAPH[m] if t.startswith("cni_skel.types")}
             for m in FULL_GRAPH if m == "cni_skel.types" or m.startswith("cni_skel.types.")}
    assert {"cni_skel.types.current", "cni_skel.types.convert"} <= types.keys()
    assert _cycles(types) == []


def test_full_graph_sees_lazy_imports():
    tree = ast.parse("def f():\n    from .convert import x\n")
    assert _load_time_imports(tree) == []
    assert [_targets("cni_skel.types.current", n) for n in _every_import(tree)] == \
        [["cni_skel.types.convert"]]


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("cni_skel.")
                                          or m == "cni_skel"))
def test_sdk_never_imports_a_plugin(module):
    names = FULL_GRAPH[module]
    assert not [n for n in names if n.split(".")[0] == "cni_skel_plugins"]


@pytest.mark.parametrize("module", ["cni_skel.warm.client", "cni_skel.warm.protocol"])
def test_launcher_modules_stay_lean(module):
    if module not in MODULES:
        pytest.fail(f"{module} is missing")
    with open(MODULES[module], encoding="utf-8") as fp:
        tree = ast.parse(fp.read())
    names = {t for n in _load_time_imports(tree) for t in _targets(module, n)}
    names.discard("cni_skel.warm.protocol")
    names = {n.split(".")[0] for n in names}
    assert names <= LAUNCHER_OK, names - LAUNCHER_OK


@pytest.mark.parametrize("module", ["cni_skel.harness", "cni_skel.testing"])
def test_test_helpers_never_import_the_cli(module):
    names = FULL_GRAPH[module]
    assert not [n for n in names if n == "cni_skel.cli" or n.startswith("cni_skel.cli.")]
