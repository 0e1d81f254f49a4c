"""CNI meta plugin ``sbr``: source-based routing inside the pod.

Chained after an interface plugin, for each of its addresses on
CNI_IFNAME a rule ``from <address> lookup <table>`` sends the pod's
traffic from that address through a table of its own, holding a default
route via the address's gateway and the interface's routes, moved there
from the main table (Go 1.1.1's sbr). With ``table`` set (Go >= 1.6) only
the rules are added, to that table, and the routes stay where they are.

What DEL puts back and what ADD refuses: docs/sbr.md. In short, DEL gives
the main table back the routes ADD moved out of it, and nothing else: the
default routes ADD made itself carry `ROUTE_PROTO` and are deleted, not
moved; ADD refuses (code 7, before any change) a prevResult address that
is not on CNI_IFNAME, and a prevResult with none on it.
"""

from __future__ import annotations

import fcntl
import ipaddress
from typing import Any

from pydantic import Field

from cni_skel import CmdArgs, CNIError, NetConf, Plugin, Result, netlink
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.types import IPConfig, check_expressible

__all__ = ["FIRST_TABLE", "ROUTE_PROTO", "Sbr", "SbrConf"]

#: Go's first candidate table: the first one from here with no rule and no
#: route in it is used, and the next free one for the next address.
FIRST_TABLE = 100
#: rtm_protocol of the default routes ADD makes in its tables (a value
#: /etc/iproute2/rt_protos leaves unnamed): what tells DEL they are sbr's own
#: and not routes it moved out of the main table. Go's sbr makes them proto
#: boot; after a Go ADD, our DEL cannot tell them apart and moves them back.
ROUTE_PROTO = 201
_UNICAST = 1  # RTN_UNICAST


class SbrConf(NetConf):
    """NetConf (cniVersion, name, prevResult, ...) plus ``table`` (Go >= 1.6:
    the routing table the rules look up, 1..2^32-1; the routes are then left
    alone). A bad value is code 7 naming it."""

    table: int | None = Field(None, ge=1, le=2**32 - 1)


def _ips_of(ifname: str, prev: Result) -> list[IPConfig]:
    """prevResult's IPs on ``ifname`` (an IP without an interface index, or
    with one out of range, counts as on it, as in Go's getIPCfgs).

    Raises:
        CNIError: 7 when none is (Go: 999 when prevResult has no IP at all,
            and nothing done when it has none on ``ifname``, after moving
            every main-table route of it).
    """
    out = []
    for ipc in prev.ips:
        idx = ipc.interface
        if idx is not None and 0 <= idx < len(prev.interfaces) \
                and prev.interfaces[idx].name != ifname:
            continue
        out.append(ipc)
    if not out:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f"No IP addresses supplied on interface: {ifname}",
                       f"prevResult has {len(prev.ips)} IP address(es), none on {ifname}"
                       if prev.ips else "")
    return out


def _link_holding(ipr: Any, ifname: str, ips: list[IPConfig]) -> netlink.Link:
    """CNI_IFNAME's link, once every address of ``ips`` is on it: a rule
    for an address the pod does not hold is one DEL never finds (it looks
    rules up by the interface's addresses).

    Raises:
        CNIError: 999 when the link is missing (Go's text); 7 naming the
            first address that is not on it.
    """
    link = netlink.find_link(ipr, ifname)
    if link is None:
        raise CNIError(ERR_INTERNAL,
                       f"Cannot find network interface {ifname}: Link not found")
    held = {a.ip for a in netlink.addresses(ipr, link)}
    for ipc in ips:
        if ipc.address.ip not in held:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"prevResult address {ipc.address} is not on interface {ifname}",
                           f"{ifname} holds: {', '.join(sorted(map(str, held))) or 'none'}")
    return link


def _lock(pod: NetNS) -> None:
    """flock the pod's namespace file, as Go's sbr does (its filemutex on
    CNI_NETNS): two sbr calls on one pod, Go's or ours, never interleave.
    Released when ``pod`` is closed."""
    fcntl.flock(pod.fd, fcntl.LOCK_EX)


def _free_table(used: set[int], candidate: int) -> int:
    while candidate in used:
        candidate += 1
    return candidate


