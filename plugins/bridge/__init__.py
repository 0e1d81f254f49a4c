"""The ``bridge`` plugin: a veth pair from the container to a Linux bridge on
the node, addresses from the IPAM plugin, optional gateway, masquerade and
MAC spoof check (nftables).

A drop-in for the Go reference bridge (containernetworking/plugins,
plugins/main/bridge): same executable name, config keys, result shape and
error texts. The plugin is `Bridge` (in `.plugin`); its config is in
`.config`, its nftables layout in `.rules`.
"""

from __future__ import annotations

from .plugin import Bridge

__all__ = ["Bridge"]
