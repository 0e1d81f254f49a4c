"""The nftables state of portmap, as libnftables JSON commands.

One table, ``inet cni_portmap``, for IPv4 and IPv6 (an inet table keeps both
families in one listing and one transaction)::

    chain prerouting  { type nat hook prerouting priority dstnat; }
        fib daddr type local jump hostports
    chain output      { type nat hook output priority dstnat; }
        fib daddr type local jump hostports
    chain hostports {
        jump dnat_<G> comment "<network>"          # one per network (x conditions)
    }
    chain dnat_<G> {            # G = <nft.network_tag: "n" + 12 hex>_<conditions: 8 hex>
        meta nfproto ipv4 <conditionsV4> dnat ip to
            ip daddr . meta l4proto . th dport map @<G>_ha4 :
            ip daddr . meta l4proto . th dport map @<G>_hp4
        meta nfproto ipv4 <conditionsV4> dnat ip to
            meta l4proto . th dport map @<G>_a4 : meta l4proto . th dport map @<G>_p4
        (the same for ip6 with conditionsV6 and the *6 maps)
    }
    chain postrouting { type nat hook postrouting priority srcnat; }
        ct status dnat ip saddr . ip daddr @hairpin4 masquerade
        ct status dnat ip saddr 127.0.0.0/8 ip daddr @localhost4 masquerade
        ct status dnat ip daddr @masqall4 masquerade
        ct status dnat ip6 saddr . ip6 daddr @hairpin6 masquerade
        ct status dnat ip6 daddr @masqall6 masquerade

    map <G>_a4  { type inet_proto . inet_service : ipv4_addr; }      # -> container IP
    map <G>_p4  { type inet_proto . inet_service : inet_service; }   # -> container port
    map <G>_ha4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr; }    # hostIP
    map <G>_hp4 { type ipv4_addr . inet_proto . inet_service : inet_service; }
    set claims4 { type ipv4_addr . inet_proto . inet_service; }  # hostIP|0.0.0.0 . proto . port
    set hairpin4 { type ipv4_addr . ipv4_addr; }   # container IP . container IP
    set localhost4 { type ipv4_addr; }             # container IP
    set masqall4 { type ipv4_addr; }               # container IP (masqAll)
    (and the *6 twins; no localhost6: ::1 is never routed)
    set records { type ipv6_addr; }   # per attachment: what its entries were made from
                                      # (made with the first record)

Address and port live in two maps with the same key because libnftables 1.0.6
cannot declare a map with concatenated data (``ipv4_addr . inet_service``)
through JSON; a lookup is per new connection (NAT sees only the first
packet), and both are hash lookups, so the cost stays flat in the number of
pods. Every element carries the attachment tag as its comment. ``claims``
holds one element per mapping across all networks, so a port already mapped
by any container (in any network) makes ``create element`` fail in the
kernel: conflicts are refused atomically even between concurrent ADDs.

Each network (with its conditions) has its own chain and maps, so GC of one
network only looks at its own maps, and conditions apply to its containers
only. The base layout and each network's chain are created once, in a
transaction holding a ``create chain`` that fails with EEXIST when it is
already there.

``records`` lets DEL and CHECK find an attachment's entries without listing
anybody else's: ADD adds, in the transaction that creates the entries, one
or more elements whose key is a 128-bit hash of the attachment tag and
chunk number (the set's ``ipv6_addr`` type is used as an opaque 16-byte key)
and whose comment is a `Record` of what the entries were made from (network
groups, container addresses, host ports), e.g.
``r1 1/1 g:n0123456789ab_89abcdef 4:10.88.0.5 tcp/8080 udp/53@10.0.0.1``. The
record only says where to look: DEL reads the candidate elements one by one
(`cni_skel.nft.lookup`) and removes those whose comment is still the
attachment's tag, with the record, in one transaction. A table made before
``records`` existed gets it from the first ADD that lists the table, with a
record for every attachment found in it (same transaction).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.nft import COMMENT_MAX, GetElement, network_tag

from .config import PROTOCOLS

__all__ = [
    "FAMILY",
    "RECORDS",
    "SHARED_SETS",
    "TABLE",
    "Entry",
    "Record",
    "base_layout",
    "create_cmds",
    "delete_cmds",
    "group_id",
    "group_layout",
    "group_maps",
    "network_groups",
    "nft_types",
    "normalize",
    "query",
    "record_cmds",
    "record_key",
    "record_query",
    "records_by_prefix",
    "records_from_entries",
    "records_set",
    "tag_prefix",
]

TABLE = "cni_portmap"
FAMILY = "inet"
HOSTPORTS = "hostports"
RECORDS = "records"
_T = {"family": FAMILY, "table": TABLE}
_P = {4: "ip", 6: "ip6"}
_NFPROTO = {4: "ipv4", 6: "ipv6"}
_ADDR = {4: "ipv4_addr", 6: "ipv6_addr"}
_UNSPEC = {4: "0.0.0.0", 6: "::"}
_PROTO_NAMES = {num: name for name, num in PROTOCOLS.items()}
#: Sets shared by every network: kind -> key layout.
SHARED_SETS = {
    "claims4": ("addr", "proto", "port"), "claims6": ("addr", "proto", "port"),
    "hairpin4": ("addr", "addr"), "hairpin6": ("addr", "addr"),
    "localhost4": ("addr",), "masqall4": ("addr",), "masqall6": ("addr",),
}
_MAP_KINDS = {"a": ("proto", "port"), "p": ("proto", "port"),
              "ha": ("addr", "proto", "port"), "hp": ("addr", "proto", "port")}
_GROUP_MAP = re.compile(r"^(n[0-9a-f]{12})_([0-9a-f]{8})_(a|p|ha|hp)([46])$")


def group_id(network: str, cond4: list[str], cond6: list[str]) -> str:
    """``<network id>_<8 hex digits of the conditions>``: a network's DNAT
    chain and maps for one set of conditions."""
    conds = hashlib.sha256(json.dumps([cond4, cond6]).encode()).hexdigest()[:8]
    return f"{network_tag(network)}_{conds}"


def group_maps(gid: str) -> list[str]:
    """The names of group ``gid``'s maps."""
    return [f"{gid}_{kind}{v}" for v in (4, 6) for kind in _MAP_KINDS]


