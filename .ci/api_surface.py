#!/usr/bin/env python3
"""The public API of cni_skel as a checked text snapshot (api/cni_skel.txt).

    python .ci/api_surface.py write   # make api: (re)write api/cni_skel.txt from the code
    python .ci/api_surface.py check   # make api-check (CI): the rules below

What is public (docs/stability.md; the docstring of cni_skel/__init__.py):
the names in ``cni_skel.PUBLIC`` and, for each dotted module name ``m`` in
``cni_skel.PUBLIC_MODULES``, the names in ``cni_skel.<m>.__all__``. The code
is read statically: ``PUBLIC``, ``_EXPORTS``, ``PUBLIC_MODULES``,
``__version__`` and ``compat.DEPRECATED`` with `ast`, everything else with
griffe (nothing is imported, so annotations stay as written in the source).

The snapshot, one line per public object, sorted by dotted path:

* ``module cni_skel.netlink`` for each module of ``PUBLIC_MODULES``;
* ``cni_skel.netlink.find_link(ipr: Socket, name: Link | str | int) -> Link | None``
  (``async `` in front for a coroutine function, decorators as written in
  ``[...]`` after it);
* ``class cni_skel.netlink.Link(Base, ...)  [@dataclass(frozen=True)]``, then
  one line per member of the class: those defined on it, and those it
  inherits from a base class of cni_skel that is not itself listed as a
  public class (an internal base's methods are the public class's). Members
  are the names without a leading underscore, plus dunder methods
  (``__init__``, ``__getitem__``, ``__enter__``...) other than those in
  ``DUNDER_SKIP``; methods with their signature, properties as
  ``path: type  [property]`` (``, writable`` with a setter), attributes,
  dataclass and pydantic fields as ``path: annotation = default`` (the value
  only when assigned in the class body). A private base of the package
  (``_ResultModel``) is shown as its own bases. A decorator whose arguments
  are not all flags or numbers shows as ``@name(...)``;
* ``cni_skel.sysctl.PROC_SYS = '/proc/sys'`` for a module attribute (a data
  table longer than ``VALUE_MAX`` as ``{...}``);
* ``cni_skel.Plugin -> cni_skel.skel.Plugin``: a name that is an alias of
  another public name (every top-level name, ``cni_skel.cli.describe_error``)
  points at it; a re-export of an internal object (``cni_skel.types.Result``
  from ``cni_skel.types.current``) is listed in full under its public path,
  so moving internals around changes no line;
* after the surface, ``cni_skel.compat.DEPRECATED`` (served by module
  ``__getattr__`` aliases, invisible to static analysis):
  ``deprecated OLD -> REPLACEMENT  [deprecated in X, removed in Y]``.

The first header line gives ``cni_skel.__version__``. Annotations, defaults
and values are griffe's rendering of the source (quotes normalised), so the
file is the same on every machine.

``check`` fails (exit 1, saying what to do) when

(a) the snapshot generated from the code differs from api/cni_skel.txt
    (a unified diff is printed): run ``make api``;
(b) an object that differs between the baseline (the newest
    api/cni_skel-<version>.txt, the last release) and the surface generated
    from the code (added, removed, or its line changed) is not named in
    CHANGELOG.md, in the text above the baseline release's heading
    (``## [0.1.0]``). An alias line counts as what it points at: a name that
    turned from a definition into an alias of the same thing elsewhere
    (``cli.describe_error -> runtime.describe_error``) did not change, and a
    change of the target is reported under the target's name only. Named:
    inside backticks, optionally followed by ``(...)``, the full dotted path
    or a dotted suffix of it that keeps at least its class (a member of a
    class: ``Plugin.verbs``, ``skel.Plugin.verbs``) or else its module's
    last component (``netlink.find_link``; a module: ``masq``,
    ``cni_skel.masq``); a top-level name only as ``cni_skel.NAME``; a
    class's ``__init__`` also by the class's own names (``env.CmdArgs``: a
    changelog says what a class takes, not what its ``__init__`` does). A module
    or class added or removed as a whole, once named, covers everything
    below it (and is listed alone, with the count of what it covers);
(c) the snapshot's version is not ``cni_skel.__version__``, or CHANGELOG.md
    has no section for that version (``## [0.2.0] - date``) nor
    ``## [Unreleased]``.

At a release, copy api/cni_skel.txt to api/cni_skel-<version>.txt: it is the
next baseline. The 0.1.0 baseline predates this tool; it was made from the
0.1.0 tree (commit d9d26ce), which had no PUBLIC_MODULES (top-level names
from its ``__all__``; modules: today's list as far as they existed, plus
``install`` and ``worker``, which its README documented):

    python .ci/api_surface.py write --source /path/to/0.1.0-checkout \\
        --modules args,cli,config,conntrack,env,errors,harness,install,invoke,ipam,model,\\
netlink,netns,nft,runtime,skel,state,sysctl,testing,types,version,worker \\
        --out api/cni_skel-0.1.0.txt

Needs the stdlib and griffe; ``check`` needs neither git nor network.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "cni_skel"
SNAPSHOT = ROOT / "api" / "cni_skel.txt"
CHANGELOG = ROOT / "CHANGELOG.md"

#: Dunder methods that are not part of what a caller relies on (and pydantic's
#: ``__pydantic_*__``/``__get_pydantic_*__`` hooks).
DUNDER_SKIP = frozenset({
    "__repr__", "__str__", "__format__", "__hash__", "__sizeof__", "__del__",
    "__post_init__", "__init_subclass__", "__class_getitem__", "__set_name__",
    "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__copy__", "__deepcopy__",
    "__rich_repr__", "__pretty__", "__repr_args__",
})

#: Longer data tables (``rtnl.COMMANDS``) show as ``{...}``.
VALUE_MAX = 120

HEADER = re.compile(r"^# (\S+) (\S+) public API")
LINE_KEY = re.compile(r"^(?:(module|class|deprecated|type) |async )?([A-Za-z_][\w.]*)")
IDENT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class SurfaceError(Exception):
    """The code cannot be read as the rule says (a name in __all__ that is not there...)."""


# --- the package's own declarations, read with ast ---------------------------------------

class _NotStatic(Exception):
    pass


def _eval(node: ast.expr, env: dict[str, object]) -> object:
    """The value of a literal-ish expression: constants, tuples/lists/sets/dicts
    (with ``*name``), names bound before, ``sorted/tuple/list(x)`` and ``+``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items: list[object] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                items.extend(_eval(element.value, env))
            else:
                items.append(_eval(element, env))
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _NotStatic
        return {_eval(k, env): _eval(v, env) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise _NotStatic
        return env[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords
            and node.func.id in {"sorted", "tuple", "list"} and len(node.args) == 1):
        return {"sorted": sorted, "tuple": tuple, "list": list}[node.func.id](
            _eval(node.args[0], env))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _eval(node.left, env) + _eval(node.right, env)
    raise _NotStatic


def module_values(path: Path) -> tuple[dict[str, object], dict[str, str]]:
    """The static module-level values of ``path``, and its ``from . import``
    names (name -> dotted target, relative to the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    env: dict[str, object] = {}
    imports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                where = f"{node.module}.{alias.name}" if node.module else alias.name
                imports[alias.asname or alias.name] = where
            continue
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                env[target.id] = _eval(value, env)
            except (_NotStatic, TypeError):
                env.pop(target.id, None)
    return env, imports


@dataclass
class Declared:
    """What a source tree says about its own surface."""

    version: str
    top: tuple[str, ...]              # PUBLIC (or, before it existed, __all__)
    exports: dict[str, str]           # _EXPORTS: lazy top-level name -> module
    imports: dict[str, str]           # top-level ``from .x import y as z``: z -> x.y
    modules: tuple[str, ...]          # PUBLIC_MODULES
    deprecated: dict[str, tuple[str, str, str]] = field(default_factory=dict)


def read_declared(source: Path, modules: tuple[str, ...] | None = None) -> Declared:
    init = source / PACKAGE / "__init__.py"
    env, imports = module_values(init)
    top = env.get("PUBLIC", env.get("__all__"))
    if not isinstance(top, (tuple, list)):
        raise SurfaceError(f"{init}: no static PUBLIC or __all__")
    if modules is None:
        modules = env.get("PUBLIC_MODULES")
        if not isinstance(modules, tuple):
            raise SurfaceError(f"{init}: no static PUBLIC_MODULES (give --modules)")
    deprecated: dict[str, tuple[str, str, str]] = {}
    compat = source / PACKAGE / "compat.py"
    if compat.exists():
        deprecated = module_values(compat)[0].get("DEPRECATED", {})
    return Declared(version=str(env["__version__"]), top=tuple(top),
                    exports=dict(env.get("_EXPORTS", {})),
                    imports=imports, modules=tuple(modules), deprecated=deprecated)


# --- the surface, from griffe --------------------------------------------------------------

def _flat(value: object) -> str:
    return " ".join(str(value).split())


def _decorator(text: str) -> str:
    """A decorator as written when its arguments are flags and numbers
    (``dataclass(frozen=True)``), else its name and ``(...)`` (the help text of
    ``click.group(...)`` is no part of the surface)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    if not isinstance(node, ast.Call):
        return text
    values = [*node.args, *(k.value for k in node.keywords)]
    if all(isinstance(v, ast.Constant) and not isinstance(v.value, (str, bytes))
           for v in values):
        return text
    return f"{ast.unparse(node.func)}(...)"


def _decorators(obj: griffe.Object) -> str:
    names = [f"@{_decorator(_flat(d.value))}" for d in getattr(obj, "decorators", ())]
    return f"  [{', '.join(names)}]" if names else ""


def _value(value: object) -> str:
    """An attribute's value as written; a data table (a dict, list, set or tuple
    display) longer than `VALUE_MAX` as its brackets around ``...``."""
    text = _flat(value)
    if len(text) > VALUE_MAX and text[0] in "{[(" and text[-1] in "}])":
        return f"{text[0]}...{text[-1]}"
    return text


def _signature(fn: griffe.Function) -> str:
    kinds = griffe.ParameterKind
    params = list(fn.parameters)
    out: list[str] = []
    star = any(p.kind is kinds.var_positional for p in params)
    for i, p in enumerate(params):
        if p.kind is kinds.keyword_only and not star:
            out.append("*")
            star = True
        text = {kinds.var_positional: "*", kinds.var_keyword: "**"}.get(p.kind, "") + p.name
        if p.annotation is not None:
            text += f": {_flat(p.annotation)}"
        if p.default is not None and p.kind not in (kinds.var_positional, kinds.var_keyword):
            text += (" = " if p.annotation is not None else "=") + _flat(p.default)
        out.append(text)
        if p.kind is kinds.positional_only and (
                i + 1 == len(params) or params[i + 1].kind is not kinds.positional_only):
            out.append("/")
    returns = f" -> {_flat(fn.returns)}" if fn.returns is not None else ""
    return f"({', '.join(out)}){returns}"


def _is_property(obj: griffe.Object) -> bool:
    return "property" in obj.labels or "cached_property" in obj.labels


def _public_member(name: str, obj: griffe.Object | griffe.Alias) -> bool:
    if not name.startswith("_"):
        return True
    return (name.startswith("__") and name.endswith("__") and name not in DUNDER_SKIP
            and not name.startswith(("__pydantic", "__get_pydantic")) and obj.is_function)


class Surface:
    """The public objects of one source tree, rendered as snapshot lines."""

    def __init__(self, source: Path, declared: Declared) -> None:
        logging.getLogger("griffe").setLevel(logging.ERROR)
        self.declared = declared
        self.package = griffe.load(PACKAGE, search_paths=[str(source)], try_relative_path=False,
                                   allow_inspection=False, resolve_aliases=True,
                                   resolve_external=False)
        found = Path(self.package.filepath).resolve()
        if not found.is_relative_to(source.resolve()):
            raise SurfaceError(f"griffe loaded {found}, not the tree at {source}")
        self.lines: list[tuple[str, str]] = []
        # public path -> the path its first hop points at (None: defined there)
        self.entries: dict[str, str | None] = {}
        for name in declared.top:
            if name in declared.exports:
                self.entries[f"{PACKAGE}.{name}"] = f"{PACKAGE}.{declared.exports[name]}.{name}"
            elif name in declared.imports:
                self.entries[f"{PACKAGE}.{name}"] = f"{PACKAGE}.{declared.imports[name]}"
            else:
                self.entries[f"{PACKAGE}.{name}"] = None
        self.modules = {m: self._module(m) for m in declared.modules}
        for m, module in self.modules.items():
            for name in self._all(m, module):
                self.entries.setdefault(f"{PACKAGE}.{m}.{name}", None)
        # Every public path: a top-level name and a module may share one
        # (cni_skel.rollback: the function shadows the module at run time).
        self.public = set(self.entries) | {f"{PACKAGE}.{m}" for m in self.modules}
        # Final object path -> the public path where it is listed in full.
        self.homes: dict[str, str] = {}

    def _module(self, dotted: str) -> griffe.Module:
        try:
            obj = self._lookup(f"{PACKAGE}.{dotted}")
        except KeyError:
            raise SurfaceError(f"{PACKAGE}.{dotted}: no such module") from None
        if not obj.is_module:
            raise SurfaceError(f"{PACKAGE}.{dotted} is not a module")
        return obj

    @staticmethod
    def _all(dotted: str, module: griffe.Module) -> list[str]:
        names = module.exports
        if names is None:
            raise SurfaceError(f"{PACKAGE}.{dotted} has no __all__ griffe can read")
        out = []
        for name in names:
            if not isinstance(name, str):
                raise SurfaceError(f"{PACKAGE}.{dotted}.__all__: {name!r} is not a plain name")
            out.append(name)
        return out

    def _lookup(self, path: str) -> griffe.Object | griffe.Alias:
        """The object at ``path``, submodules first (``cni_skel.rollback``)."""
        rest = path.split(".")
        if rest[0] != PACKAGE:
            raise KeyError(path)
        obj: griffe.Object | griffe.Alias = self.package
        for part in rest[1:]:
            in_modules = obj.is_module and part in obj.modules
            obj = obj.modules[part] if in_modules else obj.members[part]
        return obj

    def _member_at(self, path: str) -> griffe.Object | griffe.Alias:
        """The object a public name is, where it is defined (not imported)."""
        parent, _, name = path.rpartition(".")
        owner = self._lookup(parent)
        if name not in owner.members:
            raise SurfaceError(f"{path} is public but not defined (statically)")
        return owner.members[name]

    def build(self) -> list[tuple[str, str]]:
        # First pass: where each public path leads (alias to a public path, external, or
        # an object listed in full), so that inherited members know which bases are listed.
        plans: dict[str, tuple[str, object]] = {}
        for path, hop in sorted(self.entries.items()):
            plans[path] = self._plan(path, hop)
            if plans[path][0] == "object":
                self.homes.setdefault(plans[path][1].path, path)
        for m in self.modules:
            self.lines.append((f"{PACKAGE}.{m}", f"module {PACKAGE}.{m}"))
        for path, (kind, what) in plans.items():
            if kind == "alias":
                self.lines.append((path, f"{path} -> {what}"))
            else:
                self._render(path, what)
        for old, (new, since, until) in sorted(self.declared.deprecated.items()):
            self.lines.append((old, f"deprecated {old} -> {_flat(new)}  "
                                    f"[deprecated in {since}, removed in {until}]"))
        return self.lines

    def _plan(self, path: str, hop: str | None) -> tuple[str, object]:
        if hop is None:
            obj = self._member_at(path)
        else:
            if hop in self.public and hop != path:
                return ("alias", hop)
            try:
                obj = self._lookup(hop)
            except KeyError:
                raise SurfaceError(f"{path}: {hop} does not exist") from None
        while obj.is_alias:
            target = obj.target_path
            if target in self.public and target != path:
                return ("alias", target)
            try:
                obj = obj.target
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return ("alias", target)  # outside the package
        return ("object", obj)

    def _render(self, path: str, obj: griffe.Object) -> None:
        if obj.is_module:
            self.lines.append((path, f"module {path}"))
        elif obj.is_class:
            self._class(path, obj)
        elif obj.is_function:
            self._function(path, obj)
        elif obj.is_attribute:
            self._attribute(path, obj, in_class=False)
        elif obj.kind.value == "type alias":
            self.lines.append((path, f"type {path} = {_flat(obj.value)}"))
        else:
            raise SurfaceError(f"{path}: cannot render a {obj.kind.value}")

    def _function(self, path: str, fn: griffe.Function) -> None:
        if _is_property(fn):  # griffe 1: a property is a function with a label
            self._property(path, fn.returns, fn.labels)
            return
        prefix = "async " if "async" in fn.labels else ""
        overloads = getattr(fn, "overloads", None) or []
        for overload in overloads:
            self.lines.append((path, f"{prefix}{path}{_signature(overload)}  [@overload]"))
        self.lines.append((path, f"{prefix}{path}{_signature(fn)}{_decorators(fn)}"))

    def _property(self, path: str, returns: object, labels: set[str]) -> None:
        tags = ["property"] + (["writable"] if "writable" in labels else [])
        annotation = f": {_flat(returns)}" if returns is not None else ""
        self.lines.append((path, f"{path}{annotation}  [{', '.join(tags)}]"))

    def _attribute(self, path: str, attr: griffe.Attribute, *, in_class: bool) -> None:
        if _is_property(attr):  # griffe 2: a property is an attribute with a label
            self._property(path, attr.annotation, attr.labels)
            return
        text = path
        if attr.annotation is not None:
            text += f": {_flat(attr.annotation)}"
        # A class attribute, a field's default, a module constant: as written. A value
        # assigned in a method (self.x = ... in __init__) is no default of the class.
        if attr.value is not None and not (in_class and self._set_in_method(attr)):
            text += f" = {_value(attr.value)}"
        self.lines.append((path, text))

    @staticmethod
    def _set_in_method(attr: griffe.Attribute) -> bool:
        owner = attr.parent
        if owner is None or attr.lineno is None:
            return False
        return any(m.is_function and not m.is_alias and m.lineno is not None
                   and m.endlineno is not None and m.lineno <= attr.lineno <= m.endlineno
                   for m in owner.members.values())

    def _bases(self, cls: griffe.Class) -> list[str]:
        """The bases as written, a private base of the package (``_ResultModel``)
        replaced by its own bases: its members are listed on the class."""
        out: list[str] = []
        for base in cls.bases:
            target = None
            path = getattr(base, "canonical_path", None)
            if isinstance(path, str) and path.startswith(f"{PACKAGE}."):
                try:
                    target = self._lookup(path)
                    target = target.final_target if target.is_alias else target
                except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                    target = None
            if target is not None and target.is_class and target.name.startswith("_"):
                out.extend(b for b in self._bases(target) if b not in out)
            else:
                out.append(_flat(base))
        return out

    def _class(self, path: str, cls: griffe.Class) -> None:
        bases = self._bases(cls)
        bases += [f"{k}={_flat(v)}" for k, v in (getattr(cls, "keywords", None) or {}).items()]
        head = f"class {path}({', '.join(bases)})" if bases else f"class {path}"
        self.lines.append((path, head + _decorators(cls)))
        members: dict[str, griffe.Object | griffe.Alias] = {}
        for name, member in cls.members.items():
            if _public_member(name, member):
                members[name] = member
        for name, member in self._internal_inherited(cls).items():
            members.setdefault(name, member)
        for name, member in sorted(members.items()):
            sub = f"{path}.{name}"
            while member.is_alias:
                try:
                    member = member.target
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    break
            if member.is_alias:
                self.lines.append((sub, f"{sub} -> {member.target_path}"))
            elif member.is_class:
                self._class(sub, member)
            elif member.is_function:
                self._function(sub, member)
            elif member.is_attribute:
                self._attribute(sub, member, in_class=True)
            else:
                self._render(sub, member)

    def _internal_inherited(self, cls: griffe.Class) -> dict[str, griffe.Object]:
        """Members ``cls`` inherits from the package's classes that are not listed as
        public classes themselves (their members are nowhere else in the snapshot)."""
        try:
            mro = cls.mro()
        except (ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return {}
        out: dict[str, griffe.Object] = {}
        for base in mro:
            base = base.final_target if base.is_alias else base
            if not base.path.startswith(f"{PACKAGE}.") or base.path in self.homes:
                continue
            for name, member in base.members.items():
                if _public_member(name, member) and name not in cls.members:
                    out.setdefault(name, member)
        return out


def render(source: Path, declared: Declared) -> str:
    lines = Surface(source, declared).build()
    body = [text for _, text in sorted(lines)]
    main = [t for t in body if not t.startswith("deprecated ")]
    old = [t for t in body if t.startswith("deprecated ")]
    out = [f"# {PACKAGE} {declared.version} public API (docs/stability.md)",
           "# cni_skel.PUBLIC, and the __all__ of each module in cni_skel.PUBLIC_MODULES.",
           "# Written by .ci/api_surface.py (make api), checked by make api-check: do not edit.",
           "", *main, "",
           "# Deprecated (cni_skel.compat.DEPRECATED): old name -> what replaces it",
           *old]
    return "\n".join(out) + "\n"


# --- reading snapshots, and the CHANGELOG ----------------------------------------------------

@dataclass
class Snapshot:
    version: str
    objects: dict[str, set[str]]      # key -> its lines
    modules: set[str]
    classes: set[str]


def parse_snapshot(text: str, where: str) -> Snapshot:
    lines = text.splitlines()
    header = HEADER.match(lines[0]) if lines else None
    if header is None or header.group(1) != PACKAGE:
        raise SurfaceError(f"{where}: no '# {PACKAGE} VERSION public API' header")
    snap = Snapshot(header.group(2), {}, set(), set())
    for line in lines[1:]:
        if not line.strip() or line.startswith("#"):
            continue
        match = LINE_KEY.match(line)
        if match is None:
            raise SurfaceError(f"{where}: cannot read {line!r}")
        kind, key = match.groups()
        snap.objects.setdefault(key, set()).add(line)
        if kind == "module":
            snap.modules.add(key)
        elif kind == "class":
            snap.classes.add(key)
    return snap


def _version_key(path: Path) -> tuple[int, ...]:
    version = path.stem.removeprefix(f"{PACKAGE}-")
    return tuple(int(part) if part.isdigit() else -1 for part in re.split(r"[.-]", version))


def find_baseline(api_dir: Path) -> Path | None:
    found = sorted(api_dir.glob(f"{PACKAGE}-*.txt"), key=_version_key)
    return found[-1] if found else None


def spellings(key: str, modules: set[str], classes: set[str]) -> set[str]:
    """The backticked names that name ``key`` (rule (b) of the module docstring)."""
    parts = key.split(".")
    if key in modules:
        return {".".join(parts[i:]) for i in range(len(parts))}
    parent = key.rpartition(".")[0]
    if parent in classes:
        anchor = len(parent.split(".")) - 1
    else:
        module = max((m for m in modules | {PACKAGE} if key.startswith(m + ".")), key=len)
        anchor = len(module.split(".")) - 1
    names = {".".join(parts[i:]) for i in range(anchor + 1)}
    if parent in classes and parts[-1] == "__init__":
        names |= spellings(parent, modules, classes)  # the class's constructor
    return names


def named_in(text: str) -> set[str]:
    """The dotted names inside backticks in ``text`` (``name`` or ``name(...)``)."""
    names = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        span = re.sub(r"\(.*\)$", "", span.strip())
        if IDENT_PATH.fullmatch(span):
            names.add(span)
    return names


def changelog_above(text: str, version: str) -> str | None:
    """The changelog text above the ``## [version]`` heading (None: no such heading)."""
    match = re.search(rf"^##\s*\[{re.escape(version)}\]", text, re.MULTILINE)
    return text[:match.start()] if match else None


ALIAS = re.compile(r"^([A-Za-z_][\w.]*) -> ([A-Za-z_][\w.]*)$")


def effective(snap: Snapshot, key: str, other: Snapshot, seen: frozenset[str] = frozenset()
              ) -> set[str]:
    """What ``key`` gives a caller, for comparing it with ``other``: its lines,
    where an alias line stands for the lines of what it points at (re-rooted
    at ``key``), unless ``other`` has the same alias line (a change of the
    target is then the target's, under its own name); a name below an alias
    (``X.attr`` where ``X -> Y``) is ``Y.attr``'s."""
    if key in seen:
        return set()
    seen = seen | {key}
    lines = snap.objects.get(key)
    if lines is None:
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            above, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
            for line in snap.objects.get(above, ()):
                alias = ALIAS.match(line)
                if alias and alias.group(2) in snap.objects:
                    target = f"{alias.group(2)}.{rest}"
                    return {text.replace(target, key, 1)
                            for text in effective(snap, target, other, seen)}
        return set()
    out: set[str] = set()
    for line in lines:
        alias = ALIAS.match(line)
        target = alias.group(2) if alias else None
        if target is None or target not in snap.objects or line in other.objects.get(key, ()):
            out.add(line)
        else:
            out |= {text.replace(target, key, 1)
                    for text in effective(snap, target, other, seen)}
    return out


def _container(lines: set[str]) -> str | None:
    for line in lines:
        if line.startswith(("module ", "class ")):
            return line.split(" ", 1)[0]
    return None


def uncovered(baseline: Snapshot, current: Snapshot, changelog_text: str) -> dict[str, int]:
    """The objects that differ between the snapshots and the changelog text
    does not name: key -> how many more below it naming it covers (a module or
    class added or removed as a whole; what is below one is not listed)."""
    named = named_in(changelog_text)
    modules = baseline.modules | current.modules
    classes = baseline.classes | current.classes
    changed: list[str] = []
    whole: set[str] = set()  # modules and classes added or removed as a whole
    for key in sorted(set(baseline.objects) | set(current.objects)):
        before = effective(baseline, key, current)
        after = effective(current, key, baseline)
        if before == after:
            continue
        changed.append(key)
        kinds = {_container(before), _container(after)}
        if len(kinds) == 2 and kinds != {None}:
            whole.add(key)
    # Once named, a module or class added or removed as a whole covers what is below it.
    covering = {c for c in whole if spellings(c, modules, classes) & named}
    out: dict[str, int] = {}
    for key in changed:
        if spellings(key, modules, classes) & named:
            continue
        if any(key.startswith(c + ".") for c in covering):
            continue
        outer = [c for c in whole if key.startswith(c + ".")]
        if outer:
            top = min(outer, key=len)
            out[top] = out.get(top, 0) + 1
        else:
            out.setdefault(key, 0)
    return dict(sorted(out.items()))


# --- commands ----------------------------------------------------------------------------------

def cmd_write(args: argparse.Namespace) -> int:
    source = Path(args.source)
    modules = None
    if args.modules:
        modules = tuple(m.strip() for m in args.modules.split(",") if m.strip())
    declared = read_declared(source, modules)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(source, declared), encoding="utf-8")
    print(f"api_surface: wrote {_rel(out)} ({PACKAGE} {declared.version})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    snapshot_path, changelog_path = Path(args.snapshot), Path(args.changelog)
    declared = read_declared(ROOT)
    generated = render(ROOT, declared)
    problems: list[str] = []
    todo: list[str] = []
    shown = _rel(snapshot_path)
    written = snapshot_path.read_text(encoding="utf-8") if snapshot_path.exists() else ""
    if generated != written:  # (a)
        sys.stdout.writelines(difflib.unified_diff(
            written.splitlines(keepends=True), generated.splitlines(keepends=True),
            f"{shown} (written)", f"{shown} (from the code)"))
        problems.append(f"{shown} is not what the code exports (diff above)"
                        if written else f"{shown} does not exist")
        todo.append("run `make api`")
    current = parse_snapshot(generated, "the generated surface")
    if written:
        header = parse_snapshot(written, shown).version
        if header != declared.version:  # (c)
            problems.append(f"{shown} is for {header}, cni_skel.__version__ is {declared.version}")
    changelog = changelog_path.read_text(encoding="utf-8") if changelog_path.exists() else None
    cl = _rel(changelog_path)
    if changelog is None:
        problems.append(f"{cl} does not exist")
        todo.append(f"write {cl} (Keep a Changelog: `## [Unreleased]` above the releases' "
                    "sections)")
    elif not re.search(rf"^##\s*\[(?:{re.escape(declared.version)}|Unreleased)\]", changelog,
                       re.MULTILINE | re.IGNORECASE):  # (c)
        problems.append(f"{cl} has no `## [{declared.version}]` or `## [Unreleased]` section")
        todo.append(f"add a `## [Unreleased]` (or `## [{declared.version}] - date`) section "
                    f"to {cl}")
    baseline_path = Path(args.baseline) if args.baseline else find_baseline(SNAPSHOT.parent)
    missing: dict[str, int] = {}
    if baseline_path is None or not baseline_path.exists():
        problems.append(f"no baseline snapshot ({_rel(SNAPSHOT.parent)}/{PACKAGE}-VERSION.txt)")
        todo.append("restore the last release's snapshot from git (it is never regenerated)")
    elif changelog is not None:  # (b)
        baseline = parse_snapshot(baseline_path.read_text(encoding="utf-8"), _rel(baseline_path))
        above = changelog_above(changelog, baseline.version)
        if above is None:
            problems.append(f"{cl} has no `## [{baseline.version}]` heading (the baseline "
                            f"release, {_rel(baseline_path)})")
            todo.append(f"keep the `## [{baseline.version}]` section in {cl}")
        else:
            missing = uncovered(baseline, current, above)
            for key in missing:  # what changed, for the changelog's author
                before = effective(baseline, key, current)
                after = effective(current, key, baseline)
                print(f"api_surface: {key}:")
                print("".join(f"  - {line}\n" for line in sorted(before - after))
                      + "".join(f"  + {line}\n" for line in sorted(after - before)), end="")
            if missing:
                problems.append(f"{len(missing)} public name(s) changed since {baseline.version} "
                                f"and not named in {cl} above `## [{baseline.version}]`")
                todo.append(f"name these in {cl} (inside backticks, in a section above "
                            f"`## [{baseline.version}]`): " + ", ".join(
                                f"{key} (added or removed whole: covers {n} below it)" if n
                                else key for key, n in missing.items()))
    if not problems:
        print(f"api_surface: ok ({shown} matches the code; every change since "
              f"{baseline.version} is in {cl})")
        return 0
    for problem in problems:
        print(f"api_surface: {problem}")
    if todo:
        print("api_surface: " + ", and ".join(todo))
    return 1


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write the snapshot from the code")
    write.add_argument("--source", default=str(ROOT),
                       help="the tree holding cni_skel/ (default: this checkout)")
    write.add_argument("--modules", help="comma-separated modules (default: PUBLIC_MODULES)")
    write.add_argument("--out", default=str(SNAPSHOT))
    check = sub.add_parser("check", help="the snapshot and CHANGELOG.md against the code")
    check.add_argument("--snapshot", default=str(SNAPSHOT))
    check.add_argument("--changelog", default=str(CHANGELOG))
    check.add_argument("--baseline", help="default: the newest api/cni_skel-VERSION.txt")
    args = parser.parse_args(argv)
    try:
        return cmd_write(args) if args.command == "write" else cmd_check(args)
    except SurfaceError as e:
        print(f"api_surface: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
