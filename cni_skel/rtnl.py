"""`Rtnl`: a synchronous rtnetlink socket, and pyroute2 request building.

`Rtnl` is a `cni_skel.nlsock.NetlinkSocket` of NETLINK_ROUTE whose answers
pyroute2's ``MarshalRtnl`` parses. Every `cni_skel.netlink` helper takes it
where it takes a pyroute2 ``IPRoute`` (same answers, same errors), at about
half the CPU per request: no asyncio loop, GETs without an extra ACK, and
NLM_F_ECHO answering a creation with the created link. Get one bound to a
namespace with `cni_skel.netns.NetNS.rtnl`, for the calling thread's
namespace with ``Rtnl()``; close it when done (context manager).

Requests are pyroute2 messages (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``...).
`build` fills one from pyroute2-style keywords (``ifname="v0",
kind="veth", peer={...}``, ``dst="10.0.0.0/8", gateway=...``) with
pyroute2's own request filters (``pyroute2.requests``), the code behind
``IPRoute.link`` / ``.addr`` / ``.route``; `Rtnl.link`, `Rtnl.addr` and
`Rtnl.route` send what it builds.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from pyroute2.netlink import (
    NLA_F_NESTED,
    NLA_F_NET_BYTEORDER,
    NLM_F_ACK,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_ECHO,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    nla_slot,
)
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELROUTE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    RTM_SETLINK,
    rt_proto,
    rt_type,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl
from pyroute2.netlink.rtnl.rtmsg import IP6_RT_PRIO_USER, rtmsg
from pyroute2.requests.address import AddressFieldFilter, AddressIPRouteFilter
from pyroute2.requests.bridge import BridgeFieldFilter, BridgeIPRouteFilter
from pyroute2.requests.link import LinkFieldFilter, LinkIPRouteFilter
from pyroute2.requests.main import RequestProcessor
from pyroute2.requests.route import RouteFieldFilter, RouteIPRouteFilter

from .nlsock import DEFAULT_TIMEOUT, NetlinkSocket

__all__ = ["COMMANDS", "GET", "Rtnl", "build"]

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12
#: rtnetlink.h: the multicast group of link notices (RTM_NEWLINK/RTM_DELLINK).
RTMGRP_LINK = 1
#: sockios.h: the ioctl giving a socket's network namespace as an fd.
SIOCGSKNS = 0x894C
_REQ = NLM_F_REQUEST | NLM_F_ACK
#: Flags of a GET: one answer, no ACK.
GET = NLM_F_REQUEST
_DUMP = NLM_F_REQUEST | NLM_F_DUMP
_CREATE = _REQ | NLM_F_CREATE | NLM_F_EXCL

#: kind -> command -> (message type, NLM_F_* flags): what `build` knows.
COMMANDS: dict[str, dict[str, tuple[int, int]]] = {
    "link": {"add": (RTM_NEWLINK, _CREATE), "set": (RTM_NEWLINK, _REQ),
             "del": (RTM_DELLINK, _REQ), "get": (RTM_GETLINK, GET),
             "dump": (RTM_GETLINK, _DUMP)},
    "addr": {"add": (RTM_NEWADDR, _CREATE), "replace": (RTM_NEWADDR, _REQ | NLM_F_REPLACE
                                                        | NLM_F_CREATE),
             "del": (RTM_DELADDR, _REQ), "dump": (RTM_GETADDR, _DUMP)},
    "route": {"add": (RTM_NEWROUTE, _CREATE),
              "replace": (RTM_NEWROUTE, _REQ | NLM_F_REPLACE | NLM_F_CREATE),
              "append": (RTM_NEWROUTE, _REQ | NLM_F_CREATE | NLM_F_APPEND),
              "del": (RTM_DELROUTE, _REQ), "get": (RTM_GETROUTE, GET),
              "dump": (RTM_GETROUTE, _DUMP)},
    # IPRoute.vlan_filter: bridge port VLANs (AF_BRIDGE)
    "vlan_filter": {"add": (RTM_SETLINK, _REQ), "del": (RTM_DELLINK, _REQ)},
}
_MESSAGES = {"link": ifinfmsg, "addr": ifaddrmsg, "route": rtmsg, "vlan_filter": ifinfmsg}
AF_BRIDGE = 7
_NLA_TYPE_MASK = ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
_NLA_HEADER = struct.Struct("HH")


def _filters(kind: str, command: str) -> tuple[Any, ...]:
    # pyroute2's filter pairs for IPRoute.link / .addr / .route
    if kind == "link":
        return LinkFieldFilter(), LinkIPRouteFilter(command)
    if kind == "addr":
        return AddressFieldFilter(), AddressIPRouteFilter(command)
    if kind == "vlan_filter":
        return BridgeFieldFilter(), BridgeIPRouteFilter(command)
    return (RouteFieldFilter(add_defaults=command not in ("dump", "show")),
            RouteIPRouteFilter(command))


def build(kind: str, command: str, /, *, strict_check: bool = False,
          **kwargs: Any) -> tuple[Any, int, int]:
    """``(message, message type, flags)`` for ``IPRoute.<kind>(command,
    **kwargs)``: ``kind`` "link", "addr", "route" or "vlan_filter", ``command`` one of
    `COMMANDS` [kind]. Keywords are pyroute2's (IFLA_/IFA_/RTA_ names in
    lower case, message fields, and its shortcuts such as ``kind`` /
    ``peer`` / ``master`` for links, ``dst="net/len"`` / ``metrics`` for
    routes); pyroute2's request filters turn them into the message, as
    ``IPRoute`` does (a route's add, replace, append or del with the plain
    values `cni_skel.netlink` passes is filled in directly, to the same
    bytes, at half the CPU: `_route_message`). A route to add defaults to
    proto "static", type "unicast", as with ``IPRoute.route``. A dump takes
    message fields only (``family``, ...). ``strict_check``: for a socket with
    NETLINK_GET_STRICT_CHK on (`Rtnl.strict_check`), whose GET headers the
    kernel checks (as pyroute2's ``IPRoute(strict_check=True)``).

    Raises:
        KeyError: unknown kind or command.
        ValueError, TypeError: pyroute2 refused a value.
    """
    msg_type, flags = COMMANDS[kind][command]
    if command == "dump":
        msg = _MESSAGES[kind]()
        for key, value in kwargs.items():
            msg[key] = value
        return msg, msg_type, flags
    if kind == "route" and command in ("add", "replace", "append"):
        kwargs.setdefault("proto", "static")
        kwargs.setdefault("type", "unicast")
    if kind == "route" and command != "get":
        msg = _route_message(kwargs, strict_check)
        if msg is not None:
            return msg, msg_type, flags
    return _filtered(kind, command, strict_check, kwargs), msg_type, flags


def _filtered(kind: str, command: str, strict_check: bool, kwargs: dict[str, Any]) -> Any:
    """The message pyroute2's request filters make of ``kwargs``."""
    msg = _MESSAGES[kind]()
    if kind == "vlan_filter":
        kwargs["family"] = AF_BRIDGE
    request = RequestProcessor(context=kwargs, prime=kwargs)
    if kind == "route":
        request.set_parameter("strict_check", strict_check)
    for request_filter in _filters(kind, command):
        request.add_filter(request_filter)
    request.finalize()
    # As pyroute2's NetlinkRequest: fields first, every other key an NLA.
    for name, _fmt in msg.fields:
        msg[name] = request.get_value(name, default=0, mode="field")
    for key, value in request.items():
        nla = msg.name2nla(key)
        if value is not None and msg.valid_nla(nla):
            msg["attrs"].append([nla, value])
    return msg


#: Route keywords `_route_message` takes: those `cni_skel.netlink`'s route
#: helpers pass (with `build`'s proto and type defaults).
_ROUTE_NLAS = {"dst": "RTA_DST", "gateway": "RTA_GATEWAY", "oif": "RTA_OIF",
               "prefsrc": "RTA_PREFSRC", "priority": "RTA_PRIORITY", "table": "RTA_TABLE",
               "metrics": "RTA_METRICS"}
_ROUTE_FIELDS = ("family", "proto", "type", "scope")
_ROUTE_KEYS = frozenset(_ROUTE_NLAS) | frozenset(_ROUTE_FIELDS)
_ROUTE_METRICS = {"mtu": "RTAX_MTU", "advmss": "RTAX_ADVMSS"}


def _route_message(kwargs: dict[str, Any], strict_check: bool) -> Any:
    """The ``rtmsg`` pyroute2's route filters would build from ``kwargs``
    (the same bytes once encoded: tests/test_netns_netlink.py compares them),
    filled in directly: the filters cost ~60 µs a request, as much as
    encoding the message. None for anything but plain values of the keys
    in `_ROUTE_NLAS` and `_ROUTE_FIELDS` (the filters then build it)."""
    family = kwargs.get("family")
    dst = kwargs.get("dst")
    if (family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(dst, str)
            or not kwargs.keys() <= _ROUTE_KEYS):
        return None
    address, _, length = dst.partition("/")
    if not length.isdigit() or not address:
        return None
    msg = rtmsg()
    msg["family"] = family
    msg["dst_len"] = int(length)
    for name, names in (("proto", rt_proto), ("type", rt_type), ("scope", {})):
        value = kwargs.get(name)
        if isinstance(value, str):
            value = names.get(value)  # other names: the filters read /etc/iproute2
            if value is None:
                return None
        elif value is not None and not isinstance(value, int):
            return None
        msg[name] = value or 0
    table = kwargs.get("table")
    if table is not None and (not isinstance(table, int) or table <= 0):
        return None
    # as pyroute2's RouteIPRouteFilter.get_table: RTA_TABLE carries the table
    msg["table"] = 0 if strict_check else table if table and table < 255 else 254
    attrs = msg["attrs"]
    for key, value in kwargs.items():
        nla = _ROUTE_NLAS.get(key)
        if nla is None or value is None or value == "":
            continue
        if key == "dst":
            if msg["dst_len"] == 0:
                continue  # a default route: the family alone
            value = address
        elif key == "priority":
            if not isinstance(value, int):
                return None
            if value == 0 and family == socket.AF_INET6:
                value = IP6_RT_PRIO_USER  # what the kernel makes of metric 0
        elif key == "metrics":
            if not isinstance(value, dict) or not value.keys() <= _ROUTE_METRICS.keys():
                return None
            value = {"attrs": [[_ROUTE_METRICS[k], v] for k, v in value.items()
                               if v is not None]}
            if not value["attrs"]:
                continue
        elif not isinstance(value, int if key in ("oif", "table") else str):
            return None
        attrs.append([nla, value])
    return msg


class PartialIfinfmsg(ifinfmsg):
    """An ``ifinfmsg`` that decodes only the attributes a subclass names in
    ``_KEEP`` (IFLA_* names). pyroute2 makes an object of each of the ~40
    attributes a link carries (stats, AF_SPEC, ...), ~0.15 ms a link; a
    reader that needs a few pays for those few. The kept ones are decoded
    by pyroute2's own classes, from its compiled table; a pyroute2 without
    that table (or without one of the names) decodes them all."""

    _KEEP: tuple[str, ...] = ()
    _keep: dict[int, Any] | None = None

    def _table(self) -> dict[int, Any] | None:
        cls = type(self)
        if cls.__dict__.get("_keep") is None:
            # pyroute2's table, compiled when the first message was made
            table = getattr(cls, "_nlmsg_base__t_nla_map", None)
            if not isinstance(table, dict):
                return None
            cls._keep = {t: prime for t, prime in table.items()
                         if isinstance(t, int) and prime.get("name") in cls._KEEP}
        return cls._keep

    def decode_nlas(self, offset: int) -> None:
        if not self._KEEP:
            return None
        keep = self._table()
        if keep is None or len(keep) != len(self._KEEP):
            return super().decode_nlas(offset)
        data, end, attrs = self.data, self.offset + self.length, self["attrs"]
        while offset <= end - 4:
            length, nla_type = _NLA_HEADER.unpack_from(data, offset)
            length = min(max(length, 4), end - offset)
            prime = keep.get(nla_type & _NLA_TYPE_MASK)
            if prime is not None:  # as pyroute2's decode_nlas does it
                nla = prime["class"](data=data, offset=offset, parent=self, length=length,
                                     init=prime["init"])
                nla._nla_array = prime["nla_array"]
                nla._nla_flags = nla_type & ~_NLA_TYPE_MASK
                attrs.append(nla_slot(prime["name"], nla))
            offset += (length + 3) & ~3


def link_marshal(msg_class: type, msg_type: int = RTM_NEWLINK) -> Marshal:
    """A parser of link messages (answers, or ``msg_type`` notifications)
    that makes ``msg_class`` (e.g. a `PartialIfinfmsg`) of each link;
    messages of other types are decoded as far as their header."""
    marshal = Marshal()
    marshal.msg_map = {msg_type: msg_class}
    return marshal


class Rtnl(NetlinkSocket):
    """A synchronous NETLINK_ROUTE socket in the calling thread's network
    namespace (``sock``: an unbound one opened elsewhere, now owned).

    `cni_skel.netlink` helpers take it as their ``ipr``. ``nlm_request``
    has ``IPRoute.nlm_request``'s signature (what those helpers call);
    `link` / `addr` / `route` are ``IPRoute``'s for the commands in
    `COMMANDS`, answering lists of pyroute2 messages.

    ``strict_check`` is True when the kernel checks GET and dump requests
    strictly and so honours their filters (NETLINK_GET_STRICT_CHK, Linux
    4.20+): a dump of one table's routes or one link's addresses then
    answers only those, instead of everything for the caller to sift.

    Raises:
        OSError: the socket can not be created.
    """

    def __init__(self, sock: socket.socket | None = None, *,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(NETLINK_ROUTE, MarshalRtnl(), sock=sock, timeout=timeout)
        try:
            self._sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self.strict_check = True
        except OSError:  # an older kernel: unfiltered dumps, sifted by the caller
            self.strict_check = False

    def nlm_request(self, msg: Any, msg_type: int,
                    msg_flags: int = NLM_F_REQUEST | NLM_F_DUMP) -> list[Any]:
        """`request` under ``IPRoute.nlm_request``'s name and signature."""
        return self.request(msg, msg_type, msg_flags)

    def link(self, command: str, /, *, echo: bool = False, **kwargs: Any) -> list[Any]:
        """``IPRoute.link(command, **kwargs)`` ("add", "set", "del", "get",
        "dump"). ``echo``: ask the kernel to answer a change with the link
        as it now is (NLM_F_ECHO; older kernels send the ACK only).

        Raises:
            NetlinkError: the kernel refused (``code`` is the errno).
        """
        return self._send("link", command, echo, kwargs)

    def addr(self, command: str, /, **kwargs: Any) -> list[Any]:
        """``IPRoute.addr(command, **kwargs)`` ("add", "replace", "del",
        "dump"). Raises NetlinkError."""
        return self._send("addr", command, False, kwargs)

    def route(self, command: str, /, **kwargs: Any) -> list[Any]:
        """``IPRoute.route(command, **kwargs)`` ("add", "replace", "append",
        "del", "get", "dump"). Raises NetlinkError."""
        return self._send("route", command, False, kwargs)

    def _send(self, kind: str, command: str, echo: bool, kwargs: dict[str, Any]) -> list[Any]:
        msg, msg_type, flags = build(kind, command, strict_check=self.strict_check, **kwargs)
        if echo and flags & NLM_F_ACK:
            flags |= NLM_F_ECHO
        return self.request(msg, msg_type, flags)
