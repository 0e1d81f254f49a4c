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
    chain dnat_<G> {                               # G = <network id>_<conditions id>
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
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, CNIError

from .config import PROTOCOLS

__all__ = [
    "FAMILY",
    "SHARED_SETS",
    "TABLE",
    "Entry",
    "base_layout",
    "create_cmds",
    "delete_cmds",
    "group_id",
    "group_layout",
    "group_maps",
    "network_groups",
    "network_id",
    "normalize",
]

TABLE = "cni_portmap"
FAMILY = "inet"
HOSTPORTS = "hostports"
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


def network_id(network: str) -> str:
    """``n`` + 12 hex digits of SHA-256 of the network name."""
    return "n" + hashlib.sha256(network.encode()).hexdigest()[:12]


def group_id(network: str, cond4: list[str], cond6: list[str]) -> str:
    """``<network id>_<8 hex digits of the conditions>``: a network's DNAT
    chain and maps for one set of conditions."""
    conds = hashlib.sha256(json.dumps([cond4, cond6]).encode()).hexdigest()[:8]
    return f"{network_id(network)}_{conds}"


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
