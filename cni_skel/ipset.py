"""ipsets of addresses with a comment per entry, over netlink (pyroute2).

An iptables rule matching a set (``-m set --match-set <name> src``) is
written once; what changes per pod is one set entry, one netlink request
whatever the number of pods. Entries carry a comment (at most
`COMMENT_MAX` bytes) that tells whose they are, so DEL and GC find an
attachment's entries without prevResult or state files.

Sets are ``hash:ip`` of one IP version with the comment extension, in the
calling thread's network namespace (an `Rtnl`-like rule: make the
`IPSets` inside `cni_skel.netns.NetNS.run` to act elsewhere).

Source: the kernel's ip_set (``IPSET_CMD_*``; ipset(8) for the terms).
"""

from __future__ import annotations

import ipaddress
import socket
from types import TracebackType
from typing import Any, NamedTuple

from pyroute2.ipset import IPSet
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.ipset import IPSET_FLAG_LIST_HEADER

from .errors import ERR_INTERNAL, CNIError

__all__ = ["COMMENT_MAX", "IPSetEntry", "IPSets"]

#: Bytes of an entry's comment the kernel keeps (IPSET_MAX_COMMENT_SIZE).
COMMENT_MAX = 255
_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}
_ADDR_ATTR = {4: "IPSET_ATTR_IPADDR_IPV4", 6: "IPSET_ATTR_IPADDR_IPV6"}
_ERR_EXIST = 4103  # IPSET_ERR_EXIST: added already / not there to delete
_ENOENT = 2


class IPSetEntry(NamedTuple):
    """One entry: ``address`` (an IP address, no prefix) and its comment."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    comment: str | None


class IPSets:
    """The ipsets of the calling thread's network namespace; a context
    manager closing its netlink socket. Errors other than the ones each
    method names are `CNIError` 999 naming the set."""

    def __init__(self) -> None:
        try:
            self._ipset = IPSet()
        except (OSError, NetlinkError) as exc:
            raise CNIError(ERR_INTERNAL, f"ipset netlink socket: {exc}",
                           "the kernel needs ip_set (CONFIG_IP_SET)") from exc

    def __enter__(self) -> IPSets:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._ipset.close()

    @staticmethod
    def _fail(what: str, name: str, exc: Exception) -> CNIError:
        return CNIError(ERR_INTERNAL, f"ipset {name}: {what}: {exc}")

    def ensure(self, name: str, version: int) -> None:
        """Create ``hash:ip`` set ``name`` of IP version ``version`` (4 or
        6) with comments, unless a set of that name exists."""
        try:
            self._ipset.create(name, stype="hash:ip", family=_FAMILY[version],
                               comment=True, exclusive=False)
        except NetlinkError as exc:
            raise self._fail("create", name, exc) from exc

    def header(self, name: str) -> dict[str, Any] | None:
        """The set's header counters (``references``: iptables rules using
        it; ``elements``), None when there is no such set."""
        try:
            msgs = list(self._ipset.list(name, flags=IPSET_FLAG_LIST_HEADER))
        except NetlinkError as exc:
            if exc.code == _ENOENT:
                return None
            raise self._fail("header", name, exc) from exc
        data = next((m.get_attr("IPSET_ATTR_DATA") for m in msgs), None)
        if data is None:
            return None
        return {"references": data.get_attr("IPSET_ATTR_REFERENCES"),
                "elements": data.get_attr("IPSET_ATTR_ELEMENTS")}

    def _entry(self, op: str, name: str, address: Any, absent: tuple[int, ...],
               **kw: Any) -> bool:
        """One entry request (``op``: add, delete, test); False when the
        kernel answers one of the ``absent`` codes."""
        ip = ipaddress.ip_address(address)
        try:
            answer = getattr(self._ipset, op)(name, str(ip), family=_FAMILY[ip.version],
                                              etype="ip", **kw)
        except NetlinkError as exc:
            if exc.code in absent:
                return False
            raise self._fail(f"{op} {ip}", name, exc) from exc
        return op != "test" or bool(answer)

    def add(self, name: str, address: Any, comment: str) -> bool:
        """Add ``address`` with ``comment`` (cut to `COMMENT_MAX` bytes).
        False when the set holds it already (its comment stays)."""
        return self._entry("add", name, address, (_ERR_EXIST,),
                           comment=comment.encode()[:COMMENT_MAX].decode(errors="ignore"))

    def delete(self, name: str, address: Any) -> bool:
        """Delete ``address``; False when it (or the set) is not there."""
        return self._entry("delete", name, address, (_ERR_EXIST, _ENOENT))

    def contains(self, name: str, address: Any) -> bool:
        """Whether set ``name`` holds ``address`` (False without the set)."""
        return self._entry("test", name, address, (_ENOENT,))

    def entries(self, name: str) -> list[IPSetEntry]:
        """Every entry of set ``name`` (empty when there is no such set)."""
        try:
            msgs = list(self._ipset.list(name))
        except NetlinkError as exc:
            if exc.code == _ENOENT:
                return []
            raise self._fail("list", name, exc) from exc
        out = []
        for msg in msgs:
            adt = msg.get_attr("IPSET_ATTR_ADT")
            if adt is None:
                continue
            for data in adt.get_attrs("IPSET_ATTR_DATA"):
                ip = data.get_attr("IPSET_ATTR_IP_FROM")
                if ip is None:
                    continue
                for attr in _ADDR_ATTR.values():
                    value = ip.get_attr(attr)
                    if value is not None:
                        out.append(IPSetEntry(ipaddress.ip_address(value),
                                              data.get_attr("IPSET_ATTR_COMMENT")))
                        break
        return out