def network_groups(names: Iterable[str], nid: str) -> dict[str, list[str]]:
    """Group id -> its map names, among ``names``, for network id ``nid``."""
    out: dict[str, list[str]] = {}
    for name in names:
        m = _GROUP_MAP.match(name)
        if m and m.group(1) == nid:
            out.setdefault(f"{m.group(1)}_{m.group(2)}", []).append(name)
    return out


def key_layout(set_name: str) -> tuple[str, ...] | None:
    """The component kinds of a set's key (None: not one of ours)."""
    if set_name in SHARED_SETS:
        return SHARED_SETS[set_name]
    m = _GROUP_MAP.match(set_name)
    return _MAP_KINDS[m.group(3)] if m else None


def _norm_one(kind: str, value: Any) -> Any:
    if kind == "addr":
        return str(ipaddress.ip_address(value))
    if kind == "proto":
        if isinstance(value, int):
            return _PROTO_NAMES.get(value, value)
        return str(value).lower()
    return int(value)


def normalize(set_name: str, key: Any) -> Any:
    """A listed key of one of our sets as a hashable canonical value (so a
    key read back compares equal to the one we built); None when it can not
    be read as one."""
    layout = key_layout(set_name)
    if layout is None:
        return None
    parts = key["concat"] if isinstance(key, dict) and "concat" in key else [key]
    if len(parts) != len(layout):
        return None
    try:
        return tuple(_norm_one(k, p) for k, p in zip(layout, parts, strict=True))
    except (ValueError, TypeError):
        return None


def nft_types(set_name: str) -> tuple[list[str], str | None]:
    """libnftables type names of one of our sets: (key parts, map data or None)."""
    layout = key_layout(set_name)
    if layout is None:
        raise ValueError(f"{set_name} is not a portmap set")
    v = int(set_name[-1])
    key = [{"addr": _ADDR[v], "proto": "inet_proto", "port": "inet_service"}[k] for k in layout]
    m = _GROUP_MAP.match(set_name)
    data = None if m is None else (_ADDR[v] if m.group(3) in ("a", "ha") else "inet_service")
    return key, data


