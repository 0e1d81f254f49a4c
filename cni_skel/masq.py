"""IP masquerade per network for any plugin's ``ipMasq``, in nftables sets.

Go's plugins call ``ip.SetupIPMasq`` / ``ip.TeardownIPMasq`` per container
(iptables: a chain per container; nftables: rules per container). Here each
network has one chain and a few sets written once; a pod is only elements
in those sets, so the cost of an ADD, a DEL and of every packet does not
grow with the number of pods. Every element carries the attachment's tag
(`cni_skel.tags.attachment_tag`) as its comment: DEL and GC find an
attachment's elements without prevResult, netns or state files.

Public API, called from a plugin's verbs::

    tag = attachment_tag(args.container_id, args.ifname)
    setup_ip_masq(conf.name, tag, [ipc.address for ipc in result.ips])   # ADD
    teardown_ip_masq(conf.name, tag)                                     # DEL
    gc_ip_masq(conf.name, conf.gc_keep_tags())                           # GC
    check_ip_masq(conf.name, tag, [ipc.address for ipc in prev.ips])     # CHECK

and `cni_skel.nft.nft_status` for STATUS. `Masquerade` is the same state as
commands, for a plugin that writes other nftables entries in the same
transaction (the bridge plugin's spoof check).

Layout, table ``inet <table>`` (`TABLE` unless the caller names another)::

    chain postrouting { type nat hook postrouting priority srcnat; }
        ip saddr @<N>_pods4 jump <N>             # one pair per network
        ip6 saddr @<N>_pods6 jump <N>
    chain <N> {                                  # N: network_tag, "n_" + 16 hex
        ip saddr . ip daddr @<N>_local4 return   # to the pod's own subnet
        ip daddr 224.0.0.0/4 return              # multicast
        ip6 saddr . ip6 daddr @<N>_local6 return
        ip6 daddr ff00::/8 return
        masquerade
    }
    set <N>_pods4  { type ipv4_addr; }                              # pod address
    set <N>_local4 { type ipv4_addr . ipv4_addr; flags interval; }  # address . subnet

which is Go's per-container rule ``ip saddr A ip daddr != S masquerade``
(and its multicast exception) as set lookups. Networks are told apart by
name (the CNI ``name``): DEL and GC of one never touch another's elements.

The layout is created once, in the same transaction as a ``create`` of the
network's chain, which fails with EEXIST when it is there (so concurrent
first ADDs can not duplicate rules); an ADD after that is one transaction
that only adds elements, and a DEL of nothing commits nothing.

Source: Go ``pkg/ip/ipmasq_linux.go`` (containernetworking/plugins 1.1.1)
for what is masqueraded; the layout is ours.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Iterable
from typing import Any

from .errors import ERR_INTERNAL, CNIError
from .nft import Nft, NftError, Table, network_tag

__all__ = [
    "FAMILY",
    "TABLE",
    "Masquerade",
    "check_ip_masq",
    "gc_ip_masq",
    "setup_ip_masq",
    "teardown_ip_masq",
]

#: The table plugins share unless they name their own (one per family inet).
TABLE = "cni_skel_masq"
FAMILY = "inet"
MULTICAST = {4: ("224.0.0.0", 4), 6: ("ff00::", 8)}
_P = {4: "ip", 6: "ip6"}
_ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}
GC_TRIES = 3  # listings before GC gives up on elements going meanwhile

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _payload(version: int, field: str) -> dict:
    return {"payload": {"protocol": _P[version], "field": field}}


def _prefix(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> dict:
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


class Masquerade:
    """The masquerade state of network ``network`` as libnftables JSON
    commands (none is run but by the verbs below and `Nft.apply`).

    ``table``: the inet table holding it (`TABLE` by default; the bridge
    plugin keeps its ``cni_skel_bridge``). ``nft``: the `Nft` to list and
    run with (made when None, in the calling thread's namespace).

    Attributes:
        id: the network's chain, ``"n_" + 16 hex`` (`network_tag`); its
            sets are ``<id>_pods4/6`` and ``<id>_local4/6``.
    """

    def __init__(self, network: str, nft: Nft | None = None, *, table: str = TABLE) -> None:
        self.network = network
        self.table = table
        self.id = network_tag(network, prefix="n_", width=16)
        self.nft = nft or Nft()

    def _obj(self, kind: str, **spec: Any) -> dict:
        return {kind: {"family": FAMILY, "table": self.table, **spec}}

    def set_names(self, version: int) -> tuple[str, str]:
        """``(pods, local)`` set names of IP version ``version`` (4 or 6)."""
        return f"{self.id}_pods{version}", f"{self.id}_local{version}"

    def layout(self) -> list[dict]:
        """Commands creating the table, its postrouting chain, this
        network's sets, chain and rules; fails with EEXIST (`NftError`)
        when the network's chain exists."""
        cmds: list[dict] = [
            {"add": {"table": {"family": FAMILY, "name": self.table}}},
            {"add": self._obj("chain", name="postrouting", type="nat", hook="postrouting",
                              prio=100, policy="accept")},
        ]
        for v in (4, 6):
            pods, local = self.set_names(v)
            cmds.append({"add": self._obj("set", name=pods, type=_ADDR_TYPE[v])})
            cmds.append({"add": self._obj("set", name=local, type=[_ADDR_TYPE[v]] * 2,
                                          flags=["interval"])})
        # EEXIST here means another ADD set the network up first.
        cmds.append({"create": self._obj("chain", name=self.id)})
        for v in (4, 6):
            pods, _ = self.set_names(v)
            cmds.append({"add": self._obj("rule", chain="postrouting",
                                          comment=self.network[:200],
                                          expr=[{"match": {"op": "==",
                                                           "left": _payload(v, "saddr"),
                                                           "right": f"@{pods}"}},
                                                {"jump": {"target": self.id}}])})
        for v in (4, 6):
            _, local = self.set_names(v)
            addr, plen = MULTICAST[v]
            cmds.append({"add": self._obj("rule", chain=self.id, expr=[
                {"match": {"op": "==", "left": {"concat": [_payload(v, "saddr"),
                                                           _payload(v, "daddr")]},
                           "right": f"@{local}"}},
                {"return": None}])})
            cmds.append({"add": self._obj("rule", chain=self.id, expr=[
                {"match": {"op": "==", "left": _payload(v, "daddr"),
                           "right": {"prefix": {"addr": addr, "len": plen}}}},
                {"return": None}])})
        cmds.append({"add": self._obj("rule", chain=self.id, expr=[{"masquerade": None}])})
        return cmds

    def elements(self, addrs: Iterable[IPInterface], tag: str) -> list[dict]:
        """Commands adding ``addrs`` (pod address with its subnet's prefix
        length, as an IPAM result's ``address``) of attachment ``tag``."""
        cmds = []
        for a in addrs:
            pods, local = self.set_names(a.version)
            cmds.append({"add": self._obj("element", name=pods, elem=[
                {"elem": {"val": str(a.ip), "comment": tag}}])})
            cmds.append({"add": self._obj("element", name=local, elem=[
                {"elem": {"val": {"concat": [str(a.ip), _prefix(a.network)]},
                          "comment": tag}}])})
        return cmds

    def entries(self, tags: set[str] | None = None, *, keep: set[str] | None = None,
                listing: Table | None = None) -> list[dict]:
        """Commands deleting this network's elements tagged with ``tags``
        (or, with ``keep``, with any tag not in ``keep``); none when there
        are none. ``listing``: the table as already listed (else listed
        here, one request)."""
        if listing is None:
            listing = self.nft.table(FAMILY, self.table)
        if listing is None:
            return []
        cmds = []
        for v in (4, 6):
            for name in self.set_names(v):
                vals = listing.tagged(name, tags, keep=keep)
                if vals:
                    cmds.append({"delete": self._obj("element", name=name, elem=vals)})
        return cmds

    def missing(self, addrs: Iterable[IPInterface], tag: str) -> list[str]:
        """What CHECK finds wrong: one description per absent rule or
        element (empty when all is there)."""
        listing = self.nft.table(FAMILY, self.table)
        if listing is None:
            return [f"nftables table {FAMILY} {self.table} is missing"]
        problems = []
        if self.id not in listing.chains:
            problems.append(f"masquerade chain {self.id} of network {self.network!r} is missing")
        jumps = [r for r in listing.chain_rules("postrouting")
                 if any(e.get("jump", {}).get("target") == self.id for e in r["expr"])]
        if len(jumps) < 2:
            problems.append(f"postrouting jumps to {self.id} are missing")
        # each set read once: per address it made CHECK quadratic in addresses
        tagged: dict[str, set[str]] = {}
        for a in addrs:
            pods, local = self.set_names(a.version)
            for name in (pods, local):
                if name not in tagged:
                    tagged[name] = {str(v) for v, c in listing.elements(name) if c == tag}
            if str(a.ip) not in tagged[pods]:
                problems.append(f"{a.ip} is not in masquerade set {pods}")
            if not tagged[local]:
                problems.append(f"{a} is not in set {local}")
        return problems


def setup_ip_masq(network: str, tag: str, addrs: Iterable[IPInterface], *,
                  table: str = TABLE, nft: Nft | None = None) -> None:
    """Masquerade what ``addrs`` send outside their subnet (Go
    ``ip.SetupIPMasq`` for each address). ``addrs``: interfaces such as an
    IPAM result's ``ips[].address`` (``10.1.0.5/24``: traffic to
    10.1.0.0/24 and to multicast is left alone). ``tag``: the attachment's
    (`cni_skel.tags.attachment_tag`). One transaction; the first call of a
    network also creates its layout. Undo with `teardown_ip_masq`.

    Raises:
        NftError: 50 when libnftables can not be loaded; 999 naming the
            network when nftables refuses (nothing was added).
    """
    masq = Masquerade(network, nft, table=table)
    masq.nft.apply(masq.elements(addrs, tag), [masq.layout()],
                   what=f"masquerade of network {network}")


def teardown_ip_masq(network: str, tag: str, *, table: str = TABLE,
                     nft: Nft | None = None) -> None:
    """Remove attachment ``tag``'s elements from ``network``'s sets (Go
    ``ip.TeardownIPMasq``), found by their tag: needs no address, netns
    or prevResult. Repeatable (nothing there: nothing done). The layout
    stays for the network's other pods.

    Raises:
        NftError: 50 without libnftables; 999 when nftables refuses.
    """
    masq = Masquerade(network, nft, table=table)
    masq.nft.run(masq.entries({tag}), what=f"masquerade teardown of network {network}")


def gc_ip_masq(network: str, keep: set[str], *, table: str = TABLE,
               nft: Nft | None = None) -> None:
    """Remove ``network``'s elements whose tag is not in ``keep`` (the
    valid attachments' tags, `cni_skel.config.NetConf.gc_keep_tags`; spec
    1.1.0 "GC"). One transaction; listed again when an element went
    meanwhile (a concurrent DEL). Other networks are never looked at.

    Raises:
        NftError: 50 without libnftables; 999 when nftables refuses.
    """
    masq = Masquerade(network, nft, table=table)
    for attempt in range(GC_TRIES):
        try:
            masq.nft.run(masq.entries(keep=keep), what=f"masquerade GC of network {network}")
            return
        except NftError as e:
            if e.errno != errno.ENOENT or attempt == GC_TRIES - 1:
                raise


def check_ip_masq(network: str, tag: str, addrs: Iterable[IPInterface], *,
                  table: str = TABLE, nft: Nft | None = None) -> None:
    """CHECK: ``network``'s layout and attachment ``tag``'s elements for
    ``addrs`` (prevResult's ``ips[].address``) are there.

    Raises:
        CNIError: 999 naming every missing rule or element (Go's CHECK
            errors are 999 too); NftError 50 without libnftables.
    """
    problems = Masquerade(network, nft, table=table).missing(addrs, tag)
    if problems:
        raise CNIError(ERR_INTERNAL, "; ".join(problems))
