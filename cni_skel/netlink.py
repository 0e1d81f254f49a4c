"""Netlink helpers every interface plugin needs (links, addresses, routes, veth).

Each function takes a pyroute2 ``IPRoute`` (``ipr``) first and acts in the
namespace that socket is bound to: get one for a container namespace with
:meth:`cni_skel.netns.NetNS.iproute`, for the current one with ``IPRoute()``.

Conventions:

* Links are named by interface name (``str``); an ``int`` is taken as an
  ifindex. MTUs are in bytes, MACs are ``"aa:bb:cc:dd:ee:ff"`` strings.
* Families: ``None`` (all), ``4`` / ``6`` or ``socket.AF_INET`` /
  ``socket.AF_INET6``.
* Answers are typed (`Link`, :mod:`ipaddress` objects), not pyroute2 messages.
* Errors are :class:`~cni_skel.errors.CNIError`: a kernel (``NetlinkError``)
  failure not handled specially becomes code 999 with message
  ``"<operation> <target>: <strerror>"``; bad arguments (names, addresses,
  MACs) are code 7 (invalid network config).

``ipr`` is a pyroute2 ``IPRoute`` bound to the namespace to act in
(`cni_skel.netns.NetNS.iproute`).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyroute2.netlink.exceptions import NetlinkDumpInterrupted, NetlinkError

from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyroute2 import IPRoute

    from cni_skel.netns import NetNS

__all__ = [
    "Link",
    "LinkExists",
    "LinkNotFound",
    "add_address",
    "add_route",
    "addresses",
    "bridge_port",
    "bridge_port_set",
    "bridge_vlan_add",
    "bridge_vlan_del",
    "bridge_vlans",
    "create_veth_pair",
    "del_address",
    "del_route",
    "delete_link",
    "ensure_bridge",
    "find_link",
    "link_down",
    "link_index",
    "link_set",
    "link_up",
    "move_link",
    "routes",
    "wait_operstate",
]

IFNAMSIZ = 16
IFF_UP = 0x1
IFF_NOARP = 0x80
IFF_PROMISC = 0x100
IFF_ALLMULTI = 0x200
IFA_F_NODAD = 0x02
RT_TABLE_MAIN = 254
RT_SCOPE_NOWHERE = 255
_SCOPES = {"universe": 0, "global": 0, "site": 200, "link": 253, "host": 254, "nowhere": 255}

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}$")


class LinkNotFound(CNIError):
    """No link of that name in the namespace (code 999)."""

    def __init__(self, name: Link | str | int) -> None:
        name = name.name if isinstance(name, Link) else name
        super().__init__(ERR_INTERNAL, f'link "{name}" not found')
        self.name = name


class LinkExists(CNIError):
    """A link of that name already exists (code 999)."""

    def __init__(self, name: str) -> None:
        super().__init__(ERR_INTERNAL, f'link "{name}" already exists')
        self.name = name


# --------------------------------------------------------------------------
# internals


def _errmsg(exc: Exception) -> str:
    code = getattr(exc, "code", 0)
    args = getattr(exc, "args", ())
    msg = args[1] if len(args) > 1 and isinstance(args[1], str) and args[1] else ""
    if not msg:
        msg = os.strerror(code) if code else str(exc)
    return msg[:1].lower() + msg[1:]


def _call(op: str, target: object, fn: Callable[..., Any], *args: Any,
          ignore: tuple[int, ...] = (), **kwargs: Any) -> Any:
    """Run one pyroute2 request; ``ignore``d errnos return None, others raise.

    Returns the response messages as a list/tuple. A NetlinkError becomes
    CNIError(999, "<op> <target>: <strerror>"); a ValueError/TypeError raised
    by pyroute2 while encoding arguments becomes code 7. A dump interrupted by
    a concurrent change (NLM_F_DUMP_INTR) is retried a few times.
    """
    if isinstance(target, Link):
        target = target.name
    attempts = 5
    while True:
        attempts -= 1
        try:
            result = fn(*args, **kwargs)
            if result is None:
                return []
            # dumps may come back as generators (config.nlm_generator)
            return result if isinstance(result, (list, tuple)) else list(result)
        except NetlinkDumpInterrupted as e:
            if attempts > 0:
                continue
            raise CNIError(ERR_INTERNAL, f"{op} {target}: {_errmsg(e)}") from e
        except NetlinkError as e:
            if e.code in ignore:
                return None
            raise CNIError(ERR_INTERNAL, f"{op} {target}: {_errmsg(e)}") from e
        except (ValueError, TypeError) as e:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"{op} {target}: {e}") from e


def _errno_of(exc: BaseException) -> int | None:
    cause = exc.__cause__
    return getattr(cause, "code", None)


def _check_ifname(name: str) -> str:
    """Validate an interface name as the kernel's dev_valid_name() (code 7)."""
    if (
        not isinstance(name, str)
        or not name
        or len(name.encode()) >= IFNAMSIZ
        or name in (".", "..")
        or any(c == "/" or c == ":" or c.isspace() for c in name)
    ):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid interface name "{name}"')
    return name


