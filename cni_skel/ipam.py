"""Apply an IPAM result to an interface, and check one against the kernel.

What an interface plugin does with the result of its IPAM delegate (see
`cni_skel.ipam_add`): put the addresses on the container
interface, bring it up, add the routes; and for CHECK, verify that the
kernel still holds them.

Source: Go ``pkg/ipam.ConfigureIface`` and ``pkg/ip.ValidateExpectedInterfaceIPs``
/ ``ValidateExpectedRoute`` (containernetworking/plugins), whose behaviour
these mirror, including the error texts where a user might search for them.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from . import netlink
from .errors import ERR_INTERNAL, CNIError
from .sysctl import read_sysctl, write_sysctl

if TYPE_CHECKING:  # pragma: no cover
    from .netlink import Link
    from .netns import NetNS
    from .types import IPConfig, Result, Route

__all__ = ["check_interface_ips", "check_routes", "configure_iface", "settle_addresses"]

IFA_F_TENTATIVE = 0x40
IFA_F_DADFAILED = 0x08
DAD_SETTLE_TIMEOUT = 5.0  # seconds, as Go's ConfigureIface


def configure_iface(netns: NetNS, ifname: str | Link, result: Result, *,
                    ipr: Any = None, wait_dad: bool = True) -> None:
    """Configure ``ifname`` inside ``netns`` from ``result``.

    ``ifname``: the interface's name, or its `cni_skel.netlink.Link` (read
    in ``netns``; no look-up then). ``ipr``: a netlink socket bound to
    ``netns`` to use (`cni_skel.netns.NetNS.rtnl`); one is opened when None.
    ``wait_dad``: False skips the wait for IPv6 DAD below, for a link whose
    DAD cannot run yet: a tap nobody has attached to has no carrier, and its
    addresses stay tentative until one does (Go 1.9.1 waits the 5 s, then
    goes on because the link is not operationally up).

    ``result`` must be about ``ifname`` alone: every entry of ``result.ips``
    with an ``interface`` index must index an entry of ``result.interfaces``
    named ``ifname``; entries without an index are skipped. The result is
    checked whole before anything changes: when it is refused, the link,
    its addresses, routes and sysctls are as they were. (Go checks each
    entry as it goes and may refuse after adding earlier addresses.) To
    configure several interfaces from one result, give each its own
    ``Result`` holding its entries.

    Then, in order: add each address; for the first IPv6 one, enable IPv6 on
    ``lo`` and ``ifname`` (disable_ipv6=0) and keep_addr_on_down=1. Bring
    the link up, wait (at most 5 s) for IPv6 duplicate address detection
    when there is an IPv6 gateway, and add ``result.routes`` through
    ``ifname``; a route without ``gw`` goes via the first gateway of its
    family. Idempotent for addresses and routes that already exist. A kernel
    error part-way leaves what was done before it (undo it with the link,
    e.g. on `cni_skel.rollback`).

    Raises:
        CNIError: 999 ``failed to add IP addr <address> to "<ifname>":
            invalid interface index`` for the first entry whose index points
            at another interface or out of range (Go's text), before any
            change; 999 ``LinkNotFound`` when ``ifname`` is not in
            ``netns``; 999 for kernel errors (naming the address or route);
            3 when the namespace is gone.

    Source: Go ``pkg/ipam.ConfigureIface`` (containernetworking/plugins,
    ipam_linux.go).
    """
    with contextlib.ExitStack() as stack:
        if ipr is None:
            ipr = stack.enter_context(netns.rtnl())
        stack.enter_context(netns.enter())
        _configure(ipr, ifname, result, wait_dad)


def _configure(ipr: Any, link: str | Link, result: Result, wait_dad: bool = True) -> None:
    """`configure_iface`'s work, inside the namespace."""
    ifname = link if isinstance(link, str) else link.name
    index = netlink.link_index(ipr, link)  # a look-up: changes nothing
    ips = _own_ips(result, ifname)  # refuse before the first change, not part-way
    gw4 = gw6 = None
    ipv6_ready = False
    for ipc in ips:
        if ipc.address.version == 6 and not ipv6_ready:
            _enable_ipv6(ifname)
            ipv6_ready = True
        netlink.add_address(ipr, index, ipc.address)
        if ipc.gateway is not None:
            if ipc.gateway.version == 4 and gw4 is None:
                gw4 = ipc.gateway
            elif ipc.gateway.version == 6 and gw6 is None:
                gw6 = ipc.gateway
    netlink.link_up(ipr, index)
    if gw6 is not None and wait_dad:
        settle_addresses(ipr, index, DAD_SETTLE_TIMEOUT)
    for route in result.routes:
        dst = route.dst.network
        gw = route.gw if route.gw is not None else (gw4 if dst.version == 4 else gw6)
        netlink.add_route(ipr, dst, gw=gw, dev=index, priority=route.priority or None,
                          table=route.table, scope=route.scope, mtu=route.mtu or None,
                          advmss=route.advmss or None)


def _own_ips(result: Result, ifname: str) -> list[IPConfig]:
    """The entries of ``result.ips`` to add to ``ifname``; 999 for the first
    whose index names another interface or none."""
    ips = []
    for ipc in result.ips:
        if ipc.interface is None:
            continue
        i = ipc.interface
        if i < 0 or i >= len(result.interfaces) or result.interfaces[i].name != ifname:
            raise CNIError(ERR_INTERNAL, f'failed to add IP addr {ipc.address} to '
                                         f'"{ifname}": invalid interface index')
        ips.append(ipc)
    return ips


def _enable_ipv6(ifname: str) -> None:
    # Runs inside the target namespace: /proc/sys/net follows the thread's netns.
    for dev in ("lo", ifname):
        key = f"net/ipv6/conf/{dev}/disable_ipv6"
        try:
            if read_sysctl(key) != "0":
                write_sysctl(key, "0")
        except CNIError:
            # IPv6 disabled at boot has no such file: adding the address will
            # fail with a clear error below.
            continue
    with contextlib.suppress(CNIError):
        write_sysctl(f"net/ipv6/conf/{ifname}/keep_addr_on_down", "1")


def settle_addresses(ipr: Any, link: str | int | Link, timeout: float) -> None:
    """Wait until no IPv6 address of ``link`` is tentative (DAD running), at
    most ``timeout`` seconds.

    Raises:
        CNIError: 999 naming the link when addresses are still tentative, or
            when one failed DAD (a duplicate on the link).
    """
    deadline = time.monotonic() + timeout
    index = netlink.link_index(ipr, link)
    while True:
        tentative = [flags for _, flags in netlink.address_flags(ipr, index, 6)
                     if flags & IFA_F_TENTATIVE]
        if not tentative:
            return
        if any(flags & IFA_F_DADFAILED for flags in tentative):
            raise CNIError(ERR_INTERNAL, f'duplicate address detection failed on "{link}"')
        if time.monotonic() >= deadline:
            raise CNIError(ERR_INTERNAL, f'addresses of "{link}" still tentative after '
                                         f"{timeout:g} s")
        time.sleep(0.05)


def check_interface_ips(ipr: Any, ifname: str | Link, ips: list[IPConfig]) -> None:
    """Every address of ``ips`` is on ``ifname`` (a name or its `Link`) with
    its prefix length.

    Raises:
        CNIError: 999 naming the interface and the missing address.
    """
    present = {str(a) for a in netlink.addresses(ipr, ifname)}
    name = ifname if isinstance(ifname, str) else ifname.name
    for ipc in ips:
        if str(ipc.address) not in present:
            raise CNIError(ERR_INTERNAL, f'IP address {ipc.address} not found on "{name}"')


def check_routes(ipr: Any, routes: list[Route]) -> None:
    """Every route of ``routes`` is in the kernel's main table with the same
    destination and gateway (when one is given).

    Raises:
        CNIError: 999 naming the route that is missing.
    """
    # gateways by destination: a scan of the table per route was quadratic
    gws: dict[Any, set[Any]] = {}
    for r in netlink.routes(ipr):
        gws.setdefault(r["dst"], set()).add(r["gw"])
    for route in routes:
        dst = route.dst.network
        found = dst in gws and (route.gw is None or route.gw in gws[dst])
        if not found:
            via = f" via {route.gw}" if route.gw is not None else ""
            raise CNIError(ERR_INTERNAL, f"route {dst}{via} not found")
