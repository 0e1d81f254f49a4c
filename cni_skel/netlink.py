"""Netlink helpers every interface plugin needs (links, addresses, routes, veth).

Each function takes a netlink socket (``ipr``) first and acts in the
namespace that socket is bound to. Two kinds are accepted, with the same
answers and errors:

* `cni_skel.rtnl.Rtnl`, the SDK's synchronous rtnetlink socket: about half
  the CPU per request of pyroute2's ``IPRoute`` (no asyncio loop), and a
  creation is answered with the created link (NLM_F_ECHO) instead of a
  second request. Get one with :meth:`cni_skel.netns.NetNS.rtnl` (a
  container namespace) or ``Rtnl()`` (the calling thread's namespace). The
  reference plugins use it.
* a pyroute2 ``IPRoute`` (:meth:`cni_skel.netns.NetNS.iproute`, or
  ``IPRoute()``), for code that also calls pyroute2's own API on it.

Both carry the same pyroute2 messages (``ipr.nlm_request``); the requests
are built here, with pyroute2's request filters where keywords become
nested attributes (veth peer, bridge, routes).

Conventions:

* Links are named by interface name (``str``); an ``int`` is taken as an
  ifindex; a `Link` by its index. Given a `Link` or an index, a helper sends
  no look-up of its own; links are changed and deleted by name without one
  too (the kernel finds a link by IFLA_IFNAME). Addresses and routes need
  the index: pass the `Link` along.
* MTUs are in bytes, MACs are ``"aa:bb:cc:dd:ee:ff"`` strings.
* Families: ``None`` (all), ``4`` / ``6`` or ``socket.AF_INET`` /
  ``socket.AF_INET6``.
* Answers are typed (`Link`, :mod:`ipaddress` objects), not pyroute2 messages.
* Errors are :class:`~cni_skel.errors.CNIError`: a kernel (``NetlinkError``)
  failure not handled specially becomes code 999 with message
  ``"<operation> <target>: <strerror>"``; bad arguments (names, addresses,
  MACs) are code 7 (invalid network config).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_ECHO,
    NLM_F_EXCL,
    NLM_F_REQUEST,
)
from pyroute2.netlink.exceptions import NetlinkDumpInterrupted, NetlinkError
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELRULE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETNSID,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWNSID,
    RTM_NEWRULE,
    RTM_SETLINK,
)
from pyroute2.netlink.rtnl.fibmsg import fibmsg
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg, macvx_data
from pyroute2.netlink.rtnl.ifinfmsg.tuntap import manage_tuntap
from pyroute2.netlink.rtnl.nsidmsg import nsidmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from cni_skel import compat, linkbatch
from cni_skel.env import ifname_problem
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.netns import CLONE_FS, CLONE_NEWNET, NetNS, setns, unshare
from cni_skel.rtnl import RTMGRP_LINK, SIOCGSKNS, PartialIfinfmsg, Rtnl, build, link_marshal

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyroute2 import IPRoute

    Socket = IPRoute | Rtnl

__all__ = [
    "IPVLAN_MODES",
    "MACVLAN_MODES",
    "RT_TABLE_DEFAULT",
    "RT_TABLE_LOCAL",
    "RT_TABLE_MAIN",
    "Link",
    "LinkExists",
    "LinkNotFound",
    "Rule",
    "add_address",
    "add_listed_route",
    "add_route",
    "add_rule",
    "address_flags",
    "addresses",
    "bridge_port",
    "bridge_port_set",
    "bridge_vlan_add",
    "bridge_vlan_del",
    "bridge_vlans",
    "create_dummy",
    "create_ipvlan",
    "create_macvlan",
    "create_tap",
    "create_veth_pair",
    "create_vlan",
    "create_vrf",
    "default_route_interface",
    "del_address",
    "del_route",
    "del_rule",
    "delete_link",
    "deletions_fd",
    "ensure_bridge",
    "find_link",
    "finishing_deletions",
    "link_down",
    "link_flags",
    "link_index",
    "link_set",
    "link_up",
    "links",
    "move_link",
    "netnsid",
    "reap_deletions",
    "route_get",
    "routes",
    "rules",
    "wait_deletions",
    "wait_operstate",
]

IFNAMSIZ = 16
IFF_UP = 0x1
IFF_NOARP = 0x80
IFF_PROMISC = 0x100
IFF_ALLMULTI = 0x200
IFA_F_NODAD = 0x02
#: The kernel's routing tables (``ip route show table default|main|local``).
RT_TABLE_DEFAULT = 253
RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255
RT_SCOPE_NOWHERE = 255
_SCOPES = {"universe": 0, "global": 0, "site": 200, "link": 253, "host": 254, "nowhere": 255}
# IFLA_EXT_MASK bits (linux/rtnetlink.h)
RTEXT_FILTER_BRVLAN = 0x2
_REQ = NLM_F_REQUEST | NLM_F_ACK
_DUMP = NLM_F_REQUEST | NLM_F_DUMP

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
    """Run one request; ``ignore``d errnos return None, others raise.

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


def _send(ipr: Socket, msg: Any, msg_type: int, flags: int,
          marshal: Marshal | None = None) -> Any:
    """One request on either kind of socket: its answer messages
    (``marshal``: parses an `Rtnl`'s answer instead of its own)."""
    if isinstance(ipr, Rtnl):
        if marshal is None:
            return ipr.request(msg, msg_type, flags)
        return ipr.request(msg, msg_type, flags, marshal=marshal)
    # pyroute2 0.9.7's IPRoute.nlm_request fails on a missing status key;
    # nlm_request_batch is the same request (it answers only requests that
    # ask for an ACK or a dump, so a GET asks for the ACK, as IPRoute's do).
    if not flags & (NLM_F_ACK | NLM_F_DUMP):
        flags |= NLM_F_ACK
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    return ipr.nlm_request_batch([msg])


def _request(op: str, target: object, ipr: Socket, msg: Any, msg_type: int, flags: int,
             ignore: tuple[int, ...] = (), marshal: Marshal | None = None) -> Any:
    """`_call` of one prepared message: its answer, None for an ignored errno."""
    return _call(op, target, _send, ipr, msg, msg_type, flags, marshal, ignore=ignore)


def _built(op: str, target: object, ipr: Socket, kind: str, command: str, /, *,
           echo: bool = False, ignore: tuple[int, ...] = (), marshal: Marshal | None = None,
           **kwargs: Any) -> Any:
    """`_request` of a message pyroute2's request filters build from
    keywords (`cni_skel.rtnl.build`); ``echo``: NLM_F_ECHO on an `Rtnl`
    (pyroute2's socket is not asked for it), its answer parsed by
    ``marshal`` when given."""

    def send() -> Any:
        msg, msg_type, flags = build(kind, command, strict_check=_strict(ipr), **kwargs)
        if echo and isinstance(ipr, Rtnl):
            flags |= NLM_F_ECHO
        return _send(ipr, msg, msg_type, flags, marshal)

    return _call(op, target, send, ignore=ignore)


def _strict(ipr: Socket) -> bool:
    """Does the kernel filter dumps on this socket (`Rtnl.strict_check`)?
    (The answers are sifted here anyway: this only saves decoding.)"""
    return isinstance(ipr, Rtnl) and ipr.strict_check


def _errno_of(exc: BaseException) -> int | None:
    cause = exc.__cause__
    return getattr(cause, "code", None)


def _plausible_ifname(name: str) -> bool:
    """Could the kernel have a link of this name? (else it is simply missing)"""
    return bool(name) and len(name.encode()) < IFNAMSIZ


def _check_ifname(name: str) -> str:
    """A name for a link to create: `cni_skel.env.ifname_problem` (the
    kernel's dev_valid_name(), and no ``%`` template) or code 7."""
    if not isinstance(name, str) or ifname_problem(name) is not None:
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