def _check_mac(mac: str) -> str:
    """Normalise ``aa:bb:..`` / ``AA-BB-..`` to lower-case colon form (code 7)."""
    if not isinstance(mac, str) or not _MAC_RE.match(mac):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid MAC address "{mac}"')
    return mac.replace("-", ":").lower()


def _family(family: int | None) -> int:
    if family in (None, 0):
        return 0
    if family in (4, socket.AF_INET):
        return socket.AF_INET
    if family in (6, socket.AF_INET6):
        return socket.AF_INET6
    raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"unsupported address family {family!r}")


@dataclass(frozen=True)
class Link:
    """One network interface as the kernel reported it (RTM_NEWLINK), the
    typed answer of `find_link` (Go: ``netlink.Link``'s ``Attrs()``).

    Attributes:
        index: ifindex in the namespace it was read in.
        name: IFLA_IFNAME.
        mac: IFLA_ADDRESS, lower-case ``aa:bb:..`` (None for devices without one).
        mtu: bytes. txqlen: packets (IFLA_TXQLEN).
        up: IFF_UP is set (administratively up).
        operstate: IF_OPER_* as text: ``"UP"``, ``"DOWN"``, ``"LOWERLAYERDOWN"``,
            ``"UNKNOWN"``, ...
        kind: IFLA_INFO_KIND (``"veth"``, ``"bridge"``, ...; None for plain devices).
        master: ifindex of the bridge/bond it is enslaved to, or None.
        peer_index: IFLA_LINK: a veth's peer or a VLAN's parent, possibly an
            index in another namespace; None when not set.
        flags: the raw IFF_* flags.

    Helpers taking a link accept a `Link`, an ifindex or a name; given a
    `Link` or an index they send no look-up of their own.
    """

    index: int
    name: str
    mac: str | None = None
    mtu: int | None = None
    txqlen: int | None = None
    up: bool = False
    operstate: str | None = None
    kind: str | None = None
    master: int | None = None
    peer_index: int | None = None
    flags: int = 0


def _link_summary(msg: Any) -> Link:
    return Link(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        mac=msg.get("IFLA_ADDRESS"),
        mtu=msg.get("IFLA_MTU"),
        txqlen=msg.get("IFLA_TXQLEN"),
        up=bool(msg["flags"] & IFF_UP),
        operstate=msg.get("IFLA_OPERSTATE"),
        kind=msg.get(("linkinfo", "kind")),
        master=msg.get("IFLA_MASTER") or None,
        peer_index=msg.get("IFLA_LINK") or None,
        flags=msg["flags"],
    )


# --------------------------------------------------------------------------
# links


def find_link(ipr: IPRoute, name: Link | str | int) -> Link | None:
    """The `Link` of that name / index, or None when there is none. A name
    that can not be an interface name (empty, 16+ bytes) simply matches
    nothing. Given a `Link`, reads it again by its index (its state now).

    Raises:
        CNIError: code 999 for other netlink failures.
    """
    if isinstance(name, Link):
        name = name.index
    if isinstance(name, int):
        msgs = _call("get link", name, ipr.link, "get", index=name, ignore=(errno.ENODEV,))
    else:
        if not name or len(name.encode()) >= IFNAMSIZ:
            return None
        msgs = _call("get link", name, ipr.link, "get", ifname=name, ignore=(errno.ENODEV,))
    if not msgs:
        return None
    return _link_summary(msgs[0])


