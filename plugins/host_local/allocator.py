"""Ranges, range sets and the round-robin address walk of host-local.

Mirrors the Go allocator (plugins/ipam/host-local/backend/allocator:
range.go, range_set.go, allocator.go): a *range* is a subnet with an
inclusive ``rangeStart``-``rangeEnd`` window and a gateway; a *range set* is
a list of disjoint ranges of one address family from which one address is
handed out. Stdlib only: no I/O here, the store lives in `.store`.

Where we are stricter than Go (all code 7 at config time, see `Range.build`):
a gateway outside its subnet, ``rangeStart`` after ``rangeEnd``, and a range
set with no allocatable address. And the IPv4 network and broadcast addresses
are never handed out, even when an explicit ``rangeStart``/``rangeEnd``
includes them (Go only avoids them through its defaults).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IP = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

__all__ = [
    "IP",
    "Range",
    "RangeError",
    "RangeSet",
    "canonical_ip",
    "walk",
]


class RangeError(ValueError):
    """A range or range set that cannot be used; the text is Go's where Go has one."""


def canonical_ip(ip: IP) -> IP:
    """IPv4-mapped IPv6 (``::ffff:a.b.c.d``) as IPv4, as Go's ``To4()`` does."""
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class Range:
    """One canonical range (Go ``Range`` after ``Canonicalize``).

    Attributes (ipaddress objects): ``subnet``, ``start``, ``end`` (both
    inclusive), ``gateway``. Build it with `Range.build`.
    """

    __slots__ = ("_excluded", "_hi", "_lo", "end", "gateway", "start", "subnet")

    def __init__(self, subnet: Network, start: IP, end: IP, gateway: IP) -> None:
        self.subnet = subnet
        self.start = start
        self.end = end
        self.gateway = gateway
        self._lo = int(start)
        self._hi = int(end)
        excluded = {int(gateway)}
        if subnet.version == 4:
            excluded.add(int(subnet.network_address))
            excluded.add(int(subnet.broadcast_address))
        self._excluded = frozenset(excluded)

    @classmethod
    def build(cls, subnet: ipaddress.IPv4Interface | ipaddress.IPv6Interface | None,
              start: IP | None = None, end: IP | None = None,
              gateway: IP | None = None) -> Range:
        """Validate a configured range and fill in Go's defaults.

        ``subnet`` keeps its host bits as written (they are an error, as in
        Go). Defaults: gateway = network + 1; start = network + 1; end = the
        last address (IPv4: the one before broadcast).

        Raises:
            RangeError: missing subnet; subnet too small (IPv4 /31, /32, IPv6
            /127, /128: Go's "Network X too small to allocate from"); host
            bits set; gateway, rangeStart or rangeEnd outside the subnet;
            rangeStart after rangeEnd.
        """
        if subnet is None:
            raise RangeError("missing subnet")
        net = subnet.network
        if net.prefixlen > net.max_prefixlen - 2:
            raise RangeError(f"Network {subnet} too small to allocate from")
        if subnet.ip != net.network_address:
            raise RangeError(
                f"Network has host bits set. For a subnet mask of length {net.prefixlen} "
                f"the network address is {net.network_address}")
        first = net.network_address + 1
        last = net.broadcast_address - 1 if net.version == 4 else net.broadcast_address
        values = {}
        for label, value, default in (("Gateway", gateway, first),
                                      ("RangeStart", start, first),
                                      ("RangeEnd", end, last)):
            if value is None:
                values[label] = default
                continue
            value = canonical_ip(value)
            if value.version != net.version or value not in net:
                raise RangeError(f"{label} {value} not in network {net}")
            values[label] = value
        if values["RangeStart"] > values["RangeEnd"]:
            raise RangeError(f"RangeStart {values['RangeStart']} is after "
                             f"RangeEnd {values['RangeEnd']} in network {net}")
        return cls(net, values["RangeStart"], values["RangeEnd"], values["Gateway"])

    @property
    def version(self) -> int:
        return self.subnet.version

    def contains(self, ip: IP) -> bool:
        """``ip`` is in the subnet and between start and end (Go ``Range.Contains``)."""
        ip = canonical_ip(ip)
        return ip.version == self.version and self._lo <= int(ip) <= self._hi

    def reserved(self, ip: IP) -> bool:
        """Never handed out: the gateway; for IPv4 also network and broadcast."""
        return int(ip) in self._excluded

    def allocatable_count(self) -> int:
        """How many addresses of start..end may be handed out."""
        inside = sum(1 for x in self._excluded if self._lo <= x <= self._hi)
        return self._hi - self._lo + 1 - inside

    def overlaps(self, other: Range) -> bool:
        """Same family and the start..end windows intersect (Go ``Range.Overlaps``)."""
        return (self.version == other.version
                and self._lo <= other._hi and other._lo <= self._hi)

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"

    def __repr__(self) -> str:
        return f"Range({self.subnet}, {self}, gw {self.gateway})"


class RangeSet:
    """A non-empty list of disjoint ranges of one family; one address comes
    from each set. ``str()`` is Go's ``start-end,start-end``."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: list[Range]) -> None:
        if not ranges:
            raise RangeError("empty range set")
        if len({r.version for r in ranges}) != 1:
            raise RangeError("mixed address families")
        for i, r1 in enumerate(ranges):
            for r2 in ranges[i + 1:]:
                if r1.overlaps(r2):
                    raise RangeError(f"subnets {r1} and {r2} overlap")
        self.ranges = list(ranges)
        if self.allocatable_count() == 0:
            raise RangeError(f"no allocatable address in {self} "
                             "(the gateway, network and broadcast addresses are never handed out)")

    @property
    def version(self) -> int:
        return self.ranges[0].version

    def range_for(self, ip: IP) -> Range | None:
        """The range containing ``ip``, or None."""
        for r in self.ranges:
            if r.contains(ip):
                return r
        return None

    def contains(self, ip: IP) -> bool:
        return self.range_for(ip) is not None

    def overlaps(self, other: RangeSet) -> bool:
        return any(a.overlaps(b) for a in self.ranges for b in other.ranges)

    def allocatable_count(self) -> int:
        return sum(r.allocatable_count() for r in self.ranges)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.ranges)

    def __repr__(self) -> str:
        return f"RangeSet({self})"


def walk(rset: RangeSet, last: IP | None) -> Iterator[tuple[IP, Range]]:
    """Every allocatable address of ``rset`` once, in Go's round-robin order.

    With ``last`` (the set's last reserved address) inside the set, start
    right after it and wrap around through the following ranges, so ``last``
    comes out last; otherwise start at the first range's ``rangeStart``.
    Reserved addresses (`Range.reserved`) are skipped. Lazy: a /64 costs
    nothing until walked, and a caller stops at its first free address.
    """
    ranges = rset.ranges
    n = len(ranges)
    idx = 0
    cur = int(ranges[0].start)
    start_from_last = last is not None and rset.contains(last)

    def advance() -> None:
        nonlocal idx, cur
        if cur == int(ranges[idx].end):
            idx = (idx + 1) % n
            cur = int(ranges[idx].start)
        else:
            cur += 1

    if start_from_last:
        assert last is not None
        last = canonical_ip(last)
        idx = next(i for i, r in enumerate(ranges) if r.contains(last))
        cur = int(last)
        advance()
    first = cur
    family = ipaddress.IPv4Address if rset.version == 4 else ipaddress.IPv6Address
    while True:
        r = ranges[idx]
        ip = family(cur)
        if not r.reserved(ip):
            yield ip, r
        advance()
        if cur == first:
            return
