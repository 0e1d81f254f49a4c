"""portmap's ``backend: "iptables"``: Go's iptables layout, rule for rule,
and the removal of what Go's portmap left (either backend) for a container.

What Go 1.9.1's portmap writes (``portmap_iptables.go``, ``chain.go``), in
table ``nat`` of each IP version of the container's address, in this order::

    CNI-HOSTPORT-SETMARK   -m comment --comment "CNI portfwd masquerade mark"
                           -j MARK --set-xmark <1<<markMasqBit>/<same>     (snat, no
    CNI-HOSTPORT-MASQ      -m mark --mark <mark> -j MASQUERADE              external chain)
      POSTROUTING, first:  -m comment --comment "CNI portfwd requiring masquerade"
                           -j CNI-HOSTPORT-MASQ
    CNI-HOSTPORT-DNAT      (no rules of its own)
      PREROUTING, OUTPUT:  -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
    CNI-DN-<21 hex>        per mapping: the hairpin mark (-s <pod>/32, or any
                           source with masqAll), the localhost mark (IPv4,
                           not masqAll: -s 127.0.0.1), the DNAT
      CNI-HOSTPORT-DNAT:   -m comment --comment 'dnat name: "<net>" id: "<cid>"'
                           -m multiport -p <proto> --destination-ports <up to 15>
                           [conditions] -j CNI-DN-<21 hex>   (per protocol, sorted)

A chain is created when missing, a rule added when ``iptables -C`` does not
find it (Go's ``EnsureChain`` / ``InsertUnique``), all of one IP version in
one ``iptables-restore --noflush``; a restore that loses a race with another
ADD creating the shared chains is planned and run again.

Source: containernetworking/plugins 1.9.1 ``plugins/meta/portmap``, checked
against its binaries (and Debian's 1.1.1, same layout) in
tests/test_portmap_goiptables.py.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
from dataclasses import dataclass, field

from cni_skel import gorules
from cni_skel.errors import ERR_PLUGIN_NOT_AVAILABLE, CNIError
from cni_skel.iptables import IPTables, restore_line, variant
from cni_skel.nft import Nft

from .config import PortMapConf

__all__ = [
    "DNAT_CHAIN",
    "MASQ_CHAIN",
    "NFT_CHAINS",
    "NFT_TABLE",
    "SETMARK_CHAIN",
    "Chain",
    "chains",
    "check",
    "dnat_chain",
    "gc",
    "made_by_go",
    "nft_rules",
    "remove",
    "setup",
    "status",
]

SETMARK_CHAIN = "CNI-HOSTPORT-SETMARK"
MASQ_CHAIN = "CNI-HOSTPORT-MASQ"
DNAT_CHAIN = "CNI-HOSTPORT-DNAT"
_OLD_SNAT_CHAIN = "CNI-HOSTPORT-SNAT"  # Go < 0.7; its per-pod chains are still torn down
_MULTIPORT_MAX = 15
_COMMENT_MAX = 255

#: Go 1.9.1's nftables backend: table ``cni_hostport`` in families ip and
#: ip6; an attachment's rules are commented with its bare container ID.
NFT_TABLE = "cni_hostport"
NFT_CHAINS = ("hostports", "hostip_hostports", "masquerading")

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


@dataclass
class Chain:
    """One chain of Go's layout (go ``chain``): its ``rules``, and the
    ``entry_rules`` (without their ``-j <name>``) added to each of
    ``entry_chains``, first in it when ``prepend``."""

    name: str
    rules: list[list[str]] = field(default_factory=list)
    entry_chains: tuple[str, ...] = ()
    entry_rules: list[list[str]] = field(default_factory=list)
    prepend: bool = False

    def entries(self) -> list[tuple[str, list[str]]]:
        return [(chain, [*rule, "-j", self.name]) for chain in self.entry_chains
                for rule in self.entry_rules]


def _chain_name(network: str, container_id: str, prefix: str) -> str:
    # go utils.MustFormatChainNameWithPrefix: "CNI-" + prefix, 28 characters in all
    width = 28 - len("CNI-" + prefix)
    return f"CNI-{prefix}" + hashlib.sha512((network + container_id).encode()).hexdigest()[:width]


def dnat_chain(network: str, container_id: str) -> str:
    """The container's DNAT chain: ``CNI-DN-`` + 21 hex of SHA-512(network
    + containerID)."""
    return _chain_name(network, container_id, "DN-")


def _comment(network: str, container_id: str) -> str:
    text = f'dnat name: "{network}" id: "{container_id}"'
    return text if len(text) <= _COMMENT_MAX else text[:_COMMENT_MAX - 2] + "..."


def _mark(bit: int) -> str:
    return f"{1 << bit:#x}/{1 << bit:#x}"


def _dnat_rules(conf: PortMapConf, container_id: str, addr: IPInterface) -> Chain:
    """Go's ``fillDnatRules`` for one container address."""
    v6 = addr.version == 6
    chain = Chain(dnat_chain(conf.name, container_id), entry_chains=(DNAT_CHAIN,))
    comment = _comment(conf.name, container_id)
    setmark = conf.external_set_mark_chain or SETMARK_CHAIN
    by_proto: dict[str, list[int]] = {}
    for m in conf.port_mappings:
        by_proto.setdefault(m.protocol, []).append(m.host_port)
    conditions = (conf.conditions_v6 if v6 else conf.conditions_v4) or []
    for proto in sorted(by_proto):
        ports = by_proto[proto]
        for i in range(0, len(ports), _MULTIPORT_MAX):
            spec = ",".join(str(p) for p in ports[i:i + _MULTIPORT_MAX])
            chain.entry_rules.append(["-m", "comment", "--comment", comment, "-m", "multiport",
                                      "-p", proto, "--destination-ports", spec, *conditions])
    for m in conf.port_mappings:
        base = ["-p", m.protocol, "--dport", str(m.host_port)]
        if m.host_ip is not None:
            if (m.host_ip.version == 6) != v6:
                continue
            if not m.host_ip.is_unspecified:
                base += ["-d", str(m.host_ip)]
        if conf.snat_enabled:
            # Go's containerNet.String(): the address with prevResult's prefix
            source = ("::/0" if v6 else "0.0.0.0/0") if conf.masq_all else str(addr)
            chain.rules.append([*base, "-s", source, "-j", setmark])
            if not v6 and not conf.masq_all:
                chain.rules.append([*base, "-s", "127.0.0.1", "-j", setmark])
        ip = addr.ip
        target = f"[{ip}]:{m.container_port}" if v6 else f"{ip}:{m.container_port}"
        chain.rules.append([*base, "-j", "DNAT", "--to-destination", target])
    return chain