@dataclass(frozen=True)
class Entry:
    """One element we want: set/map ``set``, ``key`` (canonical tuple),
    ``data`` (map data or None), ``what`` (for messages), ``index`` (the
    mapping it comes from, None for per-container entries)."""

    set: str
    key: tuple
    data: Any = None
    what: str = ""
    index: int | None = None

    @property
    def shared_masq(self) -> bool:
        return self.set.startswith(("hairpin", "localhost", "masqall"))

    def key_json(self) -> Any:
        return {"concat": list(self.key)} if len(self.key) > 1 else self.key[0]

    def elem_json(self, comment: str) -> Any:
        elem = {"elem": {"val": self.key_json(), "comment": comment}}
        return elem if self.data is None else [elem, self.data]


def query(e: Entry) -> GetElement:
    """The point read of ``e``'s element (its data and comment)."""
    key, data = nft_types(e.set)
    if len(key) == 1:
        return GetElement(e.set, e.key[0], key[0], data)
    return GetElement(e.set, e.key, key, data)


# --- records ---------------------------------------------------------------------

_RECORD_SALT = b"cni-skel portmap record\0"
_RECORD_TAG = "r1"
_CHUNK = COMMENT_MAX - len(f"{_RECORD_TAG} 65536/65536 ")


def _prefix(tag: str) -> bytes:
    return hashlib.sha256(_RECORD_SALT + tag.encode()).digest()[:14]


def record_key(tag: str, chunk: int = 0) -> str:
    """The key (as an IPv6 address) of chunk ``chunk`` of ``tag``'s record."""
    return str(ipaddress.IPv6Address(_prefix(tag) + chunk.to_bytes(2, "big")))


def record_query(tag: str, chunk: int = 0) -> GetElement:
    return GetElement(RECORDS, record_key(tag, chunk), "ipv6_addr")


def records_set(create: bool = False) -> dict:
    """``add set records`` (``create``: EEXIST when it is there)."""
    return {"create" if create else "add": {"set": {**_T, "name": RECORDS,
                                                    "type": "ipv6_addr"}}}


