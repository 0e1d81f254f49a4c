"""The ``bandwidth`` meta plugin: rate limits on a pod's traffic with token
bucket filters on the node's end of its veth (containernetworking/plugins,
plugins/meta/bandwidth).

Same executable name, config keys and ifb names as Go's; the plugin is
`Bandwidth` (in `.plugin`).
"""

from __future__ import annotations

from .plugin import IFB_PREFIX, Bandwidth, BandwidthConf, BandwidthEntry, ifb_name

__all__ = ["IFB_PREFIX", "Bandwidth", "BandwidthConf", "BandwidthEntry", "ifb_name"]