@dataclasses.dataclass(frozen=True)
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
        mode: the kind's mode: a macvlan's ``"bridge"``, ``"private"``,
            ``"vepa"``, ``"passthru"`` or ``"source"``; an ipvlan's ``"l2"``,
            ``"l3"`` or ``"l3s"``; None for other kinds.
        vlan_id: a vlan link's VLAN ID (0..4094); None for other kinds.
        vrf_table: a vrf link's routing table (IFLA_VRF_TABLE); None for
            other kinds.
        alias: IFLA_IFALIAS (``ip link set NAME alias TEXT``; set it with
            ``link_set(ipr, name, ifalias=TEXT)``), None when unset.
        link_netnsid: IFLA_LINK_NETNSID: set when `peer_index` / `parent`
            is an index in another namespace (a link created into or moved
            to a pod keeps its parent in the node's); None when it is here.

    Helpers taking a link accept a `Link`, an ifindex or a name; given a
    `Link` or an index they send no look-up of their own.

    Deprecated since 0.2.0 (gone in 0.3.0): item access as on 0.1.0's dicts
    (``link["mac"]``, ``link.get("master")``; the old key ``"link"`` is
    `peer_index`) works and warns (DeprecationWarning).
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
    mode: str | None = None
    vlan_id: int | None = None
    link_netnsid: int | None = None
    alias: str | None = None
    vrf_table: int | None = None

    @property
    def parent(self) -> int | None:
        """The ifindex of the link a macvlan, ipvlan or vlan sits on
        (IFLA_LINK, the same number as `peer_index`), None for other kinds.
        An index in another namespace when `link_netnsid` is set."""
        return self.peer_index if self.kind in _CHILD_KINDS else None

    def __getitem__(self, key: str) -> Any:
        """Deprecated: ``link[key]`` as on 0.1.0's dicts; use ``link.<key>``.
        Raises KeyError for a key 0.1.0's dicts did not have."""
        compat.warn("cni_skel.netlink.Link.__getitem__")
        return self._old_key(key)

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: ``link.get(key, default)`` as on 0.1.0's dicts; use
        ``link.<key>``."""
        compat.warn("cni_skel.netlink.Link.get")
        try:
            return self._old_key(key)
        except KeyError:
            return default

    def _old_key(self, key: str) -> Any:
        field = _OLD_LINK_KEYS.get(key) if isinstance(key, str) else None
        if field is None:
            raise KeyError(key)
        return getattr(self, field)


# 0.1.0's link dict keys -> Link attributes ("link" was IFLA_LINK); later
# fields never had a key.
_NEW_LINK_FIELDS = ("mode", "vlan_id", "link_netnsid", "alias")
_OLD_LINK_KEYS = {f.name: f.name for f in dataclasses.fields(Link)
                  if f.name not in _NEW_LINK_FIELDS} | {"link": "peer_index"}
#: Kinds whose IFLA_LINK is the link they sit on (`Link.parent`).
_CHILD_KINDS = frozenset({"macvlan", "macvtap", "ipvlan", "ipvtap", "vlan"})
# pyroute2 0.9's macvlan attribute table stops at MACADDR_COUNT (6); the
# kernel has had the broadcast queue length (7, 8) since 5.11, and Go's
# macvlan sets it. Extended once, before any macvlan message is compiled.
if not any(entry[0] == "IFLA_MACVLAN_BC_QUEUE_LEN" for entry in macvx_data.nla_map):
    macvx_data.nla_map = (*macvx_data.nla_map, ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
                          ("IFLA_MACVLAN_BC_QUEUE_LEN_USED", "uint32"))
#: IFLA_MACVLAN_MODE values (linux/if_link.h) by name.
MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}
#: IFLA_IPVLAN_MODE values by name.
IPVLAN_MODES = {"l2": 0, "l3": 1, "l3s": 2}
_IPVLAN_MODE_NAMES = {v: k for k, v in IPVLAN_MODES.items()}
_MACVLAN_MODE_NAMES = {v: k for k, v in MACVLAN_MODES.items()}


def _kind_data(kind: str | None, info: Any) -> tuple[str | None, int | None]:
    """``(mode, vlan id or vrf table)`` of a link's IFLA_INFO_DATA."""
    if kind not in ("macvlan", "macvtap", "ipvlan", "ipvtap", "vlan", "vrf"):
        return None, None
    data = info.get_attr("IFLA_INFO_DATA")
    if data is None:
        return None, None
    if kind == "vlan":
        return None, data.get_attr("IFLA_VLAN_ID")
    if kind == "vrf":
        return None, data.get_attr("IFLA_VRF_TABLE")
    if kind.startswith("ipv"):
        mode = data.get_attr("IFLA_IPVLAN_MODE")
        return _IPVLAN_MODE_NAMES.get(mode, str(mode) if mode is not None else None), None
    mode = data.get_attr("IFLA_MACVLAN_MODE")
    if isinstance(mode, int):  # a value pyroute2 has no name for
        mode = _MACVLAN_MODE_NAMES.get(mode, str(mode))
    return mode, None


def _link_summary(msg: Any) -> Link:
    value = _attrs(msg)
    info = value("IFLA_LINKINFO")
    flags = msg["flags"]
    kind = None if info is None else info.get_attr("IFLA_INFO_KIND")
    mode, number = _kind_data(kind, info)
    netnsid = value("IFLA_LINK_NETNSID")
    return Link(
        index=msg["index"],
        name=value("IFLA_IFNAME"),
        mac=value("IFLA_ADDRESS"),
        mtu=value("IFLA_MTU"),
        txqlen=value("IFLA_TXQLEN"),
        up=bool(flags & IFF_UP),
        operstate=value("IFLA_OPERSTATE"),
        kind=kind,
        master=value("IFLA_MASTER") or None,
        peer_index=value("IFLA_LINK") or None,
        flags=flags,
        mode=mode,
        vlan_id=number if kind == "vlan" else None,
        link_netnsid=netnsid if netnsid is not None and netnsid >= 0 else None,
        alias=value("IFLA_IFALIAS") or None,
        vrf_table=number if kind == "vrf" else None,
    )


class _ifinfmsg_summary(PartialIfinfmsg):
    """An ``ifinfmsg`` decoding the attributes `_link_summary` reads: a
    `Link` read this way costs ~0.1 ms instead of ~0.25."""

    _KEEP = ("IFLA_IFNAME", "IFLA_ADDRESS", "IFLA_MTU", "IFLA_TXQLEN", "IFLA_OPERSTATE",
             "IFLA_LINKINFO", "IFLA_MASTER", "IFLA_LINK", "IFLA_LINK_NETNSID", "IFLA_IFALIAS")


class _ifinfmsg_head(PartialIfinfmsg):
    """An ``ifinfmsg`` decoded only as far as its header (index, type, flags)."""

    _KEEP = ()


class _ifinfmsg_name(PartialIfinfmsg):
    """An ``ifinfmsg`` with its name only (a deletion's notice: `_unlisted`)."""

    _KEEP = ("IFLA_IFNAME",)


_LINK_SUMMARY = link_marshal(_ifinfmsg_summary)
_LINK_HEAD = link_marshal(_ifinfmsg_head)
_LINK_DELETED = link_marshal(_ifinfmsg_name, RTM_DELLINK)
_NSID = link_marshal(nsidmsg, RTM_NEWNSID)


def _link_msg(name: Link | str | int) -> Any:
    """An ``ifinfmsg`` naming the link: by index (a `Link`, an int), else by
    IFLA_IFNAME (the kernel looks it up: no GET of ours)."""
    msg = ifinfmsg()
    if isinstance(name, Link):
        msg["index"] = name.index
    elif isinstance(name, int):
        msg["index"] = name
    else:
        msg["attrs"].append(["IFLA_IFNAME", name])
    return msg


# --------------------------------------------------------------------------
# links


def find_link(ipr: Socket, name: Link | str | int) -> Link | None:
    """The `Link` of that name / index, or None when there is none. A name
    that can not be an interface name (empty, 16+ bytes) simply matches
    nothing. Given a `Link`, reads it again by its index (its state now).
    One RTM_GETLINK.

    Raises:
        CNIError: code 999 for other netlink failures.
    """
    if isinstance(name, str) and not _plausible_ifname(name):
        return None
    # (IFLA_EXT_MASK RTEXT_FILTER_SKIP_STATS would drop 370 of 1500 bytes,
    # but not an attribute: decoding costs the same, encoding the mask more.)
    msg = _link_msg(name)
    target = name.index if isinstance(name, Link) else name
    msgs = _request("get link", target, ipr, msg, RTM_GETLINK, NLM_F_REQUEST,
                    ignore=(errno.ENODEV,), marshal=_LINK_SUMMARY)
    if not msgs:
        return None
    return _link_summary(msgs[0])


def netnsid(ipr: Socket, netns: int | Socket) -> int | None:
    """The id ``ipr``'s namespace knows another by (what a `Link`'s
    ``link_netnsid`` holds: a veth's peer there); None when it has given it
    none. ``netns``: that namespace as an open fd, or a socket of it (its
    namespace read with SIOCGSKNS). One RTM_GETNSID (Go:
    ``netlink.GetNetNsIdByFd``; ``ip netns list-id``).

    Raises:
        CNIError: code 999 for netlink failures (EBADF: not a namespace fd;
            a socket whose namespace the kernel will not tell).
    """
    if isinstance(netns, int):
        return _netnsid(ipr, netns)
    try:
        fd = fcntl.ioctl(netns.fileno(), SIOCGSKNS)
    except OSError as e:
        raise CNIError(ERR_INTERNAL, f"get netns id: {_errmsg(e)}") from e
    try:
        return _netnsid(ipr, fd)
    finally:
        os.close(fd)


def _netnsid(ipr: Socket, fd: int) -> int | None:
    msg = nsidmsg()
    msg["attrs"].append(["NETNSA_FD", fd])
    msgs = _request("get netns id", fd, ipr, msg, RTM_GETNSID, NLM_F_REQUEST, marshal=_NSID)
    nsid = msgs[0].get_attr("NETNSA_NSID") if msgs else None
    # NETNSA_NSID_NOT_ASSIGNED (-1) arrives as an unsigned 32-bit value
    return None if nsid is None or nsid >= 0x80000000 else nsid


def link_flags(ipr: Socket, name: Link | str | int) -> int | None:
    """The IFF_* flags of a link (None: no such link). One RTM_GETLINK whose
    answer is decoded, on an `Rtnl`, as far as its header only.

    Raises:
        CNIError: code 999 for other netlink failures.
    """
    if isinstance(name, str) and not _plausible_ifname(name):
        return None
    target = name.index if isinstance(name, Link) else name
    msgs = _request("get link", target, ipr, _link_msg(name), RTM_GETLINK, NLM_F_REQUEST,
                    ignore=(errno.ENODEV,), marshal=_LINK_HEAD)
    return msgs[0]["flags"] if msgs else None


def link_index(ipr: Socket, name: Link | str | int) -> int:
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


def _index_or_none(ipr: Socket, name: Link | str | int) -> int | None:
    """A `Link`'s or an int's index as given; a name's looked up (None: no
    such link). Callers given an index treat ENODEV as "missing"."""
    if isinstance(name, Link):
        return name.index
    if isinstance(name, int):
        return name
    link = find_link(ipr, name)
    return None if link is None else link.index


# link_set keywords sent as they are (IFLA_*), and the IFF_* flag keywords
_LINK_ATTRS = {"mtu": "IFLA_MTU", "txqlen": "IFLA_TXQLEN", "address": "IFLA_ADDRESS",
               "ifname": "IFLA_IFNAME", "master": "IFLA_MASTER"}
_FLAG_KEYS = {"up": IFF_UP, "promisc": IFF_PROMISC, "allmulti": IFF_ALLMULTI, "arp": IFF_NOARP}


def _brport_info(*, hairpin: bool | None, isolated: bool | None) -> list[Any] | None:
    """IFLA_LINKINFO changing bridge-port flags (None: nothing to change).
    The kernel applies slave data through the link's master (so no
    IFLA_INFO_KIND: it would make the kernel look for a "bridge_slave"
    link type, and try to load its module)."""
    data = [[nla, int(bool(on))] for nla, on in (("IFLA_BRPORT_MODE", hairpin),
                                                 ("IFLA_BRPORT_ISOLATED", isolated))
            if on is not None]
    if not data:
        return None
    return ["IFLA_LINKINFO", {"attrs": [["IFLA_INFO_SLAVE_KIND", "bridge"],
                                        ["IFLA_INFO_SLAVE_DATA", {"attrs": data}]]}]


def link_set(ipr: Socket, name: Link | str | int, /, **attrs: Any) -> None:
    """Change link attributes (RTM_NEWLINK "set"), in one request.

    Keywords handled here: ``mtu`` (bytes), ``address``/``mac`` (MAC string),
    ``txqlen`` (packets), ``ifname``/``name`` (rename; the link usually must
    be down), ``master`` (ifindex, `Link` or link name; ``0`` detaches),
    ``up`` (bool), ``promisc`` / ``allmulti`` / ``arp`` (bool), ``hairpin``
    / ``isolated`` (bool: bridge-port flags IFLA_BRPORT_MODE /
    IFLA_BRPORT_ISOLATED of a link enslaved to a bridge; applied before the
    IFF_* flags, so ``hairpin=True, up=True`` brings up a hairpin port).
    Other keywords are passed to pyroute2's link "set" request filters as
    is (IFLA_* names, lower-case; not together with hairpin/isolated).
    ``ipr`` and ``name`` are positional-only, so ``name=`` renames.
    ``None`` values are ignored; nothing to do is a no-op. A link given by
    name is changed by name (no look-up), unless it is renamed.

    Raises:
        LinkNotFound: (999) no such link (also for a ``master`` name).
        LinkExists: (999) renaming onto an existing name.
        CNIError: 7 for invalid names/MACs, 999 for kernel errors.
    """
    attrs = {k: v for k, v in attrs.items() if v is not None}
    if not attrs:
        return
    kwargs: dict[str, Any] = {}
    brport = _brport_info(hairpin=attrs.pop("hairpin", None), isolated=attrs.pop("isolated", None))
    flags = change = 0
    for key, value in attrs.items():
        if key in ("mac", "address"):
            kwargs["address"] = _check_mac(value)
        elif key in ("name", "ifname"):
            kwargs["ifname"] = _check_ifname(value)
        elif key == "master":
            kwargs["master"] = value if isinstance(value, int) else link_index(ipr, value)
        elif key in _FLAG_KEYS:
            bit = _FLAG_KEYS[key]
            on = bool(value) if key != "arp" else not value  # arp=False sets IFF_NOARP
            change |= bit
            flags = (flags | bit) if on else (flags & ~bit)
        elif key in ("mtu", "txqlen"):
            kwargs[key] = int(value)
        else:
            kwargs[key] = value
    target: Link | str | int = name
    if isinstance(name, str) and ("ifname" in kwargs or set(kwargs) - set(_LINK_ATTRS)):
        target = link_index(ipr, name)  # renamed, or pyroute2's filters want an index
    elif isinstance(name, str) and not _plausible_ifname(name):
        raise LinkNotFound(name)

    def send() -> Any:
        if set(kwargs) - set(_LINK_ATTRS):
            index = target.index if isinstance(target, Link) else target
            extra = {"flags": flags, "change": change} if change else {}
            msg, msg_type, msg_flags = build("link", "set", index=index, **kwargs, **extra)
        else:
            msg, msg_type, msg_flags = _link_msg(target), RTM_NEWLINK, _REQ
            msg["flags"], msg["change"] = flags, change
            msg["attrs"] += [[_LINK_ATTRS[k], v] for k, v in kwargs.items()]
        if brport is not None:
            msg["attrs"].append(brport)
        return _send(ipr, msg, msg_type, msg_flags)

    try:
        _call("set link", name, send)
    except CNIError as e:
        err = _errno_of(e)
        if "ifname" in kwargs and err == errno.EEXIST:
            raise LinkExists(kwargs["ifname"]) from e.__cause__
        if err == errno.ENODEV and isinstance(target, str):
            raise LinkNotFound(name) from e.__cause__
        raise


def link_up(ipr: Socket, name: Link | str | int) -> None:
    """Set IFF_UP on the link ("ip link set NAME up").

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors.
    """
    link_set(ipr, name, up=True)


def link_down(ipr: Socket, name: Link | str | int) -> None:
    """Clear IFF_UP on the link ("ip link set NAME down").

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors.
    """
    link_set(ipr, name, up=False)


def delete_link(ipr: Socket, name: Link | str | int, missing_ok: bool = True) -> bool:
    """Delete a link (for a veth, both ends go). True if it was deleted.
    One request (a name is resolved by the kernel).

    Answers once the kernel has taken the link out of its namespace: its
    RTM_DELLINK notification is out, so its name and index are free, its
    addresses and routes gone, and a veth's peer with it. The rest of the
    kernel's work (``netdev_run_todo``: an RCU barrier, ~20 ms and more
    on a busy node, which Go's plugins wait for) goes on in a thread of
    this process; `wait_deletions` waits for it, and a process's exit
    does; a long-lived process may serve on meanwhile (`deletions_fd`,
    `reap_deletions`). The thread has its own root, cwd and umask, so the
    caller may still setns into another mount namespace. Where that cannot
    be set up (no SIOCGSKNS), the call waits.

    With ``missing_ok`` (default) a missing link returns False.

    Raises:
        LinkNotFound: (999) missing and not ``missing_ok``.
        CNIError: 999 for kernel errors (e.g. EOPNOTSUPP for ``lo``).
    """
    missing = isinstance(name, str) and not _plausible_ifname(name)
    if not missing:
        ignore = (errno.ENODEV,) if missing_ok or isinstance(name, str) else ()
        if _delete_unlisted(ipr, name, ignore) is not None:
            return True
    if missing_ok:
        return False
    raise LinkNotFound(name)


#: Deletions answered once unlisted, still in the kernel (`wait_deletions`):
#: each thread with the eventfd it signals when done.
_finishing: list[tuple[threading.Thread, int]] = []
#: (pid, eventfd) of `deletions_fd`, signalled too as each of them ends.
_finished: tuple[int, int] | None = None


def _delete_unlisted(ipr: Socket, name: Link | str | int, ignore: tuple[int, ...]) -> Any:
    """`_request` of the RTM_DELLINK, sent by a thread in ``ipr``'s
    namespace while this one waits there for the link's RTM_DELLINK
    notification or the request's end, whichever comes first."""
    msg = _link_msg(name)
    try:
        ns_fd = fcntl.ioctl(ipr.fileno(), SIOCGSKNS)
    except OSError:
        return _request("delete link", name, ipr, msg, RTM_DELLINK, _REQ, ignore=ignore)
    index = name.index if isinstance(name, Link) else name if isinstance(name, int) else None
    wanted = name.name if isinstance(name, Link) else name if isinstance(name, str) else None
    outcome: dict[str, Any] = {}
    watching = threading.Event()
    done = os.eventfd(0, os.EFD_CLOEXEC)

    def delete() -> None:
        try:
            try:
                batched = _node_namespace(ns_fd)
                setns(ns_fd, CLONE_NEWNET)  # this thread's only
            except OSError:  # never a request from another namespace: the caller sends it
                outcome["elsewhere"] = True
                return
            finally:
                os.close(ns_fd)
            # It may outlive the call: setns into a mount namespace needs a
            # root and cwd the caller's thread shares with no other.
            with contextlib.suppress(OSError):
                unshare(CLONE_FS)
            try:
                outcome["watch"] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                                                 socket.NETLINK_ROUTE)
                outcome["watch"].bind((0, RTMGRP_LINK))
            except OSError:
                pass  # no watch: the caller waits for the request's end
            finally:
                watching.set()
            with Rtnl() as own:
                answer = _UNBATCHED
                if batched:
                    answer = _call("delete link", name, _delete_batched, own, name,
                                   ignore=ignore)
                outcome["answer"] = answer
                if answer is _UNBATCHED:
                    outcome["answer"] = _request("delete link", name, own, msg, RTM_DELLINK,
                                                 _REQ, ignore=ignore)
        except BaseException as exc:  # raised by the caller when it waits for this
            outcome["error"] = exc
        finally:
            watching.set()
            os.eventfd_write(done, 1)
            finished = _finished
            if finished is not None and finished[0] == os.getpid():
                with contextlib.suppress(OSError):
                    os.eventfd_write(finished[1], 1)

    thread = threading.Thread(target=delete, name="cni-skel delete link")
    try:
        thread.start()
    except RuntimeError:  # no thread to be had: wait here
        os.close(ns_fd)
        os.close(done)
        return _request("delete link", name, ipr, msg, RTM_DELLINK, _REQ, ignore=ignore)
    watching.wait()
    watch = outcome.get("watch")
    try:
        gone = None if watch is None else _unlisted(watch, done, index, wanted)
    finally:
        if watch is not None:
            watch.close()
    if gone is not None:
        linkbatch.unlisted(gone)  # a batch this process leads: the next may go
        _finishing.append((thread, done))
        # The notification is sent while the deletion still holds RTNL (the
        # link's sysfs entry and a veth's peer follow): a request that takes
        # RTNL answers once that is over. RTM_SETLINK of the gone index: ENODEV.
        with contextlib.suppress(CNIError):
            _request("delete link", name, ipr, _link_msg(gone), RTM_SETLINK, _REQ,
                     ignore=(errno.ENODEV,))
        return ()
    _end(thread, done)
    if outcome.get("elsewhere"):
        return _request("delete link", name, ipr, msg, RTM_DELLINK, _REQ, ignore=ignore)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("answer")