@dataclass(frozen=True)
class Record:
    """What an attachment's entries were made from: network groups ``gids``,
    container addresses ``ips`` ((version, address)), host ports ``ports``
    ((protocol, host port, host IP or None)). Records of several ADDs of one
    attachment are merged with ``|``."""

    gids: frozenset[str] = frozenset()
    ips: frozenset[tuple[int, str]] = frozenset()
    ports: frozenset[tuple[str, int, str | None]] = frozenset()

    def __or__(self, other: Record) -> Record:
        return Record(self.gids | other.gids, self.ips | other.ips, self.ports | other.ports)

    @classmethod
    def of(cls, gid: str, ips: dict[int, Any], mappings: list) -> Record:
        """The record of one ADD (container addresses ``ips``, version ->
        address, and `PortMapping` list ``mappings``)."""
        ports = set()
        for m in mappings:
            host = None if m.host_ip is None or m.host_ip.is_unspecified else str(m.host_ip)
            ports.add((m.protocol, m.host_port, host))
        return cls(frozenset({gid}), frozenset((v, str(ip)) for v, ip in ips.items()),
                   frozenset(ports))

    def tokens(self) -> list[str]:
        out = [f"g:{g}" for g in sorted(self.gids)]
        out += [f"{v}:{ip}" for v, ip in sorted(self.ips)]
        out += [f"{p}/{port}" + (f"@{h}" if h else "")
                for p, port, h in sorted(self.ports, key=lambda t: (t[0], t[1], t[2] or ""))]
        return out

    def chunks(self) -> list[str]:
        """The comments of the record's elements, each within an nftables
        comment."""
        parts: list[list[str]] = [[]]
        size = 0
        for tok in self.tokens():
            if parts[-1] and size + 1 + len(tok) > _CHUNK:
                parts.append([])
                size = 0
            size += len(tok) + (1 if parts[-1] else 0)
            parts[-1].append(tok)
        n = len(parts)
        return [" ".join([_RECORD_TAG, f"{i + 1}/{n}", *toks]) for i, toks in enumerate(parts)]

    @staticmethod
    def count(comment: str | None) -> int | None:
        """How many chunks the record of which ``comment`` is one has."""
        head = (comment or "").split(" ", 2)
        if len(head) < 2 or head[0] != _RECORD_TAG:
            return None
        _i, _, n = head[1].partition("/")
        return int(n) if n.isdigit() and int(n) > 0 else None

    @classmethod
    def parse(cls, comments: list[str | None]) -> Record | None:
        """The record of chunk comments ``comments`` (in order); None when
        they do not make one (a chunk missing, another format)."""
        gids: set[str] = set()
        ips: set[tuple[int, str]] = set()
        ports: set[tuple[str, int, str | None]] = set()
        n = len(comments)
        try:
            for i, comment in enumerate(comments):
                words = (comment or "").split()
                if words[:2] != [_RECORD_TAG, f"{i + 1}/{n}"]:
                    return None
                for tok in words[2:]:
                    kind, sep, rest = tok.partition(":")
                    if sep and kind == "g":
                        gids.add(rest)
                    elif sep and kind in ("4", "6"):
                        ip = ipaddress.ip_address(rest)
                        if ip.version != int(kind):
                            return None
                        ips.add((ip.version, str(ip)))
                    else:
                        proto_port, _, host = tok.partition("@")
                        proto, sep, port = proto_port.partition("/")
                        if not sep or proto not in PROTOCOLS:
                            return None
                        ports.add((proto, int(port),
                                   str(ipaddress.ip_address(host)) if host else None))
        except ValueError:
            return None
        return cls(frozenset(gids), frozenset(ips), frozenset(ports))

    def entries(self) -> list[Entry]:
        """Every element ADDs with this record may have made (no data): where
        DEL looks."""
        out: dict[tuple[str, tuple], Entry] = {}

        def add(name: str, key: tuple) -> None:
            out.setdefault((name, key), Entry(name, key))

        for v, ip in sorted(self.ips):
            used = False
            for proto, port, host in sorted(self.ports, key=lambda t: (t[0], t[1], t[2] or "")):
                if host is not None and ipaddress.ip_address(host).version != v:
                    continue
                used = True
                add(f"claims{v}", (host or _UNSPEC[v], proto, port))
                for gid in sorted(self.gids):
                    if host is None:
                        add(f"{gid}_a{v}", (proto, port))
                        add(f"{gid}_p{v}", (proto, port))
                    else:
                        add(f"{gid}_ha{v}", (host, proto, port))
                        add(f"{gid}_hp{v}", (host, proto, port))
            if used:
                add(f"hairpin{v}", (ip, ip))
                add(f"masqall{v}", (ip,))
                if v == 4:
                    add("localhost4", (ip,))
        return list(out.values())


def record_cmds(tag: str, record: Record) -> list[dict]:
    """``create element`` of ``tag``'s record (EEXIST when one is there)."""
    elems = [{"elem": {"val": record_key(tag, i), "comment": c}}
             for i, c in enumerate(record.chunks())]
    return [{"create": {"element": {**_T, "name": RECORDS, "elem": elems}}}]


def records_by_prefix(listed: Iterable[tuple[Any, Any, str | None]]
                      ) -> dict[bytes, list[tuple[int, str, str | None]]]:
    """Listed ``records`` elements grouped by attachment (hash prefix):
    ``[(chunk, key as listed, comment)]`` sorted by chunk."""
    out: dict[bytes, list[tuple[int, str, str | None]]] = {}
    for key, _data, comment in listed:
        try:
            raw = ipaddress.IPv6Address(key).packed
        except (ValueError, TypeError):
            continue
        out.setdefault(raw[:14], []).append((int.from_bytes(raw[14:], "big"), key, comment))
    for chunks in out.values():
        chunks.sort()
    return out


def tag_prefix(tag: str) -> bytes:
    """The hash prefix of ``tag``'s record keys (see `records_by_prefix`)."""
    return _prefix(tag)


