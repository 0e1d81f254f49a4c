"""Tell a LAN a pod's addresses: gratuitous ARP and unsolicited neighbour
advertisements.

A macvlan, ipvlan or vlan interface puts a pod straight on a LAN, where the
switches and neighbours may still hold an old MAC for a reused address.
Once its addresses are set, the plugin announces them: an ARP announcement
for each IPv4 address (RFC 5227: an ARP request whose sender and target
address are both the address), an unsolicited neighbour advertisement for
each IPv6 one (RFC 4861 section 7.2.6: to ff02::1, Override set, carrying
the link's MAC).

The cheap way is the kernel's, and Go's: `notify_sysctls` turns on the
link's ``arp_notify`` / ``ndisc_notify`` before it goes up with its
addresses (`cni_skel.ipam.configure_iface` adds them, then brings it up):
going up, the kernel sends a gratuitous ARP for each IPv4 address, and an
unsolicited NA for each IPv6 one once DAD is done; later MAC changes are
announced too. `announce_addresses` sends them now, for a link already up:
each ARP needs a packet socket, whose close waits for an RCU grace period
(milliseconds on a busy node).

Sending is best effort, as in Go (``_ = arping.GratuitousArpOverIface``):
a send that fails (link down, IPv6 off, address still tentative) is
reported in the answer, never raised.

Source: Go plugins/main/macvlan and ipvlan (``arp_notify``, ``ndisc_notify``),
RFC 5227 section 3, RFC 4861 section 7.2.6.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import CNIError
from .sysctl import write_sysctl

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .netlink import Link
    from .netns import NetNS

__all__ = ["announce_addresses", "gratuitous_arp", "notify_sysctls", "unsolicited_na"]

ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800
_BROADCAST = b"\xff" * 6
_ALL_NODES = "ff02::1"
_ND_NEIGHBOR_ADVERT = 136
_NA_OVERRIDE = 0x20000000
_ND_OPT_TARGET_LL = 2


def _mac_bytes(link: Link) -> bytes:
    if not link.mac:
        raise ValueError(f'link "{link.name}" has no MAC address')
    return bytes.fromhex(link.mac.replace(":", ""))


def gratuitous_arp(link: Link, address: Any) -> None:
    """Broadcast one ARP announcement of IPv4 ``address`` (an address or
    interface, ``"10.1.2.3"`` / ``"10.1.2.3/24"``) from ``link``, in the
    calling thread's namespace (``netns.run(gratuitous_arp, ...)``).

    Raises:
        OSError: the kernel refused the send (e.g. ENETDOWN: the link is down).
        ValueError: not an IPv4 address, or the link has no MAC.
    """
    ip = ipaddress.ip_interface(address).ip
    if ip.version != 4:
        raise ValueError(f"{ip} is not an IPv4 address")
    mac = _mac_bytes(link)
    # ARP over Ethernet: htype 1, ptype IPv4, hlen 6, plen 4, op 1 (request)
    arp = struct.pack("!HHBBH", 1, ETH_P_IP, 6, 4, 1) + mac + ip.packed + b"\0" * 6 + ip.packed
    frame = _BROADCAST + mac + struct.pack("!H", ETH_P_ARP) + arp
    # Protocol 0 and no bind: a socket that only sends registers no packet
    # hook, so opening and closing it waits for no RCU grace period (a bound
    # one costs milliseconds in synchronize_net).
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) as s:
        s.sendto(frame, (link.name, ETH_P_ARP))


def unsolicited_na(link: Link, address: Any) -> None:
    """Send one unsolicited neighbour advertisement of IPv6 ``address`` to
    all nodes (ff02::1) from ``link``, in the calling thread's namespace;
    the kernel picks the source address (a link-local one) and the ICMPv6
    checksum.

    Raises:
        OSError: the kernel refused the send (EADDRNOTAVAIL while the link
            has no usable IPv6 address yet, ENETDOWN...).
        ValueError: not an IPv6 address, or the link has no MAC.
    """
    ip = ipaddress.ip_interface(address).ip
    if ip.version != 6:
        raise ValueError(f"{ip} is not an IPv6 address")
    mac = _mac_bytes(link)
    # type, code, checksum (the kernel's), flags, target, option: target link-layer address
    na = (struct.pack("!BBHI", _ND_NEIGHBOR_ADVERT, 0, 0, _NA_OVERRIDE) + ip.packed
          + struct.pack("!BB", _ND_OPT_TARGET_LL, 1) + mac)
    with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, link.index)
        s.sendto(na, (_ALL_NODES, 0, 0, link.index))


def announce_addresses(netns: NetNS, link: Link, addresses: Iterable[Any]) -> list[str]:
    """Announce each address of ``link`` (a `cni_skel.netlink.Link` read in
    ``netns``; addresses as `ipaddress` interfaces or strings, e.g. a
    result's ``ip.address``): `gratuitous_arp` for IPv4, `unsolicited_na`
    for IPv6, from inside ``netns``. Best effort: never raises for a failed
    send.

    Returns:
        one ``"<address>: <why>"`` line per address not announced (empty:
        all were sent).

    Raises:
        CNIError: as `cni_skel.netns.NetNS.enter` (999).
    """
    failed: list[str] = []
    with netns.enter():
        for address in addresses:
            try:
                ip = ipaddress.ip_interface(address).ip
                if ip.version == 4:
                    gratuitous_arp(link, ip)
                else:
                    unsolicited_na(link, ip)
            except (OSError, ValueError) as e:
                failed.append(f"{address}: {getattr(e, 'strerror', None) or e}")
    return failed


def notify_sysctls(ifname: str) -> None:
    """Set ``net.ipv4.conf.<ifname>.arp_notify`` and
    ``net.ipv6.conf.<ifname>.ndisc_notify`` to 1 in the calling thread's
    namespace (``netns.run(notify_sysctls, ifname)``), so the kernel
    announces the link's addresses when it comes up and when its MAC
    changes (Go's macvlan/ipvlan; a missing key, e.g. IPv6 off, is ignored,
    as Go)."""
    for key in (f"net/ipv4/conf/{ifname}/arp_notify", f"net/ipv6/conf/{ifname}/ndisc_notify"):
        with contextlib.suppress(CNIError):
            write_sysctl(key, "1")
