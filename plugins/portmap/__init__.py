"""The ``portmap`` plugin: host ports forwarded to the container (DNAT) with
nftables, as a chained plugin.

A drop-in for the Go reference portmap (containernetworking/plugins,
plugins/meta/portmap) with its nftables backend: same config keys, same
executable name. The layout differs (see `cni_skel_plugins.portmap.layout`):
mappings live in nftables maps instead of one rule per mapping, so the cost of
a new connection does not grow with the number of pods. The plugin is
`PortMap` (in `.plugin`).
"""

from __future__ import annotations

from .plugin import PortMap

__all__ = ["PortMap"]
