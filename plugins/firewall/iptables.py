"""The iptables backend: Go's chains in the node's iptables filter table,
the pods in an ipset per IP version.

Layout (per IP version that has pod addresses; Go 1.1.1's names)::

    FORWARD       -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD   (first)
    CNI-FORWARD   -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN (first)
                  -m set --match-set CNI-FW-POD4 dst -m conntrack
                      --ctstate RELATED,ESTABLISHED -m comment --comment ... -j ACCEPT
                  -m set --match-set CNI-FW-POD4 src -m comment --comment ... -j ACCEPT
    CNI-ADMIN     (empty: the operator's overrides, jumped to before ours)

Go writes the same two ACCEPT rules per pod address (``-d <ip>/32 ...``,
``-s <ip>/32 -j ACCEPT``), so its ADD and every packet cost more with every
pod; here a pod is an ipset entry (`cni_skel.ipset`), commented with its
owner (`owner`), and the rules are written once. The ``same-bridge`` and
``isolated`` ingress policies are Go's isolation chains
(``CNI-ISOLATION-STAGE-1/2``), per bridge.

DEL of a pod this plugin did not add (no record: a Go-made pod on a node
moving to cni-skel) deletes Go's per-address rules for prevResult's
addresses, as Go's DEL does. CHECK and that DEL look for Go's rules in one
listing of CNI-FORWARD (`Layout.go_rules_of`), and that DEL removes them
in one ``iptables-restore``, not one command per rule: each iptables-nft
command reads the whole chain, so a prevResult of a thousand addresses
took tens of seconds that way.

Source: containernetworking/plugins 1.1.1 plugins/meta/firewall
(iptables.go, ingresspolicy.go); ``isolated`` is Go >= 1.7.0's
(containernetworking/plugins#1140).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from cni_skel.errors import CNIError
from cni_skel.ipset import IPSets
from cni_skel.iptables import IPTables

__all__ = ["ADMIN_CHAIN", "PRIV_CHAIN", "SETS", "Layout", "go_rules", "isolate_bridge"]

PRIV_CHAIN = "CNI-FORWARD"
ADMIN_CHAIN = "CNI-ADMIN"
#: The ipset of pod addresses per IP version.
SETS = {4: "CNI-FW-POD4", 6: "CNI-FW-POD6"}
_PRIV_COMMENT = "CNI firewall plugin rules"
_ADMIN_COMMENT = "CNI firewall plugin admin overrides"
_SET_COMMENT = "cni-skel firewall: pods of ipset {}"
_STAGE1 = "CNI-ISOLATION-STAGE-1"
_STAGE2 = "CNI-ISOLATION-STAGE-2"


def _comment(text: str) -> list[str]:
    return ["-m", "comment", "--comment", text]


def host_prefix(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Go's ``ipString``: the address as a /32 or /128."""
    return f"{ip}/{ip.max_prefixlen}"


