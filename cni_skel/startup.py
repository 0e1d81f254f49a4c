"""Start-up cost of a one-shot plugin process: import-time shortcuts.

A plugin executable without a warm worker starts a fresh interpreter per
call, so what its dependencies do at import time is paid on every ADD and
DEL. `prepare` is called by `cni_skel.skel.run_plugin_main` (plain one-shot
executables and the launchers' fallback) before the plugin is imported, and
by ``Plugin.main``; it changes *when* work is done, never what is done:

* **pyroute2 without its eager package init.** ``pyroute2/__init__.py``
  imports every pyroute2 API (NDB, IPDB, IPSet, IPVS, nl80211, plan9, ...)
  to re-export them, ~40 ms; a plugin needs ``IPRoute`` and the netlink
  exceptions. The package is registered with its real spec and path but its
  ``__init__`` deferred: submodules import normally, the usual top-level
  names (``IPRoute``, ``NetlinkError``, ``Conntrack``...) load from their
  defining submodules on first access, and any other attribute runs the real
  ``__init__`` first, so ``from pyroute2 import X`` keeps working for every
  X. Same modules, same classes: pyroute2's objects are untouched.
* **No pydantic plugin discovery when there is no pydantic plugin.**
  pydantic looks for its plugins (entry point group ``pydantic``) through
  ``importlib.metadata`` when the first model is built: importing it and
  scanning every distribution's metadata costs ~20 ms. When no distribution
  on ``sys.path`` declares that group (checked by reading the
  ``entry_points.txt`` files, ~1 ms) pydantic's loader is replaced by one
  answering "no plugins", which is what the real one would answer. With a
  plugin installed, or any doubt (zipped paths, foreign finders), nothing is
  changed.
* **Fewer cycle-collector passes** (`fewer_gc_passes`) while all of that
  is imported.

The first two are skipped when the package is already imported, so a
process that imported pyroute2 or built a model before is never affected.
Both reach into another library's layout, so each is also skipped unless the
installed version lies in the range it was verified against
(`PYROUTE2_VERIFIED`, `PYDANTIC_VERIFIED`; read from the packages' own
``version.py`` files, without importing them or scanning metadata), and
pydantic's private loader still defines ``get_plugins``. A newer library
then simply starts the slow way; ``tests/test_startup_guards.py`` fails on
it, so the range is widened only after the shortcut is checked again.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["PYDANTIC_VERIFIED", "PYROUTE2_VERIFIED", "fewer_gc_passes", "installed_version",
           "lazy_pyroute2", "prepare", "skip_pydantic_plugin_scan"]

#: Versions ``[low, high)`` whose layout the shortcuts were checked against.
PYROUTE2_VERIFIED = ((0, 9), (0, 10))
PYDANTIC_VERIFIED = ((2, 6), (3, 0))
# Where each package states its version, relative to its directory.
_VERSION_FILES = {"pyroute2": ("config/version.py", "__version__"),
                  "pydantic": ("version.py", "VERSION")}

#: pyroute2's top-level names our code (and plugins) import, by defining module;
#: tests check they are the objects ``pyroute2/__init__.py`` re-exports.
PYROUTE2_NAMES = {
    "IPRoute": "pyroute2.iproute",
    "AsyncIPRoute": "pyroute2.iproute",
    "IPBatch": "pyroute2.iproute",
    "NetNS": "pyroute2.iproute",
    "RawIPRoute": "pyroute2.iproute",
    "NetlinkError": "pyroute2.netlink.exceptions",
    "NetlinkDumpInterrupted": "pyroute2.netlink.exceptions",
    "NetlinkDecodeError": "pyroute2.netlink.exceptions",
    "Conntrack": "pyroute2.conntrack",
    "AsyncConntrack": "pyroute2.conntrack",
    "ConntrackEntry": "pyroute2.conntrack",
}


_prepared = False


def prepare() -> None:
    """All of the above, once; for a process about to run one plugin call."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    fewer_gc_passes()
    lazy_pyroute2()
    skip_pydantic_plugin_scan()


def fewer_gc_passes() -> None:
    """Collect reference cycles every 100,000 allocations instead of 700.

    Importing pydantic and pyroute2 allocates a few hundred thousand objects
    that all live until the process exits; with the default threshold the
    cycle collector walks them again and again (~8% of the start-up). Cycles
    are still collected, just less often: this is for short-lived processes."""
    import gc

    gc.set_threshold(max(gc.get_threshold()[0], 100_000), *gc.get_threshold()[1:])


def installed_version(package: str) -> tuple[int, ...] | None:
    """The version of ``package`` (``"pyroute2"`` or ``"pydantic"``) found on
    sys.path, as a tuple of its leading numbers, read from its version file
    without importing it; None when it cannot be read."""
    spec = _find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    rel, name = _VERSION_FILES[package]
    for base in spec.submodule_search_locations:
        try:
            with open(os.path.join(base, rel), encoding="utf-8") as fp:
                text = fp.read()
        except OSError:
            continue
        m = re.search(rf"^{name}\s*=\s*['\"](\d+(?:\.\d+)*)", text, re.MULTILINE)
        if m:
            return tuple(int(p) for p in m.group(1).split("."))
    return None