def link_index(ipr: IPRoute, name: Link | str | int) -> int:
    """The ifindex of link ``name``: a `Link`'s or an int as given (no
    look-up), a name looked up.

    Raises:
        LinkNotFound: (code 999) no such link.
        CNIError: code 999 for other netlink failures.
    """
    if isinstance(name, Link):
        return name.index
    if isinstance(name, int):
        return name
    link = find_link(ipr, name)
    if link is None:
        raise LinkNotFound(name)
    return link.index


def _index_or_none(ipr: IPRoute, name: Link | str | int) -> int | None:
    """A `Link`'s or an int's index as given; a name's looked up (None: no
    such link). Callers given an index treat ENODEV as "missing"."""
    if isinstance(name, Link):
        return name.index
    if isinstance(name, int):
        return name
    link = find_link(ipr, name)
    return None if link is None else link.index


def link_set(ipr: IPRoute, name: Link | str | int, /, **attrs: Any) -> None:
    """Change link attributes (RTM_NEWLINK "set").

    Keywords handled here: ``mtu`` (bytes), ``address``/``mac`` (MAC string),
    ``txqlen`` (packets), ``ifname``/``name`` (rename; the link usually must
    be down), ``master`` (ifindex or link name; ``0`` detaches), ``up``
    (bool), ``promisc`` / ``allmulti`` / ``arp`` (bool). Other keywords are
    passed to pyroute2's ``link("set")`` as is (IFLA_* names, lower-case).
    ``ipr`` and ``name`` are positional-only, so ``name=`` renames.
    ``None`` values are ignored; nothing to do is a no-op.

    Raises:
        LinkNotFound: (999) no such link (also for a ``master`` name).
        LinkExists: (999) renaming onto an existing name.
        CNIError: 7 for invalid names/MACs, 999 for kernel errors.
    """
    attrs = {k: v for k, v in attrs.items() if v is not None}
    if not attrs:
        return
    index = link_index(ipr, name)
    kwargs: dict[str, Any] = {}
    flags = change = 0
    for key, value in attrs.items():
        if key in ("mac", "address"):
            kwargs["address"] = _check_mac(value)
        elif key in ("name", "ifname"):
            kwargs["ifname"] = _check_ifname(value)
        elif key == "master":
            kwargs["master"] = value if isinstance(value, int) else link_index(ipr, value)
        elif key in ("up", "promisc", "allmulti", "arp"):
            bit = {"up": IFF_UP, "promisc": IFF_PROMISC, "allmulti": IFF_ALLMULTI,
                   "arp": IFF_NOARP}[key]
            on = bool(value) if key != "arp" else not value  # arp=False sets IFF_NOARP
            change |= bit
            flags = (flags | bit) if on else (flags & ~bit)
        elif key in ("mtu", "txqlen"):
            kwargs[key] = int(value)
        else:
            kwargs[key] = value
    if change:
        kwargs["flags"] = flags
        kwargs["change"] = change
    try:
        _call("set link", name, ipr.link, "set", index=index, **kwargs)
    except CNIError as e:
        if "ifname" in kwargs and _errno_of(e) == errno.EEXIST:
            raise LinkExists(kwargs["ifname"]) from e.__cause__
        raise


def link_up(ipr: IPRoute, name: Link | str | int) -> None:
    """Set IFF_UP on the link ("ip link set NAME up").

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors.
    """
    link_set(ipr, name, up=True)


def link_down(ipr: IPRoute, name: Link | str | int) -> None:
    """Clear IFF_UP on the link ("ip link set NAME down").

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors.
    """
    link_set(ipr, name, up=False)


