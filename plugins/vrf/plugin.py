"""CNI meta plugin ``vrf``: the interface an earlier plugin made joins a
VRF in the pod (created on first use), keeping its addresses and routes.

Go's vrf: ``vrfname`` names the VRF, ``table`` its routing table (0 or
absent: the lowest table no VRF of the pod uses, from 1). Several
interfaces may share one VRF; the last DEL removes it. Enslaving makes the
kernel drop the interface's IPv6 addresses and its routes from the main
table: the global IPv6 addresses are put back and the routes re-added in
the VRF's table, as Go's plugin does since 1.2 (here every route but the
kernel's own, scope-link ones too).
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from typing import Any

from pydantic import Field

from cni_skel import CmdArgs, CNIError, NetConf, Plugin, Result, netlink
from cni_skel.config import IfName
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG
from cni_skel.ipam import settle_addresses
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.types import check_expressible
from cni_skel.version import ALL_VERSIONS

__all__ = ["Vrf", "VrfConf"]

#: How long a put-back IPv6 address may take to get its local route in the
#: VRF's table (Go's back-off: 10 ms doubling, 8 retries).
ROUTE_WAIT = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
#: Seconds the interface's IPv6 addresses may stay tentative after joining.
SETTLE_TIMEOUT = 10.0
_RTN_UNICAST = 1
_RTPROT_KERNEL = 2  # routes the kernel made for an address


class VrfConf(NetConf):
    """NetConf plus ``vrfname`` (required, an interface name) and ``table``
    (0..2^32-1, 0: pick one). A bad value is code 7 naming it."""

    vrfname: IfName | None = None
    table: int = Field(0, ge=0, le=2**32 - 1)


def _global_v6(ipr: Any, link: netlink.Link) -> list[tuple[Any, int]]:
    return [(a, flags) for a, flags in netlink.address_flags(ipr, link, 6)
            if not a.ip.is_link_local]


def _find_vrf(ipr: Any, name: str) -> netlink.Link | None:
    link = netlink.find_link(ipr, name)
    if link is not None and link.kind != "vrf":
        raise CNIError(ERR_INTERNAL, f"Netlink {name} is not a VRF")
    return link


def _free_table(ipr: Any) -> int:
    used = {v.vrf_table for v in netlink.links(ipr, "vrf")}
    table = 1
    while table in used:
        table += 1
    return table


def _wait_local_route(ipr: Any, link: netlink.Link, ip: Any, table: int) -> None:
    for delay in (0.0, *ROUTE_WAIT):
        time.sleep(delay)
        if any(r["dst"] == ipaddress.ip_network(ip) and r["oif"] == link.index
               for r in netlink.routes(ipr, 6, table=table)):
            return
    raise CNIError(ERR_INTERNAL, f"failed getting local/host addresses for {link.name} in "
                                 f"table {table} with dst {ip}")


class Vrf(Plugin):
    """vrf: ADD, DEL as Go's; CHECK looks (Go's passes whatever it finds);
    GC and STATUS succeed (nothing outside the pod)."""

    name = "vrf"
    config_model = VrfConf
    supported_versions = tuple(v for v in ALL_VERSIONS if v not in ("0.1.0", "0.2.0"))

    def validate_config(self, args: CmdArgs, conf: VrfConf) -> None:
        if not conf.vrfname:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           "configuration is expected to have a valid vrf name")

    def add(self, args: CmdArgs, conf: VrfConf) -> Result:
        """Find or create the VRF, enslave CNI_IFNAME, put back its global
        IPv6 addresses and its routes (in the VRF's table). A failure undoes
        it all (the interface released, its addresses and routes back, a VRF
        this ADD made deleted).

        Returns:
            prevResult unchanged.

        Raises:
            CNIError: 7 for a bad or missing ``vrfname`` or no prevResult;
                999 when the name is another kind of link, the VRF exists
                with another table, CNI_IFNAME is missing or already has a
                master, or the kernel refuses.
        """
        self.validate_config(args, conf)
        if conf.prev_result is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "missing prevResult from earlier plugin")
        check_expressible(conf.cni_version, conf.prev_result)
        with NetNS.open(args.netns) as pod, pod.rtnl() as ipr, rollback(self.name) as undo:
            vrf = _find_vrf(ipr, conf.vrfname)
            if vrf is not None and conf.table and vrf.vrf_table != conf.table:
                raise CNIError(ERR_INTERNAL, f"VRF {conf.vrfname} already exist with "
                                             f"different routing table {vrf.vrf_table}")
            if vrf is None:
                vrf = netlink.create_vrf(ipr, conf.vrfname, conf.table or _free_table(ipr))
                undo.callback(f"deleting VRF {conf.vrfname}", netlink.delete_link, ipr, vrf)
                netlink.link_up(ipr, vrf)
            self._join(ipr, undo, vrf, args.ifname)
        return conf.prev_result

    @staticmethod
    def _join(ipr: Any, undo: Any, vrf: netlink.Link, ifname: str) -> None:
        link = netlink.find_link(ipr, ifname)
        if link is None:
            raise CNIError(ERR_INTERNAL, f"could not get link by name {ifname}")
        if link.master is not None:
            master = netlink.find_link(ipr, link.master)
            raise CNIError(ERR_INTERNAL, f"interface {ifname} has already a master set: "
                                         f"{master.name if master else link.master}")
        before = _global_v6(ipr, link)
        routes = _own_routes(ipr, link, netlink.RT_TABLE_MAIN)
        netlink.link_set(ipr, link, master=vrf)
        undo.callback(f"releasing {ifname} from {vrf.name}", _release, ipr, link, before,
                      routes)
        after = {a for a, _ in _global_v6(ipr, link)}
        for addr, _flags in before:
            if addr not in after:
                # Without a second DAD (it passed on this link already): a
                # tentative address cannot be a route's source yet.
                netlink.add_address(ipr, link, addr, nodad=True)
                _wait_local_route(ipr, link, addr.ip, vrf.vrf_table)
        # Joining cycles the link: the IPv6 addresses it kept run DAD again,
        # and a tentative one cannot be a route's source (Go's ptp settles
        # them the same way).
        settle_addresses(ipr, link, SETTLE_TIMEOUT)
        for r in routes:
            netlink.add_listed_route(ipr, r, link, table=vrf.vrf_table)

    def delete(self, args: CmdArgs, conf: VrfConf) -> None:
        """Release CNI_IFNAME from the VRF with its global IPv6 addresses and
        its routes put back in the main table (what leaving drops; Go's DEL
        leaves them dropped), and delete the VRF when no interface is left
        in it. Succeeds when the namespace, the VRF or the interface is
        gone.

        Raises:
            CNIError: 7 for a bad ``vrfname``; 999 when the kernel refuses.
        """
        self.validate_config(args, conf)
        pod = open_netns(args.netns, missing_ok=True)
        if pod is None:
            return
        with pod, pod.rtnl() as ipr:
            vrf = _find_vrf(ipr, conf.vrfname)
            if vrf is None:
                return
            link = netlink.find_link(ipr, args.ifname)
            if link is not None and link.master == vrf.index:
                addrs = _global_v6(ipr, link)
                routes = _own_routes(ipr, link, vrf.vrf_table)
                _release(ipr, link, addrs, routes)
            if not any(lk.master == vrf.index for lk in netlink.links(ipr)):
                netlink.delete_link(ipr, vrf)

    def check(self, args: CmdArgs, conf: VrfConf) -> None:
        """The VRF exists and CNI_IFNAME is in it (and, with ``table``, the
        VRF's table is that one).

        Raises:
            CNIError: 7 without prevResult; 999 naming what differs.
        """
        self.validate_config(args, conf)
        if conf.prev_result is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "missing prevResult from earlier plugin")
        with NetNS.open(args.netns) as pod, pod.rtnl() as ipr:
            vrf = _find_vrf(ipr, conf.vrfname)
            link = netlink.find_link(ipr, args.ifname)
            if vrf is None or link is None or link.master != vrf.index:
                raise CNIError(ERR_INTERNAL, f"Failed to find {args.ifname} associated to vrf "
                                             f"{conf.vrfname}")
            if conf.table and vrf.vrf_table != conf.table:
                raise CNIError(ERR_INTERNAL, f"VRF {conf.vrfname} has routing table "
                                             f"{vrf.vrf_table}, not {conf.table}")


def _own_routes(ipr: Any, link: netlink.Link, table: int) -> list[dict]:
    """The routes through ``link`` in ``table`` but the kernel's own
    (connected, local), on-link ones first: they make the gateways
    reachable (ptp's gateway is a scope-link /32; Go >= 1.2 copies
    universe-scope routes only, which fails after ptp)."""
    return sorted((r for r in netlink.routes(ipr, table=table)
                   if r["oif"] == link.index and r["proto"] != _RTPROT_KERNEL
                   and r["type"] == _RTN_UNICAST),
                  key=lambda r: r["gw"] is not None)


def _release(ipr: Any, link: netlink.Link, addrs: list[tuple[Any, int]],
             routes: list[dict]) -> None:
    """The interface out of the VRF (DEL, and the undo of `Vrf._join`),
    its global IPv6 addresses and ``routes`` back in the main table: the
    kernel drops them again on release (Go's DEL leaves the interface
    without them)."""
    netlink.link_set(ipr, link, master=0)
    have = {a for a, _ in _global_v6(ipr, link)}
    for addr, _flags in addrs:
        if addr not in have:  # without a second DAD, as on joining
            netlink.add_address(ipr, link, addr, nodad=True)
    with contextlib.suppress(CNIError):  # a route refused below says enough
        settle_addresses(ipr, link, SETTLE_TIMEOUT)
    for r in routes:  # on-link ones first
        netlink.add_listed_route(ipr, r, link)