def go_rules(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[list[str]]:
    """The two rules Go's ADD appends to CNI-FORWARD for one pod address."""
    net = host_prefix(ip)
    return [["-d", net, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
            ["-s", net, "-j", "ACCEPT"]]


def _set_rules(version: int) -> list[list[str]]:
    name = SETS[version]
    note = _comment(_SET_COMMENT.format(name))
    return [["-m", "set", "--match-set", name, "dst", "-m", "conntrack", "--ctstate",
             "RELATED,ESTABLISHED", *note, "-j", "ACCEPT"],
            ["-m", "set", "--match-set", name, "src", *note, "-j", "ACCEPT"]]


class Layout:
    """The rules of one IP version (``version``), with ``admin`` as the
    admin chain (``iptablesAdminChainName``, Go's default CNI-ADMIN)."""

    def __init__(self, version: int, admin: str = ADMIN_CHAIN) -> None:
        self.version = version
        self.admin = admin
        self.ipt = IPTables(version)
        self.set = SETS[version]

    def _jumps(self) -> list[tuple[str, list[str]]]:
        return [("FORWARD", [*_comment(_PRIV_COMMENT), "-j", PRIV_CHAIN]),
                (PRIV_CHAIN, [*_comment(_ADMIN_COMMENT), "-j", self.admin])]

    def ensure(self, ipsets: IPSets) -> None:
        """Make the set, the chains and the rules that are missing (Go's
        ``setupChains``: each ADD checks, as the filter may have been
        flushed since). The set's rules are checked by the kernel's count
        of rules using the set: two is all of them."""
        ipsets.ensure(self.set, self.version)
        for chain, rule in self._jumps():
            # a jump that is there proves both chains are (a chain jumped
            # to can not be deleted): one -C each in the common case
            if not self.ipt.exists(chain, rule):
                for name in (PRIV_CHAIN, self.admin):
                    self.ipt.ensure_chain(name)
                self.ipt.insert_unique(chain, rule)
        header = ipsets.header(self.set) or {}
        if header.get("references") != len(_set_rules(self.version)):
            for rule in _set_rules(self.version):
                self.ipt.append_unique(PRIV_CHAIN, rule)

    def problems(self, ipsets: IPSets, *, with_set: bool = True) -> list[str]:
        """What CHECK finds missing of the layout (empty: all there);
        ``with_set`` False: the jumps only (a Go-made pod's rules)."""
        out = []
        rules = self._jumps()
        if with_set:
            if ipsets.header(self.set) is None:
                return [f"ipset {self.set} is missing"]
            rules += [(PRIV_CHAIN, r) for r in _set_rules(self.version)]
        for chain, rule in rules:
            if not self.ipt.exists(chain, rule):
                out.append(f"expected {chain} rule {' '.join(rule)} not found")
        return out

    def delete_go_rules(self, addrs: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]
                        ) -> None:
        """Go's DEL: its per-address rules, where there. One listing of
        CNI-FORWARD (`go_rules_of`) tells which addresses have them: those
        go in one ``iptables-restore`` (all or nothing), rule by rule with
        ``-D`` when it fails (a rule not there is no error) or when the
        chain can not be listed. An address the chain does not name costs
        nothing."""
        addrs = list(dict.fromkeys(addrs))
        lines = self._listing()
        have = self._go_rules_in(lines, addrs) if lines is not None else {}
        batch = [ip for ip in addrs if have.get(ip)]
        single = [ip for ip in addrs if lines is None or have.get(ip) is None]
        if batch and not self._restore([f"-D {PRIV_CHAIN} {' '.join(rule)}"
                                        for ip in batch for rule in go_rules(ip)]):
            single += batch
        for ip in single:
            for rule in go_rules(ip):
                self.ipt.delete(PRIV_CHAIN, rule)

    def has_go_rules(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        """Whether CNI-FORWARD holds Go's two rules for ``ip`` (two ``-C``)."""
        return all(self.ipt.exists(PRIV_CHAIN, rule) for rule in go_rules(ip))

    def go_rules_of(self, addrs: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]
                    ) -> dict[ipaddress.IPv4Address | ipaddress.IPv6Address, bool]:
        """Whether CNI-FORWARD holds Go's two rules for each of ``addrs``,
        from one listing of the chain: both rules listed as Go writes them
        is yes, no rule naming the address is no, anything else (a listing
        spelled otherwise) is asked with ``-C`` (`has_go_rules`), as is
        every address when the chain can not be listed."""
        addrs = list(addrs)
        lines = self._listing()
        have = self._go_rules_in(lines, addrs) if lines is not None else {}
        return {ip: self.has_go_rules(ip) if have.get(ip) is None else bool(have[ip])
                for ip in addrs}

    @staticmethod
    def _go_rules_in(lines: list[str], addrs: list[ipaddress.IPv4Address | ipaddress.IPv6Address]
                     ) -> dict[ipaddress.IPv4Address | ipaddress.IPv6Address, bool | None]:
        """From ``iptables -S`` lines: True when both of an address's Go
        rules are listed as Go writes them, False when no rule names it,
        None when unsure."""
        listed = set(lines)
        named = {word for line in lines for word in line.split()}
        out: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, bool | None] = {}
        for ip in addrs:
            if host_prefix(ip) not in named:
                out[ip] = False
            elif all(f"-A {PRIV_CHAIN} {' '.join(r)}" in listed for r in go_rules(ip)):
                out[ip] = True
            else:
                out[ip] = None
        return out

    def _listing(self) -> list[str] | None:
        """CNI-FORWARD's ``-S`` lines ([] without the chain); None when it
        can not be listed (the caller asks rule by rule)."""
        try:
            return self.ipt.list_rules(PRIV_CHAIN)
        except CNIError:
            return None

    def _restore(self, commands: list[str]) -> bool:
        """``commands`` in one transaction: all applied, or none and False."""
        try:
            self.ipt.restore(commands)
        except CNIError:
            return False
        return True


def isolate_bridge(version: int, bridge: str, *, isolated: bool) -> None:
    """Go's ``setupIsolationChains`` for ``bridge``: traffic from another
    isolated bridge into it is dropped (and, ``isolated``, between its own
    ports too). Per bridge, kept when pods go (Go's DEL leaves them too: the
    bridge may still serve other pods)."""
    ipt = IPTables(version)
    # Go 1.1.1 comments every rule of the chains with the same-bridge text.
    note = _comment("CNI firewall plugin rules (ingressPolicy: same-bridge)")
    for chain in (_STAGE1, _STAGE2):
        ipt.ensure_chain(chain)
    ipt.insert_unique("FORWARD", ["-j", _STAGE1, *note])
    ipt.insert_unique(_STAGE1, ["-i", bridge, "!", "-o", bridge, "-j", _STAGE2, *note])
    if isolated:
        own = _comment("CNI firewall plugin rules (ingressPolicy: isolated)")
        ipt.insert_unique(_STAGE1, ["-i", bridge, "-o", bridge, "-j", "DROP", *own])
    ipt.append_unique(_STAGE1, ["-j", "RETURN", *note])
    ipt.insert_unique(_STAGE2, ["-o", bridge, "-j", "DROP", *note])
    ipt.append_unique(_STAGE2, ["-j", "RETURN", *note])