def delete_link(ipr: IPRoute, name: Link | str | int, missing_ok: bool = True) -> bool:
    """Delete a link (for a veth, both ends go). True if it was deleted.

    With ``missing_ok`` (default) a missing link returns False.

    Raises:
        LinkNotFound: (999) missing and not ``missing_ok``.
        CNIError: 999 for kernel errors (e.g. EOPNOTSUPP for ``lo``).
    """
    index = _index_or_none(ipr, name)
    if index is None:
        if missing_ok:
            return False
        raise LinkNotFound(name)
    ignore = (errno.ENODEV,) if missing_ok else ()
    result = _call("delete link", name, ipr.link, "del", index=index, ignore=ignore)
    return result is not None


def move_link(ipr: IPRoute, name: Link | str | int, netns: NetNS) -> None:
    """Move a link into another namespace (IFLA_NET_NS_FD), keeping its name.

    Raises:
        LinkNotFound: (999) no such link in ``ipr``'s namespace.
        LinkExists: (999) the target namespace has a link of that name.
        CNIError: 999 for other kernel errors.
    """
    index = link_index(ipr, name)
    try:
        _call("move link", name, ipr.link, "set", index=index, net_ns_fd=netns.fd)
    except CNIError as e:
        if _errno_of(e) == errno.EEXIST:
            raise LinkExists(str(name)) from e.__cause__
        raise


def create_veth_pair(
    ipr: IPRoute,
    name: str,
    peer_name: str,
    peer_netns: NetNS | None = None,
    mtu: int | None = None,
    mac: str | None = None,
    peer_mac: str | None = None,
) -> tuple[Link, Link]:
    """Create a veth pair ``name`` <-> ``peer_name`` in ``ipr``'s namespace.

    With ``peer_netns`` the peer is created directly in that namespace
    (VETH_INFO_PEER carrying IFLA_NET_NS_FD), so it never appears in the
    first one. ``mtu`` (bytes) applies to both ends (as Go's netlink does);
    ``mac`` / ``peer_mac`` set the ends' addresses (kernel random otherwise).
    Both ends are left down.

    Returns:
        ``(link, peer)``: the two `Link` objects; the peer's is read
        through an IPRoute bound to ``peer_netns`` (its ifindex belongs there).

    Raises:
        LinkExists: (999) ``name`` or ``peer_name`` is taken (in its namespace).
        CNIError: 7 for invalid names/MACs/MTU, 999 for kernel errors.
    """
    _check_ifname(name)
    _check_ifname(peer_name)
    peer: dict[str, Any] = {"ifname": peer_name}
    kwargs: dict[str, Any] = {"ifname": name, "kind": "veth"}
    if mtu is not None:
        mtu = int(mtu)
        if mtu <= 0:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid MTU {mtu}")
        kwargs["mtu"] = peer["mtu"] = mtu
    if mac is not None:
        kwargs["address"] = _check_mac(mac)
    if peer_mac is not None:
        peer["address"] = _check_mac(peer_mac)
    if peer_netns is not None:
        peer["net_ns_fd"] = peer_netns.fd
    kwargs["peer"] = peer
    try:
        _call("create veth", name, ipr.link, "add", **kwargs)
    except CNIError as e:
        if _errno_of(e) == errno.EEXIST:
            taken = name
            if find_link(ipr, name) is None:
                if peer_netns is None:
                    taken = peer_name
                else:
                    with peer_netns.iproute() as pipr:
                        if find_link(pipr, peer_name) is not None:
                            taken = peer_name
            raise LinkExists(taken) from e.__cause__
        raise
    link = find_link(ipr, name)
    if peer_netns is None:
        peer_link = find_link(ipr, peer_name)
    else:
        with peer_netns.iproute() as pipr:
            peer_link = find_link(pipr, peer_name)
    if link is None or peer_link is None:
        missing = name if link is None else peer_name
        raise CNIError(ERR_INTERNAL, f'veth "{missing}" vanished right after creation')
    return link, peer_link


# --------------------------------------------------------------------------
# bridges

BRIDGE_VLAN_INFO_PVID = 0x2
BRIDGE_VLAN_INFO_UNTAGGED = 0x4
AF_BRIDGE = 7
RTEXT_FILTER_BRVLAN = 0x2


