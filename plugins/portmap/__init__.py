"""The ``portmap`` plugin: host ports forwarded to the container (DNAT) with
nftables, as a chained plugin.

A drop-in for the Go reference portmap (containernetworking/plugins,
plugins/meta/portmap) with its nftables backend: same config keys, same
executable name. The layout differs (see `cni_skel_plugins.portmap.layout`):
mappings live in nftables maps instead of one rule per mapping, so the cost of
a new connection does not grow with the number of pods. The module is light
on purpose; pydantic, libnftables and pyroute2 load in the verbs.
"""

from __future__ import annotations

from cni_skel.skel import Plugin

__all__ = ["PortMap", "main"]


class PortMap(Plugin):
    """portmap: ``runtimeConfig.portMappings`` DNATed to the container.

    Config: `cni_skel_plugins.portmap.config` (``portMappings``, ``snat``,
    ``masqAll``, ``backend``, ``conditionsV4``/``conditionsV6``).

    ADD (prevResult required, code 7 without): the first IPv4 and IPv6
    address of prevResult on CNI_IFNAME (Go's choice) get every mapping of
    their family, in one nftables transaction: DNAT for traffic to any local
    address of the node (prerouting and output hooks, ``fib daddr type
    local``), or to ``hostIP`` only; with ``snat`` (default true) hairpin
    traffic (the container to its own host port) and, for IPv4, traffic from
    127.0.0.0/8 are masqueraded (``route_localnet=1`` on the node interfaces
    of prevResult); ``masqAll`` masquerades mapped traffic from any source.
    (Hairpin through a Linux bridge with br_netfilter loaded also needs the
    bridge plugin's ``hairpinMode``, as with Go.)
    Stale UDP conntrack entries to the host ports are then deleted (failures
    logged, as Go). No mappings, or no address: prevResult passed through.
    Errors: 7 when a (hostIP, protocol, hostPort) is already mapped by
    another attachment, in any network (Go: last writer wins), or twice in
    the request to different container ports; 7/2 for config errors (see
    the config module); nothing is applied on any error.

    CHECK: every mapping of the container is present, tagged with this
    attachment and pointing at its address and port (999 otherwise; 7
    without prevResult). DEL: removes every entry tagged with this attachment
    (``containerID/ifname``), with or without portMappings and prevResult (Go
    does nothing without portMappings), in one transaction; nothing to remove
    commits nothing. ADD keeps a record of each attachment in the table, so
    CHECK and DEL read only their own elements: their cost does not grow
    with the number of pods. GC (1.1.0): removes this
    network's entries of attachments not in ``cni.dev/valid-attachments``
    (7 without the list), and this network's DNAT chains left empty by a
    change of conditions. STATUS (1.1.0): 50 when nftables can not be used.
    """

    name = "portmap"
    about = "CNI portmap plugin (cni-skel, nftables)"
    config_model = "cni_skel_plugins.portmap.config:PortMapConf"
    verbs = "cni_skel_plugins.portmap.verbs"


def main() -> None:
    """Executable entry point (``cni-skel install`` writes a script calling it)."""
    PortMap.main()


if __name__ == "__main__":
    main()
