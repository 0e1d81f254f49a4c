"""The ``vrf`` meta plugin: puts the pod's interface in a VRF
(containernetworking/plugins, plugins/meta/vrf). Same executable name and
config keys as Go's; the plugin is `Vrf` (in `.plugin`).
"""

from __future__ import annotations

from .plugin import Vrf, VrfConf

__all__ = ["Vrf", "VrfConf"]