def ensure_bridge(ipr: IPRoute, name: str, *, mtu: int | None = None,
                  vlan_filtering: bool = False) -> Link:
    """Create Linux bridge ``name`` unless it exists; return its `Link`.

    An existing bridge is reused as it is (its MTU is not changed, as Go's
    bridge plugin: ``LinkAdd`` with EEXIST ignored). Concurrent callers are
    fine: losing the creation race is the same as finding it. ``mtu`` in
    bytes. ``vlan_filtering`` creates it with IFLA_BR_VLAN_FILTERING (the
    kernel needs CONFIG_BRIDGE_VLAN_FILTERING, else EOPNOTSUPP) and turns it
    on for an existing bridge.

    Raises:
        CNIError: 999 ``"<name>" already exists but is not a bridge`` (Go's
            text) when another kind of link holds the name; 999 for kernel
            errors; 7 for an invalid name or MTU.
    """
    _check_ifname(name)
    kwargs: dict[str, Any] = {"ifname": name, "kind": "bridge"}
    if mtu:
        if int(mtu) <= 0:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid MTU {mtu}")
        kwargs["mtu"] = int(mtu)
    if vlan_filtering:
        kwargs["br_vlan_filtering"] = 1
    _call("create bridge", name, ipr.link, "add", ignore=(errno.EEXIST,), **kwargs)
    link = find_link(ipr, name)
    if link is None:
        raise CNIError(ERR_INTERNAL, f'bridge "{name}" vanished right after creation')
    if link.kind != "bridge":
        raise CNIError(ERR_INTERNAL, f'"{name}" already exists but is not a bridge')
    if vlan_filtering:
        _call("enable VLAN filtering on", name, ipr.link, "set", index=link.index,
              kind="bridge", br_vlan_filtering=1)
    return link


