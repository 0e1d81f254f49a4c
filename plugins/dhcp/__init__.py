"""The ``dhcp`` IPAM plugin: the pod's address from the LAN's DHCP server,
leased for as long as the pod lives, with no daemon of its own.

A drop-in for Go's plugins/ipam/dhcp (containernetworking/plugins 1.1.1):
same executable name, config keys (`.config`), client ID and result. Go's
plugin is a client of ``dhcp daemon``, a second long-running process with
its own unit and socket (``daemonSocketPath``); ours keeps the leases in
the cni-skel worker's keeper (`.leases.Leases`, a `cni_skel.keeper.Service`),
so the worker that already serves the plugins is the only daemon. Run
one-shot, without a worker, every verb but VERSION answers code 11 naming
the worker's socket (Go fails the same way without its daemon).
"""

from __future__ import annotations

import ipaddress
import sys
from typing import Any

from cni_skel import keeper, netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_PLUGIN_NOT_AVAILABLE,
    CNIError,
)
from cni_skel.netns import NetNS
from cni_skel.skel import Plugin
from cni_skel.types import DNS, IPConfig, Result, Route, check_expressible

from .config import DhcpConf, DhcpIPAM, provided_options, requested_options

__all__ = ["Dhcp", "lease_result"]

SERVICE = "dhcp"
_SLACK = 10.0  # seconds a call waits beyond the lease timeout (the keeper's own)
_RT_SCOPE_LINK = 253  # a route on the link, no next hop


def _classless_routes(data: list[int]) -> list[Route]:
    """Option 121 (RFC 3442): width, the significant octets, the gateway;
    none at all for a malformed option (Go's parseCIDRRoutes). A route
    whose gateway is 0.0.0.0 (on-link, RFC 3442 section 4) gets scope link
    (253) and keeps ``gw`` 0.0.0.0, as Go >= 1.8.0 answers: the kernel
    then holds it as a route on the link (a gateway behind it resolves
    through it), not as a universe route without a next hop."""
    routes, i = [], 0
    while len(data) - i >= 5:
        width = data[i]
        if width > 32:
            return []
        octets = (width + 7) // 8
        if len(data) - i < 1 + octets + 4:
            return []
        dst = bytes(data[i + 1:i + 1 + octets]).ljust(4, b"\0")
        gw = bytes(data[i + 1 + octets:i + 5 + octets])
        router = ipaddress.IPv4Address(gw)
        routes.append(Route(dst=ipaddress.IPv4Interface((dst, width)), gw=router,
                            scope=_RT_SCOPE_LINK if router.is_unspecified else None))
        i += 5 + octets
    return routes


def _static_routes(data: list[int]) -> list[Route]:
    """Option 33: destination and router pairs, the destination's classful
    mask (Go's parseRoutes)."""
    routes = []
    for i in range(0, len(data) - len(data) % 8, 8):
        dst = ipaddress.IPv4Address(bytes(data[i:i + 4]))
        first = data[i]
        width = 8 if first < 128 else 16 if first < 192 else 24 if first < 224 else 32
        routes.append(Route(dst=ipaddress.IPv4Interface((dst, width)),
                            gw=ipaddress.IPv4Address(bytes(data[i + 4:i + 8]))))
    return routes


def _search_list(data: list[int]) -> list[str]:
    """Option 119 (RFC 3397): DNS names in wire form, with compression
    pointers into the option; what does not decode ends the list."""
    names: list[str] = []
    i = 0
    while i < len(data):
        labels: list[str] = []
        pos, end, hops = i, None, 0
        while pos < len(data) and data[pos] != 0:
            size = data[pos]
            if size & 0xC0 == 0xC0:  # pointer: the name goes on elsewhere
                if pos + 1 >= len(data) or hops > len(data):
                    return names
                end = pos + 2 if end is None else end
                pos, hops = ((size & 0x3F) << 8) | data[pos + 1], hops + 1
                continue
            labels.append(bytes(data[pos + 1:pos + 1 + size]).decode("ascii", "replace"))
            pos += 1 + size
        if pos >= len(data):
            return names
        i = end if end is not None else pos + 1
        names.append(".".join(labels))
    return names


def lease_result(ack: dict[str, Any], cni_version: str, priority: int = 0) -> Result:
    """The IPAM result of a lease (the server's ACK as pyroute2 decodes it):
    ``ips`` the offered address with the subnet mask's prefix and the first
    router as gateway; ``routes`` option 121's when it has any, else option
    33's and a default route via the gateway (Go's Routes), each with metric
    ``priority`` when not 0; ``dns`` from options 6 (nameservers), 15
    (domain) and 119 (search) when the server sent them (Go 1.1.1 has none).

    Raises:
        CNIError: 999 for an ACK without a subnet mask (Go's text).
    """
    options = ack.get("options") or {}
    mask = options.get("subnet_mask")
    if not mask:
        raise CNIError(ERR_INTERNAL, "DHCP option Subnet Mask not found in DHCPACK")
    address = ipaddress.IPv4Interface(f"{ack['yiaddr']}/{mask}")
    routers = options.get("router") or []
    gateway = ipaddress.IPv4Address(routers[0]) if routers else None
    routes = _classless_routes(options.get("classless_static_route") or [])
    if not routes:
        routes = _static_routes(options.get("static_route") or [])
        if gateway is not None:
            routes.append(Route(dst=ipaddress.IPv4Interface("0.0.0.0/0"), gw=gateway))
    for route in routes:
        route.priority = priority or None
    dns = None
    search = _search_list(options.get("domain_search") or [])
    if options.get("name_server") or options.get("domain_name") or search:
        dns = DNS(nameservers=list(options.get("name_server") or []),
                  domain=options.get("domain_name") or None, search=search)
    result = Result(cni_version=cni_version,
                    ips=[IPConfig(address=address, gateway=gateway)], routes=routes)
    if dns is not None:
        result.dns = dns
    return result


