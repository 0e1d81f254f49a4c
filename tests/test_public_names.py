"""What the docs and examples show a plugin author is public API.

Every ``cni_skel`` name used in code in README.md, docs/*.md (fenced blocks of
any language, comments and shell lines included), examples/**/*.py and
plugins/ptp/plugin.py (the tutorial's plugin, which is the reference ptp)
must be public by the rule of docs/stability.md: a name of
``cni_skel.PUBLIC``, a module of ``cni_skel.PUBLIC_MODULES``, or a name in
such a module's ``__all__`` (``cni_skel.__version__`` too). Checked: ``from cni_skel.m import
a, b``, ``import cni_skel.m``, ``cni_skel.a.b`` chains, and ``m.name`` where
``m`` is a public module imported in the same block or file (``from cni_skel
import netlink`` then ``netlink.find_link``). What comes after a public
object (``cni_skel.Plugin.add``) is the object's own business. Prose outside
code is not checked."""

from __future__ import annotations

import importlib
import pathlib
import re

import cni_skel

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Dotted text that is not a Python name: the entry-point group (pyproject.toml).
NOT_NAMES = {"cni_skel.plugins"}

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
FROM_IMPORT = re.compile(
    r"(?<![\w.])from[ \t]+(cni_skel(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n;#'\"\\]*)")
IMPORT = re.compile(r"(?<![\w.])import[ \t]+(cni_skel(?:\.\w+)+)(?:[ \t]+as[ \t]+(\w+))?")
CHAIN = re.compile(r"(?<![\w.])cni_skel(?:\.\w+)+")


def _surface() -> tuple[set[str], dict[str, set[str]]]:
    modules = {m: set(importlib.import_module(f"cni_skel.{m}").__all__)
               for m in cni_skel.PUBLIC_MODULES}
    return set(cni_skel.PUBLIC) | {"__version__"}, modules


TOP, MODULES = _surface()


def is_public(dotted: str) -> bool:
    """``dotted`` (``cni_skel...``) names a public module, a public name, or
    something reached through a public object."""
    if dotted in NOT_NAMES:
        return True
    parts = dotted.split(".")[1:]
    if not parts:
        return True
    for cut in range(len(parts), 0, -1):  # a module first: cni_skel.rollback.X is the module's
        module = ".".join(parts[:cut])
        if module in MODULES:
            return cut == len(parts) or parts[cut] in MODULES[module]
    return parts[0] in TOP


def where_public(dotted: str) -> str:
    """A hint: where the last component of ``dotted`` is public, if anywhere."""
    name = dotted.rpartition(".")[2]
    found = [f"cni_skel.{name}"] if name in TOP else []
    found += [f"cni_skel.{m}.{name}" for m, names in sorted(MODULES.items()) if name in names]
    return f" (public: {', '.join(found)})" if found else ""


def uses(code: str) -> list[tuple[int, str]]:
    """``(line within code, dotted name)`` for each cni_skel name ``code`` uses."""
    found: list[tuple[int, int, str]] = []  # (offset, line, dotted)
    bound: dict[str, str] = {}  # local name -> public module
    taken: list[tuple[int, int]] = []  # spans of import statements

    def line(offset: int) -> int:
        return code.count("\n", 0, offset) + 1

    for m in FROM_IMPORT.finditer(code):
        taken.append(m.span())
        module, names = m[1], m[2]
        base = m.start(2)
        for n in re.finditer(r"(\w+)(?:\s+as\s+(\w+))?", names.strip("()")):
            name, alias = n[1], n[2] or n[1]
            dotted = f"{module}.{name}"
            at = base + n.start() + (1 if names.startswith("(") else 0)
            found.append((at, line(at), dotted))
            below = dotted.removeprefix("cni_skel.")
            if below in MODULES and not (module == "cni_skel" and name in TOP):
                bound[alias] = below
    for m in IMPORT.finditer(code):
        taken.append(m.span())
        found.append((m.start(1), line(m.start(1)), m[1]))
        below = m[1].removeprefix("cni_skel.")
        if m[2] and below in MODULES:
            bound[m[2]] = below
    for m in CHAIN.finditer(code):
        if not any(start <= m.start() < end for start, end in taken):
            found.append((m.start(), line(m.start()), m[0]))
    for local, module in bound.items():
        for m in re.finditer(rf"(?<![\w.]){re.escape(local)}\.(\w+)", code):
            if not any(start <= m.start() < end for start, end in taken):
                found.append((m.start(), line(m.start()), f"cni_skel.{module}.{m[1]}"))
    return [(ln, dotted) for _, ln, dotted in sorted(found)]


def code_of(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(first line, code)``: a .py file whole, a .md file's fenced blocks."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [(1, text)]
    return [(text.count("\n", 0, m.start(2)) + 1, m[2]) for m in FENCE.finditer(text)]


def sources() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "examples").rglob("*.py")), ROOT / "plugins" / "ptp" / "plugin.py"]


def violations(path: pathlib.Path) -> list[str]:
    """``FILE:LINE: NAME is not public`` for each non-public name ``path``'s code uses."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    return [f"{shown}:{first + ln - 1}: {dotted} is not public{where_public(dotted)}"
            for first, code in code_of(path) for ln, dotted in uses(code)
            if not is_public(dotted)]


def test_docs_and_examples_use_public_names_only():
    bad = [v for path in sources() for v in violations(path)]
    assert not bad, "internal names in code the docs show:\n" + "\n".join(bad)


def test_the_scan_sees_what_it_should(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "Prose: `cni_skel.warm.install` is not checked.\n\n"
        "```python\n"
        "from cni_skel import Plugin, netlink, rollback\n"
        "from cni_skel.netns import (\n    NetNS,\n    not_there as nt,\n)\n"
        "import cni_skel.runtime as rt\n"
        "netlink.find_link(ipr, 'eth0'); netlink._private(1); conf.netlink.x\n"
        "rt.Runtime(); rt.conf.load(); rollback('x')\n"
        "x = cni_skel.Plugin.add, cni_skel.__version__, cni_skel.skel.Plugin\n"
        "```\n\n"
        "~~~sh\n"
        "python -c 'from cni_skel.warm.install import write_executable'  # a comment\n"
        "python -m cni_skel.cli  # cni_skel_plugins.bridge is another package\n"
        "~~~\n")
    assert violations(doc) == [
        "x.md:7: cni_skel.netns.not_there is not public",
        "x.md:10: cni_skel.netlink._private is not public",
        "x.md:11: cni_skel.runtime.conf is not public",
        "x.md:16: cni_skel.warm.install.write_executable is not public "
        "(public: cni_skel.cli.write_executable)",
    ]