def bridge_port(ipr: IPRoute, name: Link | str | int) -> dict | None:
    """Bridge-port settings of an enslaved link: ``{hairpin, isolated}``
    (bools), or None when the link is not a bridge port (or missing)."""
    index = _index_or_none(ipr, name)
    msgs = None if index is None else \
        _call("get link", name, ipr.link, "get", index=index, ignore=(errno.ENODEV,))
    if not msgs:
        return None
    data = msgs[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA")
    if msgs[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_KIND") != "bridge" or data is None:
        return None
    return {
        "hairpin": bool(data.get("IFLA_BRPORT_MODE")),
        "isolated": bool(data.get("IFLA_BRPORT_ISOLATED")),
    }


def bridge_port_set(ipr: IPRoute, name: Link | str | int, *, hairpin: bool | None = None,
                    isolated: bool | None = None) -> None:
    """Set bridge-port flags of a link enslaved to a bridge (IFLA_BRPORT_MODE
    for hairpin, IFLA_BRPORT_ISOLATED); None leaves a flag as it is.

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors (e.g. the link
        is not a bridge port).
    """
    attrs: dict[str, Any] = {}
    if hairpin is not None:
        attrs["mode"] = int(bool(hairpin))
    if isolated is not None:
        attrs["isolated"] = int(bool(isolated))
    if not attrs:
        return
    index = link_index(ipr, name)
    _call("set bridge port flags on", name, ipr.brport, "set", index=index, **attrs)


def bridge_vlans(ipr: IPRoute, name: Link | str | int) -> list[tuple[int, bool, bool]]:
    """VLANs of a bridge port as ``(vid, pvid, untagged)``, sorted by vid
    (empty when VLAN filtering is off or the link is missing)."""
    index = _index_or_none(ipr, name)
    if index is None:
        return []
    msgs = _call("list VLANs of", name, ipr.link, "dump", family=AF_BRIDGE,
                 ext_mask=RTEXT_FILTER_BRVLAN)
    out = []
    for msg in msgs:
        if msg["index"] != index:
            continue
        spec = msg.get("IFLA_AF_SPEC")
        for info in (spec.get_attrs("IFLA_BRIDGE_VLAN_INFO") if spec is not None else ()):
            flags = info["flags"]
            out.append((info["vid"], bool(flags & BRIDGE_VLAN_INFO_PVID),
                        bool(flags & BRIDGE_VLAN_INFO_UNTAGGED)))
    return sorted(out)


def bridge_vlan_add(ipr: IPRoute, name: Link | str | int, vid: int, *, pvid: bool = False,
                    untagged: bool = False) -> None:
    """Allow VLAN ``vid`` (1-4094) on a bridge port; ``pvid``: untagged
    ingress goes to it; ``untagged``: egress leaves untagged (the port's
    master must have VLAN filtering on).

    Raises:
        CNIError: 7 for a vid out of range, 999 for kernel errors.
    """
    if not 1 <= int(vid) <= 4094:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid VLAN ID {vid}")
    flags = (BRIDGE_VLAN_INFO_PVID if pvid else 0) | (BRIDGE_VLAN_INFO_UNTAGGED if untagged else 0)
    index = link_index(ipr, name)
    _call(f"add VLAN {vid} to", name, ipr.vlan_filter, "add", index=index,
          vlan_info={"vid": int(vid), "flags": flags})


def bridge_vlan_del(ipr: IPRoute, name: Link | str | int, vid: int) -> None:
    """Remove VLAN ``vid`` from a bridge port (missing is fine)."""
    index = link_index(ipr, name)
    _call(f"delete VLAN {vid} from", name, ipr.vlan_filter, "del", index=index,
          vlan_info={"vid": int(vid)}, ignore=(errno.ENOENT, errno.EINVAL))


def wait_operstate(ipr: IPRoute, name: Link | str | int, state: str = "UP", *,
                   delays: tuple[float, ...] = (0, 0.05, 0.5, 1, 1)) -> Link:
    """Poll link ``name`` until its operstate is ``state``; return its `Link`.

    ``delays``: seconds slept before each look (Go's bridge plugin waits
    0/50/500/1000/1000 ms for the host veth to come up).

    Raises:
        LinkNotFound: (999); CNIError: 999 ``"<name>" is <operstate>`` when it
        never reaches ``state``.
    """
    link = None
    for delay in delays:
        if delay:
            time.sleep(delay)
        link = find_link(ipr, name)
        if link is None:
            raise LinkNotFound(name)
        if link.operstate == state:
            return link
    assert link is not None
    raise CNIError(ERR_INTERNAL, f'"{link.name}" is in state {link.operstate}, not {state}')


# --------------------------------------------------------------------------
# addresses


def _interface(value: Any) -> IPInterface:
    try:
        return ipaddress.ip_interface(value)
    except ValueError as e:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid IP address "{value}"') from e


def addresses(ipr: IPRoute, name: Link | str | int, family: int | None = None) -> list[IPInterface]:
    """Addresses on a link, in kernel (dump) order, as ip_interface objects.

    ``family`` restricts to IPv4 or IPv6. IPv6 link-local addresses are
    included. For point-to-point addresses the local side is returned.

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors.
    """
    index = link_index(ipr, name)
    fam = _family(family)
    msgs = _call("list addresses of", name, ipr.addr, "dump", family=fam)
    out: list[IPInterface] = []
    for msg in msgs:
        if msg["index"] != index or (fam and msg["family"] != fam):
            continue
        addr = msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS")
        if addr is None:
            continue
        out.append(ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}"))
    return out


def add_address(
    ipr: IPRoute, name: Link | str | int, ip: IPInterface | str, *, nodad: bool = False
) -> bool:
    """Add ``ip`` (address with prefix, e.g. ``"10.1.2.3/24"``) to a link.

    IPv4 addresses with a prefix shorter than /31 get the broadcast address
    set (as Go's netlink.AddrAdd). ``nodad`` skips IPv6 duplicate address
    detection (IFA_F_NODAD). Idempotent: returns False when the address
    already exists (EEXIST), True when added.

    Raises:
        LinkNotFound: (999); CNIError: 7 for an unparsable address, 999 for
        kernel errors.
    """
    iface = _interface(ip)
    index = link_index(ipr, name)
    kwargs: dict[str, Any] = {
        "index": index,
        "address": str(iface.ip),
        "prefixlen": iface.network.prefixlen,
        "family": socket.AF_INET if iface.version == 4 else socket.AF_INET6,
    }
    if iface.version == 4 and iface.network.prefixlen < 31:
        kwargs["broadcast"] = str(iface.network.broadcast_address)
    if nodad:
        kwargs["flags"] = IFA_F_NODAD
    result = _call(f"add address {iface} to", name, ipr.addr, "add",
                   ignore=(errno.EEXIST,), **kwargs)
    return result is not None


def del_address(
    ipr: IPRoute, name: Link | str | int, ip: IPInterface | str, missing_ok: bool = True
) -> bool:
    """Remove ``ip`` (with prefix) from a link. True if it was removed.

    With ``missing_ok`` (default) a missing address or link returns False.

    Raises:
        LinkNotFound: (999) link missing and not ``missing_ok``.
        CNIError: 7 for an unparsable address, 999 for kernel errors
        (EADDRNOTAVAIL when the address is missing and not ``missing_ok``).
    """
    iface = _interface(ip)
    index = _index_or_none(ipr, name)
    if index is None:
        if missing_ok:
            return False
        raise LinkNotFound(name)
    ignore = (errno.EADDRNOTAVAIL, errno.ENODEV) if missing_ok else ()
    result = _call(
        f"delete address {iface} from", name, ipr.addr, "del",
        index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen,
        family=socket.AF_INET if iface.version == 4 else socket.AF_INET6,
        ignore=ignore,
    )
    return result is not None


# --------------------------------------------------------------------------
# routes


def _scope(scope: int | str | None) -> int | None:
    if scope is None or isinstance(scope, int):
        return scope
    try:
        return _SCOPES[scope]
    except KeyError:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid route scope "{scope}"') from None


def _route_spec(ipr: IPRoute, dst: Any, gw: Any, dev: str | int | None) -> dict[str, Any]:
    """Common route keywords: dst/dst_len, family, gateway, oif."""
    gateway: IPAddress | None = None
    if gw is not None and gw != "":
        try:
            gateway = ipaddress.ip_address(gw)
        except ValueError as e:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid gateway "{gw}"') from e
    if isinstance(dst, str) and dst == "default":
        if gateway is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           'route "default" needs a gateway to pick the family')
        dst = "0.0.0.0/0" if gateway.version == 4 else "::/0"
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except (ValueError, TypeError) as e:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid route destination "{dst}"') from e
    if gateway is not None and gateway.version != net.version:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f'gateway "{gateway}" does not match route destination "{net}"')
    # pyroute2 turns "0.0.0.0/0" / "::/0" into "family only" (no RTA_DST)
    spec: dict[str, Any] = {
        "dst": str(net),
        "family": socket.AF_INET if net.version == 4 else socket.AF_INET6,
    }
    if gateway is not None:
        spec["gateway"] = str(gateway)
    if dev is not None:
        spec["oif"] = link_index(ipr, dev)
    return spec