def _host(ip: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(ip)  # a single address: /32 or /128


def _belongs(ipc: IPConfig, route: dict) -> bool:
    """Go's test for moving a route into an address's table: its source or
    gateway lies in the address's subnet, or it has neither (generic)."""
    net = ipc.address.network
    return any(a is not None and a.version == net.version and a in net
               for a in (route["src"], route["gw"])) \
        or (route["src"] is None and route["gw"] is None)


def _del_route(ipr: Any, link: netlink.Link, route: dict, table: int) -> None:
    netlink.del_route(ipr, route["dst"], gw=route["gw"], dev=link,
                      priority=route["priority"] or None, table=table)


class Sbr(Plugin):
    """sbr: ADD and DEL as Go's; CHECK looks for the rules (Go's passes
    without looking); GC and STATUS succeed (nothing is kept outside the
    pod's namespace)."""

    name = "sbr"
    config_model = SbrConf

    def add(self, args: CmdArgs, conf: SbrConf) -> Result:
        """Rules (and, without ``table``, per-address tables) for prevResult's
        IPs on CNI_IFNAME. Any failure undoes what this ADD did.

        Only the main-table routes ADD copied into at least one table
        leave the main table (Go deletes every route of the link there,
        those it copied nowhere included: IPv6 routes via a link-local
        gateway, non-unicast ones), so that DEL can put back exactly what
        was there.

        Returns:
            prevResult unchanged.

        Raises:
            CNIError: 7 without prevResult, with no IP on CNI_IFNAME in it,
                or with one that CNI_IFNAME does not hold; 999 when
                CNI_IFNAME is missing in the pod or the kernel refuses.
        """
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           "This plugin must be called as chained plugin")
        check_expressible(conf.cni_version, prev)
        ips = _ips_of(args.ifname, prev)
        with NetNS.open(args.netns) as pod, pod.rtnl() as ipr, rollback(self.name) as undo:
            _lock(pod)
            link = _link_holding(ipr, args.ifname, ips)
            if conf.table is not None:
                for ipc in ips:
                    self._rule(ipr, undo, ipc, conf.table)
                return prev
            every = netlink.routes(ipr, table=None)  # one dump: every table's
            used = {r.table for r in netlink.rules(ipr)} | {r["table"] for r in every}
            own = [r for r in every
                   if r["table"] == netlink.RT_TABLE_MAIN and r["oif"] == link.index]
            table = _free_table(used, FIRST_TABLE)
            copied = [False] * len(own)
            for ipc in ips:
                self._rule(ipr, undo, ipc, table)
                if ipc.gateway is not None:
                    default = "0.0.0.0/0" if ipc.address.version == 4 else "::/0"
                    netlink.add_route(ipr, default, gw=ipc.gateway, dev=link, table=table,
                                      proto=ROUTE_PROTO)
                    undo.callback(f"deleting table {table}'s default route",
                                  netlink.del_route, ipr, default, dev=link, table=table)
                for n, route in enumerate(own):
                    # Go copies every route of the link; only unicast ones can be re-added.
                    # A main-table default route via the gateway replaces ADD's own
                    # (same key): it is then the main table's, and goes back on DEL.
                    if route["type"] == _UNICAST and _belongs(ipc, route):
                        netlink.add_listed_route(ipr, route, link, table=table)
                        undo.callback(f"deleting {route['dst']} from table {table}",
                                      _del_route, ipr, link, route, table)
                        copied[n] = True
                used.add(table)
                table = _free_table(used, table + 1)
            # Deleted only once every table has its copies: two addresses of
            # one subnet need the main table's routes for their gateways.
            for route in (r for r, moved in zip(own, copied, strict=True) if moved):
                _del_route(ipr, link, route, netlink.RT_TABLE_MAIN)
                undo.callback(f"putting {route['dst']} back in the main table",
                              netlink.add_listed_route, ipr, route, link)
        return prev

    @staticmethod
    def _rule(ipr: Any, undo: Any, ipc: IPConfig, table: int) -> None:
        src = _host(ipc.address.ip)
        netlink.add_rule(ipr, table, src=src)
        undo.callback(f"deleting the rule from {src}", _del_rules, ipr, src, table)

    def delete(self, args: CmdArgs, conf: SbrConf) -> None:
        """Remove the rules whose source is an address of CNI_IFNAME (only
        those looking up ``table`` when it is set); without ``table``, the
        routes through CNI_IFNAME in the tables those rules looked up go
        back to the main table (what ADD moved; Go's DEL leaves them in the
        tables and the main table without them), except the default routes
        ADD made (proto `ROUTE_PROTO`), which are deleted. Succeeds when the
        namespace is gone (nothing left to tidy); when the interface is gone
        (its routes went with it), the rules whose source is one of
        prevResult's addresses go (Go's DEL leaves them).

        Raises:
            CNIError: 999 naming the last rule or route the kernel would not
                delete or put back.
        """
        pod = open_netns(args.netns, missing_ok=True)
        if pod is None:
            return
        with pod, pod.rtnl() as ipr:
            _lock(pod)
            link = netlink.find_link(ipr, args.ifname)
            if link is not None:
                mine = {a.ip for a in netlink.addresses(ipr, link)}
            else:  # the interface went, its addresses with it: prevResult names them
                try:
                    ips = _ips_of(args.ifname, conf.prev_result) if conf.prev_result else []
                except CNIError:
                    ips = []
                mine = {ipc.address.ip for ipc in ips}
                if not mine:
                    return
            failed: CNIError | None = None
            tables = set()
            for rule in netlink.rules(ipr, table=conf.table):
                if rule.src is not None and rule.src.network_address in mine:
                    try:
                        netlink.del_rule(ipr, rule)
                        tables.add(rule.table)
                    except CNIError as exc:  # as Go: go on, answer the last failure
                        failed = exc
            if conf.table is None and link is not None:
                failed = _move_back(ipr, link, tables) or failed
            if failed is not None:
                raise failed

    def check(self, args: CmdArgs, conf: SbrConf) -> None:
        """Each of prevResult's IPs on CNI_IFNAME has its rule (into
        ``table`` when set) and, without ``table``, a rule's table with a
        gateway holds the default route. Go's CHECK passes without looking.

        Raises:
            CNIError: 7 without prevResult; 999 naming the missing rule or
                route.
        """
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "sbr: Required prevResult missing")
        with NetNS.open(args.netns) as pod, pod.rtnl() as ipr:
            rules = netlink.rules(ipr, table=conf.table)
            for ipc in _ips_of(args.ifname, prev):
                src = _host(ipc.address.ip)
                tables = [r.table for r in rules if r.src == src]
                if not tables:
                    raise CNIError(ERR_INTERNAL, f"sbr: no rule from {src.network_address}"
                                                 + (f" into table {conf.table}" if conf.table
                                                    else ""))
                if conf.table is None and ipc.gateway is not None and not any(
                        r["dst"].prefixlen == 0 and r["gw"] == ipc.gateway
                        for t in tables for r in netlink.routes(ipr, table=t)):
                    raise CNIError(ERR_INTERNAL, f"sbr: table {tables[0]} has no default "
                                                 f"route via {ipc.gateway}")


def _move_back(ipr: Any, link: netlink.Link, tables: set[int]) -> CNIError | None:
    """Routes through ``link`` in ``tables`` go back to the main table,
    where a route of the same destination and metric does not keep them
    out, and leave ``tables``; ADD's own default routes (`ROUTE_PROTO`)
    only leave. The last failure, if any."""
    failed = None
    for table in sorted(tables - {netlink.RT_TABLE_MAIN, netlink.RT_TABLE_LOCAL}):
        # on-link routes first: they make the gateways reachable
        for route in sorted(netlink.routes(ipr, table=table), key=lambda r: r["gw"] is not None):
            if route["oif"] != link.index:
                continue
            try:
                if route["type"] == _UNICAST and route["proto"] != ROUTE_PROTO:
                    netlink.add_listed_route(ipr, route, link, replace=False)
                _del_route(ipr, link, route, table)
            except CNIError as exc:
                failed = exc
    return failed


def _del_rules(ipr: Any, src: Any, table: int) -> None:
    for rule in netlink.rules(ipr, table=table):
        if rule.src == src:
            netlink.del_rule(ipr, rule)
