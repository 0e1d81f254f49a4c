"""The ``firewall`` meta plugin: lets pods' traffic through the node's
packet filter: iptables (Go's chains, pods in ipsets), nftables drop
chains, or firewalld zones (containernetworking/plugins,
plugins/meta/firewall).

Same executable name, config keys, chains and firewalld calls as Go's;
the plugin is `Firewall` (in `.plugin`).
"""

from __future__ import annotations

from .plugin import FIREWALLD_MAX_ADDRESSES, Firewall, FirewallConf, owner

__all__ = ["FIREWALLD_MAX_ADDRESSES", "Firewall", "FirewallConf", "owner"]