_UNBATCHED = ("unbatched",)


def _node_namespace(ns_fd: int) -> bool:
    """Is ``ns_fd`` the namespace this process runs in (a node's, where
    concurrent DELs delete their host ends: `cni_skel.linkbatch`)?"""
    return os.fstat(ns_fd).st_ino == os.stat("/proc/self/ns/net").st_ino


def _delete_batched(own: Rtnl, name: Link | str | int) -> Any:
    """`linkbatch.delete` as a request's answer: ``()`` deleted, raises
    ENODEV when missing, ``_UNBATCHED`` when it could not batch. Only a
    link with a kind (IFLA_INFO_KIND: the kernel's rtnl_link_ops, which a
    group deletion needs) joins a batch."""
    # A `Link` that says its kind is taken at its word (no look-up): its
    # index is gone, or still that link (indexes are not reused).
    link = name if isinstance(name, Link) and name.kind else find_link(own, name)
    if link is None:
        raise NetlinkError(errno.ENODEV)
    if link.kind is None:
        return _UNBATCHED
    deleted = linkbatch.delete(own, link.index)
    if deleted is False:
        raise NetlinkError(errno.ENODEV)
    return _UNBATCHED if deleted is None else ()


def _unlisted(watch: socket.socket, done: int, index: int | None,
              name: str | None) -> int | None:
    """Wait on ``watch`` (RTMGRP_LINK) for the RTM_DELLINK of the link with
    ``index`` or ``name``: its index. None once ``done`` says the request
    ended first (an error, a link already gone), or notifications were lost."""
    while True:
        ready, _, _ = select.select([watch, done], [], [])
        if watch not in ready:
            return None
        try:
            data = watch.recv(65536)
        except OSError:  # ENOBUFS: the request's end decides
            return None
        for msg in _LINK_DELETED.parse(data):
            if msg["header"]["type"] == RTM_DELLINK and (
                    msg["index"] == index or msg.get_attr("IFLA_IFNAME") == name):
                return msg["index"]


