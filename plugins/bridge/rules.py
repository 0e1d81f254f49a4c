"""nftables state of the bridge plugin: IP masquerade and MAC spoof checks.

Both keep per-pod data in sets, so the rules are written once and the cost
per packet does not grow with the number of pods (upstream writes a rule, or
two chains, per container). Every element carries the attachment's tag
(`cni_skel.nft.attachment_tag`) as its comment, which is how DEL and GC find
a container's entries with no prevResult and no netns.

Masquerade is the SDK's (`cni_skel.masq`, its layout described there), in
table ``inet cni_skel_bridge`` (`masquerade`), where nodes already hold it.

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

from collections.abc import Callable
from typing import Any

from cni_skel.masq import FAMILY as MASQ_FAMILY
from cni_skel.masq import Masquerade
from cni_skel.nft import Nft, Table, network_tag

__all__ = ["MASQ_FAMILY", "SPOOF_FAMILY", "TABLE", "SpoofCheck", "masquerade"]

TABLE = "cni_skel_bridge"
SPOOF_FAMILY = "bridge"
#: The sets every network shared before per-network spoof-check sets.
LEGACY_PORTS = "spoofchk_ports"
LEGACY_ALLOWED = "spoofchk_allowed"


def _obj(kind: str, family: str, **spec: Any) -> dict:
    return {kind: {"family": family, "table": TABLE, **spec}}


def masquerade(network: str, nft: Nft | None = None) -> Masquerade:
    """Network ``network``'s masquerade (`cni_skel.masq.Masquerade`) in the
    bridge's table ``inet cni_skel_bridge``."""
    return Masquerade(network, nft, table=TABLE)


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
