"""The ``bridge`` plugin: a veth pair from the container to a Linux bridge on
the node, addresses from the IPAM plugin, optional gateway, masquerade and
MAC spoof check (nftables).

A drop-in for the Go reference bridge (containernetworking/plugins,
plugins/main/bridge): same executable name, config keys, result shape and
error texts. The module is light on purpose (the skel and this class);
pyroute2 and libnftables load in the verbs, never for VERSION.
"""

from __future__ import annotations

from cni_skel.skel import Plugin

__all__ = ["Bridge"]


class Bridge(Plugin):
    """bridge: attach the container to a Linux bridge through a veth pair.

    Config: `cni_skel_plugins.bridge.config.BridgeConf`. CNI_ARGS: ``MAC``
    (and the K8S_* keys kubelet sends).

    ADD: create (or reuse) the bridge and bring it up (an existing link of
    that name that is not a bridge: 999 ``"<name>" already exists but is not a
    bridge``); create the veth pair, host end ``veth<8 hex>`` on the bridge
    (hairpin, isolation, VLANs), container end CNI_IFNAME created directly in
    the container netns with the MTU and MAC (999 when that name is taken
    there); IPAM ADD; container sysctls (accept_dad off unless ``enabledad``,
    arp_notify), addresses and routes; with ``isGateway`` the gateway
    addresses on the bridge (``forceAddress``: replace a different one, else
    999) and forwarding on; with ``isDefaultGateway`` a default route per
    family. ``ipMasq`` and ``macspoofchk`` add this attachment's entries to
    shared nftables sets (`cni_skel_plugins.bridge.rules`) in one
    transaction. Any failure undoes what was created, IPAM DEL included.
    Result: interfaces [bridge, host veth, container (sandbox)] (+ the VLAN
    gateway interface), ``ips`` with ``interface: 2``, routes, dns (the
    config's ``dns`` wins when set), in the config's version. Without
    ``ipam`` at 0.1.0/0.2.0 (no IP, which those results cannot carry): code
    1 before anything is created (Go creates the veth, then fails).

    DEL: the container interface (when the netns and it exist), IPAM DEL
    (always), this attachment's nftables entries found by its tag (so it
    works with an empty CNI_NETNS and no prevResult; upstream leaks its
    masquerade rules there). Never deletes the bridge. Repeatable.

    CHECK (0.4.0+): IPAM CHECK, then as upstream: bridge present with
    prevResult's MAC and the configured promiscuity, container veth with
    prevResult's MAC, IPs and routes, host veth its peer on the bridge, and
    the nftables entries present. 7 without prevResult.

    GC (1.1.0): IPAM GC, then nftables entries of attachments not in
    ``cni.dev/valid-attachments``. STATUS (1.1.0): IPAM STATUS; 50 when
    nftables is needed (ipMasq/macspoofchk) and not usable.
    """

    name = "bridge"
    about = "CNI bridge plugin (cni-skel)"
    config_model = "cni_skel_plugins.bridge.config:BridgeConf"
    args_model = "cni_skel_plugins.bridge.config:BridgeArgs"
    verbs = "cni_skel_plugins.bridge.verbs"
