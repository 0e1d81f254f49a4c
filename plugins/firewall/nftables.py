"""The nftables part: pods let through a node's own nftables filter.

In nftables an ``accept`` ends only the base chain it is in; every other
base chain on the forward hook still sees the packet, and a ``drop`` in
any of them is final. So a pod is let through a filter that drops
forwarded traffic only by an accept inside that very chain. For each base
chain on the forward hook whose policy is ``drop`` (tables of families
ip, ip6 and inet; not iptables-nft's own tables, which only the iptables
backend writes), this writes into its table::

    set cni_firewall_pods4 { type ipv4_addr; }      # ip and inet tables
    set cni_firewall_pods6 { type ipv6_addr; }      # ip6 and inet tables
    chain cni_firewall {
        ip daddr @cni_firewall_pods4 ct state established,related accept
        ip saddr @cni_firewall_pods4 accept
        (ip6 likewise)
    }
    <the drop chain>: ... its own rules ...; jump cni_firewall   (appended)

The jump is appended, after the operator's rules: what they accept or drop
themselves still decides first; only what would fall to the drop policy
is let through for pods. Elements carry their owner as comment.

Source: nft(8), "Base chains" / verdict statements; the layout is ours
(Go's firewall has no nftables backend).
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Iterable
from typing import Any, NamedTuple

from cni_skel.nft import GetElement, Nft, NftError, lookup

__all__ = ["CHAIN", "SETS", "DropChain", "add_pods", "delete_pods", "drop_chains", "problems"]

CHAIN = "cni_firewall"
SETS = {4: "cni_firewall_pods4", 6: "cni_firewall_pods6"}
_VERSIONS = {"ip": (4,), "ip6": (6,), "inet": (4, 6)}
_P = {4: "ip", 6: "ip6"}
_ADDR = {4: "ipv4_addr", 6: "ipv6_addr"}
# iptables-nft's tables: written through iptables only (it can not list
# a table holding native rules it does not know).
_IPTABLES_TABLES = {"filter", "mangle", "raw", "security", "nat"}
_JUMP_COMMENT = "cni-skel firewall: pods"


class DropChain(NamedTuple):
    """A base chain on the forward hook with policy drop."""

    family: str
    table: str
    chain: str


def drop_chains(nft: Nft) -> list[DropChain]:
    """The node's forward base chains that drop by policy (not iptables')."""
    out = []
    for obj in nft.run([{"list": {"chains": {}}}], what="list chains"):
        c = obj.get("chain", {})
        if c.get("hook") != "forward" or c.get("policy") != "drop":
            continue
        if c.get("family") not in _VERSIONS:
            continue
        if c["family"] in ("ip", "ip6") and c.get("table") in _IPTABLES_TABLES:
            continue
        out.append(DropChain(c["family"], c["table"], c["name"]))
    return out


def _obj(dc: DropChain, kind: str, **spec: Any) -> dict:
    return {kind: {"family": dc.family, "table": dc.table, **spec}}


def _match(v: int, field: str, right: Any) -> dict:
    return {"match": {"op": "==", "left": {"payload": {"protocol": _P[v], "field": field}},
                      "right": right}}


def _layout(dc: DropChain) -> list[dict]:
    """Our sets, chain and rules in ``dc``'s table; EEXIST when the chain
    is there (so two first ADDs can not write the rules twice)."""
    cmds: list[dict] = []
    for v in _VERSIONS[dc.family]:
        cmds.append({"add": _obj(dc, "set", name=SETS[v], type=_ADDR[v])})
    cmds.append({"create": _obj(dc, "chain", name=CHAIN)})
    for v in _VERSIONS[dc.family]:
        cmds.append({"add": _obj(dc, "rule", chain=CHAIN, expr=[
            _match(v, "daddr", f"@{SETS[v]}"),
            {"match": {"op": "in", "left": {"ct": {"key": "state"}},
                       "right": ["established", "related"]}},
            {"accept": None}])})
        cmds.append({"add": _obj(dc, "rule", chain=CHAIN, expr=[
            _match(v, "saddr", f"@{SETS[v]}"), {"accept": None}])})
    return cmds


def _jumps(nft: Nft, dc: DropChain) -> bool:
    """Whether ``dc`` jumps to our chain (its own rules listed, not the
    table: our sets in it grow with the pods)."""
    objs = nft.run([{"list": {"chain": {"family": dc.family, "table": dc.table,
                                        "name": dc.chain}}}], what=f"list chain {dc.chain}")
    return any(e.get("jump", {}).get("target") == CHAIN
               for o in objs if "rule" in o for e in o["rule"].get("expr", ()))


def _ensure(nft: Nft, dc: DropChain) -> None:
    try:
        nft.run(_layout(dc), what=f"firewall layout in table {dc.family} {dc.table}")
    except NftError as exc:
        if exc.errno != errno.EEXIST:
            raise
    if not _jumps(nft, dc):
        nft.run([{"add": _obj(dc, "rule", chain=dc.chain, comment=_JUMP_COMMENT,
                              expr=[{"jump": {"target": CHAIN}}])}],
                what=f"jump from chain {dc.chain}")


def _present(dc: DropChain, addrs: list[ipaddress.IPv4Address | ipaddress.IPv6Address]
             ) -> list[bool]:
    """Whether each address is in its set (point reads: flat in pods)."""
    answers = lookup(dc.family, dc.table, [GetElement(SETS[ip.version], str(ip),
                                                      _ADDR[ip.version]) for ip in addrs])
    return [a is not None for a in answers]


def add_pods(nft: Nft, addrs: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address],
             owner: str) -> list[dict]:
    """Let ``addrs`` through every drop chain: the layout where missing,
    then the elements of every table in one transaction (a table that
    refuses them leaves none in the others). Returns what was added, as
    records ``{"family", "table", "set", "address"}`` for `delete_pods`
    (an address some other attachment has in the set already is its, and
    not returned)."""
    addrs = list(addrs)
    added: list[dict] = []
    cmds: list[dict] = []
    for dc in drop_chains(nft):
        mine = [ip for ip in addrs if ip.version in _VERSIONS[dc.family]]
        if not mine:
            continue
        _ensure(nft, dc)
        there = _present(dc, mine)
        new = [ip for ip, have in zip(mine, there, strict=True) if not have]
        cmds += [{"add": _obj(dc, "element", name=SETS[ip.version],
                              elem=[{"elem": {"val": str(ip), "comment": owner}}])}
                 for ip in new]
        added += [{"family": dc.family, "table": dc.table, "set": SETS[ip.version],
                   "address": str(ip)} for ip in new]
    if cmds:
        nft.run(cmds, what="add pods to the drop chains' sets")
    return added


def delete_pods(nft: Nft, records: Iterable[dict]) -> None:
    """Delete the elements `add_pods` returned, in one transaction; those
    gone already (the table reloaded, say) are no error (one at a time
    then: one missing element fails the whole transaction)."""
    records = list(records)
    cmds = [{"delete": {"element": {"family": r["family"], "table": r["table"],
                                    "name": r["set"], "elem": [r["address"]]}}}
            for r in records]
    try:
        if cmds:
            nft.run(cmds, what="delete pods from the drop chains' sets")
        return
    except NftError as exc:
        if exc.errno != errno.ENOENT:
            raise
    for r, cmd in zip(records, cmds, strict=True):
        try:
            nft.run([cmd], what=f"delete pod from table {r['table']}")
        except NftError as exc:
            if exc.errno != errno.ENOENT:
                raise


def problems(nft: Nft, addrs: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]
             ) -> list[str]:
    """What CHECK finds missing in the drop chains (empty: nothing)."""
    out = []
    addrs = list(addrs)
    for dc in drop_chains(nft):
        mine = [ip for ip in addrs if ip.version in _VERSIONS[dc.family]]
        if not mine:
            continue
        where = f"table {dc.family} {dc.table}"
        if not _jumps(nft, dc):
            out.append(f"chain {dc.chain} of {where} does not jump to {CHAIN}")
        for ip, have in zip(mine, _present(dc, mine), strict=True):
            if not have:
                out.append(f"{ip} is not in set {SETS[ip.version]} of {where}")
    return out