def records_from_entries(listed: dict[str, Iterable[tuple[Any, Any, str | None]]]
                         ) -> dict[str, Record]:
    """Records rebuilt from listed entries (set name -> its ``(key, data,
    comment)``), by tag: for a table made before ``records``."""
    gids: dict[str, set] = {}
    ips: dict[str, set] = {}
    ports: dict[str, set] = {}
    for name, elems in listed.items():
        layout = key_layout(name)
        if layout is None:
            continue
        v = int(name[-1])
        m = _GROUP_MAP.match(name)
        for key, data, comment in elems:
            norm = normalize(name, key)
            if comment is None or norm is None:
                continue
            for d in (gids, ips, ports):
                d.setdefault(comment, set())
            if m is not None:
                gids[comment].add(f"{m.group(1)}_{m.group(2)}")
                kind = m.group(3)
                if kind in ("a", "p"):
                    ports[comment].add((norm[0], norm[1], None))
                else:
                    ports[comment].add((norm[1], norm[2], norm[0]))
                if kind in ("a", "ha") and data is not None:
                    with contextlib.suppress(ValueError):
                        ips[comment].add((v, str(ipaddress.ip_address(data))))
            elif name.startswith("claims"):
                host = None if norm[0] == _UNSPEC[v] else norm[0]
                ports[comment].add((norm[1], norm[2], host))
            else:  # hairpin, localhost, masqall: the container address
                ips[comment].add((v, norm[0]))
    return {t: Record(frozenset(gids[t]), frozenset(ips[t]), frozenset(ports[t])) for t in gids}


def create_cmds(entries: Iterable[Entry], comment: str) -> list[dict]:
    """``create element`` commands (EEXIST on any existing key), one per set."""
    by_set: dict[str, list] = {}
    for e in entries:
        by_set.setdefault(e.set, []).append(e.elem_json(comment))
    return [{"create": {"element": {**_T, "name": name, "elem": elems}}}
            for name, elems in by_set.items()]


def delete_cmds(keys: Iterable[tuple[str, Any]]) -> list[dict]:
    """``delete element`` commands for ``(set name, key JSON)`` pairs."""
    by_set: dict[str, list] = {}
    for name, key in keys:
        by_set.setdefault(name, []).append(key)
    return [{"delete": {"element": {**_T, "name": name, "elem": elems}}}
            for name, elems in by_set.items()]


def want_entries(mappings: list, ips: dict[int, Any], *, snat: bool,
                 masq_all: bool, gid: str) -> list[Entry]:
    """Every element an attachment with container addresses ``ips``
    (version -> address) and port ``mappings`` (`PortMapping` list) needs.
    A mapping with a hostIP of the other family is skipped for that address
    (as Go); an unspecified hostIP means every address of its family. A
    mapping repeated as is counts once.

    Raises:
        CNIError: 7 when two mappings claim the same (hostIP, protocol,
            hostPort) for different container ports.
    """
    out: list[Entry] = []
    for v, ip in sorted(ips.items()):
        cip = str(ip)
        used = False
        seen: dict[tuple, tuple[int, int]] = {}
        for i, m in enumerate(mappings):
            if m.host_ip is not None and m.host_ip.version != v:
                continue
            used = True
            host = None if m.host_ip is None or m.host_ip.is_unspecified else str(m.host_ip)
            where = host or "every address"
            what = f"{m.protocol} port {m.host_port} on {where} (IPv{v})"
            claim = (host or _UNSPEC[v], m.protocol, m.host_port)
            if claim in seen:
                first, port = seen[claim]
                if port != m.container_port:
                    raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                                   f"invalid network config: runtimeConfig.portMappings.{i}: "
                                   f"{what} is also mapped by portMappings.{first} to another "
                                   f"container port")
                continue  # the same mapping twice
            seen[claim] = (i, m.container_port)
            out.append(Entry(f"claims{v}", claim, None, what, i))
            if host is None:
                key = (m.protocol, m.host_port)
                out.append(Entry(f"{gid}_a{v}", key, cip, what, i))
                out.append(Entry(f"{gid}_p{v}", key, m.container_port, what, i))
            else:
                out.append(Entry(f"{gid}_ha{v}", claim, cip, what, i))
                out.append(Entry(f"{gid}_hp{v}", claim, m.container_port, what, i))
        if not used or not snat:
            continue
        if masq_all:
            out.append(Entry(f"masqall{v}", (cip,), None, f"masquerade of {cip}"))
        else:
            out.append(Entry(f"hairpin{v}", (cip, cip), None, f"hairpin masquerade of {cip}"))
            if v == 4:
                out.append(Entry("localhost4", (cip,), None,
                                 f"localhost masquerade of {cip}"))
    return out


# --- layout -----------------------------------------------------------------------