def routes(
    ipr: IPRoute, family: int | None = None, table: int | None = RT_TABLE_MAIN
) -> list[dict]:
    """Routes of one table (main by default; ``table=None``: all tables).

    Each is ``{dst: ip_network, gw: ip_address | None, oif: ifindex | None,
    table, scope (int, 0 universe / 253 link / 254 host), priority (metric,
    0 when unset), family (4/6), proto, type, src (prefsrc or None), mtu
    (RTAX_MTU or None), advmss (RTAX_ADVMSS or None)}``, in dump order.
    Multipath routes show ``gw``/``oif`` None.

    Raises:
        CNIError: 999 for kernel errors.
    """
    fam = _family(family)
    # family 255: the kernel dumps every family (pyroute2's documented trick)
    msgs = _call("list routes", f"(table {table})", ipr.get_routes, family=fam or 255)
    out = []
    for msg in msgs:
        mfam = msg["family"]
        if mfam not in (socket.AF_INET, socket.AF_INET6) or (fam and mfam != fam):
            continue
        mtable = msg.get("RTA_TABLE") or msg["table"]
        if table is not None and mtable != table:
            continue
        zero = "0.0.0.0" if mfam == socket.AF_INET else "::"
        dst = ipaddress.ip_network(f"{msg.get('RTA_DST') or zero}/{msg['dst_len']}",
                                   strict=False)
        gw = msg.get("RTA_GATEWAY")
        src = msg.get("RTA_PREFSRC")
        mtu = advmss = None
        metrics = msg.get("RTA_METRICS")
        if metrics is not None:
            mtu = metrics.get("RTAX_MTU")
            advmss = metrics.get("RTAX_ADVMSS")
        out.append({
            "dst": dst,
            "gw": ipaddress.ip_address(gw) if gw else None,
            "oif": msg.get("RTA_OIF"),
            "table": mtable,
            "scope": msg["scope"],
            "priority": msg.get("RTA_PRIORITY") or 0,
            "family": 4 if mfam == socket.AF_INET else 6,
            "proto": msg["proto"],
            "type": msg["type"],
            "src": ipaddress.ip_address(src) if src else None,
            "mtu": mtu,
            "advmss": advmss,
        })
    return out


