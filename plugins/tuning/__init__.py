"""The ``tuning`` meta plugin: sysctls and link settings of the container's
interface, restored on DEL.

A drop-in for the Go reference tuning (containernetworking/plugins,
plugins/meta/tuning): same executable name, same config keys, the same
saved-values file. The plugin is `Tuning` (in `.plugin`).
"""

from __future__ import annotations

from .plugin import Tuning

__all__ = ["Tuning"]