def _match(left: dict, right: Any, op: str = "==") -> dict:
    return {"match": {"op": op, "left": left, "right": right}}


def _payload(v: int, field: str) -> dict:
    return {"payload": {"protocol": _P[v], "field": field}}


_L4PROTO = {"meta": {"key": "l4proto"}}
_DPORT = {"payload": {"protocol": "th", "field": "dport"}}
_DNAT_STATUS = _match({"ct": {"key": "status"}}, "dnat", "in")
_LOCAL = _match({"fib": {"result": "type", "flags": ["daddr"]}}, "local")


def base_layout() -> list[dict]:
    """Table, hook chains, shared sets and their rules. Holds ``create chain
    hostports``: EEXIST when the layout is already there."""
    cmds: list[dict] = [{"add": {"table": {"family": FAMILY, "name": TABLE}}}]
    for name, hook, prio in (("prerouting", "prerouting", -100), ("output", "output", -100),
                             ("postrouting", "postrouting", 100)):
        cmds.append({"add": {"chain": {**_T, "name": name, "type": "nat", "hook": hook,
                                       "prio": prio, "policy": "accept"}}})
    for name, layout in SHARED_SETS.items():
        v = int(name[-1])
        types = [{"addr": _ADDR[v], "proto": "inet_proto", "port": "inet_service"}[k]
                 for k in layout]
        cmds.append({"add": {"set": {**_T, "name": name,
                                     "type": types if len(types) > 1 else types[0]}}})
    cmds.append({"create": {"chain": {**_T, "name": HOSTPORTS}}})
    for chain in ("prerouting", "output"):
        cmds.append({"add": {"rule": {**_T, "chain": chain,
                                      "expr": [_LOCAL, {"jump": {"target": HOSTPORTS}}]}}})
    masq: list[list[dict]] = []
    for v in (4, 6):
        pair = {"concat": [_payload(v, "saddr"), _payload(v, "daddr")]}
        masq.append([_match(pair, f"@hairpin{v}")])
        if v == 4:
            masq.append([_match(_payload(4, "saddr"), {"prefix": {"addr": "127.0.0.0", "len": 8}}),
                         _match(_payload(4, "daddr"), "@localhost4")])
        masq.append([_match(_payload(v, "daddr"), f"@masqall{v}")])
    for exprs in masq:
        cmds.append({"add": {"rule": {**_T, "chain": "postrouting",
                                      "expr": [_DNAT_STATUS, *exprs, {"masquerade": None}]}}})
    return cmds


def group_layout(gid: str, network: str, conditions: dict[int, list[dict]]) -> list[dict]:
    """A network's maps, its DNAT chain (``create``: EEXIST when there) and
    the jump to it. ``conditions``: version -> JSON match expressions."""
    cmds: list[dict] = []
    for v in (4, 6):
        for kind, layout in _MAP_KINDS.items():
            types = [{"addr": _ADDR[v], "proto": "inet_proto", "port": "inet_service"}[k]
                     for k in layout]
            data = _ADDR[v] if kind in ("a", "ha") else "inet_service"
            cmds.append({"add": {"map": {**_T, "name": f"{gid}_{kind}{v}", "type": types,
                                         "map": data}}})
    chain = f"dnat_{gid}"
    cmds.append({"create": {"chain": {**_T, "name": chain}}})
    for v in (4, 6):
        pre = [_match({"meta": {"key": "nfproto"}}, _NFPROTO[v]), *conditions.get(v, [])]
        for host in (True, False):
            key = {"concat": [_payload(v, "daddr"), _L4PROTO, _DPORT] if host
                   else [_L4PROTO, _DPORT]}
            a, p = ("ha", "hp") if host else ("a", "p")
            dnat = {"dnat": {"family": _P[v],
                             "addr": {"map": {"key": key, "data": f"@{gid}_{a}{v}"}},
                             "port": {"map": {"key": key, "data": f"@{gid}_{p}{v}"}}}}
            cmds.append({"add": {"rule": {**_T, "chain": chain, "expr": [*pre, dnat]}}})
    cmds.append({"add": {"rule": {**_T, "chain": HOSTPORTS, "comment": network[:200],
                                  "expr": [{"jump": {"target": chain}}]}}})
    return cmds