def add_route(
    ipr: IPRoute,
    dst: str | IPNetwork,
    gw: str | IPAddress | None = None,
    dev: str | int | None = None,
    mtu: int | None = None,
    advmss: int | None = None,
    priority: int | None = None,
    table: int | None = None,
    scope: int | str | None = None,
) -> bool:
    """Add a unicast route (proto boot, as Go's netlink and iproute2).

    ``dst``: a network (``"10.2.0.0/16"``; host bits are masked off; a bare
    address is a host route; ``"default"`` with a gateway). ``gw``: next hop;
    ``dev``: output link name/ifindex. ``mtu``/``advmss`` in bytes (route
    metrics). ``priority``: metric. ``table``: 254 (main) when None.
    ``scope``: int or "universe"/"link"/"host"/"site"; None leaves the
    kernel default (universe), as Go's ``ip.AddRoute`` does.

    Idempotent: an identical route (EEXIST) returns False; True when added.
    Note EEXIST means "same dst/metric/table exists", possibly with another
    gateway.

    Raises:
        LinkNotFound: (999) ``dev`` missing.
        CNIError: 7 for bad dst/gw/scope, 999 for kernel errors (e.g.
        ENETUNREACH for a gateway not reachable on-link).
    """
    spec = _route_spec(ipr, dst, gw, dev)
    spec["proto"] = "boot"
    if priority is not None:
        spec["priority"] = int(priority)
    if table is not None:
        spec["table"] = int(table)
    sc = _scope(scope)
    if sc is not None:
        spec["scope"] = sc
    metrics = {k: int(v) for k, v in (("mtu", mtu), ("advmss", advmss)) if v is not None}
    if metrics:
        spec["metrics"] = metrics
    result = _call("add route", _route_target(spec, gw, dev), ipr.route, "add",
                   ignore=(errno.EEXIST,), **spec)
    return result is not None


def del_route(
    ipr: IPRoute,
    dst: str | IPNetwork,
    gw: str | IPAddress | None = None,
    dev: str | int | None = None,
    priority: int | None = None,
    table: int | None = None,
    scope: int | str | None = None,
    missing_ok: bool = True,
) -> bool:
    """Delete a route; arguments as :func:`add_route`, unset ones match any.

    (The scope defaults to "nowhere", which the kernel treats as a wildcard.)
    True if a route was deleted; a missing route (ESRCH) or ``dev`` returns
    False with ``missing_ok`` (default).

    Raises:
        LinkNotFound: (999) ``dev`` missing and not ``missing_ok``.
        CNIError: 7 for bad arguments, 999 for kernel errors.
    """
    try:
        spec = _route_spec(ipr, dst, gw, dev)
    except LinkNotFound:
        if missing_ok:
            return False
        raise
    if priority is not None:
        spec["priority"] = int(priority)
    if table is not None:
        spec["table"] = int(table)
    sc = _scope(scope)
    spec["scope"] = RT_SCOPE_NOWHERE if sc is None else sc
    ignore = (errno.ESRCH,) if missing_ok else ()
    result = _call("delete route", _route_target(spec, gw, dev), ipr.route, "del",
                   ignore=ignore, **spec)
    return result is not None


def _route_target(spec: dict[str, Any], gw: Any, dev: Any) -> str:
    text = spec["dst"]
    if gw is not None and gw != "":
        text += f" via {gw}"
    if dev is not None:
        text += f" dev {dev}"
    return text