def _verified(package: str, bounds: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    version = installed_version(package)
    return version is not None and bounds[0] <= version < bounds[1]


# --- pyroute2 -------------------------------------------------------------------------


def _find_spec(name: str) -> Any:
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def lazy_pyroute2() -> bool:
    """Register ``pyroute2`` with its ``__init__`` deferred (see the module
    doc). Returns whether it did (False: already imported, or not found)."""
    if "pyroute2" in sys.modules or not _verified("pyroute2", PYROUTE2_VERIFIED):
        return False
    spec = _find_spec("pyroute2")
    if spec is None or spec.loader is None or not spec.submodule_search_locations \
            or not hasattr(spec.loader, "exec_module"):
        return False
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    module.__class__ = _LazyPackage
    sys.modules["pyroute2"] = module
    return True


def _run_package_init(module: Any) -> None:
    """Run pyroute2's real ``__init__`` in the registered module (once)."""
    import types

    module.__class__ = types.ModuleType  # plain attribute misses from here on
    try:
        module.__spec__.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module.__name__, None)
        raise


def _lazy_getattr(module: Any, name: str) -> Any:
    import importlib

    if not name.startswith("__"):
        source = PYROUTE2_NAMES.get(name)
        if source is not None:
            value = getattr(importlib.import_module(source), name)
            setattr(module, name, value)
            return value
        # A submodule (``from pyroute2 import netns, config``): import it alone.
        full = f"{module.__name__}.{name}"
        try:
            return importlib.import_module(full)
        except ModuleNotFoundError as e:
            if e.name != full:
                raise
    _run_package_init(module)
    try:
        return module.__dict__[name]
    except KeyError:
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None


class _LazyPackage(type(sys)):  # types.ModuleType, without importing types
    """The module class of a package whose ``__init__`` has not run yet."""

    def __getattr__(self, name: str) -> Any:
        return _lazy_getattr(self, name)

    def __dir__(self) -> list[str]:
        _run_package_init(self)
        return sorted(self.__dict__)


# --- pydantic ---------------------------------------------------------------------------

_LOADER = "pydantic.plugin._loader"


def _declares_pydantic_plugin(text: str) -> bool:
    return any(line.strip() == "[pydantic]" for line in text.splitlines())


def _pydantic_plugins_possible() -> bool:
    """True when some distribution may declare a ``pydantic`` entry point,
    or we cannot tell cheaply (then pydantic must look itself)."""
    import importlib.machinery as machinery

    std = (machinery.BuiltinImporter, machinery.FrozenImporter, machinery.PathFinder)
    for finder in sys.meta_path:
        if finder in std or not hasattr(finder, "find_distributions"):
            continue
        return True  # a finder with its own distributions
    for entry in sys.path:
        path = entry or "."
        try:
            names = os.listdir(path)
        except NotADirectoryError:
            return True  # a zip on sys.path may hold distributions
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(path, name, "entry_points.txt"), encoding="utf-8") as fp:
                    if _declares_pydantic_plugin(fp.read()):
                        return True
            except (FileNotFoundError, NotADirectoryError):
                continue
            except (OSError, UnicodeDecodeError):
                return True
    return False


def skip_pydantic_plugin_scan() -> bool:
    """Answer pydantic's plugin lookup with "none" when no distribution
    declares a pydantic plugin (see the module doc). Returns whether it did."""
    if _LOADER in sys.modules or "pydantic" in sys.modules or _NoPluginsLoader in sys.meta_path \
            or not _verified("pydantic", PYDANTIC_VERIFIED) or not _loader_has_get_plugins() \
            or _pydantic_plugins_possible():
        return False
    sys.meta_path.insert(0, _NoPluginsLoader)
    return True


def _loader_has_get_plugins() -> bool:
    # The one name of pydantic's private loader we answer for.
    spec = _find_spec("pydantic")
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            with open(os.path.join(base, "plugin", "_loader.py"), encoding="utf-8") as fp:
                return re.search(r"^def get_plugins\(", fp.read(), re.MULTILINE) is not None
        except OSError:
            continue
    return False


def _no_plugins() -> tuple:
    return ()


class _NoPluginsLoader:
    """Finder and loader of ``pydantic.plugin._loader`` (once): a module whose
    ``get_plugins()`` answers no plugins; any other attribute loads the real
    module in its place. Through the import system, so its parent packages
    are imported as usual."""

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _LOADER:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(cls)
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, cls)

    @staticmethod
    def create_module(spec: Any) -> None:
        return None  # the default module

    @staticmethod
    def exec_module(module: Any) -> None:
        module.__doc__ = "cni_skel.startup: no distribution declares a pydantic plugin."
        module.get_plugins = _no_plugins

        def __getattr__(name: str) -> Any:
            # Dunders are the import system probing (__path__...): not ours.
            if name.startswith("__"):
                raise AttributeError(name)
            import importlib

            if sys.modules.get(_LOADER) is module:
                del sys.modules[_LOADER]
            return getattr(importlib.import_module(_LOADER), name)

        module.__getattr__ = __getattr__
