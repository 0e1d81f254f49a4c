"""Deprecated since 0.2.0 (gone in 0.3.0): 0.1.0's home of the warm worker.
Run it with ``cni-skel worker`` (``cni-skel install`` writes its systemd
units); the module moved to `cni_skel.warm.server`, which is internal. Each
name below still works and warns (DeprecationWarning).
"""

from __future__ import annotations

import importlib

from . import compat

# 0.1.0's __all__, each served from where it lives now.
_OLD_NAMES = ("DEFAULT_SOCKET", "Worker", "check", "serve")

__getattr__ = compat.module_getattr(__name__, {
    name: (lambda name=name: getattr(importlib.import_module("cni_skel.warm.server"), name))
    for name in _OLD_NAMES})
