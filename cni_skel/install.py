"""Deprecated since 0.2.0 (gone in 0.3.0): 0.1.0's home of the executable
writer. Write plugin executables with `cni_skel.cli.write_executable` (or
``cni-skel install``); the module moved to `cni_skel.warm.install`, which is
internal. Each name below still works and warns (DeprecationWarning).
"""

from __future__ import annotations

import importlib

from . import compat

# 0.1.0's __all__, each served from where it lives now.
_OLD_NAMES = ("DEFAULT_WORKER_SOCKET", "LAUNCHERS", "MARKER", "find_cc", "launcher_info",
              "plugin_registry", "python_argv", "write_executable")

__getattr__ = compat.module_getattr(__name__, {
    name: (lambda name=name: getattr(importlib.import_module("cni_skel.warm.install"), name))
    for name in _OLD_NAMES})
