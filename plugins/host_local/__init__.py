"""The ``host-local`` IPAM plugin: addresses from configured ranges, recorded
in files on the node.

A drop-in for the Go reference host-local (containernetworking/plugins,
plugins/ipam/host-local): same config keys, same store layout and bytes, the
same lock file, so both implementations can share one ``dataDir``. The
plugin is `HostLocal` (in `.plugin`). It never imports pyroute2: an IPAM
plugin does no netlink.
"""

from __future__ import annotations

from .plugin import HostLocal

__all__ = ["HostLocal"]
