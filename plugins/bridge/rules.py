"""nftables state of the bridge plugin: IP masquerade and MAC spoof checks.

Both keep per-pod data in sets, so the rules are written once and the cost
per packet does not grow with the number of pods (upstream writes a rule, or
two chains, per container). Every element carries the attachment's tag
(`cni_skel.nft.attachment_tag`) as its comment, which is how DEL and GC find
a container's entries with no prevResult and no netns.

Masquerade, table ``inet cni_skel_bridge``::

    chain postrouting { type nat hook postrouting priority srcnat; }
        ip saddr @<N>_pods4 jump <N>             # one pair per network
        ip6 saddr @<N>_pods6 jump <N>
    chain <N> {                                  # N: nft.network_tag, "n_" + 16 hex
        ip saddr . ip daddr @<N>_local4 return   # to the pod's own subnet
        ip daddr 224.0.0.0/4 return              # multicast
        ip6 saddr . ip6 daddr @<N>_local6 return
        ip6 daddr ff00::/8 return
        masquerade
    }
    set <N>_pods4  { type ipv4_addr; }                         # pod address
    set <N>_local4 { type ipv4_addr . ipv4_addr; flags interval; }  # address . subnet

which is upstream's per-container rule ``ip saddr A ip daddr != S masquerade``
(and the multicast exception) as set lookups.

Spoof check, table ``bridge cni_skel_bridge``::

    chain prerouting { type filter hook prerouting priority -300; }
        iifname @<N>_spoofchk_ports iifname . ether saddr != @<N>_spoofchk_allowed drop
                                                     # one rule per network
    set <N>_spoofchk_ports   { type ifname; }               # host veths checked
    set <N>_spoofchk_allowed { type ifname . ether_addr; }  # (host veth, pod MAC)

Frames entering the bridge from a checked port must carry the pod's MAC, as
upstream's per-container ``macspoofchk`` chains. Each network has its own
sets (as for masquerade), so DEL and GC of one network never remove another
network's elements, whatever its valid attachments.

Before per-network sets, every network shared ``spoofchk_ports`` and
``spoofchk_allowed`` (one rule, comment ``macspoofchk``). A node upgraded
with such elements keeps them working: the old rule still checks them, DEL
removes an attachment's old elements by its tag (an attachment belongs to
one network), CHECK accepts them, and GC removes an old element whose tag is
not valid only when its host veth is gone (an old element does not say its
network; with the veth gone it protects no pod of any network, and could
only misfire on a new veth of the same name). The old rule and sets stay,
empty in the end.

Rules are created once, in the same transaction as a ``create`` of an object
that fails with EEXIST when the layout is already there (so concurrent first
ADDs can not duplicate them); an ADD after that is a single transaction that
only adds elements, and a DEL of nothing commits nothing.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from cni_skel.nft import Nft, NftError, Table, network_tag

__all__ = ["MASQ_FAMILY", "SPOOF_FAMILY", "TABLE", "Masquerade", "SpoofCheck", "apply"]

TABLE = "cni_skel_bridge"
MASQ_FAMILY = "inet"
SPOOF_FAMILY = "bridge"
#: The sets every network shared before per-network spoof-check sets.
LEGACY_PORTS = "spoofchk_ports"
LEGACY_ALLOWED = "spoofchk_allowed"
MULTICAST = {4: ("224.0.0.0", 4), 6: ("ff00::", 8)}
_P = {4: "ip", 6: "ip6"}
_ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _payload(version: int, field: str) -> dict:
    return {"payload": {"protocol": _P[version], "field": field}}


def _obj(kind: str, family: str, **spec: Any) -> dict:
    return {kind: {"family": family, "table": TABLE, **spec}}


def _prefix(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> dict:
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


class Masquerade:
    """Masquerade state of one network (upstream ``ip.SetupIPMasq`` with the
    nftables backend, as sets)."""

    def __init__(self, network: str, nft: Nft | None = None) -> None:
        self.network = network
        self.id = network_tag(network, prefix="n_", width=16)  # bridge's format (nft)
        self.nft = nft or Nft()

    def set_names(self, version: int) -> tuple[str, str]:
        return f"{self.id}_pods{version}", f"{self.id}_local{version}"

    # -- layout ---------------------------------------------------------------

    def layout(self) -> list[dict]:
        f = MASQ_FAMILY
        cmds: list[dict] = [
            {"add": {"table": {"family": f, "name": TABLE}}},
            {"add": _obj("chain", f, name="postrouting", type="nat", hook="postrouting",
                         prio=100, policy="accept")},
        ]
        for v in (4, 6):
            pods, local = self.set_names(v)
            cmds.append({"add": _obj("set", f, name=pods, type=_ADDR_TYPE[v])})
            cmds.append({"add": _obj("set", f, name=local, type=[_ADDR_TYPE[v]] * 2,
                                     flags=["interval"])})
        # EEXIST here means another ADD set the network up first.
        cmds.append({"create": _obj("chain", f, name=self.id)})
        for v in (4, 6):
            pods, local = self.set_names(v)
            cmds.append({"add": _obj("rule", f, chain="postrouting", comment=self.network[:200],
                                     expr=[{"match": {"op": "==",
                                                      "left": _payload(v, "saddr"),
                                                      "right": f"@{pods}"}},
                                           {"jump": {"target": self.id}}])})
        for v in (4, 6):
            _, local = self.set_names(v)
            addr, plen = MULTICAST[v]
            cmds.append({"add": _obj("rule", f, chain=self.id, expr=[
                {"match": {"op": "==", "left": {"concat": [_payload(v, "saddr"),
                                                           _payload(v, "daddr")]},
                           "right": f"@{local}"}},
                {"return": None}])})
            cmds.append({"add": _obj("rule", f, chain=self.id, expr=[
                {"match": {"op": "==", "left": _payload(v, "daddr"),
                           "right": {"prefix": {"addr": addr, "len": plen}}}},
                {"return": None}])})
        cmds.append({"add": _obj("rule", f, chain=self.id, expr=[{"masquerade": None}])})
        return cmds

    def elements(self, addrs: Iterable[IPInterface], tag: str) -> list[dict]:
        """Commands adding ``addrs`` (pod address/prefix) of attachment ``tag``."""
        cmds = []
        for a in addrs:
            pods, local = self.set_names(a.version)
            cmds.append({"add": _obj("element", MASQ_FAMILY, name=pods, elem=[
                {"elem": {"val": str(a.ip), "comment": tag}}])})
            cmds.append({"add": _obj("element", MASQ_FAMILY, name=local, elem=[
                {"elem": {"val": {"concat": [str(a.ip), _prefix(a.network)]},
                          "comment": tag}}])})
        return cmds

    # -- verbs ----------------------------------------------------------------

    def entries(self, tags: set[str] | None = None, *, keep: set[str] | None = None,
                table: Table | None = None) -> list[dict]:
        """Delete commands for this network's elements tagged with ``tags``
        (or, with ``keep``, with any tag not in ``keep``)."""
        table = table if table is not None else self.nft.table(MASQ_FAMILY, TABLE)
        if table is None:
            return []
        cmds = []
        for v in (4, 6):
            for name in self.set_names(v):
                vals = table.tagged(name, tags, keep=keep)
                if vals:
                    cmds.append({"delete": _obj("element", MASQ_FAMILY, name=name, elem=vals)})
        return cmds

    def missing(self, addrs: list[IPInterface], tag: str) -> list[str]:
        """What CHECK finds wrong: descriptions of absent rules/elements."""
        table = self.nft.table(MASQ_FAMILY, TABLE)
        if table is None:
            return [f"nftables table {MASQ_FAMILY} {TABLE} is missing"]
        problems = []
        if self.id not in table.chains:
            problems.append(f"masquerade chain {self.id} of network {self.network!r} is missing")
        jumps = [r for r in table.chain_rules("postrouting")
                 if any(e.get("jump", {}).get("target") == self.id for e in r["expr"])]
        if len(jumps) < 2:
            problems.append(f"postrouting jumps to {self.id} are missing")
        for a in addrs:
            pods, local = self.set_names(a.version)
            have = {str(v) for v, c in table.elements(pods) if c == tag}
            if str(a.ip) not in have:
                problems.append(f"{a.ip} is not in masquerade set {pods}")
            if not any(c == tag for _, c in table.elements(local)):
                problems.append(f"{a} is not in set {local}")
        return problems


class SpoofCheck:
    """MAC spoof check for the pods' host-side veths of one network
    (upstream ``macspoofchk``), in the network's own sets."""

    def __init__(self, network: str, nft: Nft | None = None) -> None:
        self.network = network
        self.id = network_tag(network, prefix="n_", width=16)  # bridge's format (nft)
        self.nft = nft or Nft()
        self.ports = f"{self.id}_spoofchk_ports"
        self.allowed = f"{self.id}_spoofchk_allowed"

    def layout(self) -> list[dict]:
        f = SPOOF_FAMILY
        return [
            {"add": {"table": {"family": f, "name": TABLE}}},
            {"add": _obj("chain", f, name="prerouting", type="filter", hook="prerouting",
                         prio=-300, policy="accept")},
            {"add": _obj("set", f, name=self.allowed, type=["ifname", "ether_addr"])},
            # EEXIST here means the network's layout exists.
            {"create": _obj("set", f, name=self.ports, type="ifname")},
            {"add": _obj("rule", f, chain="prerouting", comment=self.network[:200], expr=[
                {"match": {"op": "==", "left": {"meta": {"key": "iifname"}},
                           "right": f"@{self.ports}"}},
                {"match": {"op": "!=", "left": {"concat": [
                    {"meta": {"key": "iifname"}},
                    {"payload": {"protocol": "ether", "field": "saddr"}}]},
                    "right": f"@{self.allowed}"}},
                {"drop": None}])},
        ]

    def elements(self, port: str, mac: str, tag: str) -> list[dict]:
        """Commands allowing only ``mac`` from host veth ``port``."""
        return [
            {"add": _obj("element", SPOOF_FAMILY, name=self.allowed, elem=[
                {"elem": {"val": {"concat": [port, mac]}, "comment": tag}}])},
            {"add": _obj("element", SPOOF_FAMILY, name=self.ports, elem=[
                {"elem": {"val": port, "comment": tag}}])},
        ]

    def entries(self, tags: set[str] | None = None, *, keep: set[str] | None = None,
                table: Table | None = None,
                port_gone: Callable[[str], bool] | None = None) -> list[dict]:
        """Delete commands for this network's elements tagged with ``tags``
        (or, with ``keep``, with any tag not in ``keep``). Elements of the
        shared sets of old versions: those tagged with ``tags``; with
        ``keep``, those whose tag is not kept and whose host veth
        ``port_gone`` says is gone (none without ``port_gone``)."""
        table = table if table is not None else self.nft.table(SPOOF_FAMILY, TABLE)
        if table is None:
            return []
        cmds = []
        for name in (self.ports, self.allowed):
            vals = table.tagged(name, tags, keep=keep)
            if vals:
                cmds.append({"delete": _obj("element", SPOOF_FAMILY, name=name, elem=vals)})
        for name in (LEGACY_PORTS, LEGACY_ALLOWED):
            if tags is not None:
                vals = table.tagged(name, tags)
            elif keep is not None and port_gone is not None:
                vals = [v for v, _d, c in table.entries(name)
                        if c is not None and c not in keep and port_gone(_port_of(v))]
            else:
                vals = []
            if vals:
                cmds.append({"delete": _obj("element", SPOOF_FAMILY, name=name, elem=vals)})
        return cmds

    def missing(self, port: str, mac: str, tag: str) -> list[str]:
        """What CHECK finds wrong (an attachment whose elements are in the
        old shared sets passes while the old rule is there)."""
        table = self.nft.table(SPOOF_FAMILY, TABLE)
        if table is None:
            return [f"nftables table {SPOOF_FAMILY} {TABLE} is missing"]
        sets = (self.ports, self.allowed)
        if (port, tag) not in set(table.elements(self.ports)) \
                and (port, tag) in set(table.elements(LEGACY_PORTS)):
            sets = (LEGACY_PORTS, LEGACY_ALLOWED)
        ports, allowed = sets
        problems = []
        if not any(e.get("match", {}).get("right") == f"@{ports}"
                   for r in table.chain_rules("prerouting") for e in r.get("expr", ())):
            problems.append(f"macspoofchk rule of set {ports} is missing")
        if (port, tag) not in set(table.elements(ports)):
            problems.append(f"{port} is not in set {ports}")
        have = {(tuple(v["concat"]) if isinstance(v, dict) else v, c)
                for v, c in table.elements(allowed)}
        if ((port, mac), tag) not in have:
            problems.append(f"{port} . {mac} is not in set {allowed}")
        return problems


def _port_of(val: Any) -> str:
    # A ports element is the name; an allowed one ``{"concat": [name, mac]}``.
    if isinstance(val, dict) and "concat" in val:
        return str(val["concat"][0])
    return str(val)


def apply(nft: Nft, elements: list[dict], layouts: list[list[dict]], what: str) -> None:
    """Add ``elements`` in one transaction; when that fails because a table
    or set is missing (ENOENT), create each layout in a transaction of its
    own (EEXIST: another caller already did) and add the elements again.

    Raises:
        NftError: 999 naming ``what``; the failed transaction applied nothing.
    """
    if not elements:
        return
    try:
        nft.run(elements, what=what)
        return
    except NftError as e:
        if e.errno != errno.ENOENT:
            raise
    for layout in layouts:
        try:
            nft.run(layout, what=what)
        except NftError as e:
            if e.errno != errno.EEXIST:
                raise
    nft.run(elements, what=what)