class Dhcp(Plugin):
    """dhcp: ADD leases an address on CNI_IFNAME in the pod (the interface
    the main plugin made; brought up first, as Go's daemon does) and answers
    it (`lease_result`); the lease is renewed in the worker until DEL
    releases it. CHECK passes while the worker holds the attachment's lease
    (Go's CHECK leases again). GC releases the leases of this network not in
    ``cni.dev/valid-attachments``; STATUS is 50 without a worker.

    Errors: 7 for a missing ``ipam`` or a bad option (naming it), 11 when no
    lease comes within ``ipam.timeout`` (no server, a NAK each time) or
    without a worker, 3 for CHECK of an attachment with no lease, 8 for a
    namespace that is not one, 999 for an ACK without subnet mask.
    """

    name = "dhcp"
    config_model = DhcpConf
    service = "cni_skel_plugins.dhcp.leases:Leases"

    @staticmethod
    def _ipam(conf: DhcpConf) -> DhcpIPAM:
        if conf.ipam is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "invalid network config: ipam: "
                           "required key is missing")
        return conf.ipam

    @staticmethod
    def _attachment(args: CmdArgs, conf: DhcpConf) -> dict[str, str]:
        return {"containerID": args.container_id, "network": conf.name, "ifname": args.ifname}

    def validate_config(self, args: CmdArgs, conf: DhcpConf) -> None:
        """ADD's config checks: ``ipam`` and its options."""
        ipam = self._ipam(conf)
        requested_options(ipam)
        provided_options(ipam, args.args)

    def add(self, args: CmdArgs, conf: DhcpConf) -> Result:
        """Lease an address (see `Dhcp`); the result in the config's version."""
        ipam = self._ipam(conf)
        request = requested_options(ipam)
        provide = provided_options(ipam, args.args)
        check_expressible(conf.cni_version, has_ip=True)
        if ipam.daemon_socket_path:
            print(f"dhcp: ipam.daemonSocketPath {ipam.daemon_socket_path!r} is not used: the "
                  "cni-skel worker keeps the leases (no dhcp daemon needed)", file=sys.stderr)
        if not keeper.in_worker():  # before the link goes up: nothing done
            raise keeper.not_in_worker(SERVICE)
        with NetNS.open(args.netns) as pod:
            with pod.rtnl() as ipr:
                try:
                    netlink.link_up(ipr, args.ifname)
                except netlink.LinkNotFound as exc:
                    raise CNIError(ERR_INTERNAL, f'error looking up "{args.ifname}": '
                                                 "Link not found") from exc
            answer = keeper.call(SERVICE, {
                "op": "acquire", **self._attachment(args, conf), "netns": args.netns,
                "request": request, "provide": {str(k): v.hex() for k, v in provide.items()},
                "timeout": ipam.timeout}, fds=[pod.fd], timeout=ipam.timeout + _SLACK)
        try:
            return lease_result(answer["lease"]["ack"], conf.cni_version, ipam.priority)
        except CNIError:  # a lease no result can be made of is not kept (Go stops it too)
            keeper.call(SERVICE, {"op": "release", **self._attachment(args, conf)})
            raise

    def check(self, args: CmdArgs, conf: DhcpConf) -> None:
        """The worker holds a lease for the attachment (code 3 if not), and
        its address is prevResult's, when there is one (999 if not: the
        server gave the pod another address since, after a NAK)."""
        self._ipam(conf)
        answer = keeper.call(SERVICE, {"op": "check", **self._attachment(args, conf)})
        address = answer["lease"]["ack"].get("yiaddr")
        prev = conf.prev_result
        if prev is not None and prev.ips and all(str(ip.address.ip) != address
                                                 for ip in prev.ips):
            raise CNIError(ERR_INTERNAL, f"dhcp: the lease of {args.ifname} is for {address}, "
                           f"not an address of prevResult "
                           f"({', '.join(str(ip.address) for ip in prev.ips)})",
                           "the server gave another address (a NAK, an expiry): "
                           "delete and add the attachment again")

    def delete(self, args: CmdArgs, conf: DhcpConf) -> None:
        """Release the attachment's lease (RELEASE to the server); nothing
        held is no error."""
        keeper.call(SERVICE, {"op": "release", **self._attachment(args, conf)})

    def gc(self, args: CmdArgs, conf: DhcpConf) -> None:
        """Release this network's leases of attachments not kept."""
        keep = [[a.container_id, a.ifname] for a in conf.gc_keep()]
        keeper.call(SERVICE, {"op": "gc", "network": conf.name, "keep": keep})

    def status(self, args: CmdArgs, conf: DhcpConf) -> None:
        """Ready when a worker's keeper holds the leases (50 otherwise)."""
        if not keeper.in_worker():
            raise CNIError(ERR_PLUGIN_NOT_AVAILABLE, "dhcp: needs the cni-skel worker, which "
                           "holds the leases, and the plugin ran without it")