def chains(conf: PortMapConf, container_id: str, addr: IPInterface) -> list[Chain]:
    """Go's ``forwardPorts`` for one address (prevResult's, with its
    prefix): the chains in the order Go sets them up (the mark chains only
    with ``snat`` and no ``externalSetMarkChain``)."""
    out = []
    if conf.snat_enabled and conf.external_set_mark_chain is None:
        mark = _mark(conf.mark_bit)
        out.append(Chain(SETMARK_CHAIN, rules=[
            ["-m", "comment", "--comment", "CNI portfwd masquerade mark",
             "-j", "MARK", "--set-xmark", mark]]))
        out.append(Chain(MASQ_CHAIN, rules=[["-m", "mark", "--mark", mark, "-j", "MASQUERADE"]],
                         entry_chains=("POSTROUTING",), prepend=True,
                         entry_rules=[["-m", "comment", "--comment",
                                       "CNI portfwd requiring masquerade"]]))
    out.append(Chain(DNAT_CHAIN, entry_chains=("PREROUTING", "OUTPUT"),
                     entry_rules=[["-m", "addrtype", "--dst-type", "LOCAL"]]))
    out.append(_dnat_rules(conf, container_id, addr))
    return out


def _line(op: str, chain: str, rule: list[str]) -> str:
    return restore_line([op, chain, *rule])


def _plan(ipt: IPTables, layout: list[Chain]) -> list[str]:
    """The restore lines that bring ``layout`` in: a missing chain with all
    its rules, in an existing one the rules ``-C`` does not find."""
    lines: list[str] = []
    for c in layout:
        new = not ipt.chain_exists(c.name)
        if new:
            lines.append(f"-N {c.name}")
        for r in _unique(c.rules):
            if new or not ipt.exists(c.name, r):
                lines.append(_line("-A", c.name, r))
        for entry, rule in _unique(c.entries()):
            # a jump to a chain made just now can not be there yet
            if new or not ipt.exists(entry, rule):
                lines.append(_line("-I", entry, ["1", *rule]) if c.prepend
                             else _line("-A", entry, rule))
    return lines


def _unique(items: list) -> list:
    # Go's InsertUnique: a rule given twice (a mapping repeated) goes in once
    out: list = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def setup(conf: PortMapConf, container_id: str, addrs: list[IPInterface]) -> None:
    """ADD with ``backend: "iptables"``: Go's layout for each address (IPv4
    first), one ``iptables-restore`` per IP version. Undo with `remove`.

    Raises:
        CNIError: 999 naming the command and its stderr.
    """
    for addr in addrs:
        ipt = IPTables(addr.version, table="nat")
        layout = chains(conf, container_id, addr)
        for attempt in range(3):
            lines = _plan(ipt, layout)
            if not lines:
                break
            try:
                ipt.restore(lines)
                break
            except CNIError:
                if attempt == 2:  # another ADD made a shared chain meanwhile: plan again
                    raise


