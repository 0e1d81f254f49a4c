"""The ``ptp`` plugin: a veth pair from the pod to the node, routed through a
gateway address on the node's end (no bridge), optional masquerade (nftables).

A drop-in for the Go reference ptp (containernetworking/plugins,
plugins/main/ptp): same executable name, config keys and result shape. The
plugin is `Ptp` (in `.plugin`, written on cni-skel's public API only: the
same file, byte for byte, is the one docs/tutorial.md writes).
"""

from __future__ import annotations

from .plugin import Ptp, PtpConf

__all__ = ["Ptp", "PtpConf"]