def finishing_deletions() -> int:
    """How many link deletions `delete_link` answered early are still
    finishing in the kernel (threads of this process)."""
    return len(_finishing)


def deletions_fd() -> int:
    """A file descriptor that becomes readable when a link deletion
    `delete_link` answered early has finished in the kernel (an eventfd,
    non-blocking, close-on-exec): an event loop polls it and then calls
    `reap_deletions`. Made on the first call in a process (a forked child
    gets its own) and kept open for the process's life."""
    global _finished
    if _finished is None or _finished[0] != os.getpid():
        _finished = (os.getpid(), os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK))
    return _finished[1]


def reap_deletions() -> frozenset[int]:
    """Join the link deletions `delete_link` answered early that have
    finished in the kernel, without waiting for the others; empties
    `deletions_fd`. Returns the thread ids (``native_id``, as listed in
    /proc/self/task) of the deletions still finishing."""
    if _finished is not None and _finished[0] == os.getpid():
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(_finished[1])
    if not _finishing:
        return frozenset()
    ended = set(select.select([done for _, done in _finishing], [], [], 0)[0])
    still = [(thread, done) for thread, done in _finishing if done not in ended]
    for thread, done in _finishing:
        if done in ended:
            _end(thread, done)
    _finishing[:] = still
    return frozenset(thread.native_id for thread, _ in still if thread.native_id is not None)


def wait_deletions() -> None:
    """Wait until the kernel has finished every link deletion `delete_link`
    answered early in this process (a long-lived process calls it before
    it exits or needs to be single-threaded, as the cni-skel worker's
    serving processes do; a process's normal exit waits for them anyway,
    ``os._exit`` does not)."""
    while _finishing:
        _end(*_finishing.pop())


def _end(thread: threading.Thread, done: int) -> None:
    """Join a deletion's ``thread`` (its eventfd ``done`` closed) until the
    kernel no longer lists it."""
    thread.join()
    os.close(done)
    _gone(thread)


def _gone(thread: threading.Thread) -> None:
    """Wait (at most ~0.1 s) until the kernel no longer lists ``thread``:
    ``join`` returns as Python's part of it ends, a moment before the OS
    thread exits, and a process counting its threads (the worker's serving
    process, which steps down when it sees more than one) must see it gone."""
    task = f"/proc/self/task/{thread.native_id}"
    for _ in range(1000):
        if thread.native_id is None or not os.path.exists(task):
            return
        time.sleep(0.0001)


def move_link(ipr: Socket, name: Link | str | int, netns: NetNS, *,
              new_name: str | None = None, netns_ipr: Socket | None = None) -> Link | None:
    """Move a link into another namespace (IFLA_NET_NS_FD); the kernel
    takes it down on the way.

    ``new_name``: rename it there (after the move, so the name is checked
    in ``netns``; the link keeps its old name if the rename fails, and
    stays in ``netns``). ``netns_ipr``: a socket bound to ``netns`` for the
    rename and the answer (one is opened when needed and not given).

    Returns:
        with ``new_name``: the moved `Link` as read in ``netns``; without:
        None (0.1.0's answer; no look-up is made).

    Raises:
        LinkNotFound: (999) no such link in ``ipr``'s namespace.
        LinkExists: (999) the target namespace has a link of that name
            (the old one, or ``new_name``).
        CNIError: 7 for an invalid ``new_name``; 999 for other kernel errors.

    Source: Go ``netlink.LinkSetNsFd`` + ``ip.RenameLink`` (host-device).
    """
    if new_name is not None:
        _check_ifname(new_name)
    if isinstance(name, str) and not _plausible_ifname(name):
        raise LinkNotFound(name)
    if new_name is not None and isinstance(name, int) and not isinstance(name, Link):
        found = find_link(ipr, name)  # its index may change in netns: move it by name
        if found is None:
            raise LinkNotFound(name)
        name = found
    old = name.name if isinstance(name, Link) else name
    _move(ipr, name, netns)
    if new_name is None:
        return None
    with contextlib.ExitStack() as stack:
        if netns_ipr is None:
            netns_ipr = stack.enter_context(netns.rtnl())
        moved = find_link(netns_ipr, old)
        if moved is None:
            raise CNIError(ERR_INTERNAL, f'link "{old}" vanished right after its move')
        if moved.name != new_name:
            link_set(netns_ipr, moved, ifname=new_name)
        return find_link(netns_ipr, moved.index)


def _move(ipr: Socket, name: Link | str | int, netns: NetNS) -> None:
    msg = _link_msg(name)
    msg["attrs"].append(["IFLA_NET_NS_FD", netns.fd])
    try:
        _request("move link", name, ipr, msg, RTM_NEWLINK, _REQ)
    except CNIError as e:
        err = _errno_of(e)
        if err == errno.EEXIST:
            raise LinkExists(name.name if isinstance(name, Link) else str(name)) \
                from e.__cause__
        if err == errno.ENODEV and isinstance(name, str):
            raise LinkNotFound(name) from e.__cause__
        raise


def _echoed(msgs: Any) -> Link | None:
    """The link an NLM_F_ECHO request was answered with (None: not echoed)."""
    for msg in msgs or ():
        if msg["header"]["type"] == RTM_NEWLINK:
            return _link_summary(msg)
    return None