def check(conf: PortMapConf, container_id: str, addrs: list[IPInterface]) -> list[str]:
    """CHECK (Go's ``checkPorts``): one description per missing chain or
    rule of the container's DNAT chain and its entry rules; [] when all are
    there.

    Raises:
        CNIError: 999 when iptables fails.
    """
    problems = []
    for addr in addrs:
        ipt = IPTables(addr.version, table="nat")
        c = _dnat_rules(conf, container_id, addr)
        if not ipt.chain_exists(c.name):
            problems.append(f"chain {c.name} not found in {ipt.tool} table nat")
            continue
        problems += [f"{ipt.tool} -t nat rule {_line('-A', c.name, r)} not found"
                     for r in c.rules if not ipt.exists(c.name, r)]
        problems += [f"{ipt.tool} -t nat rule {_line('-A', ch, r)} not found"
                     for ch, r in c.entries() if not ipt.exists(ch, r)]
    return problems


def _iptables_remove(network: str, container_id: str) -> None:
    chain = dnat_chain(network, container_id)
    old = _chain_name(network, container_id, "SN-")
    for version in sorted(set(gorules.iptables_versions("nat", chain))
                          | set(gorules.iptables_versions("nat", old))):
        ipt = IPTables(version, table="nat")
        ipt.remove_chain(chain, (DNAT_CHAIN,))
        ipt.remove_chain(old, (_OLD_SNAT_CHAIN,))


def nft_rules(container_id: str) -> list[gorules.GoRule]:
    """The container's rules in Go 1.9.1's nftables tables (``ip`` and
    ``ip6 cni_hostport``: ``hostports``, ``hostip_hostports``,
    ``masquerading``); [] on a node without them (point reads).

    Raises:
        NftError: 999 when nftables can not be read.
    """
    families = [f for f in ("ip", "ip6") if gorules.present([(f, NFT_TABLE, None)])]
    if not families:
        return []
    return [r for r in gorules.list_rules(Nft(), families, (NFT_TABLE,))
            if r.chain in NFT_CHAINS and r.comment == container_id]


def remove(network: str, container_id: str, what: str) -> None:
    """DEL: what Go's portmap made for the container on either backend, as
    Go 1.9.1's DEL does for the one it runs (ours need no portMappings):
    the DNAT chain (and a pre-0.7 ``CNI-SN-`` chain) with the rules jumping
    to them, and its rules in ``cni_hostport``. Go's shared chains and
    tables stay, as Go leaves them.

    Raises:
        CNIError: 999 when iptables or nftables refuses (11 when Go's
            nftables rules kept changing).
    """
    _iptables_remove(network, container_id)
    if nft_rules(container_id):
        gorules.remove(container_id.__eq__, what, Nft(), families=("ip", "ip6"),
                       tables=(NFT_TABLE,))


def gc(network: str, keep: set[str]) -> None:
    """GC: the DNAT chains of ``network``'s containers not in ``keep``
    (container IDs), found by the comment of their jump in
    ``CNI-HOSTPORT-DNAT`` (Go's portmap has no GC). Go 1.9.1's nftables
    rules name no network: DEL alone removes them.

    Raises:
        CNIError: 999 when iptables refuses.
    """
    for version in gorules.iptables_versions("nat", DNAT_CHAIN):
        ipt = IPTables(version, table="nat")
        stale = set()
        for line in ipt.list_rules(DNAT_CHAIN):
            words = shlex.split(line)
            if "--comment" not in words[:-1] or words[-2:-1] != ["-j"]:
                continue
            owner = gorules.parse_owner(words[words.index("--comment") + 1])
            if owner and owner[:2] == ("dnat", network) and owner[2] not in keep \
                    and words[-1] == dnat_chain(network, owner[2]):
                stale.add(words[-1])
        for chain in sorted(stale):
            ipt.remove_chain(chain, (DNAT_CHAIN,))


def made_by_go(network: str, container_id: str) -> bool:
    """Whether Go's iptables layout holds a DNAT chain for the container."""
    return bool(gorules.iptables_versions("nat", dnat_chain(network, container_id)))


def status() -> None:
    """STATUS with ``backend: "iptables"``: the ``iptables`` command is there.

    Raises:
        CNIError: 50 when it is not on PATH.
    """
    if variant(4) is None:
        raise CNIError(ERR_PLUGIN_NOT_AVAILABLE, "iptables not found",
                       "backend iptables needs the iptables package")