def create_veth_pair(
    ipr: Socket,
    name: str,
    peer_name: str,
    peer_netns: NetNS | None = None,
    mtu: int | None = None,
    mac: str | None = None,
    peer_mac: str | None = None,
    *,
    master: Link | int | None = None,
    peer_ipr: Socket | None = None,
) -> tuple[Link, Link]:
    """Create a veth pair ``name`` <-> ``peer_name`` in ``ipr``'s namespace.

    With ``peer_netns`` the peer is created directly in that namespace
    (VETH_INFO_PEER carrying IFLA_NET_NS_FD), so it never appears in the
    first one. ``mtu`` (bytes) applies to both ends (as Go's netlink does);
    ``mac`` / ``peer_mac`` set the ends' addresses (kernel random otherwise).
    ``master``: enslave ``name`` to that bridge (`Link` or ifindex) in the
    same request. Both ends are left down.

    Returns:
        ``(link, peer)``: the two `Link` objects. The first is the kernel's
        answer to the creation on an `Rtnl`; the peer's is read through
        ``peer_ipr`` (a socket bound to ``peer_netns``; one is opened when
        not given), its ifindex belongs there.

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
    if master is not None:
        kwargs["master"] = link_index(ipr, master)
    kwargs["peer"] = peer
    try:
        answer = _built("create veth", name, ipr, "link", "add", echo=True,
                        marshal=_LINK_SUMMARY, **kwargs)
    except CNIError as e:
        if _errno_of(e) == errno.EEXIST:
            taken = name
            if find_link(ipr, name) is None and (
                    peer_netns is None or _peer_link(peer_netns, peer_ipr, peer_name) is not None):
                taken = peer_name
            raise LinkExists(taken) from e.__cause__
        raise
    link = _echoed(answer)
    if link is None:
        link = find_link(ipr, name)
    elif master is not None:
        # the kernel echoes the new link before it enslaves it
        link = dataclasses.replace(link, master=kwargs["master"])
    if peer_netns is None:
        peer_link = find_link(ipr, peer_name)
    else:
        peer_link = _peer_link(peer_netns, peer_ipr, peer_name)
    if link is None or peer_link is None:
        missing = name if link is None else peer_name
        raise CNIError(ERR_INTERNAL, f'veth "{missing}" vanished right after creation')
    return link, peer_link


def _peer_link(netns: NetNS, pipr: Socket | None, name: str) -> Link | None:
    if pipr is not None:
        return find_link(pipr, name)
    with netns.rtnl() as own:
        return find_link(own, name)


def _create_link(op: str, ipr: Socket, name: str, kind: str, *, netns: NetNS | None,
                 netns_ipr: Socket | None, mtu: int | None, mac: str | None,
                 parent: Link | str | int | None, data: dict[str, Any]) -> Link:
    """Create one link of ``kind`` (RTM_NEWLINK, NLM_F_EXCL), in ``ipr``'s
    namespace or directly in ``netns`` (IFLA_NET_NS_FD: the kernel finds
    ``parent`` in ``ipr``'s namespace and puts the new link in ``netns``,
    which never sees it appear anywhere else). Answers the new `Link` as
    read in the namespace it lives in."""
    _check_ifname(name)
    kwargs: dict[str, Any] = {"ifname": name, "kind": kind, **data}
    if mtu is not None:
        mtu = int(mtu)
        if mtu <= 0:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid MTU {mtu}")
        kwargs["mtu"] = mtu
    if mac is not None:
        kwargs["address"] = _check_mac(mac)
    if parent is not None:
        kwargs["link"] = link_index(ipr, parent)
    if netns is not None:
        kwargs["net_ns_fd"] = netns.fd
    with contextlib.ExitStack() as stack:
        if netns is None:
            netns_ipr = None
        elif netns_ipr is None:
            netns_ipr = stack.enter_context(netns.rtnl())
        try:
            answer = _built(op, name, ipr, "link", "add", echo=netns is None,
                            marshal=_LINK_SUMMARY, **kwargs)
        except CNIError as e:
            if _errno_of(e) == errno.ENODEV and parent is not None:
                raise LinkNotFound(parent) from e.__cause__
            if _errno_of(e) != errno.EEXIST:
                raise
            if netns_ipr is None or find_link(netns_ipr, name) is not None:
                raise LinkExists(name) from e.__cause__
            # Older kernels (Debian 12's 6.1) also refuse a name taken where
            # the request comes from: Go's "kernel bug", why it always makes
            # the link under a temporary name and renames it in the pod.
            return _create_renamed(op, ipr, netns_ipr, name, kind, kwargs)
        link = _echoed(answer) if netns_ipr is None else find_link(netns_ipr, name)
        if link is None and netns_ipr is None:
            link = find_link(ipr, name)
        if link is None:
            raise CNIError(ERR_INTERNAL, f'{kind} "{name}" vanished right after creation')
        return link


_TEMP_TRIES = 10


def _create_renamed(op: str, ipr: Socket, netns_ipr: Socket, name: str, kind: str,
                    kwargs: dict[str, Any]) -> Link:
    """`_create_link` under a free temporary name, renamed ``name`` in the
    target namespace (deleted again when the rename fails)."""
    for _ in range(_TEMP_TRIES):
        temp = "veth" + os.urandom(4).hex()  # Go's ip.RandomVethName
        try:
            _built(op, name, ipr, "link", "add", **{**kwargs, "ifname": temp})
            break
        except CNIError as e:
            if _errno_of(e) != errno.EEXIST:
                raise
    else:
        raise CNIError(ERR_INTERNAL, f'{op} "{name}": no free temporary name')
    link = find_link(netns_ipr, temp)
    if link is None:
        raise CNIError(ERR_INTERNAL, f'{kind} "{temp}" vanished right after creation')
    try:
        link_set(netns_ipr, link, ifname=name)
    except CNIError:
        delete_link(netns_ipr, link)
        raise
    renamed = find_link(netns_ipr, link.index)
    if renamed is None:
        raise CNIError(ERR_INTERNAL, f'{kind} "{name}" vanished right after creation')
    return renamed


def create_macvlan(ipr: Socket, name: str, parent: Link | str | int, *, mode: str = "bridge",
                   netns: NetNS | None = None, netns_ipr: Socket | None = None,
                   mtu: int | None = None, mac: str | None = None,
                   bcqueuelen: int | None = None) -> Link:
    """Create macvlan ``name`` on ``parent`` (a link of ``ipr``'s
    namespace), left down.

    ``mode``: ``"bridge"`` (default), ``"private"``, ``"vepa"``,
    ``"passthru"`` or ``"source"`` (`MACVLAN_MODES`). ``netns``: create it
    directly in that namespace (its parent stays where it is). Go always
    creates it there under a temporary name and renames it, because older
    kernels (Debian 12's 6.1) refuse a name taken in the requesting
    namespace too: here the name is tried first, and only such a refusal
    makes the link under a temporary name, renamed in ``netns``.
    ``netns_ipr``: a socket bound to ``netns`` to read and rename the new
    link with (one is opened when not given). ``mtu``: bytes (the kernel
    refuses more than the parent's); ``mac``: its address (kernel random
    otherwise). ``bcqueuelen``: the length of the queue of broadcast and
    multicast packets waiting for the macvlans of ``parent`` (packets,
    0..2**32-1; IFLA_MACVLAN_BC_QUEUE_LEN, kernels >= 5.11: an older one
    ignores it; None or 0: the kernel's 1000, as Go sends nothing then).

    Returns:
        the new `Link` (its ifindex belongs to the namespace it is in;
        `Link.mode` and `Link.parent` set).

    Raises:
        LinkExists: (999) ``name`` is taken in the target namespace.
        LinkNotFound: (999) no ``parent``.
        CNIError: 7 for an unknown mode, a bad name, MAC, MTU or
            ``bcqueuelen``; 999 for kernel errors (e.g. EINVAL for an MTU
            above the parent's).

    Source: Go ``netlink.Macvlan`` as plugins/main/macvlan creates it
    (``BCQueueLen`` since plugins 1.6).
    """
    if mode not in MACVLAN_MODES:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'unknown macvlan mode "{mode}"')
    data: dict[str, Any] = {"macvlan_mode": mode}
    if bcqueuelen:
        if not isinstance(bcqueuelen, int) or not 0 < bcqueuelen < 2**32:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid bcqueuelen {bcqueuelen!r}: "
                                                       "0..4294967295 packets")
        data["macvlan_bc_queue_len"] = bcqueuelen
    return _create_link("create macvlan", ipr, name, "macvlan", netns=netns,
                        netns_ipr=netns_ipr, mtu=mtu, mac=mac, parent=parent, data=data)


def create_ipvlan(ipr: Socket, name: str, parent: Link | str | int, *, mode: str = "l2",
                  netns: NetNS | None = None, netns_ipr: Socket | None = None,
                  mtu: int | None = None) -> Link:
    """Create ipvlan ``name`` on ``parent``, left down; it shares the
    parent's MAC. ``mode``: ``"l2"`` (default), ``"l3"`` or ``"l3s"``
    (`IPVLAN_MODES`); other arguments, answer and errors as
    `create_macvlan`. The kernel needs CONFIG_IPVLAN (else 999 "operation
    not supported").

    Source: Go ``netlink.IPVlan`` as plugins/main/ipvlan creates it.
    """
    if mode not in IPVLAN_MODES:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'unknown ipvlan mode "{mode}"')
    return _create_link("create ipvlan", ipr, name, "ipvlan", netns=netns,
                        netns_ipr=netns_ipr, mtu=mtu, mac=None, parent=parent,
                        data={"ipvlan_mode": IPVLAN_MODES[mode]})


def create_vlan(ipr: Socket, name: str, parent: Link | str | int, vlan_id: int, *,
                netns: NetNS | None = None, netns_ipr: Socket | None = None,
                mtu: int | None = None) -> Link:
    """Create 802.1Q vlan ``name`` with ID ``vlan_id`` (0..4094) on
    ``parent``, left down; other arguments, answer and errors as
    `create_macvlan` (an ID out of range: code 7; one the parent already
    carries: 999 from the kernel). The kernel needs CONFIG_VLAN_8021Q.

    Source: Go ``netlink.Vlan`` as plugins/main/vlan creates it.
    """
    if isinstance(vlan_id, bool) or not isinstance(vlan_id, int) or not 0 <= vlan_id <= 4094:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f"invalid VLAN ID {vlan_id!r} (must be between 0 and 4094)")
    return _create_link("create vlan", ipr, name, "vlan", netns=netns, netns_ipr=netns_ipr,
                        mtu=mtu, mac=None, parent=parent, data={"vlan_id": vlan_id})


def create_dummy(ipr: Socket, name: str, *, netns: NetNS | None = None,
                 netns_ipr: Socket | None = None, mtu: int | None = None,
                 mac: str | None = None) -> Link:
    """Create dummy link ``name``, left down; arguments, answer and errors
    as `create_macvlan` (no parent, no mode). The kernel needs CONFIG_DUMMY.

    Source: Go ``netlink.Dummy`` as plugins/main/dummy creates it.
    """
    return _create_link("create dummy", ipr, name, "dummy", netns=netns, netns_ipr=netns_ipr,
                        mtu=mtu, mac=mac, parent=None, data={})


def create_tap(ipr: Socket, name: str, *, netns: NetNS | None = None,
               netns_ipr: Socket | None = None, mtu: int | None = None,
               mac: str | None = None, owner: int | None = None, group: int | None = None,
               multi_queue: bool = False, vnet_hdr: bool = False,
               pi: bool = False) -> Link:
    """Create persistent tap device ``name`` (kind ``tun``, IFF_TAP), left
    down, in ``netns`` or, without it, in ``ipr``'s namespace.

    A tap is made by an ioctl on /dev/net/tun, not by netlink: pyroute2's
    tuntap support (its ``kind="tuntap"`` request, handled by
    ``manage_tuntap``) runs from a thread moved into the target namespace
    for that moment. The device is made under a free temporary name
    (``veth`` + 8 hex digits, Go's ``ip.RandomVethName``), then renamed
    ``name`` with its ``mtu`` and ``mac`` in one RTM_NEWLINK: TUNSETIFF on a
    name a tap already has would attach to that tap instead of failing, so
    ``name`` is never handed to it. pyroute2 always sets TUNSETPERSIST: the
    device outlives the creating fd, until deleted (`delete_link`).

    Arguments:
        netns: create it there (``ipr`` is then only where ``netns_ipr`` is
            not given: a socket bound to ``netns``, opened when missing).
        mtu: bytes (68 .. 65521 for a tap; the kernel refuses others).
        mac: its address (kernel random otherwise).
        owner, group: uid / gid allowed to attach to it without
            CAP_NET_ADMIN (TUNSETOWNER / TUNSETGROUP; 0 .. 2**32-2); None:
            none set (any user with CAP_NET_ADMIN).
        multi_queue: IFF_MULTI_QUEUE (several queues, one fd each).
        vnet_hdr: IFF_VNET_HDR (frames carry a virtio-net header).
        pi: keep the packet-information header (no IFF_NO_PI).
        The last three are the flags the device keeps; an opener's own
        TUNSETIFF flags replace IFF_NO_PI and IFF_VNET_HDR (but must agree on
        IFF_MULTI_QUEUE).

    Returns:
        the new `Link` as read in its namespace (kind ``"tun"``).

    Raises:
        LinkExists: (999) ``name`` is taken there; nothing is left.
        CNIError: 7 for a bad name, MAC, MTU, owner or group; 999 for
            kernel errors (EPERM without CAP_NET_ADMIN, ENOENT without
            /dev/net/tun), the device deleted again.

    Source: Go ``netlink.Tuntap`` (``Mode: TUNTAP_MODE_TAP``, ``Owner``,
    ``Group``, ``Flags``) and ``ip tuntap add mode tap`` as Go's
    plugins/main/tap (>= 1.3.0 upstream; not in Debian's 1.1.1) uses them.
    """
    _check_ifname(name)
    if mtu is not None:
        mtu = int(mtu)
        if mtu <= 0:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid MTU {mtu}")
    if mac is not None:
        mac = _check_mac(mac)
    ids: dict[str, int] = {}
    for key, value in (("uid", owner), ("gid", group)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32 - 1:
            what = "owner" if key == "uid" else "group"
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid tap {what} {value!r}: 0..4294967294")
        ids[key] = value
    flags = {"no_pi": int(not pi), "vnet_hdr": int(bool(vnet_hdr)),
             "multi_queue": int(bool(multi_queue))}
    with contextlib.ExitStack() as stack:
        if netns is not None:
            where = netns
            sock = netns_ipr if netns_ipr is not None else stack.enter_context(netns.rtnl())
        else:
            where = stack.enter_context(_socket_netns(ipr))
            sock = ipr
        temp = _free_temp_name(sock, name)
        msg, msg_type, _ = build("link", "add", ifname=temp, kind="tuntap", mode="tap",
                                 ifr=flags, **ids)
        msg["header"]["type"] = msg_type
        msg.encode()
        request = ifinfmsg(msg.data)  # what pyroute2's tuntap handler reads: a parsed one
        request.decode()
        _ids_as_c_int(request)
        try:
            with where.enter():
                manage_tuntap(request)
        except (OSError, NetlinkError) as e:
            raise CNIError(ERR_INTERNAL, f"create tap {name}: {_errmsg(e)}") from e
        link = find_link(sock, temp)
        if link is None:
            raise CNIError(ERR_INTERNAL, f'tap "{temp}" vanished right after creation')
        try:
            link_set(sock, link, ifname=name, mtu=mtu, address=mac)
        except CNIError as e:
            delete_link(sock, link)
            if isinstance(e, LinkExists) or e.__cause__ is None:
                raise
            raise CNIError(e.code, f"create tap {name}: {_errmsg(e.__cause__)}") from e.__cause__
        renamed = find_link(sock, link.index)
        if renamed is None:
            raise CNIError(ERR_INTERNAL, f'tap "{name}" vanished right after creation')
        return renamed


def _ids_as_c_int(request: Any) -> None:
    """pyroute2's tuntap handler hands the uid and gid to ``fcntl.ioctl`` as
    they are, which packs an int as a C int: 2**31 and more overflow. The
    kernel reads TUNSETOWNER/TUNSETGROUP's argument as an unsigned long cut
    to 32 bits, so the same bits as a negative int set the same id."""
    data = request.get_attr("IFLA_LINKINFO").get_attr("IFLA_INFO_DATA")
    for slot in data["attrs"]:
        if slot.name in ("IFTUN_UID", "IFTUN_GID") and slot.value >= 2**31:
            slot.nla["value"] = slot.value - 2**32


def _free_temp_name(ipr: Socket, name: str) -> str:
    """A ``veth<8 hex>`` name no link of ``ipr``'s namespace has."""
    for _ in range(_TEMP_TRIES):
        temp = "veth" + os.urandom(4).hex()  # Go's ip.RandomVethName
        if find_link(ipr, temp) is None:
            return temp
    raise CNIError(ERR_INTERNAL, f'create tap "{name}": no free temporary name')


@contextlib.contextmanager
def _socket_netns(ipr: Socket) -> Any:
    """The namespace ``ipr`` is bound to, as a `NetNS` (SIOCGSKNS)."""
    try:
        fd = fcntl.ioctl(ipr.fileno(), SIOCGSKNS)
    except OSError as e:
        raise CNIError(ERR_INTERNAL, f"netns of the netlink socket: {_errmsg(e)}") from e
    with NetNS("<netlink socket's netns>", fd) as ns:
        yield ns


def create_vrf(ipr: Socket, name: str, table: int, *, netns: NetNS | None = None,
               netns_ipr: Socket | None = None) -> Link:
    """Create VRF device ``name`` bound to routing ``table`` (1..2^32-1),
    left down; in ``netns`` when given (answers and errors as
    `create_macvlan`). Interfaces join it with ``link_set(ipr, iface,
    master=vrf.index)`` (addresses then route in ``table``); ``master=0``
    releases them. The kernel needs CONFIG_NET_VRF.

    Source: Go ``netlink.Vrf`` as plugins/meta/vrf creates it.

    Raises:
        CNIError: 7 for a bad table; 999 as `create_macvlan` (EOPNOTSUPP
            without VRF support).
    """
    if not isinstance(table, int) or not 0 < table < 2**32:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid VRF table {table!r}")
    return _create_link("create vrf", ipr, name, "vrf", netns=netns, netns_ipr=netns_ipr,
                        mtu=None, mac=None, parent=None, data={"vrf_table": table})


def links(ipr: Socket, kind: str | None = None) -> list[Link]:
    """Every link of ``ipr``'s namespace, in ifindex order; with ``kind``
    only those of that IFLA_INFO_KIND (``"veth"``, ``"macvlan"``...). One
    dump.

    Raises:
        CNIError: 999 for kernel errors.
    """
    msgs = _request("list links", "", ipr, ifinfmsg(), RTM_GETLINK, _DUMP,
                    marshal=_LINK_SUMMARY)
    found = [_link_summary(m) for m in msgs if m["header"]["type"] == RTM_NEWLINK]
    return sorted((lk for lk in found if kind is None or lk.kind == kind),
                  key=lambda lk: lk.index)


def default_route_interface(ipr: Socket, family: int = 4) -> Link | None:
    """The link of the main table's first default route of ``family`` (4
    or 6; the one with the lowest metric), or None when there is none, or
    it is multipath (no single link). Go's macvlan/ipvlan take their
    ``master`` from it when the config names none (IPv4).

    Raises:
        CNIError: 999 for kernel errors.

    Source: Go ``getDefaultRouteInterfaceName`` (plugins/main/macvlan).
    """
    fam = 4 if _family(family) == socket.AF_INET else 6
    defaults = [r for r in routes(ipr, fam) if r["dst"].prefixlen == 0 and r["oif"]
                and r["type"] == 1]  # RTN_UNICAST
    if not defaults:
        return None
    best = min(defaults, key=lambda r: r["priority"])
    return find_link(ipr, best["oif"])


# --------------------------------------------------------------------------
# bridges

BRIDGE_VLAN_INFO_PVID = 0x2
BRIDGE_VLAN_INFO_UNTAGGED = 0x4
AF_BRIDGE = 7


def ensure_bridge(ipr: Socket, name: str, *, mtu: int | None = None,
                  vlan_filtering: bool = False) -> Link:
    """Create Linux bridge ``name`` unless it exists; return its `Link`.

    An existing bridge is reused as it is (its MTU is not changed, as Go's
    bridge plugin: ``LinkAdd`` with EEXIST ignored): one RTM_GETLINK. A
    missing one is created (and, on an `Rtnl`, read from the kernel's
    answer). Concurrent callers are fine: losing the creation race is the
    same as finding it. ``mtu`` in bytes. ``vlan_filtering`` creates it with
    IFLA_BR_VLAN_FILTERING (the kernel needs CONFIG_BRIDGE_VLAN_FILTERING,
    else EOPNOTSUPP) and turns it on for an existing bridge.

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
    link = find_link(ipr, name)
    if link is None:
        answer = _built("create bridge", name, ipr, "link", "add", echo=True,
                        ignore=(errno.EEXIST,), **kwargs)
        link = _echoed(answer) or find_link(ipr, name)
    if link is None:
        raise CNIError(ERR_INTERNAL, f'bridge "{name}" vanished right after creation')
    if link.kind != "bridge":
        raise CNIError(ERR_INTERNAL, f'"{name}" already exists but is not a bridge')
    if vlan_filtering:
        _built("enable VLAN filtering on", name, ipr, "link", "set", index=link.index,
               kind="bridge", br_vlan_filtering=1)
    return link


def bridge_port(ipr: Socket, name: Link | str | int) -> dict | None:
    """Bridge-port settings of an enslaved link: ``{hairpin, isolated}``
    (bools), or None when the link is not a bridge port (or missing)."""
    if isinstance(name, str) and not _plausible_ifname(name):
        return None
    msgs = _request("get link", name, ipr, _link_msg(name), RTM_GETLINK, NLM_F_REQUEST,
                    ignore=(errno.ENODEV,))
    if not msgs:
        return None
    data = msgs[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA")
    if msgs[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_KIND") != "bridge" or data is None:
        return None
    return {
        "hairpin": bool(data.get("IFLA_BRPORT_MODE")),
        "isolated": bool(data.get("IFLA_BRPORT_ISOLATED")),
    }


def bridge_port_set(ipr: Socket, name: Link | str | int, *, hairpin: bool | None = None,
                    isolated: bool | None = None) -> None:
    """Set bridge-port flags of a link enslaved to a bridge (IFLA_BRPORT_MODE
    for hairpin, IFLA_BRPORT_ISOLATED); None leaves a flag as it is. (To
    bring the port up in the same request: `link_set` with ``hairpin``,
    ``isolated`` and ``up``.)

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors (e.g. the link
        is not a bridge port).
    """
    info = _brport_info(hairpin=hairpin, isolated=isolated)
    if info is None:
        return
    msg = _link_msg(link_index(ipr, name))
    msg["attrs"].append(info)
    _request("set bridge port flags on", name, ipr, msg, RTM_NEWLINK, _REQ)


def bridge_vlans(ipr: Socket, name: Link | str | int) -> list[tuple[int, bool, bool]]:
    """VLANs of a bridge port as ``(vid, pvid, untagged)``, sorted by vid
    (empty when VLAN filtering is off or the link is missing)."""
    index = _index_or_none(ipr, name)
    if index is None:
        return []
    msg = ifinfmsg()
    msg["family"] = AF_BRIDGE
    msg["attrs"].append(["IFLA_EXT_MASK", RTEXT_FILTER_BRVLAN])
    msgs = _request("list VLANs of", name, ipr, msg, RTM_GETLINK, _DUMP)
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


def bridge_vlan_add(ipr: Socket, name: Link | str | int, vid: int, *, pvid: bool = False,
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
    _built(f"add VLAN {vid} to", name, ipr, "vlan_filter", "add", index=index,
           vlan_info={"vid": int(vid), "flags": flags})


def bridge_vlan_del(ipr: Socket, name: Link | str | int, vid: int) -> None:
    """Remove VLAN ``vid`` from a bridge port (missing is fine)."""
    index = link_index(ipr, name)
    _built(f"delete VLAN {vid} from", name, ipr, "vlan_filter", "del", index=index,
           vlan_info={"vid": int(vid)}, ignore=(errno.ENOENT, errno.EINVAL))


def wait_operstate(ipr: Socket, name: Link | str | int, state: str = "UP", *,
                   delays: tuple[float, ...] = (0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032,
                                                0.064, 0.128, 0.25, 0.5, 1, 0.6)) -> Link:
    """Poll link ``name`` until its operstate is ``state``; return its `Link`.

    ``delays``: seconds slept before each look. Go's bridge plugin waits
    0/50/500/1000/1000 ms for the host veth to come up; the default gives up
    after about as long (2.6 s), but looks again after 1, 2, 4... ms: the
    kernel's link watcher sets a veth UP within a few ms of its peer, and a
    first sleep of 50 ms was the tail of a bridge ADD under load.

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


def address_flags(ipr: Socket, name: Link | str | int,
                  family: int | None = None) -> list[tuple[IPInterface, int]]:
    """Addresses on a link with their IFA_F_* flags (IFA_FLAGS, else the
    8-bit header field): ``(ip_interface, flags)``, in kernel (dump) order.
    One dump (plus a look-up for a name). 0x40 IFA_F_TENTATIVE: duplicate
    address detection still running; 0x08 IFA_F_DADFAILED: a duplicate.

    Raises:
        LinkNotFound: (999); CNIError: 7 for a bad family, 999 for kernel
        errors.
    """
    index = link_index(ipr, name)
    fam = _family(family)
    msg = ifaddrmsg()
    msg["family"] = fam
    if _strict(ipr):
        msg["index"] = index  # the kernel dumps this link's only
    msgs = _request("list addresses of", name, ipr, msg, RTM_GETADDR, _DUMP)
    out: list[tuple[IPInterface, int]] = []
    for msg in msgs:
        if msg["index"] != index or (fam and msg["family"] != fam):
            continue
        addr = msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS")
        if addr is None:
            continue
        flags = msg.get("IFA_FLAGS") or msg["flags"]
        out.append((ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}"), flags))
    return out


def addresses(ipr: Socket, name: Link | str | int,
              family: int | None = None) -> list[IPInterface]:
    """Addresses on a link, in kernel (dump) order, as ip_interface objects.

    ``family`` restricts to IPv4 or IPv6. IPv6 link-local addresses are
    included. For point-to-point addresses the local side is returned.

    Raises:
        LinkNotFound: (999); CNIError: 999 for kernel errors.
    """
    return [iface for iface, _flags in address_flags(ipr, name, family)]


def _addr_msg(index: int, iface: IPInterface) -> Any:
    # What pyroute2's address filters make of index/address/prefixlen/family:
    # IFA_LOCAL beside IFA_ADDRESS for IPv4.
    msg = ifaddrmsg()
    msg["index"] = index
    msg["family"] = socket.AF_INET if iface.version == 4 else socket.AF_INET6
    msg["prefixlen"] = iface.network.prefixlen
    if iface.version == 4:
        msg["attrs"].append(["IFA_LOCAL", str(iface.ip)])
    msg["attrs"].append(["IFA_ADDRESS", str(iface.ip)])
    return msg


def add_address(
    ipr: Socket, name: Link | str | int, ip: IPInterface | str, *, nodad: bool = False
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
    msg = _addr_msg(index, iface)
    if iface.version == 4 and iface.network.prefixlen < 31:
        msg["attrs"].append(["IFA_BROADCAST", str(iface.network.broadcast_address)])
    if nodad:
        msg["attrs"].append(["IFA_FLAGS", IFA_F_NODAD])
    result = _request(f"add address {iface} to", name, ipr, msg, RTM_NEWADDR,
                      _REQ | NLM_F_CREATE | NLM_F_EXCL, ignore=(errno.EEXIST,))
    return result is not None


def del_address(
    ipr: Socket, name: Link | str | int, ip: IPInterface | str, missing_ok: bool = True
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
    result = _request(f"delete address {iface} from", name, ipr, _addr_msg(index, iface),
                      RTM_DELADDR, _REQ, ignore=ignore)
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


def _route_spec(ipr: Socket, dst: Any, gw: Any, dev: Link | str | int | None) -> dict[str, Any]:
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


def _attrs(msg: Any) -> Callable[[str], Any]:
    """``value(NLA name)`` of a message, None when absent: one pass over the
    attributes (pyroute2's ``get`` walks them per name); a value is decoded
    only when read."""
    attrs = {slot.cell[0]: slot for slot in msg["attrs"]}  # pyroute2's nla_slot: (name, nla)

    def value(name: str) -> Any:
        slot = attrs.get(name)
        return None if slot is None else slot[1]

    return value


def _route_dict(msg: Any, value: Callable[[str], Any]) -> dict[str, Any]:
    """A route message (``value``: its `_attrs`) as `routes` answers it."""
    mfam = msg["family"]

    zero = "0.0.0.0" if mfam == socket.AF_INET else "::"
    dst = ipaddress.ip_network(f"{value('RTA_DST') or zero}/{msg['dst_len']}", strict=False)
    gw = value("RTA_GATEWAY")
    src = value("RTA_PREFSRC")
    mtu = advmss = None
    metrics = value("RTA_METRICS")
    if metrics is not None:
        mtu = metrics.get("RTAX_MTU")
        advmss = metrics.get("RTAX_ADVMSS")
    return {
        "dst": dst,
        "gw": ipaddress.ip_address(gw) if gw else None,
        "oif": value("RTA_OIF"),
        "table": value("RTA_TABLE") or msg["table"],
        "scope": msg["scope"],
        "priority": value("RTA_PRIORITY") or 0,
        "family": 4 if mfam == socket.AF_INET else 6,
        "proto": msg["proto"],
        "type": msg["type"],
        "src": ipaddress.ip_address(src) if src else None,
        "mtu": mtu,
        "advmss": advmss,
    }


def routes(
    ipr: Socket, family: int | None = None, table: int | None = RT_TABLE_MAIN
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
    msg = rtmsg()
    # family 255: the kernel dumps every family (pyroute2's documented trick)
    msg["family"] = fam or 255
    if table is not None and _strict(ipr):
        msg["attrs"].append(["RTA_TABLE", table])  # the kernel dumps this table's only
    # ENOENT: a strict dump of a table this family has never had a route in
    msgs = _request("list routes", f"(table {table})", ipr, msg, RTM_GETROUTE, _DUMP,
                    ignore=(errno.ENOENT,)) or []
    out = []
    for msg in msgs:
        mfam = msg["family"]
        if mfam not in (socket.AF_INET, socket.AF_INET6) or (fam and mfam != fam):
            continue
        value = _attrs(msg)
        if table is not None and (value("RTA_TABLE") or msg["table"]) != table:
            continue
        out.append(_route_dict(msg, value))
    return out


def route_get(ipr: Socket, dst: str | IPAddress) -> dict | None:
    """The route the kernel picks for ``dst`` (RTM_GETROUTE, ``ip route
    get``), shaped as a `routes` entry (``oif`` the output ifindex), or None
    when there is none (ENETUNREACH, EHOSTUNREACH).

    Raises:
        CNIError: 7 for an unparsable address, 999 for kernel errors.
    """
    try:
        addr = ipaddress.ip_address(dst)
    except ValueError as e:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid IP address "{dst}"') from e
    msg = rtmsg()
    msg["family"] = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    msg["dst_len"] = addr.max_prefixlen
    msg["attrs"].append(["RTA_DST", str(addr)])
    msgs = _request("get route to", str(addr), ipr, msg, RTM_GETROUTE, NLM_F_REQUEST,
                    ignore=(errno.ENETUNREACH, errno.EHOSTUNREACH))
    return _route_dict(msgs[0], _attrs(msgs[0])) if msgs else None


def add_route(
    ipr: Socket,
    dst: str | IPNetwork,
    gw: str | IPAddress | None = None,
    dev: Link | str | int | None = None,
    mtu: int | None = None,
    advmss: int | None = None,
    priority: int | None = None,
    table: int | None = None,
    scope: int | str | None = None,
    src: str | IPAddress | None = None,
    proto: int | str = "boot",
    *,
    replace: bool = False,
) -> bool:
    """Add a unicast route (proto boot by default, as Go's netlink and iproute2).

    ``dst``: a network (``"10.2.0.0/16"``; host bits are masked off; a bare
    address is a host route; ``"default"`` with a gateway). ``gw``: next hop;
    ``dev``: output link (`Link`, ifindex or name). ``mtu``/``advmss`` in
    bytes (route metrics). ``priority``: metric. ``table``: 254 (main) when
    None. ``scope``: int or "universe"/"link"/"host"/"site"; None leaves the
    kernel default (universe), as Go's ``ip.AddRoute`` does. ``src``: the
    preferred source address (RTA_PREFSRC, Go's ``Route.Src``; an address
    of this host, same family as ``dst``). ``proto``: who made the route, a
    number or a name of /etc/iproute2/rt_protos ("boot", "static",
    "kernel", ...). ``replace``: a route of the same dst/metric/table is
    replaced (``ip route replace``, Go's ``netlink.RouteReplace``) instead
    of kept.

    Idempotent: an identical route (EEXIST) returns False; True when added
    (always True with ``replace``). Note EEXIST means "same dst/metric/table
    exists", possibly with another gateway.

    Raises:
        LinkNotFound: (999) ``dev`` missing.
        CNIError: 7 for bad dst/gw/scope, 999 for kernel errors (e.g.
        ENETUNREACH for a gateway not reachable on-link).
    """
    spec = _route_spec(ipr, dst, gw, dev)
    spec["proto"] = proto
    if src is not None and src != "":
        try:
            prefsrc = ipaddress.ip_address(src)
        except ValueError as e:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid route source "{src}"') from e
        if (prefsrc.version == 4) != (spec["family"] == socket.AF_INET):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f'route source "{prefsrc}" does not match route destination "{dst}"')
        spec["prefsrc"] = str(prefsrc)
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
    result = _built("add route", _route_target(spec, gw, dev), ipr, "route",
                    "replace" if replace else "add", ignore=(errno.EEXIST,), **spec)
    return result is not None


def add_listed_route(ipr: Socket, route: dict, dev: Link | str | int, *,
                     table: int | None = None, replace: bool = True) -> bool:
    """Add ``route``, a route as `routes` lists it, through ``dev`` into
    ``table`` (main when None): its dst, gateway, metrics (mtu, advmss),
    priority, scope, preferred source and proto are kept. What moving a
    route between tables, or putting back what the kernel dropped with a
    link's addresses (a VRF joined or left), needs. ``replace`` as in
    `add_route` (default True: the copy wins over a route of the same
    dst/metric there).

    Raises:
        LinkNotFound, CNIError: as `add_route`.
    """
    return add_route(ipr, route["dst"], gw=route.get("gw"), dev=dev, mtu=route.get("mtu"),
                     advmss=route.get("advmss"), priority=route.get("priority") or None,
                     table=table, scope=route.get("scope"), src=route.get("src"),
                     proto=route.get("proto") or "boot", replace=replace)


def del_route(
    ipr: Socket,
    dst: str | IPNetwork,
    gw: str | IPAddress | None = None,
    dev: Link | str | int | None = None,
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
    result = _built("delete route", _route_target(spec, gw, dev), ipr, "route", "del",
                    ignore=ignore, **spec)
    return result is not None


def _route_target(spec: dict[str, Any], gw: Any, dev: Any) -> str:
    text = spec["dst"]
    if gw is not None and gw != "":
        text += f" via {gw}"
    if dev is not None:
        text += f" dev {dev.name if isinstance(dev, Link) else dev}"
    return text


# --------------------------------------------------------------------------
# policy routing (ip rule)

#: FR_ACT_* (linux/fib_rules.h) by iproute2's names for them.
_RULE_ACTIONS = {1: "lookup", 2: "goto", 3: "nop", 6: "blackhole", 7: "unreachable",
                 8: "prohibit"}
_FR_ACT_TO_TBL = 1


@dataclasses.dataclass(frozen=True)
class Rule:
    """One policy-routing rule (``ip rule``) as the kernel reported it
    (RTM_NEWRULE), the typed answer of `rules` (Go: ``netlink.Rule``).

    Attributes:
        family: 4 or 6.
        priority: the rule's preference (lower matches first); the kernel
            picks one when a rule is added without it.
        table: the routing table it looks up (RT_TABLE_MAIN 254, ...;
            0 for rules that look up nothing: ``blackhole``, ...).
        action: iproute2's word for it: ``"lookup"``, ``"goto"``,
            ``"nop"``, ``"blackhole"``, ``"unreachable"``, ``"prohibit"``.
        src, dst: the selector's networks (None: any), e.g.
            ``IPv4Network("10.1.0.5/32")``.
        iifname, oifname: the selector's interfaces (None: any).
        fwmark, fwmask: the selector's firewall mark and its mask (None: any).
        l3mdev: the rule looks up the table of the packet's VRF (``ip rule
            add l3mdev``; the kernel adds one at priority 1000 when the
            first VRF appears).
    """

    family: int
    priority: int
    table: int
    action: str = "lookup"
    src: IPNetwork | None = None
    dst: IPNetwork | None = None
    iifname: str | None = None
    oifname: str | None = None
    fwmark: int | None = None
    fwmask: int | None = None
    l3mdev: bool = False


def _rule_of(msg: Any) -> Rule | None:
    mfam = msg["family"]
    if mfam not in (socket.AF_INET, socket.AF_INET6):
        return None
    value = _attrs(msg)

    def net(attr: str, length: int) -> IPNetwork | None:
        addr = value(attr)
        return None if addr is None else ipaddress.ip_network(f"{addr}/{length}", strict=False)

    return Rule(family=4 if mfam == socket.AF_INET else 6,
                priority=value("FRA_PRIORITY") or 0,
                table=value("FRA_TABLE") or msg["table"],
                action=_RULE_ACTIONS.get(msg["action"], str(msg["action"])),
                src=net("FRA_SRC", msg["src_len"]), dst=net("FRA_DST", msg["dst_len"]),
                iifname=value("FRA_IIFNAME"), oifname=value("FRA_OIFNAME"),
                fwmark=value("FRA_FWMARK"), fwmask=value("FRA_FWMASK"),
                l3mdev=bool(value("FRA_L3MDEV")))


def rules(ipr: Socket, family: int | None = None, table: int | None = None) -> list[Rule]:
    """The namespace's policy-routing rules (``ip rule list``), both
    families unless ``family``; only those looking up ``table`` when given.
    In the kernel's order (by priority within a family).

    Raises:
        CNIError: 999 for kernel errors.
    """
    fam = _family(family)
    msg = fibmsg()
    msg["family"] = fam  # AF_UNSPEC dumps every family's rules
    msgs = _request("list rules", f"(family {family or 'all'})", ipr, msg, RTM_GETRULE,
                    _DUMP) or []
    out = []
    for m in msgs:
        rule = _rule_of(m)
        if rule is not None and (not fam or _family(rule.family) == fam) \
                and (table is None or rule.table == table):
            out.append(rule)
    return out


def _rule_msg(table: int | None, src: Any, dst: Any, priority: int | None,
              iifname: str | None, oifname: str | None, fwmark: int | None,
              fwmask: int | None, family: int | None) -> Any:
    """An RTM_*RULE message for `add_rule` / `del_rule` (code 7 for bad values)."""
    nets = {}
    for key, value in (("src", src), ("dst", dst)):
        if value is None or value == "":
            continue
        try:
            nets[key] = ipaddress.ip_network(value, strict=False)
        except (ValueError, TypeError) as e:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid rule {key} "{value}"') from e
    versions = {n.version for n in nets.values()}
    if family is not None:
        versions.add(4 if _family(family) == socket.AF_INET else 6)
    if len(versions) != 1:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "a rule needs one address family: "
                       "give src/dst of the same family, or family 4 or 6")
    (version,) = versions
    msg = fibmsg()
    msg["family"] = socket.AF_INET if version == 4 else socket.AF_INET6
    msg["action"] = _FR_ACT_TO_TBL
    if table is not None:
        if not 0 < int(table) < 2**32:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid routing table {table}")
        msg["table"] = int(table) if int(table) < 256 else 252  # RT_TABLE_COMPAT
        msg["attrs"].append(["FRA_TABLE", int(table)])
    for key, attr in (("src", "FRA_SRC"), ("dst", "FRA_DST")):
        if key in nets:
            msg[f"{key}_len"] = nets[key].prefixlen
            msg["attrs"].append([attr, str(nets[key].network_address)])
    for attr, value in (("FRA_PRIORITY", priority), ("FRA_IIFNAME", iifname),
                        ("FRA_OIFNAME", oifname), ("FRA_FWMARK", fwmark),
                        ("FRA_FWMASK", fwmask)):
        if value is not None:
            msg["attrs"].append([attr, value])
    return msg


def add_rule(ipr: Socket, table: int, *, src: str | IPNetwork | IPAddress | None = None,
             dst: str | IPNetwork | IPAddress | None = None, priority: int | None = None,
             iifname: str | None = None, oifname: str | None = None,
             fwmark: int | None = None, fwmask: int | None = None,
             family: int | None = None) -> bool:
    """Add a rule looking up ``table`` for packets matching the selector
    (``ip rule add from SRC lookup TABLE``; Go: ``netlink.RuleAdd``).

    ``src`` / ``dst``: a network or a bare address (a /32 or /128 then);
    ``family`` (4 or 6) is needed only when neither is given. ``priority``:
    None lets the kernel pick (just above the lowest-priority existing rule
    that is not priority 0, as for Go's ``netlink.NewRule()``).

    Returns True when added, False when the kernel already had an identical
    rule (EEXIST, which the kernel checks only when ``priority`` is given).

    Raises:
        CNIError: 7 for bad values (no family, mixed families, table 0),
            999 for kernel errors.
    """
    msg = _rule_msg(table, src, dst, priority, iifname, oifname, fwmark, fwmask, family)
    target = f"from {src or 'all'}" + (f" to {dst}" if dst else "") + f" lookup {table}"
    return _request("add rule", target, ipr, msg, RTM_NEWRULE,
                    _REQ | NLM_F_CREATE | NLM_F_EXCL, ignore=(errno.EEXIST,)) is not None


def del_rule(ipr: Socket, rule: Rule, *, missing_ok: bool = True) -> bool:
    """Delete ``rule`` (as `rules` answered it): the kernel deletes the first
    rule matching its priority, table and selector.

    Returns True when deleted; a rule already gone (ENOENT) returns False
    with ``missing_ok`` (default).

    Raises:
        CNIError: 999 for kernel errors (the rule gone, without ``missing_ok``).
    """
    msg = _rule_msg(rule.table or None, rule.src, rule.dst, rule.priority, rule.iifname,
                    rule.oifname, rule.fwmark, rule.fwmask, rule.family)
    msg["action"] = next((k for k, v in _RULE_ACTIONS.items() if v == rule.action),
                         _FR_ACT_TO_TBL)
    if rule.l3mdev:
        msg["attrs"].append(["FRA_L3MDEV", 1])
    target = f"from {rule.src or 'all'} lookup {rule.table} (priority {rule.priority})"
    ignore = (errno.ENOENT,) if missing_ok else ()
    return _request("delete rule", target, ipr, msg, RTM_DELRULE, _REQ,
                    ignore=ignore) is not None
